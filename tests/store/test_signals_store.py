"""SPEC §10's signals through the store, on SQLite and PostgreSQL: written idempotently on
their natural keys, read back as the frames the causes take."""

from __future__ import annotations

import math

import pandas as pd
from sqlalchemy import Engine

from auditor.model import GpuRecord, Window
from auditor.settings import Thresholds
from auditor.store.signals import (
    read_card_signals,
    read_causes,
    read_node_outages,
    read_pod_signals,
    write_card_signals,
    write_node_outages,
    write_pod_signals,
)
from auditor.store.writes import upsert_gpus


def test_pod_signals_round_trip_per_source_and_replace_themselves(engine: Engine) -> None:
    rows = [
        {"pod_uid": "p1", "source": "cgroup", "ts_ms": 1_000, "throttled_ratio": 0.4},
        {"pod_uid": "p1", "source": "serving", "ts_ms": 1_000, "requests_running": 2.0},
        {"pod_uid": "p2", "source": "cadvisor", "ts_ms": 9_000, "cpu_pressure": 0.3},
    ]
    with engine.begin() as conn:
        write_pod_signals(conn, rows)
        write_pod_signals(conn, [rows[0] | {"throttled_ratio": 0.5}])  # the same reading again
    with engine.connect() as conn:
        got = read_pod_signals(conn, ["p1"], window=Window(2_000, 5_000), margin_ms=1_000)
    assert sorted(got["source"]) == ["cgroup", "serving"]
    cgroup = got[got["source"] == "cgroup"].iloc[0]
    assert cgroup["throttled_ratio"] == 0.5
    assert math.isnan(cgroup["requests_running"])  # not recorded is NaN, never 0


def test_card_signals_and_outages_read_by_window(engine: Engine) -> None:
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "node-a", 0)])
        write_card_signals(conn, [{"gpu_id": ids["GPU-a"], "ts_ms": 5_000, "pcie_bytes_s": 3e9}])
        write_node_outages(
            conn,
            [
                {"node": "node-a", "reason": "cordoned", "start_ms": 0, "end_ms": None},
                {"node": "node-b", "reason": "not_ready", "start_ms": 0, "end_ms": 1_000},
            ],
        )
    with engine.connect() as conn:
        cards = read_card_signals(conn, window=Window(4_000, 6_000), margin_ms=0)
        outages = read_node_outages(conn, window=Window(2_000, 6_000))
        causes = read_causes(conn, [1])
    assert cards[["gpu", "ts_ms", "pcie_bytes_s"]].to_dict("records") == [
        {"gpu": "GPU-a", "ts_ms": 5_000, "pcie_bytes_s": 3e9}
    ]
    assert outages.to_dict("records") == [
        {"node": "node-a", "reason": "cordoned", "start_ms": 0, "end_ms": 6_000}
    ]
    assert isinstance(causes, pd.DataFrame)
    assert causes.empty


def test_card_signals_read_only_inside_each_cards_spans(engine: Engine) -> None:
    """The audit reads a card's signals only while it was held: rows inside the card's spans
    (once, where spans overlap), clipped to the window and its margin; none of a card given
    no span."""
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "node-a", 0), GpuRecord("GPU-b", "node-a", 1)])
        a, b = ids["GPU-a"], ids["GPU-b"]
        write_card_signals(
            conn,
            [{"gpu_id": g, "ts_ms": t * 1_000, "pcie_bytes_s": float(t)}
             for g in (a, b) for t in range(0, 20)],
        )  # fmt: skip
    with engine.connect() as conn:
        got = read_card_signals(
            conn,
            window=Window(5_000, 15_000),
            margin_ms=2_000,
            cards={a: "GPU-a", b: "GPU-b"},
            spans={a: [(0, 4_000), (9_000, 11_000), (10_000, 12_000), (12_000, 13_000)]},
        )
    assert got["gpu"].tolist() == ["GPU-a"] * 5
    assert got["ts_ms"].tolist() == [3_000, 9_000, 10_000, 11_000, 12_000]


def test_the_audit_judges_idle_time_by_a_card_row_from_before_the_pod_was_bound(
    db_url: str, engine: Engine
) -> None:
    """The audit reads a card's signals only while a pod held it, and `signal_stale_s`
    before: a pod busy for its first minute, then idle for one, is judged by the card's
    PCIe row taken a minute before it was bound (its idle midpoint is 150 s later, inside
    the 180 s a row stands for); the card's rows while it was free are not needed."""
    from auditor import jobs
    from auditor.model import GpuSample, PodRecord, WorkloadKind
    from auditor.store import pod_writes, writes

    t0, bound = 1_795_392_000_000, 1_795_392_000_000 + 600_000
    ts = range(t0, t0 + 1_800_000, 15_000)
    with engine.begin() as conn:
        ids = upsert_gpus(conn, [GpuRecord("GPU-a", "node-a", 0, "NVIDIA H100")])
        writes.insert_samples(
            conn,
            [GpuSample("GPU-a", t, 0.0 if t < bound or bound + 60_000 <= t < bound + 120_000
                       else 100.0) for t in ts],
            ids,
        )  # fmt: skip
        pod_writes.upsert_pods(
            conn,
            [PodRecord(uid="pod-1", namespace="ml", name="train-0", node="node-a",
                       team="vision", job="Job/train", job_kind="Job",
                       workload=WorkloadKind.TRAINING, gang="pod-1", gpu_count=1,
                       bound_ms=bound, finished_ms=t0 + 1_800_000)],
        )  # fmt: skip
        writes.upsert_assignments(conn, [("pod-1", ids["GPU-a"], bound)], source="test")
        write_card_signals(
            conn,
            [{"gpu_id": ids["GPU-a"], "ts_ms": bound - 60_000, "pcie_bytes_s": 5e9,
              "pcie_link_bytes_s": 8e9}],
        )  # fmt: skip
    run = jobs.audit(db_url, window=(t0, t0 + 1_800_000), thresholds=Thresholds())
    with engine.connect() as conn:
        causes = read_causes(conn, [run.run_id])
    idle = causes[causes["category"] == "compute_idle"]
    assert idle[["cause", "seconds"]].to_dict("records") == [
        {"cause": "host_transfer", "seconds": 60.0}
    ]
