"""SPEC §10's signals through the store, on SQLite and PostgreSQL: written idempotently on
their natural keys, read back as the frames the causes take."""

from __future__ import annotations

import math

import pandas as pd
from sqlalchemy import Engine

from auditor.model import GpuRecord, Window
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
