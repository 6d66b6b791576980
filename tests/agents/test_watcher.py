"""The pod watcher against the stand-in API server, through the real Kubernetes client.

What a user relies on: every GPU pod's tenure lands in the store with the times the pods
themselves carry, whatever the API does to the stream (410 at connect or in the stream, a
connection dropped mid-chunk, a stall, duplicated or reordered events); a pod deleted out
of sight is closed at the relist, marked estimated; a reused name is a new pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeapi import FakeApiServer, Fault, wait_until
from kubeobjects import T0, node, pod
from watchharness import Harness

from auditor.store.writes import write_cursor

S = 1000  # one second in ms


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        yield srv


@pytest.fixture
def h(server: FakeApiServer, db_url: str, tmp_path: Path) -> Harness:
    return Harness(server, db_url, tmp_path)


def life(name: str, uid: str, stage: int, **kw: Any) -> dict[str, Any]:
    """A pod at stage 0 pending, 1 bound, 2 running, 3 finished, 4 being deleted."""
    base = kw.pop("at", T0)
    times = {"bound": base + 10 * S, "started": base + 20 * S, "finished": base + 80 * S}
    times["deleted"] = base + 90 * S
    chosen = {k: v for i, (k, v) in enumerate(times.items()) if i < stage}
    return pod(name, uid=uid, created=base, **chosen, **kw)


def row(stage: int, *, name: str, at: int = T0, estimated_ms: int | None = None) -> dict[str, Any]:
    """The row a pod that reached `stage` should have."""
    want: dict[str, Any] = {
        "namespace": "ml",
        "name": name,
        "node": "gpu-node-1" if stage >= 1 else None,
        "created_ms": at,
        "bound_ms": at + 10 * S if stage >= 1 else None,
        "started_ms": at + 20 * S if stage >= 2 else None,
        "finished_ms": at + 80 * S if stage >= 3 else None,
        "deleted_ms": at + 90 * S if stage >= 4 else estimated_ms,
        "deleted_estimated": estimated_ms is not None,
    }
    return want


def test_lists_then_follows_pods_with_their_own_times(h: Harness) -> None:
    c = h.cluster
    c.put("pods", life("a", "uid-a", 2))
    c.put("pods", pod("cpu-only", uid="uid-cpu", gpus=0))
    with h.running():
        wait_until(lambda: "uid-a" in h.rows())
        c.put("pods", life("b", "uid-b", 0))
        for stage in (1, 2, 3, 4):
            c.put("pods", life("b", "uid-b", stage))
        c.delete("pods", "ml", "b")
        wait_until(lambda: h.rows().get("uid-b", {}).get("deleted_ms"))

    assert h.rows() == {"uid-a": row(2, name="a"), "uid-b": row(4, name="b")}
    assert h.count("relists") == 1


def test_410_at_connect_relists_and_closes_a_pod_deleted_meanwhile(
    h: Harness, server: FakeApiServer
) -> None:
    c = h.cluster
    c.put("pods", life("a", "uid-a", 2))
    c.put("pods", life("b", "uid-b", 2))
    with h.running():
        wait_until(lambda: len(h.rows()) == 2)
    c.delete("pods", "ml", "a")  # while nobody watches; then history is compacted
    c.compact()
    c.add_faults(Fault("gone_at_connect"))
    with h.running():
        wait_until(lambda: h.rows()["uid-a"]["deleted_ms"])
        c.put("pods", life("b", "uid-b", 3))
        wait_until(lambda: h.rows()["uid-b"]["finished_ms"])

    rows = h.rows()
    assert rows["uid-a"]["deleted_estimated"] is True
    assert rows["uid-a"] == row(2, name="a", estimated_ms=rows["uid-a"]["deleted_ms"])
    assert rows["uid-b"] == row(3, name="b")
    assert h.count("relists") == 2


def test_410_in_the_stream_relists(h: Harness) -> None:
    c = h.cluster
    c.put("pods", life("a", "uid-a", 1))
    c.add_faults(Fault("gone_in_stream", after=1))
    with h.running():
        wait_until(h.rows)
        c.put("pods", life("a", "uid-a", 2))  # sent, then the stream says 410
        c.put("pods", life("b", "uid-b", 2))
        wait_until(lambda: "uid-b" in h.rows() and h.count("relists") == 2)

    assert h.rows() == {"uid-a": row(2, name="a"), "uid-b": row(2, name="b")}


def test_a_connection_dropped_mid_chunk_loses_nothing_and_needs_no_relist(h: Harness) -> None:
    c = h.cluster
    c.add_faults(Fault("drop_mid_chunk", after=2))
    with h.running():
        wait_until(lambda: h.count("relists") == 1)
        for stage in range(5):
            c.put("pods", life("a", "uid-a", stage))
        wait_until(lambda: h.rows().get("uid-a", {}).get("deleted_ms"))

    assert h.rows() == {"uid-a": row(4, name="a")}
    assert h.count("relists") == 1
    assert h.count("errors") >= 1


def test_a_stalled_stream_times_out_and_the_watch_resumes(h: Harness) -> None:
    c = h.cluster
    c.add_faults(Fault("stall", after=1, seconds=30))
    with h.running():
        wait_until(lambda: h.count("relists") == 1)
        c.put("pods", life("a", "uid-a", 1))
        c.put("pods", life("a", "uid-a", 2))  # held back by the stalled stream
        wait_until(lambda: h.rows().get("uid-a", {}).get("started_ms"), timeout=10)

    assert h.rows() == {"uid-a": row(2, name="a")}
    assert h.count("relists") == 1
    assert h.count("errors") == 1  # the read timeout; bookmarks kept the other streams alive


def test_a_pod_deleted_while_the_watcher_is_down_gets_its_real_deletion_time(h: Harness) -> None:
    c = h.cluster
    c.put("pods", life("a", "uid-a", 2))
    with h.running():
        wait_until(h.rows)
    c.put("pods", life("a", "uid-a", 4))
    c.delete("pods", "ml", "a")
    with h.running():
        wait_until(lambda: h.rows()["uid-a"]["deleted_ms"])

    assert h.rows() == {"uid-a": row(4, name="a")}
    assert h.count("relists") == 1  # resumed from the stored cursor


def test_a_reused_name_is_a_new_pod(h: Harness) -> None:
    c = h.cluster
    c.put("pods", life("worker-0", "uid-old", 2))
    with h.running():
        wait_until(h.rows)
    c.delete("pods", "ml", "worker-0")  # gone without a trace, and the name taken again
    c.compact()
    c.put("pods", life("worker-0", "uid-new", 2, at=T0 + 600 * S))
    with h.running():
        wait_until(lambda: "uid-new" in h.rows())

    rows = h.rows()
    assert rows["uid-new"] == row(2, name="worker-0", at=T0 + 600 * S)
    assert rows["uid-old"]["deleted_estimated"] is True
    assert rows["uid-old"]["started_ms"] == T0 + 20 * S


@pytest.mark.parametrize(("duplicate", "reorder"), [(True, False), (False, True), (True, True)])
def test_duplicated_and_reordered_events_give_the_same_rows(
    h: Harness, duplicate: bool, reorder: bool
) -> None:
    c = h.cluster
    c.put("pods", life("seed", "uid-seed", 0))
    with h.running():
        wait_until(h.rows)
    c.duplicate, c.reorder = duplicate, reorder
    for i in range(6):
        for stage in range(5):
            c.put("pods", life(f"p{i}", f"uid-{i}", stage, at=T0 + i * S))
        if i % 2 == 0:
            c.delete("pods", "ml", f"p{i}")
    with h.running():  # the backlog arrives in one stream, doubled or shuffled
        wait_until(
            lambda: (
                len(h.rows()) == 7
                and all(r["deleted_ms"] for k, r in h.rows().items() if k != "uid-seed")
            )
        )

    rows = h.rows()
    for i in range(6):
        assert rows[f"uid-{i}"] == row(4, name=f"p{i}", at=T0 + i * S)


def test_a_namespaced_watcher_closes_no_pod_of_another_namespace(h: Harness) -> None:
    c = h.cluster
    c.put("pods", life("a", "uid-a", 2, namespace="ml"))
    c.put("pods", life("x", "uid-x", 2, namespace="other"))
    with h.running():
        wait_until(lambda: len(h.rows()) == 2)
    with h.running(namespace="ml"):
        wait_until(lambda: h.count("relists") == 2)

    assert h.rows()["uid-x"]["deleted_ms"] is None


def test_an_expired_continue_token_restarts_the_list(h: Harness) -> None:
    c = h.cluster
    for i in range(1200):
        c.put("pods", life(f"p{i:04d}", f"uid-{i}", 2))
    refl = h.reflector()
    first = c.list_page("pods", namespace=None, selector=None, limit=500, token="")
    assert first is not None
    c.snapshots.clear()  # the first page's snapshot expires before the second page

    rv = refl.relist()

    assert len(h.rows()) == 1200
    assert rv == str(c.rv)


def test_nodes_are_recorded_with_gpu_model_capacity_and_cordon(h: Harness) -> None:
    c = h.cluster
    c.put("nodes", node("gpu-node-1", gpus=8))
    with h.running(nodes=True):
        wait_until(lambda: "gpu-node-1" in h.nodes())
        c.put("nodes", node("gpu-node-1", gpus=8, cordoned=True))
        wait_until(lambda: h.nodes()["gpu-node-1"]["unschedulable"])

    got = h.nodes()["gpu-node-1"]
    assert got["gpu_model"] == "NVIDIA-H100-80GB-HBM3"
    assert (got["gpu_capacity"], got["gpu_allocatable"]) == (8, 8)


def test_a_pod_that_cannot_be_read_is_skipped_and_the_rest_recorded(h: Harness) -> None:
    bad = life("bad", "uid-bad", 2)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "lots"
    h.cluster.put("pods", bad)
    h.cluster.put("pods", life("a", "uid-a", 2))
    with h.running():
        wait_until(lambda: "uid-a" in h.rows())

    assert h.rows() == {"uid-a": row(2, name="a")}


def test_a_cursor_this_server_never_reached_is_dropped_for_a_relist(h: Harness) -> None:
    """A store moved to another cluster, or an API server restored from a backup."""
    with h.engine.begin() as conn:
        write_cursor(conn, "pods|*|", resource_version="99999999", at_ms=T0)
    h.cluster.put("pods", life("a", "uid-a", 2))
    h.cluster.add_faults(Fault("too_large_at_connect"))
    with h.running():
        wait_until(lambda: "uid-a" in h.rows())

    assert h.count("relists") == 1
