"""`auditor import outputs --url` against a real Prometheus holding backfilled vLLM series.

Hand-built series on a 15 s grid over a 10-minute window (two 5-minute intervals): a counter
that resets at the interval boundary, a second pod of the same name in another namespace
(plus the earlier pod of that name, gone before the window), a series without labels and
one of a pod the database does not know; a latency histogram whose quantiles are computed
by hand. Then the A/B simulator's own vLLM export: what the importer reads from Prometheus
equals what the simulator integrated (one replica restarts half-way: its counters reset).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from promserver import PromServer, backfill_text, binaries, start_prometheus
from records import bare_pod
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.jobs.common import open_store
from auditor.model import PodRecord
from auditor.report.compare import latency_quantiles
from auditor.settings import Config
from auditor.simulate.ab import simulate_ab
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.work_done import read_latency, read_outputs

T0 = 1_795_248_000  # 2026-11-21 08:00 UTC, a day before the A/B story; a multiple of 300 s
STEP = 15
WINDOW = (T0 * 1000, (T0 + 600) * 1000)
BUCKETS = ((0.1, 0.3), (0.5, 0.8), (1.0, 0.9), (2.0, 1.0), (math.inf, 1.0))
"""(le, share of requests at or below it): per step 10 requests arrive."""


def team_a(k: int) -> float:
    """The team-a counter at grid point k: +10 a step; at k=20 the server restarts."""
    return 100 + 10 * k if k < 20 else 4 + 10 * (k - 20)


def hand_series() -> str:
    lines = ["# TYPE vllm:generation_tokens_total gauge"]
    for k in range(-1, 41):
        t = T0 + k * STEP
        lines += [
            f'vllm:generation_tokens_total{{namespace="team-a",pod="web-0"}} {team_a(k)} {t}',
            f'vllm:generation_tokens_total{{namespace="team-b",pod="web-0"}} {50 + 5 * k} {t}',
            f'vllm:generation_tokens_total{{namespace="team-a",pod="ghost"}} {7 * (k + 1)} {t}',
            f'vllm:generation_tokens_total{{job="vllm"}} {k + 1} {t}',
        ]
    lines.append("# TYPE vllm:e2e_request_latency_seconds_bucket gauge")
    for k in range(-1, 41):
        t = T0 + k * STEP
        for le, share in BUCKETS:
            bound = "+Inf" if math.isinf(le) else f"{le:g}"
            labels = f'namespace="team-a",pod="web-0",le="{bound}"'
            lines.append(
                f"vllm:e2e_request_latency_seconds_bucket{{{labels}}} {10 * (k + 1) * share:g} {t}"
            )
    return "\n".join([*lines, "# EOF"]) + "\n"


def sim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "ab-sim"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"{found}: required under CI", pytrace=False)
        pytest.skip(found)
    root = tmp_path_factory.mktemp("prom-outputs")
    ab = simulate_ab(sim_dir(tmp_path_factory))
    backfill_text(hand_series(), root / "tsdb")
    backfill_text(ab.serving_openmetrics.read_text(encoding="utf-8"), root / "tsdb2")
    for block in (root / "tsdb2").iterdir():
        block.rename(root / "tsdb" / block.name)
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def pod(
    namespace: str, name: str, uid: str, *, bound: int, finished: int | None = None
) -> PodRecord:
    rec = bare_pod(
        name, uid, bound_ms=bound * 1000, finished_ms=None if finished is None else finished * 1000
    )
    return replace(rec, namespace=namespace, team=namespace, job=f"StatefulSet/{name}")


@pytest.fixture
def store(db_url: str) -> str:
    migrate.upgrade(make_engine(db_url))
    with open_store(db_url).begin() as conn:
        upsert_pods(
            conn,
            [
                pod("team-a", "web-0", "uid-a", bound=T0 - 3600),
                pod("team-b", "web-0", "uid-b-old", bound=T0 - 7200, finished=T0 - 3600),
                pod("team-b", "web-0", "uid-b", bound=T0 - 100),
            ],
        )
    return db_url


def stored(url: str) -> pd.DataFrame:
    with open_store(url).connect() as conn:
        return read_outputs(conn, window=WINDOW).sort_values(["pod_uid", "start_ms"])


def test_counters_with_a_reset_are_summed_per_pod_and_interval(
    prometheus: PromServer, store: str
) -> None:
    stats = jobs.import_outputs_prometheus(
        store,
        prometheus_url=prometheus.url,
        window=WINDOW,
        step_s=STEP,
        metrics=[("vllm:generation_tokens_total", "tokens")],
    )

    rows = stored(store)
    got = {
        (u, s): v
        for u, s, v in zip(rows["pod_uid"], rows["start_ms"], rows["outputs"], strict=True)
    }
    first, second = WINDOW[0], WINDOW[0] + 300_000
    # team-a: 19 steps of +10, then the restart's 4 (not 4 - 290); then 20 steps of +10
    assert got == {
        ("uid-a", first): 194.0,
        ("uid-a", second): 200.0,
        ("uid-b", first): 100.0,
        ("uid-b", second): 100.0,
    }
    assert stats.resets == 1
    assert stats.unresolved == 2  # the ghost pod's two intervals
    assert set(rows["unit"]) == {"tokens"}


def test_latency_quantiles_come_from_the_summed_bucket_increases(
    prometheus: PromServer, store: str
) -> None:
    stats = jobs.import_outputs_prometheus(
        store,
        prometheus_url=prometheus.url,
        window=WINDOW,
        step_s=STEP,
        metrics=[("vllm:generation_tokens_total", "tokens")],
    )
    with open_store(store).connect() as conn:
        buckets = read_latency(conn, window=WINDOW, pod_uids=["uid-a"])

    p50, p95 = latency_quantiles(buckets)

    assert stats.latency_rows == 2 * len(BUCKETS)
    # 400 requests in the window: 120 <= 0.1 s, 320 <= 0.5, 360 <= 1, 400 <= 2.
    # p50: rank 200 lies in (0.1, 0.5]: 0.1 + 0.4 * (200 - 120) / (320 - 120) = 0.26
    # p95: rank 380 lies in (1, 2]: 1 + 1 * (380 - 360) / (400 - 360) = 1.5
    assert p50 == pytest.approx(0.26)
    assert p95 == pytest.approx(1.5)


def test_reimporting_a_window_replaces_it(prometheus: PromServer, store: str) -> None:
    for _ in range(2):
        jobs.import_outputs_prometheus(
            store, prometheus_url=prometheus.url, window=WINDOW, step_s=STEP, latency=""
        )

    rows = stored(store)

    assert rows.groupby("pod_uid")["outputs"].sum().to_dict() == {"uid-a": 394.0, "uid-b": 200.0}


def test_the_simulators_vllm_export_reads_back_as_it_integrated(
    prometheus: PromServer, db_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ab = simulate_ab(sim_dir(tmp_path_factory))
    migrate.upgrade(make_engine(db_url))
    jobs.import_pods(db_url, ab.pods_json, config=Config())
    a = ab.windows["A"]

    result = CliRunner().invoke(
        app,
        [
            "--db",
            db_url,
            "import",
            "outputs",
            "--url",
            prometheus.url,
            "--start",
            pd.Timestamp(a[0], unit="ms", tz="UTC").isoformat(),
            "--end",
            pd.Timestamp(a[1], unit="ms", tz="UTC").isoformat(),
            "--metric",
            "vllm:generation_tokens_total",
        ],
    )

    assert result.exit_code == 0, result.output
    # one restart, seen by the token counter and each of the histogram's 12 bucket series
    assert "(13 counter resets)" in result.output
    with open_store(db_url).connect() as conn:
        got = read_outputs(conn, window=a).groupby("pod")["outputs"].sum()
    truth = pd.read_csv(ab.serving_csv)
    truth = truth[pd.to_datetime(truth["start"]) < pd.Timestamp(a[1], unit="ms", tz="UTC")]
    expected = truth.groupby(truth["pod"].str.split("/").str[1])["outputs"].sum()
    assert len(got) == 2
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-3)
