"""The evidence an inferred GPU placement uses (`auditor.classify.tenures`), read from the
store: Run:ai's links between a fraction pod and the reservation pod holding its card (labels
and annotations of Run:ai pods only), and the memory in use of the cards a guess may land on
(one grouped pass over their samples, minute by minute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from auditor.classify.tenures import GPU_GROUP, GPU_NAMED, MemoryInUse

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    import pandas as pd
    from sqlalchemy import Connection

RUNAI_GROUP_LABEL = "runai-gpu-group"
RUNAI_RESERVED_FOR = "run.ai/reserve_for_gpu_index"
"""A reservation pod's card: a GPU UUID (an index in older Run:ai releases)."""
RUNAI_GPU = "runai-gpu"
"""A fraction pod's card index on its node (older Run:ai releases)."""
MEMORY_IN_USE_MIB = 100.0
"""Framebuffer used above this is a process on the card (an idle card or MIG instance
shows a few MiB)."""
BUCKET_MS = 60_000


def with_runai_links(conn: Connection, pods: pd.DataFrame) -> pd.DataFrame:
    """`pods` with `GPU_GROUP` and `GPU_NAMED` columns, from the labels and annotations of
    the Run:ai pods (fractions and reservation pods) the store holds."""
    from sqlalchemy import select

    from auditor.collect.shares import KIND_RESERVATION, KIND_RUNAI
    from auditor.store.schema import pods as pods_table

    stmt = select(pods_table.c.uid, pods_table.c.labels, pods_table.c.annotations).where(
        pods_table.c.share_kind.in_([KIND_RUNAI, KIND_RESERVATION])
    )
    group: dict[str, str] = {}
    named: dict[str, str] = {}
    for uid, marks, notes in conn.execute(stmt):
        if isinstance(marks, dict) and isinstance(marks.get(RUNAI_GROUP_LABEL), str):
            group[str(uid)] = marks[RUNAI_GROUP_LABEL]
        if isinstance(notes, dict):
            card = notes.get(RUNAI_RESERVED_FOR) or notes.get(RUNAI_GPU)
            if isinstance(card, str) and card:
                named[str(uid)] = card
    out = pods.copy()
    out[GPU_GROUP] = out["uid"].map(group)
    out[GPU_NAMED] = out["uid"].map(named)
    return out


def memory_in_use(
    conn: Connection,
    gpus: pd.DataFrame,
    pods: pd.DataFrame,
    assignments: pd.DataFrame,
    *,
    window: tuple[int, int],
) -> MemoryInUse:
    """Per card on a node where some pod's placement is a guess (no exact mapping), the
    minutes of `window` its samples show memory in use, merged into spans."""
    from sqlalchemy import func, select

    from auditor.store.schema import gpu_samples

    exact = set(assignments["pod_uid"].dropna().astype(str))
    guessed = pods[~pods["uid"].astype(str).isin(exact) & pods["node"].notna()]
    nodes = set(guessed["node"].astype(str))
    cards = gpus[gpus["node"].astype(str).isin(nodes)]
    uuid_of = {int(i): str(u) for u, i in zip(cards["uuid"], cards["id"], strict=True)}
    spans: dict[str, list[tuple[int, int]]] = {}
    ids = sorted(uuid_of)
    for at in range(0, len(ids), 500):
        minute = gpu_samples.c.ts_ms // BUCKET_MS
        stmt = (
            select(
                gpu_samples.c.gpu_id, func.min(gpu_samples.c.ts_ms), func.max(gpu_samples.c.ts_ms)
            )
            .where(
                gpu_samples.c.gpu_id.in_(ids[at : at + 500]),
                gpu_samples.c.ts_ms >= window[0],
                gpu_samples.c.ts_ms < window[1],
                gpu_samples.c.memory_used_mib > MEMORY_IN_USE_MIB,
            )
            .group_by(gpu_samples.c.gpu_id, minute)
            .order_by(gpu_samples.c.gpu_id, func.min(gpu_samples.c.ts_ms))
        )
        for gpu_id, lo, hi in conn.execute(stmt):
            card = spans.setdefault(uuid_of[int(gpu_id)], [])
            if card and int(lo) - card[-1][1] <= 2 * BUCKET_MS:
                card[-1] = (card[-1][0], int(hi))
            else:
                card.append((int(lo), int(hi)))
    return MemoryInUse(spans, from_ms=window[0])


def held_tenures(
    conn: Connection,
    *,
    now_ms: int,
    window: tuple[int, int],
    on_nodes: Collection[str] | None = None,
    memory: Callable[[tuple[int, int]], MemoryInUse] | None = None,
    first_ms: int | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(pods, gpus, tenures) as every reader of history places them: the stored exact
    mappings, then Run:ai's links and the cards' memory in use over `window`, then the
    documented first fit (`auditor.classify.tenures`). The audit, `explain` and `whatif`
    read holdings through this, so that they place every pod alike.

    `on_nodes`: only the tenures of pods on these nodes (every pod is still returned). A
    pod is placed among its own node's cards, from its node's pods and evidence alone (over
    the same evidence window), so its tenures are the same as with every node read; only
    those nodes' memory is read.

    Where the samples are not stored (an audit from the metrics store), `memory` gives the
    cards' memory in use over an evidence window and `first_ms` the first sample's time."""
    from auditor.classify.tenures import build_tenures
    from auditor.store import reads

    pods = reads.read_pods(conn)
    gpus = reads.read_gpus(conn)
    assignments = reads.read_assignments(conn)
    nodes = reads.read_nodes(conn)
    pods = with_runai_links(conn, pods)
    placed = pods if on_nodes is None else pods[pods["node"].isin(list(on_nodes))]
    evidence = evidence_window(conn, pods, assignments, window=window, first_ms=first_ms)
    in_use = (
        memory_in_use(conn, gpus, placed, assignments, window=evidence)
        if memory is None
        else memory(evidence)
    )
    tenures = build_tenures(placed, gpus, assignments, now_ms=now_ms, nodes=nodes, in_use=in_use)
    return pods, gpus, tenures


ONSET_MARGIN_MS = 15 * 60_000


def evidence_window(
    conn: Connection,
    pods: pd.DataFrame,
    assignments: pd.DataFrame,
    *,
    window: tuple[int, int],
    first_ms: int | None = None,
) -> tuple[int, int]:
    """The stretch whose memory readings a guessed placement may use: back to the bound
    time of the earliest guessed pod that holds a card in `window` (so a day's audit and
    the week's place a pod alike), but not before the first stored sample."""
    from auditor.store import reads

    exact = set(assignments["pod_uid"].dropna().astype(str))
    guessed = pods[~pods["uid"].astype(str).isin(exact) & pods["bound_ms"].notna()]
    ends = guessed[["finished_ms", "deleted_ms"]].min(axis=1)
    live = guessed[(guessed["bound_ms"] < window[1]) & ~(ends < window[0])]
    lo = window[0]
    if not live.empty:
        lo = min(lo, int(live["bound_ms"].min()) - ONSET_MARGIN_MS)
    span = reads.sample_span(conn) if first_ms is None else (first_ms, first_ms)
    if span is not None:
        lo = max(lo, int(span[0]))
    return lo, window[1]
