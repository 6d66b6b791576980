"""Retention by 1-minute rollups: coverage of rolled-up rows, conservation, pruning, merging,
and classifying rolled-up periods, on SQLite and a real PostgreSQL.

What a rollup keeps exactly (per GPU and minute, so per GPU and any minute-aligned window):
covered time, readable time, busy time (`util/100 × readable coverage`) and the observed
span (capacity). What it coarsens: where inside a minute the idle time lay. Classifying
rolled-up data therefore gives every GPU the same capacity, unallocated and unobserved time,
busy time within 0.01% of its capacity (a tenure boundary inside a minute splits the
minute's mean), and every other category within 6% of its capacity: idle gaps shorter than
a minute (most checkpoint pauses) vanish into the minute's mean and become `compute_idle`.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from auditor import jobs
from auditor.classify import build_tenures, classify
from auditor.classify.coverage import ROLLED_PERIOD_MS, SampleTable, load_samples
from auditor.classify.rollup import (
    MINUTE_MS,
    ROLLUP_COLUMNS,
    minute_aggregates,
    pseudo_samples,
    rolled_up_seconds,
    with_rolled,
)
from auditor.cli import app
from auditor.model import CATEGORIES, GpuRecord, GpuSample, Window
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, SimulationResult, simulate
from auditor.store import reads
from auditor.store.rollup import (
    read_audit_samples,
    read_minutes,
    read_rolled_card_samples,
    read_rolled_samples,
    rollup,
    runs_rolled_up_seconds,
)
from auditor.store.schema import gpu_samples, gpu_samples_1m
from auditor.store.writes import insert_samples, replace_audit_run, upsert_gpus

TH = Thresholds()
BIG = 2**62
T0 = 29_916_666 * 60_000  # 2026-11-18 11:06 UTC
runner = CliRunner()


def frame(rows: list[tuple[str, int, float, float | None]]) -> pd.DataFrame:
    """gpu, ts_ms, util, cover_ms (None: a raw sample)."""
    return pd.DataFrame(
        {
            "gpu": [r[0] for r in rows],
            "ts_ms": np.array([r[1] for r in rows], dtype=np.int64),
            "util": np.array([r[2] for r in rows], dtype=np.float64),
            "cover_ms": np.array(
                [np.nan if r[3] is None else r[3] for r in rows], dtype=np.float64
            ),
        }
    )


def covers(st_: SampleTable) -> list[int]:
    return (st_.cov_end - st_.ts).tolist()


def assert_same_coverage(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, want, check_exact=False, check_dtype=False, rtol=1e-9)


def per_gpu_coverage(samples: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: covered, readable and busy ms as the classifier counts them; span."""
    s = load_samples(samples, thresholds=TH)
    cov = s.cov_end - s.ts
    ok = ~np.isnan(s.util)
    out = (
        pd.DataFrame(
            {
                "gpu": s.uuids[s.gpu],
                "covered": cov,
                "readable": np.where(ok, cov, 0),
                "busy": np.where(ok, np.nan_to_num(s.util) * cov / 100.0, 0.0),
            }
        )
        .groupby("gpu")[["covered", "readable", "busy"]]
        .sum()
    )
    out["first"] = pd.Series(s.first, index=s.uuids)
    out["last_end"] = pd.Series(s.last_end, index=s.uuids)
    return out


# ---------------------------------------------------------------- coverage of cover_ms rows


def test_a_cover_column_of_nan_changes_nothing() -> None:
    raw = frame([("G", T0 + 5_000 * i + (i % 3) * 40, float(i % 7), None) for i in range(40)])
    raw = pd.concat([raw, frame([("G", T0 + 900_000, 50.0, None)])], ignore_index=True)
    plain = load_samples(raw.drop(columns=["cover_ms"]), thresholds=TH)
    with_nan = load_samples(raw, thresholds=TH)
    for name in ("gpu", "ts", "util", "cov_end", "span_end", "period", "first", "last_end"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(with_nan, name))


@pytest.mark.parametrize(
    ("rows", "expected_cover", "expected_period"),
    [
        pytest.param([("G", T0, 40.0, 30_000)], [30_000], ROLLED_PERIOD_MS, id="lone-row"),
        pytest.param(
            [("G", T0, 40.0, 45_000), ("G", T0 + 60_000, 10.0, 60_000)],
            [45_000, 60_000],
            ROLLED_PERIOD_MS,
            id="hole-before-next-stays-unobserved",
        ),
        pytest.param(
            [("G", T0, 40.0, 50_000), ("G", T0 + 20_000, math.nan, 40_000)],
            [20_000, 40_000],
            ROLLED_PERIOD_MS,
            id="cut-at-next-row",
        ),
        pytest.param(
            [("G", T0, 40.0, 60_000), ("G", T0 + 3_600_000, 10.0, 60_000)],
            [60_000, 60_000],
            ROLLED_PERIOD_MS,
            id="far-next-row-no-period-rule",
        ),
        pytest.param(
            [
                ("G", T0, 40.0, 60_000),
                ("G", T0 + 60_000, 1.0, None),
                ("G", T0 + 65_000, 2.0, None),
                ("G", T0 + 70_000, 3.0, None),
                ("G", T0 + 75_000, 4.0, None),
            ],
            [60_000, 5_000, 5_000, 5_000, 5_000],
            5_000,
            id="raw-after-rolled-keeps-raw-period",
        ),
        pytest.param(
            [
                ("G", T0, 1.0, None),
                ("G", T0 + 5_000, 2.0, None),
                ("G", T0 + 10_000, 3.0, None),
                ("G", T0 + 15_000, 4.0, None),
                ("G", T0 + 20_000, 5.0, 40_000),
            ],
            [5_000, 5_000, 5_000, 5_000, 40_000],
            5_000,
            id="raw-meets-rolled-row",
        ),
        pytest.param(
            [
                ("G", T0, 1.0, None),
                ("G", T0 + 5_000, 2.0, None),
                ("G", T0 + 10_000, 3.0, None),
                ("G", T0 + 60_000, 5.0, 60_000),
            ],
            [5_000, 5_000, 5_000, 60_000],
            5_000,
            id="raw-before-a-gap-covers-one-period",
        ),
        pytest.param(
            [("G", T0, 1.0, None), ("G", T0, 50.0, 60_000)],
            [60_000],
            ROLLED_PERIOD_MS,
            id="same-instant-rolled-wins",
        ),
    ],
)
def test_cover_ms_decision_table(
    rows: list[tuple[str, int, float, float | None]],
    expected_cover: list[int],
    expected_period: int,
) -> None:
    table = load_samples(frame(rows), thresholds=TH)
    assert covers(table) == expected_cover
    assert table.period.tolist() == [expected_period]


def test_a_raw_gpu_beside_a_rolled_gpu_keeps_its_period() -> None:
    rows = [("A", T0 + 5_000 * i, 10.0, None) for i in range(5)]
    rows += [("B", T0 + MINUTE_MS * i, 10.0, 60_000) for i in range(3)]
    table = load_samples(frame(rows), thresholds=TH)
    assert table.period.tolist() == [5_000, ROLLED_PERIOD_MS]
    assert covers(table) == [5_000] * 5 + [60_000] * 3


# ---------------------------------------------------------------- minute aggregates (pure)


def test_coverage_crossing_a_minute_is_split_between_the_minutes() -> None:
    raw = frame([("G", T0 + 3_000 + 5_000 * i, 80.0, None) for i in range(12)])
    raw = raw.drop(columns=["cover_ms"])
    minutes = minute_aggregates(raw, before_ms=BIG, thresholds=TH)
    # samples at :03 .. :58, each 5 s: 57 s in the first minute, 3 s spill into the next
    assert minutes["minute_ms"].tolist() == [T0, T0 + MINUTE_MS]
    assert minutes["samples"].tolist() == [12, 0]
    assert minutes["covered_ms"].tolist() == [57_000, 3_000]
    assert minutes["covered_from_ms"].tolist() == [T0 + 3_000, T0 + MINUTE_MS]
    assert minutes["covered_to_ms"].tolist() == [T0 + MINUTE_MS, T0 + MINUTE_MS + 3_000]
    assert minutes["util_mean"].tolist() == [80.0, 80.0]


def test_unreadable_time_is_kept_apart_and_min_max_are_over_readings() -> None:
    utils = [10.0, math.nan, 30.0, 50.0] * 3
    raw = pd.DataFrame(
        {
            "gpu": "G",
            "ts_ms": [T0 + 5_000 * i for i in range(12)],
            "util": utils,
            "memory_used_mib": [float(i) for i in range(12)],
            "power_w": [100.0] * 6 + [math.nan] * 6,
        }
    )
    (m,) = minute_aggregates(raw, before_ms=BIG, thresholds=TH).to_dict("records")
    # a duplicate instant (merged as the classifier merges it) changes nothing but maxima
    twice = pd.concat([raw, raw.iloc[[3]].assign(memory_used_mib=500.0)], ignore_index=True)
    (d,) = minute_aggregates(twice, before_ms=BIG, thresholds=TH).to_dict("records")
    assert d == pytest.approx({**m, "memory_used_max_mib": 500.0, "samples": 12})
    assert (m["covered_ms"], m["readable_ms"]) == (60_000, 45_000)
    assert (m["util_min"], m["util_max"]) == (10.0, 50.0)
    assert m["util_mean"] == pytest.approx(30.0)
    assert m["memory_used_max_mib"] == 11.0
    assert m["power_mean_w"] == 100.0
    rows = pseudo_samples(pd.DataFrame([{**m, "gpu": "G"}]))
    assert rows[["ts_ms", "cover_ms"]].values.tolist() == [[T0, 45_000], [T0 + 45_000, 15_000]]
    assert rows["util"].tolist()[0] == pytest.approx(30.0)
    assert math.isnan(rows["util"].tolist()[1])


@st.composite
def raw_fleets(draw: st.DrawFn) -> pd.DataFrame:
    rows = []
    for g in range(draw(st.integers(1, 3))):
        t = T0 + draw(st.integers(0, 200_000))
        for _ in range(draw(st.integers(1, 50))):
            t += draw(st.one_of(st.just(5_000), st.integers(1, 9_000), st.integers(9_000, 400_000)))
            util = draw(st.one_of(st.floats(0, 100), st.just(math.nan), st.just(0.0)))
            rows.append((f"GPU-{g}", t, util))
    return pd.DataFrame(rows, columns=["gpu", "ts_ms", "util"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=raw_fleets(), cut_at=st.floats(0, 1))
def test_rollup_conserves_covered_readable_and_busy_time(raw: pd.DataFrame, cut_at: float) -> None:
    lo, hi = int(raw["ts_ms"].min()), int(raw["ts_ms"].max()) + 1
    cut = lo + int(cut_at * (hi - lo))
    minutes = minute_aggregates(raw, before_ms=cut, thresholds=TH)
    table = load_samples(raw, thresholds=TH)
    take = table.ts < cut
    cov = (table.cov_end - table.ts)[take]
    ok = ~np.isnan(table.util[take])
    assert int(minutes["samples"].sum()) == int(take.sum())
    assert int(minutes["covered_ms"].sum()) == int(cov.sum())
    assert int(minutes["readable_ms"].sum()) == int(cov[ok].sum())
    busy = float((minutes["util_mean"].fillna(0.0) * minutes["readable_ms"]).sum())
    assert busy == pytest.approx(float((table.util[take][ok] * cov[ok]).sum()), rel=1e-9, abs=1e-6)
    assert (minutes["minute_ms"] % MINUTE_MS == 0).all()
    assert (minutes["covered_ms"] <= MINUTE_MS).all()
    assert (minutes["covered_to_ms"] - minutes["covered_from_ms"] >= minutes["covered_ms"]).all()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=raw_fleets(), window=st.tuples(st.integers(-5, 40), st.integers(1, 40)))
def test_pseudo_samples_give_the_classifier_the_same_time(
    raw: pd.DataFrame, window: tuple[int, int]
) -> None:
    rolled = pseudo_samples(minute_aggregates(raw, before_ms=BIG, thresholds=TH))
    assert_same_coverage(per_gpu_coverage(rolled), per_gpu_coverage(raw))
    # classified with nobody holding the cards: the same capacity, unallocated and
    # unobserved time per card in any minute-aligned window
    first = int(raw["ts_ms"].min()) // MINUTE_MS * MINUTE_MS
    w = Window(first + window[0] * MINUTE_MS, first + (window[0] + window[1]) * MINUTE_MS)
    no_pods = pd.DataFrame(columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms"])
    a = classify(raw, no_pods, window=w, thresholds=TH).results
    b = classify(rolled, no_pods, window=w, thresholds=TH).results
    key = ["gpu", "category"]
    assert b.groupby(key)["seconds"].sum().to_dict() == pytest.approx(
        a.groupby(key)["seconds"].sum().to_dict()
    )
    # covered time of cards no pod held: unallocated, and busy where kernels ran
    assert rolled_up_seconds(rolled, window=(w.start_ms, w.end_ms)) == pytest.approx(
        float(a.loc[a["category"].isin(["unallocated", "busy"]), "seconds"].sum())
    )


# ---------------------------------------------------------------- the store


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> SimulationResult:
    return simulate(tmp_path_factory.mktemp("fleet"), scenario=SCENARIOS["small"])


def load_fleet(url: str, sim: SimulationResult, *, pods: bool = False) -> None:
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    if pods:
        jobs.import_pods(url, sim.pods_json, config=Config())


def raw_rows(conn_engine: Engine) -> pd.DataFrame:
    with conn_engine.connect() as conn:
        rows = conn.execute(select(gpu_samples).order_by("gpu_id", "ts_ms")).all()
    return pd.DataFrame.from_records(rows, columns=[c.name for c in gpu_samples.c])


def minute_rows(conn_engine: Engine) -> pd.DataFrame:
    with conn_engine.connect() as conn:
        rows = conn.execute(select(gpu_samples_1m).order_by("gpu_id", "minute_ms")).all()
    return pd.DataFrame.from_records(rows, columns=[c.name for c in gpu_samples_1m.c])


def test_rollup_prunes_before_the_cut_and_conserves_time(
    engine: Engine, db_url: str, fleet: SimulationResult
) -> None:
    load_fleet(db_url, fleet)
    before = raw_rows(engine)
    with engine.connect() as conn:
        reference = per_gpu_coverage(reads.read_samples(conn, start_ms=0, end_ms=BIG))
    cut = fleet.window_start_ms + 2 * 3600_000 + 17_000  # not on a minute: rounded down

    with engine.begin() as conn:
        stats = rollup(conn, before_ms=cut, thresholds=TH)

    minute_cut = cut // MINUTE_MS * MINUTE_MS
    after = raw_rows(engine)
    assert stats.before_ms == minute_cut
    assert stats.raw_deleted == int((before["ts_ms"] < minute_cut).sum()) > 0
    assert stats.gpus == before["gpu_id"].nunique()
    assert (after["ts_ms"] >= minute_cut).all()
    kept = before[before["ts_ms"] >= minute_cut].reset_index(drop=True)
    pd.testing.assert_frame_equal(after, kept)
    with engine.connect() as conn:
        mixed = per_gpu_coverage(read_audit_samples(conn, start_ms=0, end_ms=BIG))
    # the rollup computes periods per day of data, the reference over all of it: a sample
    # before an outage or at the end may cover a millisecond more or less
    assert list(mixed.index) == list(reference.index)
    np.testing.assert_allclose(mixed.to_numpy(), reference.to_numpy(), rtol=0, atol=5)


def test_rerunning_a_rollup_changes_nothing(
    engine: Engine, db_url: str, fleet: SimulationResult
) -> None:
    load_fleet(db_url, fleet)
    cut = fleet.window_start_ms + 3600_000
    with engine.begin() as conn:
        rollup(conn, before_ms=cut, thresholds=TH)
    raw, minutes = raw_rows(engine), minute_rows(engine)

    with engine.begin() as conn:
        again = rollup(conn, before_ms=cut, thresholds=TH)

    assert (again.raw_deleted, again.minutes_written, again.gpus) == (0, 0, 0)
    pd.testing.assert_frame_equal(raw_rows(engine), raw)
    pd.testing.assert_frame_equal(minute_rows(engine), minutes)


def _samples(uuid: str, times: list[int]) -> list[GpuSample]:
    return [
        GpuSample(uuid, t, util=float((t // 5_000) % 101), memory_used_mib=float(t % 977))
        for t in times
    ]


def test_late_raw_samples_merge_into_rolled_up_minutes(engine: Engine) -> None:
    """Samples that arrive after their minutes were rolled up (a sampler's buffer flushed
    after a database outage) join those minutes: the result is the one-shot rollup's."""
    times = [T0 + 5_000 * i for i in range(360)]  # 30 min every 5 s
    hole = [t for t in times if T0 + 330_000 <= t < T0 + 630_000]
    first = [t for t in times if t not in hole]
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-late", "n1", 0), GpuRecord("GPU-once", "n1", 1)])
        insert_samples(conn, _samples("GPU-late", first) + _samples("GPU-once", times), ids)
        rollup(conn, before_ms=T0 + 40 * MINUTE_MS, thresholds=TH, gpu_ids=[ids["GPU-late"]])
    with engine.begin() as conn:
        insert_samples(conn, _samples("GPU-late", hole), ids)
        late = rollup(conn, before_ms=T0 + 40 * MINUTE_MS, thresholds=TH)

    assert late.raw_deleted == len(hole) + len(times)
    with engine.connect() as conn:
        got = read_minutes(conn, start_ms=0, end_ms=BIG)
    merged = got[got["gpu"] == "GPU-late"].drop(columns="gpu").reset_index(drop=True)
    once = got[got["gpu"] == "GPU-once"].drop(columns="gpu").reset_index(drop=True)
    pd.testing.assert_frame_equal(merged, once, check_exact=False, rtol=1e-12)
    assert int(merged["samples"].sum()) == len(times)


def test_coverage_past_the_cut_is_kept_for_the_raw_samples_after_it(engine: Engine) -> None:
    times = [T0 + 3_000 + 5_000 * i for i in range(24)]  # the 12th at :58 covers to 1:03
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "n1", 0)])
        insert_samples(conn, _samples("GPU-a", times), ids)
        with_raw = per_gpu_coverage(reads.read_samples(conn, start_ms=0, end_ms=BIG))
        stats = rollup(conn, before_ms=T0 + MINUTE_MS, thresholds=TH)
    with engine.connect() as conn:
        minutes = read_minutes(conn, start_ms=0, end_ms=BIG)
        mixed = read_audit_samples(conn, start_ms=0, end_ms=BIG)

    assert stats.raw_deleted == 12
    assert minutes[["minute_ms", "samples", "covered_ms"]].values.tolist() == [
        [T0, 12, 57_000],
        [T0 + MINUTE_MS, 0, 3_000],
    ]
    assert_same_coverage(per_gpu_coverage(mixed), with_raw)


def test_reads_of_rolled_minutes(engine: Engine) -> None:
    times = [T0 + 5_000 * i for i in range(36)]  # three minutes
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "n1", 0), GpuRecord("GPU-b", "n1", 1)])
        insert_samples(conn, _samples("GPU-a", times) + _samples("GPU-b", times), ids)
        rollup(conn, before_ms=BIG // 2, thresholds=TH)
    with engine.connect() as conn:
        one = read_rolled_samples(
            conn, start_ms=T0 + MINUTE_MS, end_ms=T0 + 3 * MINUTE_MS, gpu_ids=[ids["GPU-b"]]
        )
        ranged = read_rolled_card_samples(
            conn, [(ids["GPU-a"], T0, T0 + MINUTE_MS), (ids["GPU-b"], T0, BIG)]
        )
        empty = read_rolled_samples(conn, start_ms=0, end_ms=T0)
    assert list(one.columns) == ["gpu", "ts_ms", "util", "throttle_reasons", "cover_ms"]
    assert one[["gpu", "ts_ms", "cover_ms"]].values.tolist() == [
        ["GPU-b", T0 + MINUTE_MS, MINUTE_MS],
        ["GPU-b", T0 + 2 * MINUTE_MS, MINUTE_MS],
    ]
    assert one["ts_ms"].dtype == np.int64
    assert one["cover_ms"].dtype == np.int64
    assert one["util"].dtype == np.float64
    assert ranged["gpu"].value_counts().to_dict() == {"GPU-a": 1, "GPU-b": 3}
    assert empty.empty


def test_without_rollups_the_audit_read_is_the_raw_read(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "n1", 0)])
        insert_samples(conn, _samples("GPU-a", [T0 + 5_000 * i for i in range(10)]), ids)
    with engine.connect() as conn:
        raw = reads.read_samples(conn, start_ms=0, end_ms=BIG)
        both = read_audit_samples(conn, start_ms=0, end_ms=BIG)
    pd.testing.assert_frame_equal(both, raw)
    no_minutes = pd.DataFrame(columns=list(ROLLUP_COLUMNS))
    assert with_rolled(raw, pseudo_samples(no_minutes)) is raw


# ---------------------------------------------------------------- classifying rolled-up data


def _classified(url: str, sim: SimulationResult) -> pd.DataFrame:
    engine = jobs.open_store(url)
    with engine.connect() as conn:
        gpus, pods = reads.read_gpus(conn), reads.read_pods(conn)
        tenures = build_tenures(pods, gpus, reads.read_assignments(conn), now_ms=sim.now_ms)
        samples = read_audit_samples(conn, start_ms=0, end_ms=BIG)
    engine.dispose()
    window = Window(sim.window_start_ms, sim.window_end_ms)
    res = classify(samples, tenures, window=window, thresholds=TH).results
    per_gpu = res.groupby(["gpu", "category"])["seconds"].sum().unstack(fill_value=0.0)
    return per_gpu.reindex(columns=[c.value for c in CATEGORIES], fill_value=0.0)


def test_classifying_rolled_up_data_matches_the_raw_classification(
    tmp_path: Path, fleet: SimulationResult
) -> None:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    load_fleet(url, fleet, pods=True)
    raw = _classified(url, fleet)

    stats = jobs.rollup(url, older_than_days=0, thresholds=TH, now_ms=fleet.now_ms + 3600_000)
    rolled = _classified(url, fleet).reindex(index=raw.index, fill_value=0.0)

    assert stats.gpus == len(raw)
    assert stats.raw_deleted == fleet.samples
    capacity = raw.sum(axis=1)
    np.testing.assert_allclose(rolled.sum(axis=1), capacity, rtol=1e-9)
    np.testing.assert_allclose(rolled["unobserved"], raw["unobserved"], rtol=1e-9, atol=1e-6)
    # a free card's kernel time is busy (of no pod): minute means move a little of it
    # between busy and unallocated, as they do for held cards
    for close in ("busy", "unallocated"):
        assert ((rolled[close] - raw[close]).abs() <= 1e-4 * capacity).all(), close
    worst = (rolled - raw).abs().div(capacity, axis=0).max()
    assert (worst <= 0.06).all(), worst.to_dict()


# ---------------------------------------------------------------- the job, CLI and report flag


def test_cli_rollup_uses_the_configured_age(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    now = int(pd.Timestamp.now(tz="UTC").timestamp() * 1000)
    old = [now - 20 * 86_400_000 + 5_000 * i for i in range(24)]
    young = [now - 5 * 86_400_000 + 5_000 * i for i in range(24)]
    engine = jobs.open_store(url)
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "n1", 0)])
        insert_samples(conn, _samples("GPU-a", old + young), ids)
    config = tmp_path / "auditor.toml"
    config.write_text("[retention]\nraw_days = 30\n", encoding="utf-8")

    kept = runner.invoke(app, ["--db", url, "--config", str(config), "rollup"])
    default = runner.invoke(app, ["--db", url, "rollup"])
    everything = runner.invoke(app, ["--db", url, "rollup", "--older-than", "1"])

    assert kept.exit_code == 0, kept.output
    assert "0 raw rows of 0 GPUs into 0 minute rows" in kept.output
    assert default.exit_code == 0, default.output
    assert "24 raw rows of 1 GPUs into 3 minute rows" in default.output
    assert "24 raw rows of 1 GPUs" in everything.output
    with engine.connect() as conn:
        assert reads.read_samples(conn, start_ms=0, end_ms=BIG).empty
        assert int(read_minutes(conn, start_ms=0, end_ms=BIG)["samples"].sum()) == 48


def test_cli_rollup_errors_are_one_line(tmp_path: Path) -> None:
    config = tmp_path / "auditor.toml"
    config.write_text("[retention]\nraw_days = -3\n", encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'auditor.db'}"

    bad = runner.invoke(app, ["--db", url, "--config", str(config), "rollup"])
    negative = runner.invoke(app, ["--db", url, "rollup", "--older-than", "-1"])

    assert bad.exit_code == 2
    assert "retention.raw_days" in bad.output
    assert "Traceback" not in bad.output
    assert negative.exit_code == 2


def _stored_run(url: str, *, rolled_up_seconds: float) -> None:
    engine = jobs.open_store(url)
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "n1", 0, model="H100")])
        replace_audit_run(
            conn,
            window=(T0, T0 + 3600_000),
            shard="all",
            created_ms=T0,
            thresholds=TH.as_dict(),
            version="test",
            results=[
                {
                    "gpu_id": ids["GPU-a"],
                    "pod_uid": None,
                    "category": "unallocated",
                    "seconds": 3600.0,
                    "inferred": False,
                }
            ],
            findings=[],
            rolled_up_seconds=rolled_up_seconds,
        )
    engine.dispose()


@pytest.mark.parametrize("rolled", [0.0, 2700.0])
def test_reports_flag_windows_audited_from_rollups(tmp_path: Path, rolled: float) -> None:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    _stored_run(url, rolled_up_seconds=rolled)

    table = runner.invoke(app, ["--db", url, "report"])
    as_json = runner.invoke(app, ["--db", url, "report", "--format", "json"])
    html = runner.invoke(app, ["--db", url, "report", "--format", "html"])

    assert table.exit_code == 0, table.output
    rows = pd.read_json(io.StringIO(as_json.output))
    if rolled:
        assert "Note: 0.8 GPU-h of this window were audited from 1-minute rollups" in table.output
        assert rows["window_rolled_up_gpu_hours"].tolist() == [0.75]
        assert "1-minute rollups" in html.output
    else:
        assert "rollups" not in table.output
        assert "window_rolled_up_gpu_hours" not in rows.columns
        assert "rollups" not in html.output


def test_explain_reads_rolled_up_periods(tmp_path: Path, fleet: SimulationResult) -> None:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    load_fleet(url, fleet, pods=True)
    a = fleet.assignments
    done = a[a["released_ms"].notna() & (a["released_ms"] < fleet.window_end_ms - 3600_000)]
    target = f"{done['namespace'].iloc[0]}/{done['pod'].iloc[0]}"
    before = jobs.explain(url, target, thresholds=TH)

    jobs.rollup(url, older_than_days=0, thresholds=TH, now_ms=fleet.now_ms + 3600_000)
    after = jobs.explain(url, target, thresholds=TH)

    assert after.window == before.window
    assert len(after.cards) == len(before.cards)
    for a_card, b_card in zip(after.cards, before.cards, strict=True):
        held = sum(b_card.totals.values())
        assert sum(a_card.totals.values()) == pytest.approx(held, rel=1e-9)
        assert a_card.totals.get("busy", 0.0) == pytest.approx(
            b_card.totals.get("busy", 0.0), abs=1e-4 * held
        )
        shaded = sum(a_card.timeline.seconds[c].sum() for c in a_card.timeline.seconds)
        assert shaded == pytest.approx(held, rel=1e-6)


def _per_gpu(url: str, run_id: int) -> pd.DataFrame:
    engine = jobs.open_store(url)
    with engine.connect() as conn:
        res = reads.read_results(conn, [run_id])
    engine.dispose()
    per_gpu = res.groupby(["gpu", "category"])["seconds"].sum().unstack(fill_value=0.0)
    return per_gpu.reindex(columns=[c.value for c in CATEGORIES], fill_value=0.0)


def test_the_audit_job_reads_rolled_up_periods_and_records_them(
    tmp_path: Path, fleet: SimulationResult
) -> None:
    """Roll up the first half of the data: the audit of the whole window reads raw and
    rolled-up rows side by side, keeps each card's capacity, and records the rolled-up part."""
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    load_fleet(url, fleet, pods=True)
    window = (fleet.window_start_ms, fleet.window_end_ms)
    raw = jobs.audit(url, window=window, thresholds=TH, chunk_samples=1)
    expected = _per_gpu(url, raw.run_id)
    engine = jobs.open_store(url)
    with engine.connect() as conn:
        assert runs_rolled_up_seconds(conn, [raw.run_id]) == 0.0
    middle = (window[0] + window[1]) // 2
    days = (fleet.now_ms + 3600_000 - middle) / 86_400_000
    jobs.rollup(url, older_than_days=days, thresholds=TH, now_ms=fleet.now_ms + 3600_000)

    mixed = jobs.audit(url, window=window, thresholds=TH, chunk_samples=1)
    got = _per_gpu(url, mixed.run_id).reindex(index=expected.index, fill_value=0.0)

    capacity = expected.sum(axis=1)
    np.testing.assert_allclose(got.sum(axis=1), capacity, rtol=1e-9)
    assert ((got["busy"] - expected["busy"]).abs() <= 1e-4 * capacity).all()
    assert ((got - expected).abs().div(capacity, axis=0).max() <= 0.06).all()
    with engine.connect() as conn:
        rolled = runs_rolled_up_seconds(conn, [mixed.run_id])
    # the covered part of the window's first half (the cut falls on a minute boundary;
    # outages in that half are not covered, so not rolled up either)
    assert 0.8 * capacity.sum() / 2 < rolled <= capacity.sum() / 2 + 60 * len(capacity)
    report = runner.invoke(app, ["--db", url, "report"])
    assert f"Note: {rolled / 3600:.1f} GPU-h of this window" in report.output
