"""Busy is not efficiency: SM activity per held card and `stalled_busy` (SPEC §8).

The pure rule on built cases (one card, 10 s samples), then through the store: an audit
stores the finding and the SM figures, and the report shows them with the next step.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from records import bare_pod
from typer.testing import CliRunner

from auditor import jobs
from auditor.classify.efficiency import efficiency
from auditor.cli import app
from auditor.jobs.common import open_store
from auditor.model import GpuRecord, GpuSample
from auditor.report.advice import STALLED_BUSY_STEP
from auditor.settings import Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.writes import insert_samples, upsert_gpus

T0 = 1_795_000_000_000
STEP = 10_000
MIN = 60_000


def card(minutes: float, *, util: float, sm: float | None, start: int = T0) -> pd.DataFrame:
    n = int(minutes * MIN / STEP)
    return pd.DataFrame(
        {
            "gpu": "GPU-a",
            "ts_ms": start + STEP * np.arange(n, dtype=np.int64),
            "util": float(util),
            "sm_active": np.nan if sm is None else float(sm),
        }
    )


def tenure(start: int = T0, end: int = T0 + 3600 * 1000) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "gpu": ["GPU-a"],
            "pod_uid": ["pod-1"],
            "gang": ["pod-1"],
            "start_ms": [start],
            "end_ms": [end],
        }
    )


def run(samples: pd.DataFrame, window: tuple[int, int] = (T0, T0 + 3600 * 1000)) -> object:
    return efficiency(samples, tenure(), window=window, thresholds=Thresholds())


@pytest.mark.parametrize(
    ("util", "sm", "minutes", "found"),
    [
        pytest.param(100, 0.01, 15, True, id="spinning-15min"),
        pytest.param(90, 0.05, 12, True, id="at-both-thresholds"),
        pytest.param(100, 0.01, 9, False, id="too-short"),
        pytest.param(100, 0.45, 30, False, id="busy-with-normal-sm"),
        pytest.param(89, 0.01, 30, False, id="not-busy-enough"),
        pytest.param(100, 0.06, 30, False, id="sm-above-threshold"),
        pytest.param(100, None, 30, False, id="no-sm-data"),
    ],
)
def test_stalled_busy_rule(util: float, sm: float | None, minutes: float, found: bool) -> None:
    before = card(5, util=60, sm=0.5)
    stall = card(minutes, util=util, sm=sm, start=T0 + 5 * MIN)
    after = card(5, util=60, sm=0.5, start=T0 + (5 + minutes) * MIN)

    out = run(pd.concat([before, stall, after], ignore_index=True))

    rows = out.findings  # type: ignore[attr-defined]
    assert (len(rows) == 1) is found
    if found:
        row = rows.iloc[0]
        assert (row["kind"], row["gpu"], row["pod_uid"]) == ("stalled_busy", "GPU-a", "pod-1")
        assert row["start_ms"] == T0 + 5 * MIN
        assert row["end_ms"] == T0 + (5 + minutes) * MIN
        assert row["seconds"] == pytest.approx(minutes * 60)


def test_a_coverage_gap_splits_an_episode() -> None:
    first = card(8, util=100, sm=0.0)
    second = card(8, util=100, sm=0.0, start=T0 + 20 * MIN)  # 12 min unobserved between

    out = run(pd.concat([first, second], ignore_index=True))

    assert out.findings.empty  # type: ignore[attr-defined]


def test_an_episode_is_clipped_to_the_window_but_measured_over_the_tenure() -> None:
    samples = card(20, util=100, sm=0.0)

    out = run(samples, window=(T0 + 15 * MIN, T0 + 60 * MIN))

    row = out.findings.iloc[0]  # type: ignore[attr-defined]
    assert (row["start_ms"], row["end_ms"]) == (T0 + 15 * MIN, T0 + 20 * MIN)
    assert row["seconds"] == pytest.approx(300)


def test_sm_active_seconds_and_the_busy_seconds_with_sm_data() -> None:
    with_sm = card(30, util=80, sm=0.5)
    without = card(30, util=40, sm=None, start=T0 + 30 * MIN)

    out = run(pd.concat([with_sm, without], ignore_index=True))

    sm = out.sm  # type: ignore[attr-defined]
    assert list(sm["pod_uid"]) == ["pod-1"]
    assert sm["sm_active_seconds"].iloc[0] == pytest.approx(0.5 * 1800)
    assert sm["sm_busy_seconds"].iloc[0] == pytest.approx(0.8 * 1800)


# ---------------------------------------------------------------- through the store


@pytest.fixture
def audited(db_url: str) -> str:
    """Two cards held for an hour: one spins 20 min at 100 % with idle SMs, one computes.
    The hung pod is bound first, so first-fit inference puts it on card 0."""
    migrate.upgrade(make_engine(db_url))
    samples: list[GpuSample] = []
    for k in range(360):
        t = T0 + k * STEP
        stalled = 20 <= k * STEP / MIN < 40
        samples.append(
            GpuSample("GPU-hung", t, 100.0 if stalled else 70.0, sm_active=0.0 if stalled else 0.6)
        )
        samples.append(GpuSample("GPU-fine", t, 95.0, sm_active=0.7))
    with open_store(db_url).begin() as conn:
        ids = upsert_gpus(
            conn,
            [
                GpuRecord("GPU-hung", "node-a", 0, "NVIDIA H100"),
                GpuRecord("GPU-fine", "node-a", 1, "NVIDIA H100"),
            ],
        )
        insert_samples(conn, samples, ids)
        upsert_pods(
            conn,
            [
                bare_pod("hung", "uid-hung", bound_ms=T0 - 2 * MIN),
                bare_pod("fine", "uid-fine", bound_ms=T0 - MIN),
            ],
        )
    jobs.audit(db_url, window=(T0, T0 + 3600 * 1000), thresholds=Thresholds())
    return db_url


def test_the_report_lists_stalled_busy_among_offenders_with_sm_figures(audited: str) -> None:
    rep = jobs.build_report(audited, start_ms=None, end_ms=None, by=jobs_by("pod"), team=None)

    off = rep.offenders[rep.offenders["category"] == "stalled_busy"]
    assert list(off["offender"]) == ["ml/Pod/hung"]
    assert off["gpu_hours"].iloc[0] == pytest.approx(20 / 60)
    assert off["next_step"].iloc[0] == STALLED_BUSY_STEP
    rows = rep.rows.set_index("pod")
    assert rows.loc["fine", "sm_active_gpu_hours"] == pytest.approx(0.7, rel=0.01)
    assert rows.loc["hung", "sm_active_gpu_hours"] == pytest.approx(0.6 * 40 / 60, rel=0.01)
    assert rows.loc["fine", "sm_data_share"] == pytest.approx(1.0)


def test_report_json_carries_sm_active_gpu_hours(audited: str) -> None:
    result = CliRunner().invoke(
        app, ["--db", audited, "report", "--by", "team", "--format", "json"]
    )

    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["sm_active_gpu_hours"] == pytest.approx(0.7 + 0.4, rel=0.01)
    assert row["sm_data_share"] == pytest.approx(1.0)


def jobs_by(name: str) -> object:
    from auditor.report.summary import GroupBy

    return GroupBy(name)


def test_sm_seconds_per_hour_are_what_each_hour_alone_gives() -> None:
    """SPEC §11: SM activity stored per UTC hour. A tenure from 00:20 to 02:40 of samples
    whose SM activity changes every 7 minutes (10 s apart, one straddling each hour): each
    bucket of a window from 00:30 to 02:30 is `efficiency` of that bucket alone, and the
    buckets sum to the window's."""
    from auditor.classify.hours import HOUR_MS, hour_buckets
    from auditor.model import Window

    day = T0 - T0 % HOUR_MS
    start, end = day + 20 * MIN, day + 160 * MIN
    ts = np.arange(start - 5_000, end, STEP, dtype=np.int64)
    samples = pd.DataFrame(
        {
            "gpu": "GPU-a",
            "ts_ms": ts,
            "util": 40.0 + 50.0 * ((ts // (7 * MIN)) % 2),
            "sm_active": 0.1 + 0.05 * ((ts // (7 * MIN)) % 5),
        }
    )
    held = tenure(start, end)
    window = Window(day + 30 * MIN, day + 150 * MIN)
    got = efficiency(samples, held, window=window, thresholds=Thresholds(), hour_ms=HOUR_MS).sm
    whole = efficiency(samples, held, window=window, thresholds=Thresholds()).sm
    figures = ["sm_active_seconds", "sm_busy_seconds"]
    assert got[figures].sum().to_numpy() == pytest.approx(whole[figures].sum().to_numpy())
    buckets = hour_buckets(window)
    assert sorted(got["hour_ms"]) == [b.start_ms for b in buckets]
    for b in buckets:
        alone = efficiency(samples, held, window=b, thresholds=Thresholds()).sm
        mine = got[got["hour_ms"] == b.start_ms]
        assert mine[figures].to_numpy() == pytest.approx(alone[figures].to_numpy())
