"""Who held which GPU when (SPEC §2.2): pod records → per-GPU tenures.

A pod holds its GPUs from `bound_ms` until `min(finished_ms, deleted_ms)`, or until `now_ms`
while it still holds them. A pod without a bound time holds nothing; so does a pod whose
tenure would be empty.

Which GPUs: the exact mapping (`assignments`, from pod-resources or dcgm labels) wherever the
pod has one, on whatever node those GPUs are. Otherwise the documented inference, node by
node: pods in order of bound time (ties by namespace, then name, then uid) each take the
lowest-index GPUs of their node that are free at their bound time, `gpu_count` of them. Free
means not held at that instant by any other tenure, exact or inferred earlier. MIG
resources (`nvidia.com/mig-*`) draw from the node's GPUs that have a parent (MIG instances),
anything else from those without. Where fewer are free than requested the pod takes those
that are free (possibly none): the shortfall is bad data, and inventing a GPU would put
time on a card nobody saw. A pod without a node and without an exact mapping holds
nothing. A pod listed twice counts once (its first row).
GPUs with no index sort after indexed ones, by UUID.

Finally, on each GPU, tenures that overlap (bad data) are cut: the later start wins from its
start and the earlier tenure ends there (at equal starts, an exact one beats an inferred one,
then the larger pod uid wins, deterministically). Empty tenures are dropped.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

TENURE_COLUMNS = ["gpu", "pod_uid", "gang", "start_ms", "end_ms", "inferred", "released"]
MIG_PREFIX = "nvidia.com/mig-"


def _num(value: Any) -> int | None:
    """An integer from a nullable cell, or None."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return int(value)


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
        }
    )


def _node_gpus(gpus: pd.DataFrame) -> dict[tuple[str, bool], list[str]]:
    """Per (node, is MIG): GPU UUIDs in index order (no index last, then by UUID)."""
    out: dict[tuple[str, bool], list[tuple[int, int, str]]] = defaultdict(list)
    for uuid, node, index, parent in zip(
        gpus["uuid"].tolist(),
        gpus["node"].tolist(),
        gpus["gpu_index"].tolist(),
        gpus["parent_uuid"].tolist() if "parent_uuid" in gpus.columns else [None] * len(gpus),
        strict=True,
    ):
        node_s, uuid_s = _text(node), _text(uuid)
        if node_s is None or uuid_s is None:
            continue
        idx = _num(index)
        key = (0, idx, uuid_s) if idx is not None else (1, 0, uuid_s)
        out[(node_s, _text(parent) is not None)].append(key)
    return {k: [u for _, _, u in sorted(set(v))] for k, v in out.items()}


def _free(spans: list[tuple[int, int]], at: int) -> bool:
    """Whether no span holds the GPU at `at`; drops spans over by then (pods are placed in
    bound order, so a span that has ended can never hold again)."""
    spans[:] = [(start, end) for start, end in spans if end > at]
    return not any(start <= at for start, _ in spans)


def build_tenures(
    pods: pd.DataFrame, gpus: pd.DataFrame, assignments: pd.DataFrame, *, now_ms: int
) -> pd.DataFrame:
    """Tenures (gpu, pod_uid, gang, start_ms, end_ms, inferred, released), sorted by GPU
    and start. `released` is false for a pod still holding its GPUs at `now_ms`: its end is
    only where the data stops, so its last idle stretch is no teardown."""
    exact: dict[str, list[str]] = defaultdict(list)
    for pod_uid, gpu in zip(
        assignments["pod_uid"].tolist(), assignments["gpu_uuid"].tolist(), strict=True
    ):
        p, g = _text(pod_uid), _text(gpu)
        if p is not None and g is not None and g not in exact[p]:
            exact[p].append(g)

    rows: list[tuple[str, str, str, int, int, bool]] = []
    held: dict[str, list[tuple[int, int]]] = defaultdict(list)
    waiting: list[tuple[int, str, str, str, str, str, int, bool, int]] = []
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
        if not ends:
            still_holding.add(uid)
        end = min(ends) if ends else now_ms
        if end <= bound:
            continue
        gang = _text(rec.get("gang")) or uid
        if uid in exact:
            for gpu in sorted(exact[uid]):
                rows.append((gpu, uid, gang, bound, end, False))
                held[gpu].append((bound, end))
            continue
        node = _text(rec.get("node"))
        count = _num(rec.get("gpu_count")) or 0
        if node is None or count <= 0:
            continue
        resource = _text(rec.get("gpu_resource")) or "nvidia.com/gpu"
        waiting.append(
            (
                bound,
                _text(rec.get("namespace")) or "",
                _text(rec.get("name")) or "",
                uid,
                node,
                gang,
                end,
                resource.startswith(MIG_PREFIX),
                count,
            )
        )

    pools = _node_gpus(gpus)
    for bound, _ns, _name, uid, node, gang, end, mig, count in sorted(waiting):
        free = [g for g in pools.get((node, mig), []) if _free(held[g], bound)]
        for gpu in free[:count]:
            rows.append((gpu, uid, gang, bound, end, True))
            held[gpu].append((bound, end))

    if not rows:
        return empty_tenures()
    frame = pd.DataFrame(rows, columns=TENURE_COLUMNS[:-1]).astype(
        {"gpu": object, "pod_uid": object, "gang": object}
    )
    # Later start wins; at equal starts exact beats inferred, then the larger uid.
    frame = frame.sort_values(
        ["gpu", "start_ms", "inferred", "pod_uid"],
        ascending=[True, True, False, True],
        kind="stable",
    ).reset_index(drop=True)
    uuid = frame["gpu"].to_numpy(dtype=object)
    starts = frame["start_ms"].to_numpy(dtype=np.int64)
    ends_at = frame["end_ms"].to_numpy(dtype=np.int64).copy()
    if len(frame) > 1:
        same = uuid[1:] == uuid[:-1]
        ends_at[:-1] = np.where(same, np.minimum(ends_at[:-1], starts[1:]), ends_at[:-1])
    cut = ends_at < frame["end_ms"].to_numpy(dtype=np.int64)
    frame["end_ms"] = ends_at
    frame["released"] = ~frame["pod_uid"].isin(still_holding).to_numpy() | cut
    frame = frame[frame["end_ms"] > frame["start_ms"]].reset_index(drop=True)
    return frame.astype(
        {"start_ms": np.int64, "end_ms": np.int64, "inferred": bool, "released": bool}
    )
