"""Who held which GPU when (SPEC §2.2, §7): pod records → per-GPU tenures with a share.

A pod holds its GPUs from `bound_ms` until `min(finished_ms, deleted_ms)`, or until `now_ms`
while it still holds them. A pod without a bound time holds nothing; so does a pod whose
tenure would be empty, and a Run:ai reservation pod (a placeholder, never a tenant).

Each tenure holds a **share** of its card (SPEC §7): 1 for a whole card; for time-slicing
or MPS replicas, the pod's replicas on that card / the node's `nvidia.com/gpu.replicas`;
HAMi `gpucores`/100, else its memory / the card's memory, else unknown; a Run:ai fraction
or gpu-milli/1000 as asked. An unknown share is NaN (`share_estimated`): the classifier
splits the card equally among the tenants present. A MIG instance is a card of its own,
held whole (its weight as a part of the physical card is the classifier's,
`auditor.classify.shares`).

Which GPUs: the exact mapping (`assignments`, from pod-resources, dcgm labels, HAMi's
annotation or a DRA claim) wherever the pod has one (a DRA pod has no other: it asks for no
card of its own, so without one it holds nothing), on whatever node those GPUs are; its `share` or
`replicas` column, where set, gives the share on that card. Else the evidence the data
holds (`inferred` still): a Run:ai fraction pod is on the card of the reservation pod that
shares its `runai-gpu-group` label on its node (`GPU_GROUP`) — that card as the
reservation pod's exact mapping names it (pod-resources, dcgm labels), else as its
`run.ai/reserve_for_gpu_index` annotation does (a UUID, or an index on the node,
`GPU_NAMED`) — else on the card its own `runai-gpu` annotation names. Otherwise the
documented inference, node by node: pods in order of bound time (ties by namespace, then
name, then uid) take the GPUs of their node that have room at their bound time, those that
show memory use beginning early in the tenure first (`MemoryInUse`: a card or MIG instance
in use is held, an idle one likely not), then the lowest index. Room: a
whole card needs a card no tenure holds then; a share needs that much share left (tenures
of unknown share count as none); time-slicing replicas fill a card before moving to the
next; a pod of several cards (HAMi vGPUs) takes distinct cards. MIG resources
(`nvidia.com/mig-<profile>`) draw from the node's MIG instances of that profile (any
instance where profiles are unknown), anything else from the cards without a parent. Where
fewer have room than requested the pod takes those that have (possibly none): the
shortfall is bad data, and inventing a GPU would put time on a card nobody saw. A pod
without a node and without an exact mapping holds nothing. A pod listed twice counts once
(its first row). GPUs with no index sort after indexed ones, by UUID.

Finally, on each GPU, whole-card tenures that overlap (bad data) are cut: the later start
wins from its start and the earlier tenure ends there (at equal starts, an exact one beats
an inferred one, then the larger pod uid wins, deterministically). Shared tenures are not
cut: where their shares add up to more than the card, the classifier scales them. Empty
tenures are dropped.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

TENURE_COLUMNS = [
    "gpu",
    "pod_uid",
    "gang",
    "start_ms",
    "end_ms",
    "inferred",
    "released",
    "share",
    "share_estimated",
]
MIG_PREFIX = "nvidia.com/mig-"
RESERVATION = "runai-reservation"
"""`share_kind` of Run:ai's placeholder pods: they hold no share of anything."""
DRA = "dra"
"""`share_kind` of a pod whose GPUs come from its ResourceClaims: its `gpu_count` is what
they ask for (what it waits for), its cards only the claims' exact mapping."""
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
EPS = 1e-9
GPU_GROUP = "gpu_group"
"""Optional `pods` column: Run:ai's `runai-gpu-group` label, shared by a fraction pod and
the reservation pod holding its card."""
GPU_NAMED = "gpu_named"
"""Optional `pods` column: the card a Run:ai annotation names — `run.ai/reserve_for_gpu_index`
of a reservation pod, `runai-gpu` of a fraction pod: a GPU UUID, or an index on the node."""
ONSET_MS = 15 * 60_000
"""How early in a tenure memory use beginning on a card counts as the pod's (`MemoryInUse`)."""


@dataclass(frozen=True)
class MemoryInUse:
    """Per card (UUID), the sorted [first_ms, last_ms] spans its samples show memory in use,
    from `from_ms` on (no evidence before). Where a pod's placement is a guess, a card whose
    memory use begins in the tenure's first `ONSET_MS`, before the next pod of the node was
    bound, is preferred over one that shows none (memory use that begins after the next
    bind is that pod's; use under way at the bind is the previous tenant's); for the one pod
    of its node already bound when the evidence starts, a card in use from the start."""

    spans: Mapping[str, Sequence[tuple[int, int]]]
    from_ms: int

    @property
    def start(self) -> int:
        """Memory use beginning before this began before the evidence did."""
        return self.from_ms + EDGE_MS

    def begins(self, gpu: str, lo: int, hi: int) -> int | None:
        """The first start of memory use on `gpu` in [lo, hi), after the evidence starts."""
        spans = self.spans.get(gpu, ())
        i = bisect_left(spans, (lo, lo))
        if i < len(spans) and spans[i][0] < hi and spans[i][0] >= self.start:
            return spans[i][0]
        return None

    def from_start(self, gpu: str) -> bool:
        """Whether `gpu` is in use from where the evidence starts."""
        spans = self.spans.get(gpu, ())
        return bool(spans) and spans[0][0] < self.start


EDGE_MS = 2 * 60_000
"""Memory in use this close to where the evidence starts was in use before it."""
MEMORY_IN_USE_MIB = 100.0
"""Framebuffer used above this is a process on the card (an idle card or MIG instance
shows a few MiB)."""
MEMORY_MINUTE_MS = 60_000
"""Memory readings are taken per minute: its first and last reading in use."""


def memory_spans(minutes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """A card's `MemoryInUse` spans from its minutes in use, in time order (each minute's
    first and last reading with memory in use): minutes under two minutes apart are one."""
    spans: list[tuple[int, int]] = []
    for lo, hi in minutes:
        if spans and lo - spans[-1][1] <= 2 * MEMORY_MINUTE_MS:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return spans


def _num(value: Any) -> int | None:
    """An integer from a nullable cell, or None."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return int(value)


def _float(value: Any) -> float | None:
    """A finite positive float from a nullable cell, or None."""
    if value is None or value is pd.NA:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def _text(value: Any) -> str | None:
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def empty_tenures() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "gpu": pd.Series([], dtype=object),
            "pod_uid": pd.Series([], dtype=object),
            "gang": pd.Series([], dtype=object),
            "start_ms": pd.Series([], dtype=np.int64),
            "end_ms": pd.Series([], dtype=np.int64),
            "inferred": pd.Series([], dtype=bool),
            "released": pd.Series([], dtype=bool),
            "share": pd.Series([], dtype=np.float64),
            "share_estimated": pd.Series([], dtype=bool),
        }
    )


def _column(frame: pd.DataFrame, name: str) -> list[Any]:
    return frame[name].tolist() if name in frame.columns else [None] * len(frame)


def _node_gpus(gpus: pd.DataFrame) -> dict[tuple[str, bool], list[str]]:
    """Per (node, is MIG): GPU UUIDs in index order (no index last, then by UUID). A card
    carved into MIG instances is in neither pool: nobody can be given it whole."""
    out: dict[tuple[str, bool], list[tuple[int, int, str]]] = defaultdict(list)
    carved = {_text(p) for p in _column(gpus, "parent_uuid")} - {None}
    for uuid, node, index, parent in zip(
        gpus["uuid"].tolist(),
        gpus["node"].tolist(),
        gpus["gpu_index"].tolist(),
        _column(gpus, "parent_uuid"),
        strict=True,
    ):
        node_s, uuid_s = _text(node), _text(uuid)
        if node_s is None or uuid_s is None or uuid_s in carved:
            continue
        idx = _num(index)
        key = (0, idx, uuid_s) if idx is not None else (1, 0, uuid_s)
        out[(node_s, _text(parent) is not None)].append(key)
    return {k: [u for _, _, u in sorted(set(v))] for k, v in out.items()}


def _card_names(gpus: pd.DataFrame) -> Callable[[str | None, str | None], str | None]:
    """`card_of(text, node)`: the card a Run:ai annotation names — a known UUID, or an index
    of a card (no MIG instance) on `node` — or None."""
    known = {u for u in (_text(v) for v in gpus["uuid"].tolist()) if u is not None}
    by_index: dict[tuple[str, int], str] = {}
    for uuid, node, index, parent in zip(
        gpus["uuid"].tolist(),
        gpus["node"].tolist(),
        gpus["gpu_index"].tolist(),
        _column(gpus, "parent_uuid"),
        strict=True,
    ):
        idx, node_s = _num(index), _text(node)
        if idx is not None and node_s is not None and _text(parent) is None:
            by_index.setdefault((node_s, idx), str(uuid))

    def card_of(text: str | None, node: str | None) -> str | None:
        if text is None:
            return None
        if text in known:
            return text
        if node is not None and text.isascii() and text.isdigit():
            return by_index.get((node, int(text)))
        return None

    return card_of


def node_replicas(nodes: pd.DataFrame | None) -> dict[str, int]:
    """Per node, the time-slicing/MPS replicas per card its labels say (only where > 1)."""
    out: dict[str, int] = {}
    if nodes is None or len(nodes) == 0:
        return out
    for name, labels in zip(nodes["name"].tolist(), _column(nodes, "labels"), strict=True):
        if not isinstance(labels, dict):
            continue
        text = str(labels.get(REPLICAS_LABEL, "")).strip()
        if text.isdigit() and int(text) > 1:
            out[str(name)] = int(text)
    return out


class _Ask:
    """What one pod asks of each card: a share (NaN unknown), or replicas of 1/N."""

    def __init__(
        self, rec: Mapping[Hashable, Any], *, replicas: int | None, memory: dict[str, float]
    ) -> None:
        self.kind = _text(rec.get("share_kind"))
        resource = _text(rec.get("gpu_resource")) or "nvidia.com/gpu"
        self.mig = resource.startswith(MIG_PREFIX) or self.kind == "mig"
        self.profile = resource[len(MIG_PREFIX) :] if resource.startswith(MIG_PREFIX) else None
        self.count = _num(rec.get("gpu_count")) or 0
        self.share = _float(rec.get("gpu_share"))
        self.mem_share = _float(rec.get("gpu_mem_share"))
        self.mem_mib = _float(rec.get("gpu_mem_mib"))
        self.memory = memory
        self.replicas = replicas if not self.mig and self.share is None else None
        if self.kind is not None:
            self.replicas = None  # a HAMi/Run:ai/milli share is not a time-slicing replica

    def on(self, gpu: str) -> float:
        """The share of `gpu` one unit of the request holds (NaN where unknown)."""
        if self.mig:
            return 1.0
        if self.share is not None:
            return min(self.share, 1.0)
        if self.mem_share is not None:
            return min(self.mem_share, 1.0)
        if self.mem_mib is not None and self.memory.get(gpu):
            return min(self.mem_mib / self.memory[gpu], 1.0)
        if self.kind == "hami":
            return math.nan
        if self.replicas is not None:
            return 1.0 / self.replicas
        return 1.0


Span = tuple[int, int, float]


def _room(spans: list[Span], at: int) -> tuple[float, int]:
    """(share left, tenures present) of a card at `at`; drops spans over by then (pods are
    placed in bound order, so a span that has ended can never hold again)."""
    spans[:] = [s for s in spans if s[1] > at]
    present = [s for s in spans if s[0] <= at]
    used = sum(s[2] for s in present if not math.isnan(s[2]))
    return 1.0 - used, len(present)


def _place(
    ask: _Ask, cards: list[str], held: dict[str, list[Span]], at: int
) -> list[tuple[str, float]]:
    """First fit of a request on the cards in index order: (card, share) taken."""
    taken: list[tuple[str, float]] = []
    if ask.replicas is not None and ask.share is None:
        left = ask.count
        for gpu in cards:
            if left <= 0:
                break
            room, _ = _room(held[gpu], at)
            fits = min(left, math.floor(room * ask.replicas + EPS))
            if fits > 0:
                taken.append((gpu, fits / ask.replicas))
                left -= fits
        return taken
    for gpu in cards:
        if len(taken) >= ask.count:
            break
        room, present = _room(held[gpu], at)
        share = ask.on(gpu)
        if share >= 1.0 - EPS:
            ok = present == 0
        elif math.isnan(share):
            ok = room > EPS
        else:
            ok = room >= share - EPS
        if ok:
            taken.append((gpu, share))
    return taken


def _exact_share(ask: _Ask, gpu: str, *, share: Any, replicas: Any, cards: int) -> float:
    """The share of an exactly mapped card: as the source says, else as the pod asks."""
    given = _float(share)
    if given is not None:
        return min(given, 1.0)
    held = _num(replicas)
    if ask.replicas is not None:
        if held is not None and held > 0:
            return min(held / ask.replicas, 1.0)
        per_card = max(ask.count, 1) / max(cards, 1)
        return min(per_card / ask.replicas, 1.0)
    return ask.on(gpu)


def build_tenures(
    pods: pd.DataFrame,
    gpus: pd.DataFrame,
    assignments: pd.DataFrame,
    *,
    now_ms: int,
    nodes: pd.DataFrame | None = None,
    in_use: MemoryInUse | None = None,
) -> pd.DataFrame:
    """Tenures (gpu, pod_uid, gang, start_ms, end_ms, inferred, released, share,
    share_estimated), sorted by GPU and start. `released` is false for a pod still holding
    its GPUs at `now_ms`: its end is only where the data stops, so its last idle stretch is
    no teardown. `nodes` (name, labels) gives each node's time-slicing replicas; `in_use`,
    where given, the cards' memory in use that an inferred placement prefers."""
    exact: dict[str, list[tuple[str, Any, Any]]] = defaultdict(list)
    for pod_uid, gpu, share, replicas in zip(
        assignments["pod_uid"].tolist(),
        assignments["gpu_uuid"].tolist(),
        _column(assignments, "share"),
        _column(assignments, "replicas"),
        strict=True,
    ):
        p, g = _text(pod_uid), _text(gpu)
        if p is not None and g is not None and g not in [e[0] for e in exact[p]]:
            exact[p].append((g, share, replicas))
    replicas_of = node_replicas(nodes)
    memory = {
        str(u): float(m)
        for u, m in zip(gpus["uuid"].tolist(), _column(gpus, "memory_total_mib"), strict=True)
        if _float(m) is not None
    }
    profiles = {
        str(u): str(p)
        for u, p in zip(gpus["uuid"].tolist(), _column(gpus, "mig_profile"), strict=True)
        if _text(p) is not None
    }

    rows: list[tuple[str, str, str, int, int, bool, float]] = []
    held: dict[str, list[Span]] = defaultdict(list)
    waiting: list[tuple[int, str, str, str, str, str, int, _Ask, str | None, str | None]] = []
    reservations: list[tuple[str, str, str, int, int, str | None]] = []
    seen: set[str] = set()
    still_holding: set[str] = set()
    for rec in pods.to_dict("records"):
        uid = _text(rec.get("uid"))
        bound = _num(rec.get("bound_ms"))
        if uid is None or bound is None or uid in seen:
            continue
        seen.add(uid)
        ends = [
            t for t in (_num(rec.get("finished_ms")), _num(rec.get("deleted_ms"))) if t is not None
        ]
        end = min(ends) if ends else now_ms
        node = _text(rec.get("node"))
        group, named = _text(rec.get(GPU_GROUP)), _text(rec.get(GPU_NAMED))
        if _text(rec.get("share_kind")) == RESERVATION:
            if node is not None and group is not None:
                reservations.append((uid, node, group, bound, end, named))
            continue
        if not ends:
            still_holding.add(uid)
        if end <= bound:
            continue
        gang = _text(rec.get("gang")) or uid
        ask = _Ask(rec, replicas=replicas_of.get(node or ""), memory=memory)
        if uid in exact:
            for gpu, share, replicas in sorted(exact[uid], key=lambda e: e[0]):
                s = _exact_share(ask, gpu, share=share, replicas=replicas, cards=len(exact[uid]))
                rows.append((gpu, uid, gang, bound, end, False, s))
                held[gpu].append((bound, end, s))
            continue
        if node is None or ask.count <= 0 or ask.kind == DRA:
            continue  # a DRA pod holds what its claims gave it, never a guess
        waiting.append(
            (
                bound,
                _text(rec.get("namespace")) or "",
                _text(rec.get("name")) or "",
                uid,
                node,
                gang,
                end,
                ask,
                group,
                named,
            )
        )

    pools = _node_gpus(gpus)
    card_of = _card_names(gpus)
    reserved: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for uid, node, group, r_bound, r_end, named in reservations:
        held_cards: list[str | None] = [g for g, _, _ in exact.get(uid, [])]
        for g in held_cards or [card_of(named, node)]:
            if g is not None:
                reserved[(node, group)].append((r_bound, r_end, g))
    binds: dict[tuple[str, bool], list[int]] = defaultdict(list)
    early: dict[tuple[str, bool], int] = defaultdict(int)  # bound before the evidence starts
    for w in waiting:
        binds[(w[4], w[7].mig)].append(w[0])
        if in_use is not None and w[0] < in_use.start < w[6]:
            early[(w[4], w[7].mig)] += 1
    for v in binds.values():
        v.sort()

    def evidence(gpu: str, bound: int, node: str, mig: bool) -> bool:
        """Whether `gpu`'s memory use is this pod's (`MemoryInUse`)."""
        assert in_use is not None
        if bound < in_use.start and early[(node, mig)] == 1 and in_use.from_start(gpu):
            return True
        lo = max(bound, in_use.start)
        begins = in_use.begins(gpu, lo, lo + ONSET_MS)
        later = binds[(node, mig)]
        nxt = bisect_right(later, bound)
        return begins is not None and (nxt == len(later) or later[nxt] > begins)

    for bound, _ns, _name, uid, node, gang, end, ask, group, named in sorted(
        waiting, key=lambda w: w[:4]
    ):
        found: list[str | None] = [
            g
            for r_bound, r_end, g in sorted(reserved.get((node, group or ""), []))
            if r_bound < end and r_end > bound
        ]
        linked = [g for g in dict.fromkeys(found or [card_of(named, node)]) if g is not None]
        linked = linked[: max(ask.count, 1)]
        if linked and not ask.mig:  # Run:ai's own record of the card: before any guess
            for gpu in linked:
                rows.append((gpu, uid, gang, bound, end, True, ask.on(gpu)))
                held[gpu].append((bound, end, ask.on(gpu)))
            continue
        cards = pools.get((node, ask.mig), [])
        if ask.mig and ask.profile and any(g in profiles for g in cards):
            cards = [g for g in cards if profiles.get(g) == ask.profile]
        if in_use is not None:  # stable: index order among equals
            cards = sorted(cards, key=lambda g: not evidence(g, bound, node, ask.mig))
        for gpu, share in _place(ask, cards, held, bound):
            rows.append((gpu, uid, gang, bound, end, True, share))
            held[gpu].append((bound, end, share))

    if not rows:
        return empty_tenures()
    frame = pd.DataFrame(rows, columns=[*TENURE_COLUMNS[:6], "share"]).astype(
        {"gpu": object, "pod_uid": object, "gang": object, "share": np.float64}
    )
    # Later start wins; at equal starts exact beats inferred, then the larger uid.
    frame = frame.sort_values(
        ["gpu", "start_ms", "inferred", "pod_uid"],
        ascending=[True, True, False, True],
        kind="stable",
    ).reset_index(drop=True)
    whole = (frame["share"] >= 1.0 - EPS).to_numpy()
    ends_at = frame["end_ms"].to_numpy(dtype=np.int64).copy()
    at = np.flatnonzero(whole)
    if at.size > 1:  # whole-card claims on one card cannot overlap: the later start wins
        uuid = frame["gpu"].to_numpy(dtype=object)[at]
        starts = frame["start_ms"].to_numpy(dtype=np.int64)[at]
        same = uuid[1:] == uuid[:-1]
        ends_at[at[:-1]] = np.where(
            same, np.minimum(ends_at[at[:-1]], starts[1:]), ends_at[at[:-1]]
        )
    cut = ends_at < frame["end_ms"].to_numpy(dtype=np.int64)
    frame["end_ms"] = ends_at
    frame["released"] = ~frame["pod_uid"].isin(still_holding).to_numpy() | cut
    frame["share_estimated"] = frame["share"].isna()
    frame = frame[frame["end_ms"] > frame["start_ms"]].reset_index(drop=True)
    return frame.loc[:, TENURE_COLUMNS].astype(
        {"start_ms": np.int64, "end_ms": np.int64, "inferred": bool, "released": bool}
    )
