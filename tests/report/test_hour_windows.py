"""Any window of whole hours inside audited runs, served without a new audit (SPEC §11).

Audit results are stored per UTC hour. A daily CronJob's run then answers a report of
10:00-14:00, a comparison of two afternoons, and a finance week inside a longer run, with
the figures an audit of that window alone stores. The store here is one of 9 days of
samples, every 5 minutes on the minute, of three cards (two with SM activity): work, idle
runs short and long, an outage; pods that start and finish inside hours, one still running
at the end, a gang of two; a pod's CPU at its limit now and then and a node cordoned for an
afternoon, so the causes change inside hours.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.jobs.common import iso
from auditor.model import GpuRecord, GpuSample, PodRecord, Window, WorkloadKind
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine

T0 = 1_795_392_000_000  # Monday 2026-11-23 00:00 UTC: ISO week 2026-W48 starts here
HOUR = 3_600_000
DAY = 24 * HOUR
PERIOD = 300_000
TH = Thresholds()
CARDS = ("GPU-h0", "GPU-h1", "GPU-h2")
DAILY = Window(T0 + 2 * DAY, T0 + 3 * DAY)
"""The daily run whose hours the reports read."""
LONG = Window(T0 - DAY + 30 * 60_000, T0 + 8 * DAY)
"""A run longer than a week and not on whole hours: it holds week 2026-W48."""
runner = CliRunner()


def _samples() -> list[GpuSample]:
    rng = np.random.default_rng(7)
    out: list[GpuSample] = []
    ts = np.arange(T0 - 2 * DAY, T0 + 9 * DAY, PERIOD, dtype=np.int64)
    for card in CARDS:
        # stretches of 5 min to 3 h, busy or idle, and a few missing samples (outages)
        t = 0
        while t < ts.size:
            length = int(rng.integers(1, 36))
            kind = rng.choice(["busy", "idle", "idle", "gap"], p=[0.45, 0.35, 0.1, 0.1])
            for k in range(t, min(t + length, ts.size)):
                if kind == "gap" and length > 2:
                    continue
                util = rng.uniform(20, 100) if kind == "busy" else rng.uniform(0, 3)
                sm = util / 100 * rng.uniform(0.05, 0.9) if card != "GPU-h1" else None
                out.append(GpuSample(card, int(ts[k]), float(util), sm_active=sm))
            t += length
    return out


def _pods() -> list[tuple[PodRecord, str]]:
    """Pods with their card: several a day per card, some bound off the hour grid."""
    rng = np.random.default_rng(11)
    out: list[tuple[PodRecord, str]] = []
    for i in range(36):
        card = CARDS[i % 3]
        start = T0 - DAY + i * 7 * HOUR + int(rng.integers(0, 3_600)) * 1000
        held = int(rng.integers(2 * 60, 14 * 60)) * 60_000
        gang = "ml/job-pair" if i in (9, 10) else f"ml/job-{i}"
        out.append(
            (
                PodRecord(
                    uid=f"pod-{i}",
                    namespace="ml",
                    name=f"pod-{i}",
                    node="n1" if card != "GPU-h2" else "n2",
                    team=("nlp", "vision")[i % 2],
                    job=f"Job/{gang.split('/')[1]}",
                    job_kind="Job",
                    workload=WorkloadKind.TRAINING,
                    gang=gang,
                    gpu_count=1,
                    bound_ms=start,
                    finished_ms=None if i == 35 else start + held,
                ),
                card,
            )
        )
    return out


def _write(url: str) -> None:
    from auditor.jobs.common import open_store
    from auditor.store import pod_writes, writes
    from auditor.store.signals import write_node_outages, write_pod_signals

    engine = open_store(url)
    pods = _pods()
    try:
        with engine.begin() as conn:
            ids = writes.upsert_gpus(
                conn,
                [GpuRecord(c, "n2" if c == "GPU-h2" else "n1", i, "NVIDIA H100") for i, c in
                 enumerate(CARDS)],
            )  # fmt: skip
            writes.insert_samples(conn, _samples(), ids)
            pod_writes.upsert_pods(conn, [p for p, _ in pods])
            writes.upsert_assignments(
                conn, [(p.uid, ids[c], int(p.bound_ms or 0)) for p, c in pods], source="test"
            )
            rng = np.random.default_rng(3)
            write_pod_signals(
                conn,
                [
                    {"pod_uid": p.uid, "source": "cgroup", "ts_ms": int(t),
                     "cpu_limit_ratio": float(rng.choice([0.2, 0.97])), "throttled_ratio": 0.0}
                    for p, _ in pods
                    for t in range(int(p.bound_ms or 0), int(p.finished_ms or T0 + 9 * DAY),
                                   20 * 60_000)
                ],
            )  # fmt: skip
            write_node_outages(
                conn,
                [{"node": "n2", "reason": "cordoned", "start_ms": DAILY.start_ms + 13 * HOUR
                  + 17 * 60_000, "end_ms": DAILY.start_ms + 16 * HOUR + 41 * 60_000}],
            )  # fmt: skip
    finally:
        engine.dispose()


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The 9 days, audited as one day (`DAILY`) and as one long run (`LONG`)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('hours') / 'auditor.db'}"
    else:
        from pgserver import new_database_name

        server = request.getfixturevalue("pg_server")
        name = new_database_name()
        server.admin(f"CREATE DATABASE {name}")
        url = str(server.url(name))
        engine = make_engine(url)
        migrate.upgrade(engine)
        engine.dispose()
    _write(url)
    for window in (DAILY, LONG):
        jobs.audit(url, window=window, thresholds=TH)
    yield url
    if request.param == "postgresql":
        request.getfixturevalue("pg_server").admin(f"DROP DATABASE {name} WITH (FORCE)")


def _alone(url: str, window: Window) -> Iterator[None]:
    """While inside: an audit of exactly `window` stored (reads of it take it whole)."""
    run = jobs.audit(url, window=window, thresholds=TH).run_id
    try:
        yield
    finally:
        engine = make_engine(url)
        with engine.begin() as conn:  # its rows go with it (ON DELETE CASCADE)
            conn.execute(text("DELETE FROM audit_runs WHERE id = :i"), {"i": run})
        engine.dispose()


def _figures(url: str, window: Window) -> dict[str, object]:
    """What a report by job and a team's side of `compare` show for `window`."""
    from auditor.jobs.outputs_and_compare import parse_side, side

    report = jobs.build_report(
        url, start_ms=window.start_ms, end_ms=window.end_ms, by=GroupBy.JOB, team=None
    )
    rows = report.rows.drop(columns=[c for c in report.rows.columns if "wait" in c])
    team = side(
        url, parse_side(f"team=nlp@{iso(window.start_ms)}..{iso(window.end_ms)}", option="A")
    )
    return {
        "window": report.window,
        "rows": rows.sort_values(["namespace", "job"], ignore_index=True),
        "totals": dict(report.totals),
        "causes": dict(report.causes),
        "side": {k: v for k, v in team.figures.items() if isinstance(v, float)},
    }


def _assert_same(got: dict[str, object], want: dict[str, object]) -> None:
    assert got["window"] == want["window"]
    pd.testing.assert_frame_equal(
        got["rows"],
        want["rows"],
        check_exact=False,
        rtol=1e-9,
        atol=1e-9,  # type: ignore[arg-type]
    )
    for key in ("totals", "causes", "side"):
        a, b = got[key], want[key]
        assert isinstance(a, dict)
        assert isinstance(b, dict)
        assert set(a) == set(b), key
        for name in a:
            x, y = a[name], b[name]
            if isinstance(x, float) and isinstance(y, float) and math.isnan(x):
                assert math.isnan(y), (key, name)
                continue
            assert x == pytest.approx(y, rel=1e-9, abs=1e-9), (key, name)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(first=st.integers(0, 23), hours=st.integers(1, 24))
def test_a_whole_hour_window_inside_a_daily_run_is_what_auditing_it_alone_stores(
    store: str, first: int, hours: int
) -> None:
    """`report` and `compare` of hours `first` to `first + hours` of the daily run, read
    from its hours, equal the same read of an audit of that window alone."""
    start = DAILY.start_ms + first * HOUR
    window = Window(start, min(start + hours * HOUR, DAILY.end_ms))
    sliced = _figures(store, window)
    with_alone = _alone(store, window)
    next(with_alone)
    try:
        alone = _figures(store, window)
    finally:
        next(with_alone, None)
    _assert_same(sliced, alone)


def test_the_finance_week_inside_a_longer_run_is_what_auditing_the_week_stores(
    store: str,
) -> None:
    """`export finance --week 2026-W48` from the hours of a 9-day run not on whole hours,
    against an audit of the week alone: the same rows, cents and hours."""
    config = Config()
    sliced = jobs.export_finance(store, week="2026-W48", config=config)
    with_alone = _alone(store, Window(T0, T0 + 7 * DAY))
    next(with_alone)
    try:
        alone = jobs.export_finance(store, week="2026-W48", config=config)
    finally:
        next(with_alone, None)
    a = list(csv.reader(io.StringIO(sliced)))
    b = list(csv.reader(io.StringIO(alone)))
    assert a[0] == b[0]
    assert len(a) == len(b) > 2
    for row_a, row_b in zip(a[1:], b[1:], strict=True):
        for x, y in zip(row_a, row_b, strict=True):
            try:
                assert float(x) == pytest.approx(float(y), abs=0.011), (row_a, row_b)
            except ValueError:
                assert x == y


def test_a_report_of_a_whole_run_not_on_hours_reads_its_edge_hours(store: str) -> None:
    """The long run starts at 00:30: a report of exactly its window is all its buckets,
    and a report from its start to a whole hour inside it is served too."""
    whole = jobs.build_report(
        store, start_ms=LONG.start_ms, end_ms=LONG.end_ms, by=GroupBy.TEAM, team=None
    )
    capacity = 3 * (LONG.end_ms - LONG.start_ms) / HOUR
    assert whole.totals["capacity_gpu_hours"] == pytest.approx(capacity, rel=1e-9)
    part = jobs.build_report(store, start_ms=LONG.start_ms, end_ms=T0, by=GroupBy.TEAM, team=None)
    assert part.totals["capacity_gpu_hours"] == pytest.approx(3 * (T0 - LONG.start_ms) / HOUR)


@pytest.mark.parametrize(
    ("start", "end", "hint"),
    [
        ("2026-11-25T10:30:00Z", "2026-11-25T14:00:00Z", "T10:00:00Z --end 2026-11-25T14:00:00Z"),
        ("2026-11-25T10:00:00Z", "2026-11-25T13:59:00Z", "T10:00:00Z --end 2026-11-25T14:00:00Z"),
    ],
)
def test_a_window_off_the_hours_is_refused_naming_the_whole_hours(
    store: str, start: str, end: str, hint: str
) -> None:
    result = runner.invoke(app, ["--db", store, "report", "--start", start, "--end", end])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "must start and end on whole UTC hours inside audited runs" in lines[0]
    assert f"try --start 2026-11-25{hint}" in lines[0]
    assert "Traceback" not in result.output


def test_a_window_beyond_the_audited_runs_still_asks_for_an_audit(store: str) -> None:
    """Whole hours, but past the end of the long run: the stretch no run covers is named."""
    result = runner.invoke(
        app, ["--db", store, "report", "--start", "2026-11-30T22:00:00Z", "--end",
              "2026-12-01T02:00:00Z"],
    )  # fmt: skip
    assert result.exit_code != 0
    assert "nothing covers 2026-12-01T00:00:00Z to 2026-12-01T02:00:00Z" in result.output
    assert "auditor audit" in result.output


def test_the_daily_run_stores_one_bucket_per_hour(store: str, tmp_path: Path) -> None:
    """Every stored row of the daily run lies on its hours (SM activity too), and the
    buckets of each card sum to its capacity in each hour."""
    engine = make_engine(store)
    with engine.connect() as conn:
        run = conn.execute(
            text(
                "SELECT id, hourly FROM audit_runs"
                " WHERE window_start_ms = :a AND window_end_ms = :b"
            ),
            {"a": DAILY.start_ms, "b": DAILY.end_ms},
        ).one()
        rows = conn.execute(
            text("SELECT gpu_id, hour_ms, SUM(seconds) FROM audit_results WHERE run_id = :r"
                 " GROUP BY gpu_id, hour_ms"),
            {"r": run[0]},
        ).all()  # fmt: skip
        sm_hours = {
            int(h)
            for (h,) in conn.execute(
                text("SELECT hour_ms FROM audit_sm WHERE run_id = :r"), {"r": run[0]}
            )
        }
    engine.dispose()
    assert bool(run[1])
    assert len(sm_hours) > 12
    assert sm_hours <= {DAILY.start_ms + k * HOUR for k in range(24)}
    assert {int(h) for _, h, _ in rows} == {DAILY.start_ms + k * HOUR for k in range(24)}
    for _, _, seconds in rows:
        assert float(seconds) == pytest.approx(3600.0, abs=1e-6)
