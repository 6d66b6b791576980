"""A MIG card whose layout changes, from a real Prometheus to the finance CSV (SPEC §7).

Two H100s are observed for 2.5 h while their MIG mode goes off → on, empty → one 1g → 1g +
1g + 2g, in the shape dcgm-exporter writes: with MIG off the card exports
`DCGM_FI_DEV_GPU_UTIL` on its UUID; with MIG on, each instance exports
`DCGM_FI_PROF_GR_ENGINE_ACTIVE` only, labelled `GPU_I_ID`/`GPU_I_PROFILE` beside its card's
`UUID`. The first card keeps exporting its power and temperature while MIG is on (so it is
seen while empty); the second exports nothing then (its empty half hour is unobserved).

What a user relies on: each card has 2.5 GPU-hours of capacity (one card-second per second
however it is divided); the pod that held it whole gets a whole card, each MIG pod its
slices / 7; the slices carved into no instance, or into one nobody held, are the
platform's; the finance CSV charges the team its shares and the platform the rest.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from promserver import Card, PromServer, backfill, binaries, start_prometheus
from records import bare_pod

from auditor import jobs
from auditor.jobs import import_prometheus, open_store
from auditor.model import PodRecord
from auditor.report.finance import parse_week
from auditor.report.summary import GroupBy
from auditor.settings import Config, Prices, Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods

STEP = 30
H = 3600
HALF = H // 2
_MONDAY = datetime.fromtimestamp(time.time(), UTC).date() - timedelta(days=14)
_MONDAY -= timedelta(days=_MONDAY.weekday())
WEEK = parse_week(f"{_MONDAY.isocalendar().year}-W{_MONDAY.isocalendar().week:02d}")
S0 = int(datetime(_MONDAY.year, _MONDAY.month, _MONDAY.day, tzinfo=UTC).timestamp()) + 86_400
END = S0 + 5 * HALF
MIG_ON, ONE_1G, THREE = S0 + H, S0 + 3 * HALF, S0 + 2 * H
MODEL = "NVIDIA H100 80GB HBM3"
GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
POWER = "DCGM_FI_DEV_POWER_USAGE"
TEMP = "DCGM_FI_DEV_GPU_TEMP"


def physical(uuid: str, node: str, *, whole_pod: str, reports_when_mig: bool) -> list[Card]:
    """The card (MIG off for its first hour) and its three instances, in dcgm's shape."""
    off = [(S0, MIG_ON)]
    card = Card(
        uuid,
        0,
        node,
        model=MODEL,
        holders=[(S0, MIG_ON, "ml", whole_pod)],
        only=frozenset({GPU_UTIL, POWER, TEMP}),
        when={GPU_UTIL: off} if reports_when_mig else {GPU_UTIL: off, POWER: off, TEMP: off},
    )

    def instance(gi: int, profile: str, start: int, pod: str | None) -> Card:
        return Card(
            uuid,
            0,
            node,
            model=MODEL,
            mig_instance=gi,
            mig_profile=profile,
            holders=[(start, END, "ml", pod)] if pod else [],
            only=frozenset({GR_ENGINE}),
            hostnames=[(start, END, node)],
        )

    prefix = uuid[-2:].lower()
    return [
        card,
        instance(1, "1g.10gb", ONE_1G, f"mig-a-{prefix}"),
        instance(2, "1g.10gb", THREE, None),  # carved, held by nobody
        instance(3, "2g.20gb", THREE, f"mig-b-{prefix}"),
    ]


CARDS = [
    *physical("GPU-M1", "node-m1", whole_pod="whole-m1", reports_when_mig=True),
    *physical("GPU-M2", "node-m2", whole_pod="whole-m2", reports_when_mig=False),
]


def value(card: Card, t: int) -> float:
    return {None: 80.0, 1: 0.5, 2: 0.0, 3: 1.0}[card.mig_instance]


METRICS = {GPU_UTIL: value, GR_ENGINE: value, POWER: lambda c, t: 300.0, TEMP: lambda c, t: 40.0}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"{found}: required under CI", pytrace=False)
        pytest.skip(found)
    root = tmp_path_factory.mktemp("mig-layout")
    backfill(CARDS, root / "tsdb", start_s=S0, end_s=END, interval_s=STEP, metrics=METRICS)
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def pod(name: str, node: str, start: int, resource: str) -> PodRecord:
    """A pod bound just before it shows on its card; the whole-card pod leaves when MIG goes
    on, the MIG pods run to the end."""
    whole = resource == "nvidia.com/gpu"
    return replace(
        bare_pod(
            name,
            f"uid-{name}",
            bound_ms=start * 1000 - 5_000,
            finished_ms=(MIG_ON if whole else END) * 1000,
        ),
        node=node,
        gpu_resource=resource,
        share_kind=None if whole else "mig",
    )


PODS = [
    p
    for n, node in (("m1", "node-m1"), ("m2", "node-m2"))
    for p in (
        pod(f"whole-{n}", node, S0, "nvidia.com/gpu"),
        pod(f"mig-a-{n}", node, ONE_1G, "nvidia.com/mig-1g.10gb"),
        pod(f"mig-b-{n}", node, THREE, "nvidia.com/mig-2g.20gb"),
    )
]


def test_a_card_that_changes_its_mig_layout_is_one_card_to_the_finance_csv(
    prometheus: PromServer, db_url: str
) -> None:
    migrate.upgrade(make_engine(db_url))
    with open_store(db_url).begin() as conn:
        upsert_pods(conn, PODS)
    stats = import_prometheus(
        db_url, prometheus_url=prometheus.url, window=(S0 * 1000, END * 1000), step_s=STEP
    )
    assert stats.unresolved == 0
    jobs.audit(db_url, window=(WEEK.start_ms, WEEK.end_ms), thresholds=Thresholds())

    report = jobs.build_report(
        db_url, start_ms=WEEK.start_ms, end_ms=WEEK.end_ms, by=GroupBy.POD, team=None
    )
    assert report.totals["capacity_gpu_hours"] == pytest.approx(2 * 2.5, abs=1e-6)
    rows = report.rows.set_index("pod")
    for n in ("m1", "m2"):
        # held whole for an hour at 80 %; then 1/7 for an hour at 50 %; 2/7 for 30 min, busy
        assert rows.loc[f"whole-{n}", "busy_gpu_hours"] == pytest.approx(0.8, abs=1e-6)
        assert rows.loc[f"whole-{n}", "compute_idle_gpu_hours"] == pytest.approx(0.2, abs=1e-6)
        assert rows.loc[f"mig-a-{n}", "busy_gpu_hours"] == pytest.approx(0.5 / 7, abs=1e-6)
        assert rows.loc[f"mig-b-{n}", "busy_gpu_hours"] == pytest.approx(1 / 7, abs=1e-6)
    platform = rows.loc["(platform)"]
    # the empty half hour (seen on M1, unseen on M2), 6 slices for 30 min, 1 + 3 for 30 min
    slices = 0.5 * 6 / 7 + 0.5 * 4 / 7
    assert platform["unallocated_gpu_hours"] == pytest.approx(0.5 + 2 * slices, abs=1e-6)
    assert platform["unobserved_gpu_hours"] == pytest.approx(0.5, abs=1e-6)

    price = 2.0
    config = Config(prices=Prices(default=1.0, by_model={MODEL: price}))
    text = jobs.export_finance(db_url, week=WEEK.label, config=config)
    cells = {r["team"]: r for r in csv.DictReader(io.StringIO(text))}
    held = 2 * (1.0 + 1 / 7 + 2 / 7 * 0.5)
    assert float(cells["ml"]["allocated_gpu_hours"]) == pytest.approx(held, abs=1e-4)
    assert float(cells["(platform)"]["allocated_gpu_hours"]) == pytest.approx(5 - held, abs=1e-4)
    assert {r["gpu_model"] for r in cells.values()} == {MODEL}
    total_cost = sum(float(r["allocated_cost"]) for r in cells.values())
    assert total_cost == pytest.approx(5 * price, abs=0.011)
