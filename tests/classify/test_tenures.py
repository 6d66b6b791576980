"""Who held which GPU when (SPEC §2.2): exact mapping, else the first-fit inference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from auditor.classify import TENURE_COLUMNS, build_tenures

NOW = 1_000


def pod(
    uid: str,
    bound: int | None,
    *,
    count: int = 1,
    node: str | None = "n1",
    ns: str = "team",
    name: str | None = None,
    gang: str | None = None,
    finished: int | None = None,
    deleted: int | None = None,
    resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    return {
        "uid": uid,
        "namespace": ns,
        "name": name or uid,
        "node": node,
        "gang": gang,
        "gpu_count": count,
        "gpu_resource": resource,
        "bound_ms": bound,
        "finished_ms": finished,
        "deleted_ms": deleted,
    }


def pods_frame(*pods: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(list(pods))
    for col in ("bound_ms", "finished_ms", "deleted_ms", "gpu_count"):
        frame[col] = frame[col].astype("Int64")
    return frame


def gpus_frame(node: str = "n1", n: int = 4, mig: dict[str, str] | None = None) -> pd.DataFrame:
    rows: list[dict[str, Any]] = [
        {"uuid": f"G{i}", "node": node, "gpu_index": i, "parent_uuid": None} for i in range(n)
    ]
    for i, (uuid, parent) in enumerate((mig or {}).items()):
        rows.append({"uuid": uuid, "node": node, "gpu_index": i, "parent_uuid": parent})
    return pd.DataFrame(rows)


def assign(*pairs: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame(list(pairs), columns=["pod_uid", "gpu_uuid"])


def held(frame: pd.DataFrame) -> list[tuple[str, str, int, int, bool]]:
    ordered = frame.sort_values(["pod_uid", "gpu"])
    return [
        (str(g), str(p), int(s), int(e), bool(i))
        for g, p, s, e, i in zip(
            ordered["gpu"], ordered["pod_uid"], ordered["start_ms"], ordered["end_ms"],
            ordered["inferred"], strict=True,
        )
    ]  # fmt: skip


def test_first_fit_in_bound_order_takes_the_lowest_free_indices() -> None:
    pods = pods_frame(pod("b", 20), pod("a", 10, count=2))

    out = build_tenures(pods, gpus_frame(), assign(), now_ms=NOW)

    assert held(out) == [
        ("G0", "a", 10, NOW, True),
        ("G1", "a", 10, NOW, True),
        ("G2", "b", 20, NOW, True),
    ]


def test_ties_in_bound_time_go_by_namespace_then_name() -> None:
    pods = pods_frame(
        pod("p1", 10, ns="b", name="x"),
        pod("p2", 10, ns="a", name="y"),
        pod("p3", 10, ns="a", name="x"),
    )

    out = build_tenures(pods, gpus_frame(), assign(), now_ms=NOW)

    assert held(out) == [
        ("G2", "p1", 10, NOW, True),
        ("G1", "p2", 10, NOW, True),
        ("G0", "p3", 10, NOW, True),
    ]


def test_released_gpus_are_free_again_from_the_release_instant() -> None:
    pods = pods_frame(
        pod("a", 10, count=2, finished=50),
        pod("c", 40),
        pod("b", 50),
        pod("d", 55, deleted=70, finished=90),
    )

    out = build_tenures(pods, gpus_frame(), assign(), now_ms=NOW)

    assert held(out) == [
        ("G0", "a", 10, 50, True),
        ("G1", "a", 10, 50, True),
        ("G0", "b", 50, NOW, True),
        ("G2", "c", 40, NOW, True),
        ("G1", "d", 55, 70, True),
    ]


def test_exact_mapping_wins_and_blocks_inference() -> None:
    pods = pods_frame(pod("a", 10), pod("b", 20))

    out = build_tenures(pods, gpus_frame(), assign(("a", "G3")), now_ms=NOW)

    assert held(out) == [("G3", "a", 10, NOW, False), ("G0", "b", 20, NOW, True)]


def test_a_later_exact_tenure_cuts_an_earlier_inferred_one() -> None:
    pods = pods_frame(pod("d", 50, finished=200), pod("c", 100, finished=300))

    out = build_tenures(pods, gpus_frame(n=1), assign(("c", "G0")), now_ms=NOW)

    assert held(out) == [("G0", "c", 100, 300, False), ("G0", "d", 50, 100, True)]


def test_overlapping_exact_tenures_later_start_wins() -> None:
    pods = pods_frame(pod("a", 0, finished=100), pod("b", 50, finished=150))

    out = build_tenures(pods, gpus_frame(), assign(("a", "G0"), ("b", "G0")), now_ms=NOW)

    assert held(out) == [("G0", "a", 0, 50, False), ("G0", "b", 50, 150, False)]


def test_mig_resources_draw_from_mig_instances_only() -> None:
    gpus = gpus_frame(n=2, mig={"MIG-b": "G0", "MIG-a": "G0"})
    pods = pods_frame(
        pod("m", 10, resource="nvidia.com/mig-1g.10gb"),
        pod("g", 20),
        pod("m2", 30, resource="nvidia.com/mig-1g.10gb"),
    )

    out = build_tenures(pods, gpus, assign(), now_ms=NOW)

    # G0 is carved into MIG-a and MIG-b: nobody can be given it whole
    assert held(out) == [
        ("G1", "g", 20, NOW, True),
        ("MIG-b", "m", 10, NOW, True),
        ("MIG-a", "m2", 30, NOW, True),
    ]


def test_not_enough_free_gpus_takes_what_is_free() -> None:
    pods = pods_frame(pod("a", 0, finished=100), pod("b", 10, count=2), pod("c", 20, count=2))

    out = build_tenures(pods, gpus_frame(n=2), assign(), now_ms=NOW)

    assert held(out) == [("G0", "a", 0, 100, True), ("G1", "b", 10, NOW, True)]


def test_pods_without_bound_time_or_node_or_length_hold_nothing() -> None:
    pods = pods_frame(
        pod("unbound", None),
        pod("nowhere", 10, node=None),
        pod("instant", 10, finished=10),
        pod("other-node", 10, node="n9"),
    )

    out = build_tenures(pods, gpus_frame(), assign(), now_ms=NOW)

    assert out.empty
    assert list(out.columns) == TENURE_COLUMNS


def test_exact_mapping_needs_no_node() -> None:
    pods = pods_frame(pod("a", 10, node=None))

    out = build_tenures(pods, gpus_frame(), assign(("a", "G2")), now_ms=NOW)

    assert held(out) == [("G2", "a", 10, NOW, False)]


def test_gang_defaults_to_the_pod_and_dtypes() -> None:
    pods = pods_frame(pod("a", 10, gang="job/x", count=2), pod("b", 20))

    out = build_tenures(pods, gpus_frame(), assign(), now_ms=NOW)

    assert list(out.columns) == TENURE_COLUMNS
    assert out["gang"].tolist() == ["job/x", "job/x", "b"]
    assert out["gpu"].tolist() == ["G0", "G1", "G2"]
    assert out["start_ms"].dtype == np.int64
    assert out["end_ms"].dtype == np.int64
    assert out["inferred"].dtype == bool


def test_a_pod_still_holding_at_now_is_not_released() -> None:
    pods = pods_frame(pod("a", 10, finished=50), pod("b", 60), pod("c", 5))
    out = build_tenures(pods, gpus_frame(n=2), assign(), now_ms=NOW)
    released = dict(zip(out["pod_uid"], out["released"], strict=True))
    assert released == {"c": False, "a": True, "b": False}
    # an open tenure cut short by a later exact tenure on its card has ended
    cut = build_tenures(
        pods_frame(pod("c", 5), pod("x", 30)), gpus_frame(n=1), assign(("x", "G0")), now_ms=NOW
    )
    assert dict(zip(cut["pod_uid"], cut["released"], strict=True)) == {"c": True, "x": False}
