"""`auditor import prometheus` against a real Prometheus holding a backfilled week of
dcgm-exporter data (Debian's `prometheus` and `promtool`, started here on loopback).

What users rely on: every sample of the week arrives once, with its value, across query
chunks; the pod labels become exact GPU -> pod spans (a reused pod name maps to the pod of
that time; a card without `pod` is unallocated); a re-run changes nothing; a Prometheus
that refuses or cannot be reached is a one-line error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from promserver import Card, PromServer, backfill, binaries, start_prometheus
from records import bare_pod
from sqlalchemy import func, select
from typer.testing import CliRunner

from auditor.cli import app
from auditor.errors import InputError
from auditor.jobs import import_prometheus, open_store
from auditor.model import PodRecord
from auditor.store import migrate
from auditor.store.engine import make_engine
from auditor.store.schema import gpu_assignments, gpu_samples, gpus
from auditor.store.writes import upsert_pods

STEP = 30
DAY = 86_400
END = (int(time.time()) // DAY) * DAY  # midnight today: well within retention
START = END - 7 * DAY
POINTS = 7 * DAY // STEP

CARDS = [
    Card(
        "GPU-0000",
        0,
        "node-a",
        holders=[
            (START, START + 2 * DAY, "ml", "train-0"),
            (START + 3 * DAY, END, "ml", "train-0"),  # the name again, a new pod
        ],
    ),
    Card("GPU-1111", 1, "node-a", holders=[(START, END, "ml", "infer-0")], profiling=True),
    Card("GPU-2222", 0, "node-b"),  # never held
    Card("GPU-3333", 1, "node-b", mig_instance=2),
]


def util(card: Card, t: int) -> float:
    return float((t // STEP * 7 + card.gpu * 13 + len(card.hostname)) % 101)


METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": util,
    "DCGM_FI_DEV_FB_USED": lambda c, t: 1000.0 + t // STEP % 50,
    "DCGM_FI_DEV_FB_FREE": lambda c, t: 80000.0 - t // STEP % 50,
    "DCGM_FI_PROF_SM_ACTIVE": lambda c, t: (t // STEP % 10) / 10,
}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"{found}: required under CI", pytrace=False)
        pytest.skip(found)
    root = tmp_path_factory.mktemp("prometheus")
    backfill(CARDS, root / "tsdb", start_s=START, end_s=END, interval_s=STEP, metrics=METRICS)
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def pod(name: str, uid: str, *, bound: int, finished: int | None = None) -> PodRecord:
    return bare_pod(
        name, uid, bound_ms=bound * 1000, finished_ms=None if finished is None else finished * 1000
    )


@pytest.fixture
def migrated(db_url: str) -> str:
    migrate.upgrade(make_engine(db_url))
    return db_url


@pytest.fixture
def store(migrated: str) -> str:
    with open_store(migrated).begin() as conn:
        upsert_pods(
            conn,
            [
                pod("train-0", "uid-train-1", bound=START - 60, finished=START + 2 * DAY),
                pod("train-0", "uid-train-2", bound=START + 3 * DAY - 10),
                pod("infer-0", "uid-infer", bound=START - 3600),
            ],
        )
    return migrated


@pytest.mark.slow
def test_a_backfilled_week_round_trips(prometheus: PromServer, store: str) -> None:
    window = (START * 1000, END * 1000)
    stats = import_prometheus(store, prometheus_url=prometheus.url, window=window, step_s=STEP)
    assert (stats.samples, stats.gpus, stats.holdings, stats.unresolved) == (4 * POINTS, 4, 3, 0)
    with open_store(store).connect() as conn:
        cards = {r.uuid: r for r in conn.execute(select(gpus))}
        assert cards["GPU-0000"].node == "node-a"
        assert cards["GPU-0000"].gpu_index == 0
        assert cards["GPU-0000"].model == "NVIDIA H100 80GB HBM3"
        assert cards["GPU-0000"].memory_total_mib == 81000.0
        assert cards["GPU-3333/gi2"].parent_uuid == "GPU-3333"
        rows = conn.execute(
            select(gpus.c.uuid, gpu_samples.c.ts_ms, gpu_samples.c.util, gpu_samples.c.sm_active)
            .join(gpus, gpus.c.id == gpu_samples.c.gpu_id)
            .order_by(gpus.c.uuid, gpu_samples.c.ts_ms)
        ).all()
        spans = conn.execute(
            select(
                gpu_assignments.c.pod_uid,
                gpus.c.uuid,
                gpu_assignments.c.first_seen_ms,
                gpu_assignments.c.last_seen_ms,
                gpu_assignments.c.source,
            )
            .join(gpus, gpus.c.id == gpu_assignments.c.gpu_id)
            .order_by(gpu_assignments.c.pod_uid)
        ).all()
    by_card: dict[str, list[tuple[int, float | None, float | None]]] = {}
    for uuid, ts, u, sm in rows:
        by_card.setdefault(uuid, []).append((ts, u, sm))
    card = {c.uuid if c.mig_instance is None else f"{c.uuid}/gi{c.mig_instance}": c for c in CARDS}
    for uuid, got in by_card.items():
        expected = [
            (t * 1000, util(card[uuid], t), (t // STEP % 10) / 10 if uuid == "GPU-1111" else None)
            for t in range(START, END, STEP)
        ]
        assert got == expected, uuid
    ms = 1000
    assert [tuple(s) for s in spans] == [
        ("uid-infer", "GPU-1111", START * ms, (END - STEP) * ms, "dcgm-exporter"),
        ("uid-train-1", "GPU-0000", START * ms, (START + 2 * DAY - STEP) * ms, "dcgm-exporter"),
        ("uid-train-2", "GPU-0000", (START + 3 * DAY) * ms, (END - STEP) * ms, "dcgm-exporter"),
    ]
    last_day = ((END - DAY) * 1000, END * 1000)
    again = import_prometheus(store, prometheus_url=prometheus.url, window=last_day, step_s=STEP)
    assert (again.samples, again.already) == (0, 4 * DAY // STEP)
    with open_store(store).connect() as conn:
        assert conn.execute(select(func.count()).select_from(gpu_samples)).scalar() == 4 * POINTS
        assert conn.execute(select(func.count()).select_from(gpu_assignments)).scalar() == 3


def test_pods_unknown_to_the_store_are_reported_not_invented(
    prometheus: PromServer, migrated: str
) -> None:
    window = ((END - DAY) * 1000, END * 1000)
    stats = import_prometheus(migrated, prometheus_url=prometheus.url, window=window, step_s=STEP)
    assert stats.samples == 4 * DAY // STEP
    assert (stats.holdings, stats.unresolved) == (0, 2)


def test_the_cli_imports_a_window(prometheus: PromServer, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(END - 3600))
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(END))
    args = ["--db", db, "import", "prometheus", "--url", prometheus.url]
    result = CliRunner().invoke(app, [*args, "--start", start, "--end", end, "--step", "30s"])
    assert result.exit_code == 0, result.output
    assert f"imported {4 * 120} samples of 4 GPUs" in result.output


def test_a_refusing_prometheus_is_a_one_line_error_and_stores_nothing(
    prometheus: PromServer, migrated: str
) -> None:
    window = (START * 1000, END * 1000)
    with pytest.raises(InputError, match="exceeded maximum resolution of 11,000 points"):
        import_prometheus(
            migrated, prometheus_url=prometheus.url, window=window, step_s=STEP, max_points=20_000
        )
    with open_store(migrated).connect() as conn:
        assert conn.execute(select(func.count()).select_from(gpu_samples)).scalar() == 0


def test_an_unreachable_prometheus_is_a_clear_error(migrated: str) -> None:
    with pytest.raises(InputError, match=r"cannot reach Prometheus at http://127\.0\.0\.1:9"):
        import_prometheus(
            migrated, prometheus_url="http://127.0.0.1:9", window=(0, 60_000), step_s=STEP
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start", "2026-01-02", "--end", "2026-01-01"], "window ends before it starts"),
        (["--since", "1h", "--step", "0s"], "the step must be positive"),
        (["--since", "1h", "--step", "fast"], "not a duration like"),
        ([], "give --start and --end, or --since"),
    ],
)
def test_bad_options_are_one_line_errors(args: list[str], message: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    result = CliRunner().invoke(
        app, ["--db", db, "import", "prometheus", "--url", "http://127.0.0.1:9", *args]
    )
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
