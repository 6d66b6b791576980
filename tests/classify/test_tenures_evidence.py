"""Placement guesses use the evidence in the data before the first-fit rule (SPEC §2.2, §7).

Decision table through `build_tenures`: a Run:ai fraction pod is on the card of the
reservation pod sharing its `runai-gpu-group` label (that card named by the reservation
pod's exact mapping, else its `run.ai/reserve_for_gpu_index` annotation), else on the card
its own `runai-gpu` annotation names; where a guess remains, a card or MIG instance that
shows memory in use early in the tenure wins over an idle one, then the lowest index.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from auditor.classify.tenures import GPU_GROUP, GPU_NAMED, MemoryInUse, build_tenures

NOW = 3_600_000
MIN = 60_000
DAY = 86_400_000


def pod(uid: str, *, node: str = "n1", bound: int = 0, **more: Any) -> dict[str, Any]:
    return {
        "uid": uid,
        "namespace": more.pop("ns", "team-a"),
        "name": uid,
        "node": node,
        "gang": None,
        "gpu_count": more.pop("count", 1),
        "gpu_resource": more.pop("resource", "nvidia.com/gpu"),
        "bound_ms": bound,
        "finished_ms": None,
        "deleted_ms": None,
        "share_kind": more.pop("kind", None),
        "gpu_share": more.pop("share", None),
        GPU_GROUP: more.pop("group", None),
        GPU_NAMED: more.pop("named", None),
    }


def fraction(uid: str, **more: Any) -> dict[str, Any]:
    return pod(uid, kind="runai", share=0.5, **more)


def reservation(uid: str, **more: Any) -> dict[str, Any]:
    return pod(uid, ns="runai-reservation", kind="runai-reservation", count=0, **more)


def frame(*rows: dict[str, Any]) -> pd.DataFrame:
    out = pd.DataFrame(list(rows))
    for col in ("bound_ms", "finished_ms", "deleted_ms", "gpu_count"):
        out[col] = out[col].astype("Int64")
    return out


CARDS = pd.DataFrame(
    [{"uuid": f"GPU-{i}", "node": "n1", "gpu_index": i, "parent_uuid": None} for i in range(4)]
)
MIG = pd.DataFrame(
    [{"uuid": "GPU-P", "node": "n1", "gpu_index": 0, "parent_uuid": None}]
    + [
        {
            "uuid": f"GPU-P/gi{g}",
            "node": "n1",
            "gpu_index": 0,
            "parent_uuid": "GPU-P",
            "mig_profile": "1g.5gb",
        }
        for g in (7, 8)
    ]
)


def assign(*pairs: tuple[str, str]) -> pd.DataFrame:
    return pd.DataFrame(list(pairs), columns=["pod_uid", "gpu_uuid"])


def placed(out: pd.DataFrame, uid: str) -> list[str]:
    return sorted(out.loc[out["pod_uid"] == uid, "gpu"])


BUSY_2 = MemoryInUse({"GPU-2": [(0, NOW)]}, from_ms=0)
LATE_2 = MemoryInUse({"GPU-2": [(40 * MIN, NOW)]}, from_ms=0)
LETTING_GO_2 = MemoryInUse({"GPU-2": [(0, 10 * MIN + 30_000)]}, from_ms=0)
F = fraction("f", group="g1")
R = reservation("r", group="g1")
R3 = reservation("r", group="g1", named="GPU-3")
GONE = {**R3, "deleted_ms": 5 * MIN}


@pytest.mark.parametrize(
    ("pods", "assignments", "memory", "expected"),
    [
        # the reservation pod's card from its dcgm labels / pod-resources (exact mapping)
        ([F, R], [("r", "GPU-2")], None, ["GPU-2"]),
        # ... else from its run.ai/reserve_for_gpu_index annotation: a UUID
        ([F, R3], [], None, ["GPU-3"]),
        # ... or an index on its node
        ([F, reservation("r", group="g1", named="1")], [], None, ["GPU-1"]),
        # another group's reservation pod is no evidence: first fit
        ([F, reservation("r", group="g2", named="GPU-3")], [], None, ["GPU-0"]),
        # a reservation pod on another node is no evidence
        ([F, reservation("r", group="g1", node="n2", named="GPU-3")], [], None, ["GPU-0"]),
        # a reservation pod gone before the fraction pod came is no evidence
        ([fraction("f", group="g1", bound=10 * MIN), GONE], [], None, ["GPU-0"]),
        # the fraction pod's own runai-gpu annotation
        ([fraction("f", named="2")], [], None, ["GPU-2"]),
        # the fraction pod's own exact mapping beats all of it
        ([F, R3], [("f", "GPU-1")], None, ["GPU-1"]),
        # no Run:ai evidence: the card showing memory in use beats the idle lower index
        ([fraction("f")], [], BUSY_2, ["GPU-2"]),
        ([pod("w")], [], BUSY_2, ["GPU-2"]),
        # ... unless it has no room (another pod holds it whole)
        ([pod("w"), pod("x", bound=0)], [("x", "GPU-2")], BUSY_2, ["GPU-0"]),
        # Run:ai evidence beats memory
        ([F, R3], [], BUSY_2, ["GPU-3"]),
        # memory in use only long after the bind is another pod's, no evidence
        ([pod("w")], [], LATE_2, ["GPU-0"]),
        # memory use beginning after the next pod's bind is that pod's
        (
            [pod("w"), pod("v", bound=5 * MIN)],
            [],
            MemoryInUse({"GPU-2": [(6 * MIN, NOW)]}, 0),
            ["GPU-0"],
        ),
        (
            [pod("v", bound=5 * MIN), pod("w")],
            [],
            MemoryInUse({"GPU-2": [(6 * MIN, NOW)]}, 0),
            ["GPU-2"],
        ),
        # memory in use until the bind is the previous tenant letting go
        ([pod("w", bound=10 * MIN)], [], LETTING_GO_2, ["GPU-0"]),
        # the one pod bound before the evidence starts: a card in use from the start
        ([pod("w", bound=-86_400_000)], [], BUSY_2, ["GPU-2"]),
        # ... not where two were: which one is a guess
        ([pod("w", bound=-DAY), pod("v", bound=-DAY + 1)], [], BUSY_2, ["GPU-0"]),
    ],
)
def test_evidence_before_first_fit(
    pods: list[dict[str, Any]],
    assignments: list[tuple[str, str]],
    memory: MemoryInUse | None,
    expected: list[str],
) -> None:
    out = build_tenures(frame(*pods), CARDS, assign(*assignments), now_ms=NOW, in_use=memory)
    uid = pods[0]["uid"]
    assert placed(out, uid) == expected
    assert bool(out.loc[out["pod_uid"] == uid, "inferred"].all()) == (
        (uid, expected[0]) not in assignments
    )
    assert "r" not in set(out["pod_uid"])  # a reservation pod is never a tenant


def test_a_mig_pod_goes_to_the_instance_showing_memory_in_use() -> None:
    """Run:ai `1g.5gb`: gi8 shows 4.4 GB used, gi7 none; first fit would say gi7."""
    pods = frame(pod("m", resource="nvidia.com/mig-1g.5gb", kind="mig"))
    first_fit = build_tenures(pods, MIG, assign(), now_ms=NOW)
    memory = MemoryInUse({"GPU-P/gi8": [(3 * MIN, NOW)]}, from_ms=0)
    out = build_tenures(pods, MIG, assign(), now_ms=NOW, in_use=memory)
    assert placed(first_fit, "m") == ["GPU-P/gi7"]
    assert placed(out, "m") == ["GPU-P/gi8"]


def test_two_fraction_pods_of_one_group_share_the_reserved_card() -> None:
    pods = frame(
        fraction("f1", group="g1"),
        fraction("f2", group="g1", bound=MIN),
        reservation("r", group="g1"),
    )
    out = build_tenures(pods, CARDS, assign(("r", "GPU-3")), now_ms=NOW)
    assert placed(out, "f1") == placed(out, "f2") == ["GPU-3"]
    assert out.loc[out["gpu"] == "GPU-3", "share"].tolist() == [0.5, 0.5]
