"""`import prometheus` across a dcgm-exporter restart, against a real Prometheus (Debian's
`prometheus` and `promtool`, started here on loopback).

Without a node label and without kube-state-metrics' `kube_pod_info`, the only node evidence
of a dcgm-exporter series is its `Hostname`: without host networking, the exporter pod's
name. When that pod is replaced inside the window (a DaemonSet rollout, a node drain) the
card's series come under a second name. What users rely on: the card is the same card on
the same node (one UUID is one physical card) — the first recorded node is kept, the card a
store already holds (the sampler's, an earlier import's) keeps its stored node, `--node`
names the node outright — and the window audits to its GPU-hours, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from promserver import Card, PromServer, backfill, binaries, start_prometheus
from records import bare_pod
from sqlalchemy import select

from auditor import jobs
from auditor.errors import InputError
from auditor.jobs import import_prometheus, open_store
from auditor.model import GpuRecord
from auditor.report.causes import CAUSE_COLUMNS
from auditor.report.summary import GroupBy
from auditor.settings import Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.schema import gpus
from auditor.store.writes import upsert_gpus

STEP = 30
H = 3600
END = (int(time.time()) // 86_400) * 86_400
START = END - 2 * H
RESTART = START + H  # inside the 25-minute chunk [START+50min, START+75min)
OLD, NEW = "nvidia-dcgm-exporter-km55s", "nvidia-dcgm-exporter-q28k4"
SPANS = [(START, RESTART, OLD), (RESTART, END, NEW)]

CARDS = [
    Card("GPU-R0", 0, "", hostnames=SPANS, holders=[(START, END, "ml", "train-0")]),
    Card("GPU-R1", 1, "", hostnames=SPANS),  # never held
]
METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": lambda c, t: 90.0 if c.gpu == 0 else 0.0,
    "DCGM_FI_DEV_FB_USED": lambda c, t: 30_000.0 if c.gpu == 0 else 0.0,
    "DCGM_FI_DEV_FB_FREE": lambda c, t: 51_000.0 if c.gpu == 0 else 81_000.0,
}


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"{found}: required under CI", pytrace=False)
        pytest.skip(found)
    root = tmp_path_factory.mktemp("restart")
    backfill(CARDS, root / "tsdb", start_s=START, end_s=END, interval_s=STEP, metrics=METRICS)
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


@pytest.fixture
def store(db_url: str) -> str:
    migrate.upgrade(make_engine(db_url))
    with open_store(db_url).begin() as conn:
        upsert_pods(conn, [bare_pod("train-0", "uid-train", bound_ms=(START - 600) * 1000)])
    return db_url


def stored_nodes(url: str) -> dict[str, str]:
    with open_store(url).connect() as conn:
        return {r.uuid: r.node for r in conn.execute(select(gpus.c.uuid, gpus.c.node))}


def gpu_hours(url: str) -> dict[str, dict[str, float]]:
    """Audit the window; per card, its nonzero GPU-hours by column of `report --by gpu`."""
    jobs.audit(url, window=(START * 1000, END * 1000), thresholds=Thresholds())
    report = jobs.build_report(url, start_ms=None, end_ms=None, by=GroupBy.GPU, team=None)
    rows = report.rows.set_index("gpu")
    hours = [c for c in rows.columns if c.endswith("_gpu_hours") and c not in CAUSE_COLUMNS]
    return {
        str(g): {c[:-10]: round(float(rows.loc[g, c]), 3) for c in hours if rows.loc[g, c]}
        for g in rows.index
    }


EXPECTED = {  # 2 hours each; 90 % utilisation is 10 % compute idle (SPEC §3)
    "GPU-R0": {"capacity": 2.0, "allocated": 2.0, "busy": 1.8, "compute_idle": 0.2},
    "GPU-R1": {"capacity": 2.0, "unallocated": 2.0},
}


def run(url: str, server: PromServer, **more: object) -> jobs.PrometheusImportStats:
    return import_prometheus(
        url,
        prometheus_url=server.url,
        window=(START * 1000, END * 1000),
        step_s=STEP,
        max_points=50,  # 25-minute chunks: the restart inside one, and across chunks
        **more,  # type: ignore[arg-type]
    )


def test_an_exporter_restart_keeps_each_card_on_its_first_recorded_node(
    restarted: PromServer, store: str
) -> None:
    stats = run(store, restarted)
    assert stored_nodes(store) == {"GPU-R0": OLD, "GPU-R1": OLD}
    assert stats.samples == 2 * 2 * H // STEP  # every sample of both exporter pods
    assert stats.node_sources == {"Hostname": 2}
    assert gpu_hours(store) == EXPECTED
    again = run(store, restarted)  # a re-run, now starting under the new pod's name
    assert (again.samples, again.already) == (0, 2 * 2 * H // STEP)
    assert stored_nodes(store) == {"GPU-R0": OLD, "GPU-R1": OLD}


def test_a_card_the_store_holds_keeps_its_stored_node(restarted: PromServer, store: str) -> None:
    with open_store(store).begin() as conn:  # the sampler (or an earlier import) saw them
        upsert_gpus(conn, [GpuRecord("GPU-R0", "node-a", 0), GpuRecord("GPU-R1", "node-a", 1)])
    stats = run(store, restarted)
    assert stored_nodes(store) == {"GPU-R0": "node-a", "GPU-R1": "node-a"}
    assert stats.node_sources == {"stored GPU": 2}
    assert gpu_hours(store) == EXPECTED


def test_node_names_the_node_of_an_exporter_pod_or_a_card(
    restarted: PromServer, store: str
) -> None:
    given = {OLD: "node-a", NEW: "node-a", "GPU-R1": "node-b"}
    stats = run(store, restarted, nodes=given)
    assert stored_nodes(store) == {"GPU-R0": "node-a", "GPU-R1": "node-b"}
    assert stats.node_sources == {"--node": 2}
    assert gpu_hours(store) == EXPECTED


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["node-a"], "--node takes HOSTNAME=NODE or UUID=NODE, not 'node-a'"),
        (["=node-a"], "--node takes HOSTNAME=NODE or UUID=NODE, not '=node-a'"),
        (["x=a", "x=b"], "--node names x twice: 'a' and 'b'"),
    ],
)
def test_bad_node_options_are_one_line_errors(values: list[str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        jobs.parse_node_options(values)


def test_the_cli_takes_node_options(restarted: PromServer, store: str) -> None:
    from typer.testing import CliRunner

    from auditor.cli import app

    start = datetime.fromtimestamp(START, UTC).isoformat()
    end = datetime.fromtimestamp(END, UTC).isoformat()
    args = ["--db", store, "import", "prometheus", "--url", restarted.url, "--start", start]
    args += ["--end", end, "--node", f"{OLD}=node-a", "--node", f"{NEW}=node-a"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert stored_nodes(store) == {"GPU-R0": "node-a", "GPU-R1": "node-a"}
    bad = CliRunner().invoke(app, [*args[:-2], "--node", "node-a"])
    assert bad.exit_code == 2
    assert "--node takes HOSTNAME=NODE or UUID=NODE" in bad.output
