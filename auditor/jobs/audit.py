"""The audit job: classify a window in chunks of nodes (or one shard) and store the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor import __version__
from auditor.errors import InputError
from auditor.jobs.common import nulls, open_store
from auditor.settings import Thresholds

if TYPE_CHECKING:
    import pandas as pd


AUDIT_CHUNK_NODES = 8
"""Nodes classified together: memory follows this, not the fleet."""
READ_MARGIN_MS = 15 * 60_000
"""Samples read past the last tenure end: enough for any sane period's successor sample."""


@dataclass(frozen=True)
class AuditStats:
    run_id: int
    window: tuple[int, int]
    gpus: int
    samples: int
    tenures: int
    seconds: float


def data_window(url: str, *, period_s: float) -> tuple[int, int]:
    """The span of all stored samples, for an audit given no window."""
    from auditor.store.reads import sample_span

    engine = open_store(url)
    with engine.connect() as conn:
        span = sample_span(conn)
    if span is None:
        raise InputError("no GPU samples stored yet: import some first", field="window")
    return span[0], span[1] + int(period_s * 1000)


def shard_of(node: str, shards: int) -> int:
    """The shard a node belongs to: a stable hash, the same in every process and release."""
    import hashlib

    digest = hashlib.sha256(node.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def audit(
    url: str,
    *,
    window: tuple[int, int] | None,
    thresholds: Thresholds,
    shard: tuple[int, int] | None = None,
    chunk_nodes: int = AUDIT_CHUNK_NODES,
    now_ms: int | None = None,
) -> AuditStats:
    """Classify a window and store it as an audit run, replacing the runs it supersedes.

    The cards are classified in chunks of `chunk_nodes` nodes, each with the cards of its
    gangs on other nodes read as context, so memory follows the chunk, not the fleet. With
    `shard=(i, n)` only the nodes of shard i are audited; the n shards together store
    exactly what one unsharded run stores.
    """
    from auditor.classify.engine import Window, classify
    from auditor.classify.tenures import build_tenures
    from auditor.store import reads
    from auditor.store.writes import replace_audit_run

    started = time.perf_counter()
    if window is None:
        window = data_window(url, period_s=thresholds.default_period_s)
    start_ms, end_ms = window
    if end_ms <= start_ms:
        raise InputError("the audit window ends before it starts", field="--end")
    engine = open_store(url)
    result_rows: list[dict[str, object]] = []
    finding_rows: list[dict[str, object]] = []
    n_samples = n_gpus = 0
    with engine.connect() as conn:
        gpus = reads.read_gpus(conn)
        pods = reads.read_pods(conn)
        assignments = reads.read_assignments(conn)
        tenures = build_tenures(pods, gpus, assignments, now_ms=end_ms)
        # Whole tenures (SPEC §3): read from the first start to the last end of the tenures
        # that overlap the window, plus a margin so the last sample in range meets its
        # successor. The range is the same for every chunk and shard, so each card sees the
        # same data however the fleet is split.
        overlapping = tenures[(tenures["start_ms"] < end_ms) & (tenures["end_ms"] > start_ms)]
        lo = min(start_ms, int(overlapping["start_ms"].min())) if len(overlapping) else start_ms
        hi = max(end_ms, int(overlapping["end_ms"].max())) if len(overlapping) else end_ms
        hi += READ_MARGIN_MS
        gpu_ids = dict(zip(gpus["uuid"], gpus["id"], strict=True))
        first_card = tenures.groupby("gang")["gpu"].min()
        for own, context in audit_parts(gpus, tenures, shard=shard, chunk_nodes=chunk_nodes):
            part = tenures[tenures["gpu"].isin(context)]
            samples = reads.read_samples(
                conn, start_ms=lo, end_ms=hi, gpu_ids=[int(gpu_ids[u]) for u in sorted(context)]
            )
            result = classify(samples, part, window=Window(start_ms, end_ms), thresholds=thresholds)
            res = result.results[result.results["gpu"].isin(own)]
            # a finding about a whole gang (a checkpoint series) has no card: the part that
            # owns the gang's first card stores it, so it is stored once
            fnd = result.findings
            fnd = fnd[fnd["gpu"].fillna(fnd["gang"].map(first_card)).isin(own)]
            result_rows += _result_rows(res, part, gpu_ids)
            finding_rows += _finding_rows(fnd, gpu_ids)
            n_samples += int(samples["gpu"].isin(own).sum())
            n_gpus += len(own & set(samples["gpu"]))
    with engine.begin() as conn:
        run_id = replace_audit_run(
            conn,
            window=(start_ms, end_ms),
            shard="all" if shard is None else f"{shard[0]}/{shard[1]}",
            created_ms=now_ms if now_ms is not None else int(time.time() * 1000),
            thresholds=thresholds.as_dict(),
            version=__version__,
            results=result_rows,
            findings=finding_rows,
        )
    return AuditStats(
        run_id=run_id,
        window=(start_ms, end_ms),
        gpus=n_gpus,
        samples=n_samples,
        tenures=len(tenures),
        seconds=time.perf_counter() - started,
    )


def audit_parts(
    gpus: pd.DataFrame,
    tenures: pd.DataFrame,
    *,
    shard: tuple[int, int] | None,
    chunk_nodes: int,
) -> Iterator[tuple[set[str], set[str]]]:
    """(own cards, cards to read) per chunk of `chunk_nodes` nodes of the shard, in node order.

    The cards to read are the own cards and every card of their gangs, wherever it is.
    """
    nodes = sorted({str(n) for n in gpus["node"]})
    if shard is not None:
        nodes = [n for n in nodes if shard_of(n, shard[1]) == shard[0]]
    card_node = dict(zip(gpus["uuid"], gpus["node"].astype(str), strict=True))
    gang_cards = tenures.groupby("gang")["gpu"].agg(set)
    for i in range(0, len(nodes), max(1, chunk_nodes)):
        chunk = set(nodes[i : i + max(1, chunk_nodes)])
        own = {u for u, n in card_node.items() if n in chunk}
        gangs = set(tenures.loc[tenures["gpu"].isin(own), "gang"])
        context = set(own)
        for gang in gangs:
            context |= gang_cards[gang]
        yield own, context


def _result_rows(
    res: pd.DataFrame, tenures: pd.DataFrame, gpu_ids: dict[str, int]
) -> list[dict[str, object]]:
    inferred = {
        (g, p): bool(i)
        for g, p, i in zip(tenures["gpu"], tenures["pod_uid"], tenures["inferred"], strict=True)
    }
    return [
        {
            "gpu_id": int(gpu_ids[g]),
            "pod_uid": p,
            "category": c,
            "seconds": float(s),
            "inferred": inferred.get((g, p), False) if p is not None else False,
        }
        for g, p, c, s in zip(
            res["gpu"], nulls(res["pod_uid"]), res["category"], res["seconds"], strict=True
        )
    ]


def _finding_rows(fnd: pd.DataFrame, gpu_ids: dict[str, int]) -> list[dict[str, object]]:
    return [
        {
            "kind": k,
            "gang": gang,
            "gpu_id": None if g is None else int(gpu_ids[str(g)]),
            "pod_uid": p,
            "start_ms": None if a is None else int(str(a)),
            "end_ms": None if b is None else int(str(b)),
            "seconds": float(s),
            "detail": d,
        }
        for k, gang, g, p, a, b, s, d in zip(
            fnd["kind"], nulls(fnd["gang"]), nulls(fnd["gpu"]), nulls(fnd["pod_uid"]),
            nulls(fnd["start_ms"]), nulls(fnd["end_ms"]), fnd["seconds"], nulls(fnd["detail"]),
            strict=True,
        )
    ]  # fmt: skip
