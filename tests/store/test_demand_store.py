"""Waiting pods and node outages through `import pods`, the watcher's sinks and the store, on
SQLite and PostgreSQL: read back as the demand `split_unallocated` takes and as queue waits;
a waiting pod holds no card; re-imports change nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine, select

from auditor.agents.watch.kube import Event
from auditor.classify.free_time import split_unallocated
from auditor.collect.pod_times import parse_time
from auditor.jobs.imports import import_pods
from auditor.jobs.watch_sinks import NodeSink, PodSink
from auditor.model import DEFAULT_CLUSTER, Window
from auditor.settings import Config, TeamRules
from auditor.store.demand import read_demand, read_queue_waits
from auditor.store.placement import held_tenures
from auditor.store.schema import node_outages, pods
from auditor.store.signals import read_node_outages

WAITS = Path(__file__).parents[1] / "fixtures" / "waits"
TRITON = "0c6f3a0e-7d4b-4f53-9a51-2f7b1d3c9e01"
KUEUE = "5d1e9c2b-3a47-4e8f-b6d0-8c2f7a9e4b12"
VOLCANO = "8b7a6c5d-4e3f-4a2b-9c1d-0e9f8a7b6c53"
RUNNING = "7a3b2c1d-9e8f-4d6c-a5b4-3c2d1e0f9a84"


def ms(text: str) -> int:
    got = parse_time(text, field="t")
    assert got is not None
    return got


DAY = Window(ms("2025-11-03T00:00:00Z"), ms("2025-11-04T00:00:00Z"))


def copied(tmp_path: Path, name: str, at: str) -> Path:
    """A fixture copied with its modification time at `at` (when kubectl wrote it)."""
    path = tmp_path / name
    shutil.copyfile(WAITS / name, path)
    t = ms(at) / 1000
    os.utime(path, (t, t))
    return path


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def outages(engine: Engine) -> list[tuple[str, str, int, int | None]]:
    with engine.connect() as conn:
        rows = conn.execute(select(node_outages).order_by(node_outages.c.node))
        return [(r.node, r.reason, r.start_ms, r.end_ms) for r in rows]


def test_a_snapshot_gives_each_waiting_pod_a_stretch_until_it_was_seen(
    engine: Engine, tmp_path: Path
) -> None:
    snapshot = copied(tmp_path, "pending-pods.json", "2025-11-03T09:00:00Z")
    import_pods(url_of(engine), snapshot, config=Config())
    with engine.connect() as conn:
        demand = read_demand(conn, window=DAY)
        waits = read_queue_waits(conn, window=DAY)
        clipped = read_demand(conn, window=Window(ms("2025-11-03T08:30:00Z"), DAY.end_ms))
    assert demand.dtypes.to_dict() == {
        "kind": np.dtype(object), "start_ms": np.dtype(np.int64),
        "end_ms": np.dtype(np.int64), "cards": np.dtype(np.float64),
    }  # fmt: skip
    seen = ms("2025-11-03T09:00:00Z")
    assert sorted(demand.itertuples(index=False, name=None), key=lambda r: r[1]) == [
        ("NVIDIA-H100-80GB-HBM3", ms("2025-11-03T07:30:00Z"), seen, 8.0),
        ("NVIDIA-A100-SXM4-80GB", ms("2025-11-03T08:00:00Z"), seen, 1.0),
        (None, ms("2025-11-03T08:10:00Z"), seen, 2.0),
    ]
    assert set(clipped["start_ms"]) == {ms("2025-11-03T08:30:00Z")}  # clipped to the window
    assert list(waits.columns) == [
        "pod_uid", "namespace", "name", "team", "job", "gang", "cards",
        "start_ms", "end_ms", "reason", "message", "cluster",
    ]  # fmt: skip
    assert set(waits["cluster"]) == {DEFAULT_CLUSTER}  # a job's waits are its cluster's
    by_uid = waits.set_index("pod_uid")
    assert set(by_uid.index) == {TRITON, KUEUE, VOLCANO}  # the running pod never waited
    assert by_uid.loc[KUEUE, "reason"] == "SchedulingGated"
    assert by_uid.loc[TRITON, "team"] == "serving"
    assert str(by_uid.loc[TRITON, "message"]).startswith("0/12 nodes are available: 3 Insufficient")
    assert by_uid.loc[VOLCANO, "job"] == "VolcanoJob/mnist-gang"

    # the frame is the one split_unallocated takes: a free A100 card inside the wait is blocked
    pieces = pd.DataFrame({"gpu": ["GPU-a"], "pod_uid": [None], "category": ["unallocated"],
                           "start_ms": [seen - 600_000], "end_ms": [seen],
                           "seconds": [600.0]})  # fmt: skip
    split = split_unallocated(pieces, card_node={"GPU-a": "n"},
                              card_kind={"GPU-a": "NVIDIA-A100-SXM4-80GB"},
                              unavailable=None, demand=demand)  # fmt: skip
    assert split.set_index("cause")["seconds"].to_dict() == {"blocked": 600.0}

    # waiting pods hold no card: the placement never gives them one
    with engine.connect() as conn:
        _, _, tenures = held_tenures(conn, now_ms=DAY.end_ms, window=DAY)
    assert not set(tenures["pod_uid"]) & {TRITON, KUEUE, VOLCANO}


def test_a_watch_stream_ends_the_wait_at_the_bind(engine: Engine, tmp_path: Path) -> None:
    url = url_of(engine)
    import_pods(url, copied(tmp_path, "watch-waits.json", "2025-11-03T08:30:00Z"), config=Config())
    with engine.connect() as conn:
        demand = read_demand(conn, window=DAY)
        stored = conn.execute(select(pods.c.wait_reason, pods.c.bound_ms)).one()
    assert list(demand.itertuples(index=False, name=None)) == [
        ("NVIDIA-A100-SXM4-80GB", ms("2025-11-03T08:00:00Z"), ms("2025-11-03T08:20:31Z"), 1.0)
    ]
    assert tuple(stored) == ("Unschedulable", ms("2025-11-03T08:20:31Z"))  # the reason stays


def test_a_snapshot_of_nodes_opens_their_outages_once(engine: Engine, tmp_path: Path) -> None:
    url = url_of(engine)
    snapshot = copied(tmp_path, "nodes-outages.json", "2025-11-03T10:00:00Z")
    import_pods(url, snapshot, config=Config())
    first = outages(engine)
    assert first == [
        ("gpu-a100-pool-7f2c1-02", "cordoned", ms("2025-11-03T06:15:42Z"), None),
        ("gpu-a100-pool-7f2c1-03", "not_ready", ms("2025-11-03T07:42:10Z"), None),
        ("gpu-h100-pool-2e91d-04", "short", ms("2025-11-03T09:58:12Z"), None),
    ]
    import_pods(url, snapshot, config=Config())
    assert outages(engine) == first  # imported again: nothing moves
    with engine.connect() as conn:
        open_ = read_node_outages(conn, window=DAY)
    assert set(open_["end_ms"]) == {DAY.end_ms}  # an open stretch lasts to the window's end


def test_in_capture_order_a_cordon_seen_ended_gets_its_end(engine: Engine, tmp_path: Path) -> None:
    url = url_of(engine)
    import_pods(url, copied(tmp_path, "watch-waits.json", "2025-11-03T08:30:00Z"), config=Config())
    with engine.connect() as conn:
        got = read_node_outages(conn, window=DAY)
    assert got.to_dict("records") == [
        {"node": "gpu-a100-pool-7f2c1-02", "reason": "cordoned",
         "start_ms": ms("2025-11-03T06:15:42Z"), "end_ms": ms("2025-11-03T08:20:02Z")},
    ]  # fmt: skip
    import_pods(url, copied(tmp_path, "watch-waits.json", "2025-11-03T08:30:00Z"), config=Config())
    assert len(outages(engine)) == 1


def test_the_watcher_keeps_waits_seen_and_nodes_outages(engine: Engine) -> None:
    doc = json.loads((WAITS / "pending-pods.json").read_text())
    pending = doc["items"][0]
    t0 = ms("2025-11-03T08:00:05Z")
    sink = PodSink(engine, scope="pods", teams=TeamRules(), in_scope=lambda _n, _l: True)
    sink.apply([Event("ADDED", pending)], resource_version="1", at_ms=t0)
    # no event for the pod a while; the watch goes on: it is still waiting then
    other = doc["items"][3]
    sink.apply([Event("MODIFIED", other)], resource_version="2", at_ms=t0 + 120_000)
    with engine.connect() as conn:
        seen = conn.execute(select(pods.c.wait_seen_ms).where(pods.c.uid == TRITON)).scalar()
    assert seen == t0 + 120_000
    deleted = json.loads(json.dumps(pending))
    sink.apply([Event("DELETED", deleted)], resource_version="3", at_ms=t0 + 180_000)
    with engine.connect() as conn:
        waits = read_queue_waits(conn, window=DAY)
    assert waits[["pod_uid", "start_ms", "end_ms"]].to_dict("records") == [
        {"pod_uid": TRITON, "start_ms": ms("2025-11-03T08:00:00Z"), "end_ms": t0 + 180_000}
    ]  # deleted unscheduled: it waited until then

    nodes = NodeSink(engine, scope="nodes")
    events = [
        json.loads(line)
        for line in (WAITS / "watch-waits.json").read_text().replace("}\n{", "}\x00{").split("\x00")
    ]
    node_events = [e for e in events if e["object"]["kind"] == "Node"]
    for i, e in enumerate(node_events):
        nodes.apply([Event(e["type"], e["object"])], resource_version=str(10 + i),
                    at_ms=t0 + i * 60_000)  # fmt: skip
    assert outages(engine) == [
        ("gpu-a100-pool-7f2c1-02", "cordoned", ms("2025-11-03T06:15:42Z"), t0 + 120_000)
    ]  # the watcher's clock dates the uncordon
