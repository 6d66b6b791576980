"""Placement: a GPU-count scheduler over time, and the SPEC's first-fit GPU assignment.

The scheduler binds each gang at the earliest whole minute at which every pod finds a node
with enough free GPUs for its whole hold (a gang's pods on distinct nodes, all at once). Holds
are padded by `PAD_MS` on both sides, so a card is never re-bound within a minute of its
release and the first-fit rule never meets a tie between a release and a binding.

GPU indices then follow SPEC §2.2's inference rule exactly: on each node, pods in order of
binding (ties by namespace, then name) take the lowest-index GPUs free at that time. The
auditor infers the mapping from pod JSON with the same rule, so it finds the cards used here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.simulate.plan import Ending, GangPlan, PodPlan, Profile

PAD_MS = 30_000
NEVER = 2**62
"""Release time of a pod still holding its cards at the snapshot."""
END_MARGIN_MS = 10 * 60_000
"""A closed tenure ends at least this long before the snapshot; later ones stay open."""
OPEN_ACTIVE_MS = 30 * 60_000
"""A tenure still open at the snapshot has been active at least this long."""
EDGE_MS = 60_000


@dataclass(frozen=True, slots=True)
class _Timing:
    binds: list[int]
    releases: list[int | None]
    active_start: int | None
    active_end: int | None


class Occupancy:
    """GPUs held (padded) per node and second, from `origin_ms` to `end_ms`."""

    def __init__(self, *, nodes: int, gpus: int, origin_ms: int, end_ms: int) -> None:
        self.gpus = gpus
        self.origin_ms = origin_ms
        self.length = (end_ms - origin_ms) // 1000 + 1
        self.held = np.zeros((nodes, self.length), dtype=np.int16)

    def _index(self, t_ms: int) -> int:
        return int(min(max((t_ms - self.origin_ms) // 1000, 0), self.length))

    def fits(self, node: int, start_ms: int, end_ms: int, gpus: int) -> bool:
        a, b = self._index(start_ms), self._index(end_ms)
        peak = int(self.held[node, a:b].max()) if b > a else 0
        return peak + gpus <= self.gpus

    def at(self, node: int, t_ms: int) -> int:
        i = min(self._index(t_ms), self.length - 1)
        return int(self.held[node, i])

    def add(self, node: int, start_ms: int, end_ms: int, gpus: int) -> None:
        self.held[node, self._index(start_ms) : self._index(end_ms)] += gpus


def _timing(gang: GangPlan, t: int, *, now_ms: int, data_start_ms: int) -> _Timing | None:
    """Absolute times if the gang is placed at `t`; None where that would blur a rule."""
    binds = [t + p.bind_offset_s * 1000 for p in gang.pods]
    if gang.profile is Profile.UNUSED:
        assert gang.active_s is not None
        release = t + gang.active_s * 1000
        if release > now_ms - END_MARGIN_MS or t < data_start_ms:
            return None
        return _Timing(binds, [release] * len(binds), None, None)
    a_start = t + gang.startup_s * 1000
    a_end: int | None = None
    releases: list[int | None] = [None] * len(binds)
    if gang.active_s is not None:
        a_end = a_start + gang.active_s * 1000
        closed = [a_end + p.teardown_s * 1000 for p in gang.pods]
        if max(closed) <= now_ms - END_MARGIN_MS:
            releases = list(closed)
        elif any(p.ending is Ending.DELETE and p.teardown_s == 0 for p in gang.pods):
            return None  # a replaced replica cannot stay open
        else:
            a_end = None
    if a_end is None and a_start > now_ms - OPEN_ACTIVE_MS:
        return None
    if min(binds) < data_start_ms and a_start > data_start_ms - EDGE_MS:
        return None  # a startup the samplers saw only in part
    if a_end is not None and a_end < data_start_ms + EDGE_MS:
        return None  # over, or in teardown, before the samplers started
    return _Timing(binds, releases, a_start, a_end)


@dataclass(frozen=True, slots=True)
class Zone:
    """Around a planned sampler outage: only steady, single-node gangs may hold this node,
    and none of their tenure boundaries may fall inside."""

    node: int
    start_ms: int
    end_ms: int

    def allows(self, gang: GangPlan, pod: PodPlan, timing: _Timing, i: int) -> bool:
        release = timing.releases[i]
        end = NEVER if release is None else release + pod.grace_s * 1000 + PAD_MS
        if end <= self.start_ms or timing.binds[i] >= self.end_ms:
            return True
        if not gang.outage_safe:
            return False
        edges = (
            timing.binds[i],
            timing.binds[i] + pod.pull_s * 1000,
            timing.active_start,
            timing.active_end,
            release,
            None if release is None else end,
        )
        return not any(t is not None and self.start_ms <= t < self.end_ms for t in edges)


def _pick_nodes(
    gang: GangPlan, timing: _Timing, occ: Occupancy, zones: list[Zone]
) -> list[int] | None:
    chosen: list[int] = [-1] * len(gang.pods)
    order = sorted(range(len(gang.pods)), key=lambda i: -gang.pods[i].gpus)
    used: set[int] = set()
    for i in order:
        pod = gang.pods[i]
        start = timing.binds[i] - PAD_MS
        release = timing.releases[i]
        end = NEVER if release is None else release + PAD_MS
        nodes = [n for n in range(occ.held.shape[0]) if n not in used]
        sign = -1 if gang.pack else 1
        # Steady gangs go first to the nodes whose sampler will fail, so that the outage
        # hides held cards too (their team's `unobserved`), not only free ones.
        watched = {z.node for z in zones} if gang.outage_safe else set()
        nodes.sort(key=lambda n: (n not in watched, sign * occ.at(n, timing.binds[i]), n))
        for n in nodes:
            if not all(z.allows(gang, pod, timing, i) for z in zones if z.node == n):
                continue
            if occ.fits(n, start, end, pod.gpus):
                chosen[i] = n
                used.add(n)
                break
        else:
            return None
    return chosen


def _commit(gang: GangPlan, t: int, timing: _Timing, nodes: list[int], *, now_ms: int) -> None:
    gang.placed_ms = t
    gang.active_start_ms = timing.active_start
    gang.active_end_ms = timing.active_end
    for pod, node, bound, release in zip(
        gang.pods, nodes, timing.binds, timing.releases, strict=True
    ):
        pod.node = node
        pod.bound_ms = bound
        pod.created_ms = bound - (pod.queued_s + (t - gang.earliest_ms) // 1000) * 1000
        pod.started_ms = bound + pod.pull_s * 1000
        if release is None:
            pod.ending = Ending.OPEN
            continue
        if pod.ending is Ending.DELETE:
            pod.deleted_ms = release
            pod.finished_ms = release + pod.grace_s * 1000
            pod.main_finished_ms = pod.finished_ms
        elif pod.ending is Ending.SIDECAR:
            assert timing.active_end is not None
            pod.main_finished_ms = timing.active_end + 20_000
            pod.finished_ms = release
        else:
            pod.finished_ms = pod.main_finished_ms = release
            if pod.ttl_s and release + pod.ttl_s * 1000 <= now_ms:
                pod.deleted_ms = release + pod.ttl_s * 1000


def _place_one(
    gang: GangPlan,
    occ: Occupancy,
    *,
    now_ms: int,
    data_start_ms: int,
    zones: list[Zone],
    step_s: int,
) -> bool:
    """Bind the gang at the first whole minute from its earliest time that fits."""
    for j in range(gang.max_wait_s // step_s + 1):
        t = gang.earliest_ms + j * step_s * 1000
        if t > now_ms - OPEN_ACTIVE_MS:
            return False
        timing = _timing(gang, t, now_ms=now_ms, data_start_ms=data_start_ms)
        nodes = None if timing is None else _pick_nodes(gang, timing, occ, zones)
        if timing is None or nodes is None:
            continue
        for pod, node, bound, release in zip(
            gang.pods, nodes, timing.binds, timing.releases, strict=True
        ):
            occ.add(node, bound - PAD_MS, NEVER if release is None else release + PAD_MS, pod.gpus)
        _commit(gang, t, timing, nodes, now_ms=now_ms)
        return True
    return False


def place(
    gangs: list[GangPlan],
    occ: Occupancy,
    *,
    now_ms: int,
    data_start_ms: int,
    zones: list[Zone],
    step_s: int = 60,
) -> tuple[list[GangPlan], list[GangPlan]]:
    """Place gangs in the given order, keeping `zones` clear; returns (placed, dropped)."""
    placed: list[GangPlan] = []
    dropped: list[GangPlan] = []
    for gang in gangs:
        fits = _place_one(
            gang, occ, now_ms=now_ms, data_start_ms=data_start_ms, zones=zones, step_s=step_s
        )
        (placed if fits else dropped).append(gang)
    return placed, dropped


def first_fit(pods: list[PodPlan], *, gpus_per_node: int) -> None:
    """Assign GPU indices by SPEC §2.2's rule; raises if a node is ever over-committed."""
    by_node: dict[int, list[PodPlan]] = {}
    for pod in pods:
        by_node.setdefault(pod.node, []).append(pod)
    for node, node_pods in sorted(by_node.items()):
        held_until = [-NEVER] * gpus_per_node
        for pod in sorted(node_pods, key=lambda p: (p.bound_ms, p.namespace, p.name)):
            free = [i for i in range(gpus_per_node) if held_until[i] <= pod.bound_ms]
            if len(free) < pod.gpus:
                raise AssertionError(f"node {node} over-committed at {pod.bound_ms}")
            pod.gpu_indices = tuple(free[: pod.gpus])
            release = pod.released_ms
            for i in pod.gpu_indices:
                held_until[i] = NEVER if release is None else release
