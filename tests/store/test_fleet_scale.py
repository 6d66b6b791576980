"""Fleet scale: bulk ingest paths, the audit's reads and chunks, the clustered sample table.

The figures (throughput, memory, ratios) come from `bench/bench_fleet.py`; these tests pin
the behaviour those paths must keep: idempotent writes whichever path a batch takes, reads
that return exactly what the general reader returns, chunks that never split a node or a
gang's context, and a budget that shrinks the chunk as the window grows.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine, func, select

from auditor import jobs
from auditor.jobs.parts import chunks
from auditor.model import GpuRecord
from auditor.report.offenders import stragglers
from auditor.settings import Thresholds
from auditor.store import bulk, migrate, reads
from auditor.store.connection import make_engine
from auditor.store.schema import gpu_samples
from auditor.store.writes import upsert_gpus


def _frame(gpu_ids: list[int], ticks: range, *, util: float = 50.0) -> pd.DataFrame:
    gpu = np.repeat(np.array(gpu_ids, dtype=np.int64), len(ticks))
    ts = np.tile(np.array(ticks, dtype=np.int64) * 5_000, len(gpu_ids))
    u = np.full(gpu.size, util)
    u[::7] = np.nan
    return pd.DataFrame({"gpu_id": gpu, "ts_ms": ts, "util": u, "power_w": 300.0})


def _write(engine: Engine, frame: pd.DataFrame, **override: object) -> None:
    rows, spans, repeats = bulk.frame_rows(frame)
    args: dict[str, object] = {"spans": spans, "repeats": repeats, **override}
    with engine.begin() as conn:
        bulk.write_rows(conn, rows, **args)  # type: ignore[arg-type]


def _stored(engine: Engine) -> pd.DataFrame:
    with engine.connect() as conn:
        rows = conn.execute(
            select(gpu_samples.c.gpu_id, gpu_samples.c.ts_ms, gpu_samples.c.util).order_by(
                gpu_samples.c.gpu_id, gpu_samples.c.ts_ms
            )
        ).all()
    return pd.DataFrame(rows, columns=["gpu_id", "ts_ms", "util"])


def _gpus(engine: Engine, n: int) -> list[int]:
    with engine.begin() as conn:
        ids = upsert_gpus(
            conn, [GpuRecord(f"GPU-{i}", node=f"n{i // 2}", index=i % 2) for i in range(n)]
        )
    return [ids[f"GPU-{i}"] for i in range(n)]


def test_append_replay_and_overlap_store_each_key_once(engine: Engine) -> None:
    ids = _gpus(engine, 3)
    _write(engine, _frame(ids, range(0, 100)))  # append to an empty table
    _write(engine, _frame(ids, range(100, 200)))  # append after stored data
    _write(engine, _frame(ids, range(0, 200)))  # a replay of both
    _write(engine, _frame(ids, range(150, 260), util=90.0))  # half old, half new
    got = _stored(engine)
    assert len(got) == 3 * 260
    assert not got.duplicated(["gpu_id", "ts_ms"]).any()
    # stored values are never overwritten by a replay; new keys get the new values
    first = got[got["ts_ms"] < 200 * 5_000]["util"].dropna()
    assert set(first) == {50.0}
    assert set(got[got["ts_ms"] >= 200 * 5_000]["util"].dropna()) == {90.0}
    # NaN is stored as NULL ("unreadable"), not as the float NaN
    with engine.connect() as conn:
        nulls = conn.execute(
            select(func.count()).select_from(gpu_samples).where(gpu_samples.c.util.is_(None))
        ).scalar_one()
    assert nulls == int(got["util"].isna().sum()) > 0


def test_repeated_keys_in_one_batch_are_stored_once(engine: Engine) -> None:
    ids = _gpus(engine, 2)
    frame = _frame(ids, range(0, 50))
    _write(engine, pd.concat([frame, frame.iloc[:10]], ignore_index=True))
    assert len(_stored(engine)) == 100


def test_a_batch_that_wrongly_looks_new_still_takes_each_key_once(engine: Engine) -> None:
    """As when another writer stores the same keys between the check and the COPY: the
    direct COPY fails on the key, its savepoint is rolled back, the merge takes the batch."""
    ids = _gpus(engine, 2)
    _write(engine, _frame(ids, range(0, 50)))
    _write(engine, _frame(ids, range(0, 80)), spans={}, repeats=False)
    got = _stored(engine)
    assert len(got) == 160
    assert not got.duplicated(["gpu_id", "ts_ms"]).any()


def test_card_reads_return_what_the_general_reader_returns(engine: Engine) -> None:
    ids = _gpus(engine, 3)
    frame = _frame(ids, range(0, 120))
    frame["throttle_reasons"] = np.where(frame.index % 5 == 0, "0x0000000000000004", None)
    _write(engine, frame)
    uuids = {ids[i]: f"GPU-{i}" for i in range(3)}
    ranges = [(ids[0], 0, 200_000), (ids[2], 100_000, 450_000), (ids[1], 10**9, 2 * 10**9)]
    with engine.connect() as conn:
        got = reads.read_card_samples(conn, ranges, uuids)
        want = pd.concat(
            [reads.read_samples(conn, start_ms=lo, end_ms=hi, gpu_ids=[g]) for g, lo, hi in ranges],
            ignore_index=True,
        )
    assert len(got) == 40 + 70
    assert got["gpu"].astype(str).tolist() == want["gpu"].tolist()
    np.testing.assert_array_equal(got["ts_ms"].to_numpy(), want["ts_ms"].to_numpy())
    np.testing.assert_array_equal(got["util"].to_numpy(), want["util"].to_numpy())
    assert got["throttle_reasons"].tolist() == want["throttle_reasons"].tolist()
    with engine.connect() as conn:
        empty = reads.read_card_samples(conn, [], uuids)
    assert len(empty) == 0
    assert list(empty.columns) == ["gpu", "ts_ms", "util", "throttle_reasons", "sm_active"]


def _fleet() -> tuple[pd.DataFrame, pd.DataFrame]:
    gpus = pd.DataFrame(
        {
            "uuid": [f"G{n}{i}" for n in range(4) for i in range(2)],
            "node": [f"node-{n}" for n in range(4) for _ in range(2)],
        }
    )
    tenures = pd.DataFrame(
        {
            "gpu": ["G00", "G01", "G20", "G30", "G31"],
            "pod_uid": ["a", "a", "b", "c", "c2"],
            "gang": ["ga", "ga", "gbc", "gbc", "gc2"],  # gang gbc spans node-2 and node-3
            "start_ms": [0, 0, -50_000, 10_000, 20_000],
            "end_ms": [40_000, 40_000, 30_000, 200_000, 90_000],
        }
    )
    return gpus, tenures


def test_chunks_take_whole_nodes_within_the_budget_and_read_whole_gangs() -> None:
    gpus, tenures = _fleet()
    one = list(jobs.audit_parts(gpus, tenures, shard=None, budget=100))
    assert one == [(set(gpus["uuid"]), set(gpus["uuid"]))]
    per_node = list(jobs.audit_parts(gpus, tenures, shard=None, budget=1))
    assert [sorted(own) for own, _ in per_node] == [
        ["G00", "G01"], ["G10", "G11"], ["G20", "G21"], ["G30", "G31"]
    ]  # fmt: skip
    # node-2's card G20 shares gang gbc with G30 on node-3: read as context, not owned
    assert per_node[2][1] == {"G20", "G21", "G30"}
    assert per_node[3][1] == {"G30", "G31", "G20"}
    # a budget of four cards: node-0 and node-1 together, then node-2 and node-3 (whose
    # context is those four cards); of three: node-2 with its context G30 fills a chunk
    four = list(jobs.audit_parts(gpus, tenures, shard=None, budget=4))
    assert [sorted(own) for own, _ in four] == [
        ["G00", "G01", "G10", "G11"], ["G20", "G21", "G30", "G31"]
    ]  # fmt: skip
    three = list(jobs.audit_parts(gpus, tenures, shard=None, budget=3))
    assert [sorted(own) for own, _ in three] == [
        ["G00", "G01"], ["G10", "G11"], ["G20", "G21"], ["G30", "G31"]
    ]  # fmt: skip
    # every card is owned exactly once, whatever the budget
    for parts in (one, per_node, four, three):
        owned = [u for own, _ in parts for u in own]
        assert sorted(owned) == sorted(gpus["uuid"])


def test_chunks_for_workers_are_even_and_cut_between_gangs_where_one_can() -> None:
    """With workers, a multiple of them of about equal cost, every card owned once; a cut
    moves to a boundary no gang spans where one is as near, else cuts the gang (its cards
    then read by both chunks) rather than leave a worker idle."""
    gpus, tenures = _fleet()
    cost = dict.fromkeys(gpus["uuid"], 10)
    # four wanted of four nodes: node-2 and node-3 are cut apart, gang gbc read by both
    parts = chunks(gpus, tenures, shard=None, budget=60, cost=cost, least=3, workers=2)
    assert [sorted(own) for own, _ in parts] == [
        ["G00", "G01"], ["G10", "G11"], ["G20", "G21"], ["G30", "G31"]
    ]  # fmt: skip
    assert [sorted(ctx - own) for own, ctx in parts] == [[], [], ["G30"], ["G20"]]

    # five nodes of two cards, two chunks: the nearest cuts are after node-1 and after
    # node-2, as near as each other; a gang across node-1 and node-2 moves the cut
    five = pd.DataFrame(
        {"uuid": [f"C{n}{i}" for n in range(5) for i in range(2)],
         "node": [f"m{n}" for n in range(5) for _ in range(2)]}
    )  # fmt: skip
    cost = dict.fromkeys(five["uuid"], 10)
    none = tenures.iloc[0:0]
    plain = chunks(five, none, shard=None, budget=60, cost=cost, least=1, workers=2)
    assert [len(own) // 2 for own, _ in plain] == [2, 3]
    gang = pd.DataFrame(
        {"gpu": ["C11", "C20"], "pod_uid": ["x", "y"], "gang": ["g", "g"],
         "start_ms": [0, 0], "end_ms": [10, 10]}
    )  # fmt: skip
    moved = chunks(five, gang, shard=None, budget=60, cost=cost, least=1, workers=2)
    assert [len(own) // 2 for own, _ in moved] == [3, 2]
    assert all(own == ctx for own, ctx in moved), "no gang read twice"

    # ten nodes of 8 cards, a budget of 3 nodes, 2 workers: four chunks of about equal
    # cost, not the budget's greedy cut
    big = pd.DataFrame(
        {"uuid": [f"N{n}-{i}" for n in range(10) for i in range(8)],
         "node": [f"n{n:02}" for n in range(10) for _ in range(8)]}
    )  # fmt: skip
    cost = dict.fromkeys(big["uuid"], 1)
    greedy = chunks(big, none, shard=None, budget=24, cost=cost, least=3, workers=1)
    assert [len(own) // 8 for own, _ in greedy] == [3, 3, 3, 1]  # 6 against 4 nodes
    parts = chunks(big, none, shard=None, budget=24, cost=cost, least=3, workers=2)
    assert sorted(len(own) // 8 for own, _ in parts) == [2, 2, 3, 3]  # 5 and 5
    owned = [u for own, _ in parts for u in own]
    assert sorted(owned) == sorted(big["uuid"])


def test_a_longer_window_makes_chunks_of_fewer_nodes() -> None:
    gpus, tenures = _fleet()
    sizes = []
    for days in (1, 7):
        ranges = jobs.card_ranges(gpus, tenures, window=(0, days * 86_400_000))
        cost = {u: (hi - lo) // 5_000 for u, (lo, hi) in ranges.items()}
        parts = list(jobs.audit_parts(gpus, tenures, shard=None, budget=300_000, cost=cost))
        sizes.append(max(len(ctx) for _, ctx in parts))
        # only a single node (with its gangs' context) may go past the budget
        for own, ctx in parts:
            assert sum(cost[u] for u in ctx) <= 300_000 or len({u[1] for u in own}) == 1
    assert sizes == [8, 3]  # a day: all four nodes in one chunk; a week: a node each


def test_card_ranges_stretch_to_whole_tenures_of_the_gangs_in_the_window() -> None:
    gpus, tenures = _fleet()
    margin = jobs.READ_MARGIN_MS
    ranges = jobs.card_ranges(gpus, tenures, window=(0, 100_000))
    assert ranges["G20"] == (-50_000 - margin, 100_000 + margin)  # tenure began before the window
    assert ranges["G30"] == (-margin, 200_000 + margin)  # its tenure ends after it
    assert ranges["G11"] == (-margin, 100_000 + margin)  # never held: the window
    assert ranges["G31"] == (-margin, 100_000 + margin)  # held inside the window only
    later = jobs.card_ranges(gpus, tenures, window=(150_000, 160_000))
    # G20's tenure is over by then, but its gang gbc still holds G30: a gang's gaps (its
    # checkpoint series) are those of all its tenures, so the window reads them all
    assert later["G20"] == (-50_000 - margin, 160_000 + margin)
    assert later["G21"] == (150_000 - margin, 160_000 + margin)  # no gang of the window


def test_sqlite_keeps_samples_clustered_on_their_key(tmp_path: Path) -> None:
    path = f"{tmp_path}/a.db"
    url = f"sqlite:///{path}"
    migrate.upgrade(url, "0003")
    engine = make_engine(url)
    with engine.begin() as conn:  # the 0003 table: today's writer knows later columns
        conn.exec_driver_sql(
            "INSERT INTO gpus (uuid, node) VALUES ('GPU-0', 'n0'), ('GPU-1', 'n0')"
        )
        ids = [r[0] for r in conn.exec_driver_sql("SELECT id FROM gpus ORDER BY uuid")]
        conn.exec_driver_sql(
            "INSERT INTO gpu_samples (gpu_id, ts_ms, util) VALUES (?, 1000, 5.0), (?, 2000, 7.0)",
            (ids[0], ids[1]),
        )
    engine.dispose()
    migrate.upgrade(url)
    with sqlite3.connect(path) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'gpu_samples'").fetchone()[0]
        assert "WITHOUT ROWID" in sql
        assert "REFERENCES" not in sql
        assert db.execute("SELECT gpu_id, ts_ms, util FROM gpu_samples ORDER BY 1").fetchall() == [
            (ids[0], 1000, 5.0),
            (ids[1], 2000, 7.0),
        ]
    migrate.downgrade(url, "0003")
    with sqlite3.connect(path) as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'gpu_samples'").fetchone()[0]
        assert "WITHOUT ROWID" not in sql
        assert "REFERENCES" in sql
        assert db.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2


def test_a_straggler_without_throttle_data_still_reports() -> None:
    """Feeds without throttle reasons (dcgm, many nvidia-smi queries) store no detail."""
    findings = pd.DataFrame(
        {
            "kind": ["straggler", "straggler"],
            "namespace": ["ml", "ml"],
            "job": ["j1", "j2"],
            "pod": ["p1", "p2"],
            "rank": [1, 2],
            "node": ["n1", "n2"],
            "gpu": ["G1", "G2"],
            "detail": [np.nan, "0x0000000000000004"],
            "seconds": [10.0, 20.0],
        }
    )
    got = stragglers(findings).set_index("job")
    assert got.loc["j1", "straggler_throttle"] == ""
    assert got.loc["j2", "straggler_throttle"] != ""


def test_a_cards_planned_cost_is_the_rows_its_range_reads(engine: Engine) -> None:
    """Chunks are cut at equal cost, so a card costs the samples the store holds of it
    inside its range, not the range's length: a card sampled for an hour of a day's window
    costs an hour, a card whose samples were rolled up costs a row a minute, a card the
    store holds nothing of costs nothing."""
    from auditor.jobs.parts import planned_cost
    from auditor.store.rollup import rollup

    ids = _gpus(engine, 4)
    hour = 3_600_000
    _write(engine, _frame(ids[:1], range(0, 24 * 720)))  # a day at 5 s
    _write(engine, _frame(ids[1:2], range(6 * 720, 7 * 720)))  # the seventh hour only
    _write(engine, _frame(ids[2:3], range(0, 24 * 720)))  # a day, the first 12 h rolled up
    with engine.begin() as conn:
        rollup(conn, before_ms=12 * hour, thresholds=Thresholds(), gpu_ids=[ids[2]])
    with engine.connect() as conn:
        held = reads.stored_spans(conn)
    assert held["GPU-3"] == (None, None, None, None)
    assert held["GPU-1"] == (6 * hour, 7 * hour - 5_000, None, None)
    assert held["GPU-2"][2:] == (0, 12 * hour - 60_000)

    day = {f"GPU-{i}": (0, 24 * hour) for i in range(4)}
    cost = planned_cost(day, period_ms=5_000, stored=held)
    assert cost["GPU-0"] == 24 * 720 - 1  # its first to its last reading
    assert cost["GPU-1"] == 720 - 1
    assert cost["GPU-2"] == 12 * 720 - 1 + 12 * 60 - 1  # raw half, and a row a minute
    assert cost["GPU-3"] == 0
    # a range past the stored samples costs only its overlap; without what the store
    # holds (an audit from the metrics store), every card costs its range at the period
    late = planned_cost({"GPU-1": (6 * hour + 1_800_000, 30 * hour)}, period_ms=5_000,
                        stored=held)  # fmt: skip
    assert late == {"GPU-1": 360 - 1}
    assert planned_cost(day, period_ms=5_000) == dict.fromkeys(day, 24 * 720)
