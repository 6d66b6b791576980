"""Why free cards sit free (SPEC §10), simulated: a cordoned node, the GPU pods that waited
unscheduled, and the ground truth of the causes inside `unallocated`.

**The cordon.** One node is cordoned (`spec.unschedulable`, the
`node.kubernetes.io/unschedulable` taint with its `timeAdded`) from a whole minute after the
last pod bound to it until the snapshot, so the schedule is the same with it as without:
nothing is bound there while it lasts, and what runs there keeps running. It begins after
the last waiting pod arrived, so every scheduler message the pods carry was true when it was
written. Its free cards in that stretch are `unavailable`.

**The waits.** A pod whose gang the scheduler could not place when it arrived waited
`Unschedulable` from its creation until it was bound (the watch stream `pods-watch.json`
shows it Pending, with the scheduler's message, the final `pods.json` bound); a pod never
placed waits until the snapshot (`pods.json` shows it Pending). At each instant at most the
cards the waiting pods asked for, among the free cards that can be given, are `blocked`; the
rest of the free time is `no_demand`. Every pod asks for the one kind of card the cluster has.

The truth (`free_cause_truth`) is computed from these stretches and the card's free pieces
of the category truth, not by the auditor's rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.model import WasteCategory
from auditor.simulate.plan import GangPlan, PodPlan
from auditor.simulate.truth import Pieces

CORDON_AFTER_BIND_MS = 5 * 60_000
"""The cordon begins at least this long after the node's last binding."""
CORDON_MIN_MS = 20 * 60_000
"""A cordon lasts at least this long before the snapshot."""


@dataclass(frozen=True, slots=True)
class Cordon:
    node: int
    start_ms: int
    """Until the snapshot (the node is still cordoned in `nodes.json`)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """A GPU pod waited unscheduled in [start_ms, end_ms) for `gpus` cards."""

    pod: PodPlan
    start_ms: int
    end_ms: int
    gpus: int
    bound: bool
    """It was bound at `end_ms` (else still Pending at the snapshot)."""


def plan_cordon(
    pods: list[PodPlan],
    *,
    nodes: int,
    gpus_per_node: int,
    window: tuple[int, int],
    not_before_ms: int,
) -> Cordon | None:
    """The node with the most free card time after its last binding and `not_before_ms`
    (module docstring)."""
    start_w, end = window
    best: tuple[float, int, int] | None = None
    for n in range(nodes):
        mine = [p for p in pods if p.node == n]
        last = max((p.bound_ms for p in mine), default=start_w)
        start = max(last + CORDON_AFTER_BIND_MS, start_w + (end - start_w) // 2, not_before_ms)
        start = -(-start // 60_000) * 60_000
        if end - start < CORDON_MIN_MS:
            continue
        held = 0.0
        for p in mine:
            release = end if p.released_ms is None else min(p.released_ms, end)
            held += p.gpus * max(0, release - max(p.bound_ms, start))
        free = gpus_per_node * (end - start) - held
        if best is None or free > best[0]:
            best = (free, n, start)
    return None if best is None or best[0] <= 0 else Cordon(best[1], best[2])


def plan_waits(
    pods: list[PodPlan], gang_of: list[GangPlan], pending: list[PodPlan], *, end_ms: int
) -> list[Wait]:
    """Pods that waited unscheduled: placed later than they arrived, or never."""
    waits = []
    for pod, gang in zip(pods, gang_of, strict=True):
        if gang.placed_ms is not None and gang.placed_ms > gang.earliest_ms:
            waits.append(Wait(pod, pod.created_ms, pod.bound_ms, pod.gpus, bound=True))
    for pod in pending:
        waits.append(Wait(pod, pod.created_ms, end_ms, pod.gpus, bound=False))
    return waits


def scheduler_message(
    wait_gpus: int, at_ms: int, *, pods: list[PodPlan], nodes: int, gpus_per_node: int,
    cordon: Cordon | None,
) -> str:  # fmt: skip
    """What kube-scheduler says of a pod asking `wait_gpus` cards at `at_ms`: per node
    why not (reasons sorted as the scheduler sorts them)."""
    reasons: dict[str, int] = {}
    for n in range(nodes):
        held = sum(
            p.gpus
            for p in pods
            if p.node == n
            and p.bound_ms <= at_ms
            and (p.released_ms is None or p.released_ms > at_ms)
        )
        if cordon is not None and cordon.node == n and at_ms >= cordon.start_ms:
            why = "node(s) were unschedulable"
        elif gpus_per_node - held < wait_gpus:
            why = "Insufficient nvidia.com/gpu"
        else:
            why = "node(s) didn't match pod topology spread constraints"
        reasons[why] = reasons.get(why, 0) + 1
    found = ", ".join(sorted(f"{k} {why}" for why, k in reasons.items()))
    helpless = sum(k for why, k in reasons.items() if not why.startswith("Insufficient"))
    victims = nodes - helpless
    preempt = [f"{helpless} Preemption is not helpful for scheduling"] if helpless else []
    preempt += [f"{victims} No preemption victims found for incoming pod"] if victims else []
    return (
        f"0/{nodes} nodes are available: {found}. preemption: 0/{nodes} nodes are available: "
        f"{', '.join(sorted(preempt))}."
    )


def free_cause_truth(
    *,
    pieces: list[Pieces],
    gpus_per_node: int,
    cordon: Cordon | None,
    waits: list[Wait],
    window: tuple[int, int],
) -> dict[str, float]:
    """Seconds per cause of every card's `unallocated` time (module docstring)."""
    lo, hi = window
    unavailable = 0.0
    total = 0.0
    a_list: list[np.ndarray] = []
    b_list: list[np.ndarray] = []
    for c, got in enumerate(pieces):
        free = got.of(WasteCategory.UNALLOCATED)
        a = free.start_ms.astype(np.float64)
        b = a + free.length_ms
        total += float(free.seconds.sum())
        if cordon is not None and c // gpus_per_node == cordon.node:
            cut = np.clip(cordon.start_ms, a, b)
            unavailable += float(((b - cut) / 1000.0).sum())
            b = cut
        a_list.append(a)
        b_list.append(b)
    a = np.concatenate(a_list)
    b = np.concatenate(b_list)
    keep = b > a
    a, b = a[keep], b[keep]
    wa = np.array([max(lo, w.start_ms) for w in waits], dtype=np.float64)
    wb = np.array([min(hi, w.end_ms) for w in waits], dtype=np.float64)
    wg = np.array([w.gpus for w in waits], dtype=np.float64)
    ok = wb > wa
    wa, wb, wg = wa[ok], wb[ok], wg[ok]
    edges = np.unique(np.concatenate([a, b, wa, wb]))
    free_n = np.zeros(edges.size)
    np.add.at(free_n, np.searchsorted(edges, a), 1.0)
    np.add.at(free_n, np.searchsorted(edges, b), -1.0)
    asked = np.zeros(edges.size)
    np.add.at(asked, np.searchsorted(edges, wa), wg)
    np.add.at(asked, np.searchsorted(edges, wb), -wg)
    f = np.cumsum(free_n)[:-1]
    d = np.cumsum(asked)[:-1]
    blocked = float((np.minimum(f, d) * np.diff(edges)).sum() / 1000.0)
    return {
        "unavailable": unavailable,
        "blocked": blocked,
        "no_demand": total - unavailable - blocked,
    }
