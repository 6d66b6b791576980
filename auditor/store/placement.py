"""The evidence an inferred GPU placement uses (`auditor.classify.tenures`), read from the
store: Run:ai's links between a fraction pod and the reservation pod holding its card (labels
and annotations of Run:ai pods only), and the memory in use of the cards a guess may land on
(one grouped pass over their samples, minute by minute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from auditor.classify.tenures import (
    GPU_GROUP,
    GPU_NAMED,
    MEMORY_IN_USE_MIB,
    MEMORY_MINUTE_MS,
    MemoryInUse,
    memory_spans,
)
from auditor.model import DEFAULT_CLUSTER
from auditor.store.keyscan import driver_cursor, merged_spans

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    import pandas as pd
    from sqlalchemy import Connection

RUNAI_GROUP_LABEL = "runai-gpu-group"
RUNAI_RESERVED_FOR = "run.ai/reserve_for_gpu_index"
"""A reservation pod's card: a GPU UUID (an index in older Run:ai releases)."""
RUNAI_GPU = "runai-gpu"
"""A fraction pod's card index on its node (older Run:ai releases)."""
BUCKET_MS = MEMORY_MINUTE_MS


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
    minutes of `window` its samples show memory in use, merged into spans.

    Only where a guess looks (`MemoryInUse.begins`, `from_start`): the evidence's first
    `EDGE_MS`, and around each guessed pod's bind on its node's cards, from `READ_BEFORE_MS`
    before it (where a span that would merge with one starting there lies) to `ONSET_MS`
    after. Spans starting inside those stretches are the ones a read of the whole window
    gives; the rest of a day of samples is not read."""
    import numpy as np
    import pandas as pd

    from auditor.classify.tenures import EDGE_MS, ONSET_MS

    exact = set(assignments["pod_uid"].dropna().astype(str))
    guessed = pods[~pods["uid"].astype(str).isin(exact) & pods["node"].notna()]
    nodes = set(guessed["node"].astype(str))
    cards = gpus[gpus["node"].astype(str).isin(nodes)]
    lo, hi = window
    first = lo + EDGE_MS
    stretches: dict[str, list[tuple[int, int]]] = {n: [(lo, first + BUCKET_MS)] for n in nodes}
    bound = pd.to_numeric(guessed["bound_ms"], errors="coerce")
    for node, at in zip(guessed["node"].astype(str), bound, strict=True):
        if not np.isnan(at):
            start = max(int(at), first)
            stretches[node].append((start - READ_BEFORE_MS, start + ONSET_MS))
    spans: dict[str, list[tuple[int, int]]] = {}
    ranges = {n: _minutes(v, lo=lo, hi=hi) for n, v in stretches.items()}
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    # per minute its first and last reading, grouped by the database: a twelfth of the rows
    # (at 5 s) reach Python, and the ranges are whole minutes, so no minute is split
    query = (
        f"SELECT MIN(ts_ms), MAX(ts_ms) FROM gpu_samples WHERE gpu_id = {mark}"
        f" AND ts_ms >= {mark} AND ts_ms < {mark} AND memory_used_mib > {mark}"
        f" GROUP BY ts_ms / {BUCKET_MS} ORDER BY 1"
    )
    cur = driver_cursor(conn)
    try:
        for uuid, gpu_id, node in zip(cards["uuid"], cards["id"], cards["node"], strict=True):
            minutes: list[tuple[int, int]] = []
            for a, b in ranges[str(node)]:
                cur.execute(query, (int(gpu_id), a, b, MEMORY_IN_USE_MIB))
                minutes += [(int(first), int(last)) for first, last in cur.fetchall()]
            if minutes:
                spans[str(uuid)] = memory_spans(minutes)
    finally:
        cur.close()
    return MemoryInUse(spans, from_ms=lo)


READ_BEFORE_MS = 3 * BUCKET_MS
"""Read this far before where a guess looks: memory in use up to two minutes before a
minute's first reading merges with it (one span), so a span's start is known only with the
minutes before it read."""


def _minutes(stretches: list[tuple[int, int]], *, lo: int, hi: int) -> list[tuple[int, int]]:
    """The stretches widened to whole minutes, merged, and cut to `[lo, hi)`."""
    whole = ((a // BUCKET_MS * BUCKET_MS, -(-b // BUCKET_MS) * BUCKET_MS) for a, b in stretches)
    return merged_spans(whole, lo=lo, hi=hi)


def held_tenures(
    conn: Connection,
    *,
    now_ms: int,
    window: tuple[int, int],
    on_nodes: Collection[str] | None = None,
    memory: Callable[[tuple[int, int]], MemoryInUse] | None = None,
    first_ms: int | None = None,
    cluster: str = DEFAULT_CLUSTER,
    pods: pd.DataFrame | None = None,
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
    cards' memory in use over an evidence window and `first_ms` the first sample's time.

    Everything is `cluster`'s (SPEC §11): its pods, cards, nodes and their evidence alone,
    so a cluster is placed as it would be in a store holding it alone. `pods`: its pods as
    `reads.read_pods` gives them, where the caller has read them already."""
    from auditor.classify.tenures import build_tenures
    from auditor.store import reads

    if pods is None:
        pods = reads.read_pods(conn, cluster=cluster)
    gpus = reads.read_gpus(conn, cluster=cluster)
    assignments = reads.read_assignments(conn, cluster=cluster)
    nodes = reads.read_nodes(conn, cluster=cluster)
    pods = with_runai_links(conn, pods)
    placed = pods if on_nodes is None else pods[pods["node"].isin(list(on_nodes))]
    evidence = evidence_window(
        conn, pods, assignments, window=window, first_ms=first_ms, cluster=cluster
    )
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
    cluster: str | None = None,
) -> tuple[int, int]:
    """The stretch whose memory readings a guessed placement may use: back to the bound
    time of the earliest guessed pod that holds a card in `window` (so a day's audit and
    the week's place a pod alike), but not before the first stored sample (of `cluster`'s
    cards)."""
    from auditor.store import reads

    exact = set(assignments["pod_uid"].dropna().astype(str))
    guessed = pods[~pods["uid"].astype(str).isin(exact) & pods["bound_ms"].notna()]
    ends = guessed[["finished_ms", "deleted_ms"]].min(axis=1)
    live = guessed[(guessed["bound_ms"] < window[1]) & ~(ends < window[0])]
    lo = window[0]
    if not live.empty:
        lo = min(lo, int(live["bound_ms"].min()) - ONSET_MARGIN_MS)
    span = reads.sample_span(conn, cluster=cluster) if first_ms is None else (first_ms, first_ms)
    if span is not None:
        lo = max(lo, int(span[0]))
    return lo, window[1]
