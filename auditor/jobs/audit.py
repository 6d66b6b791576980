"""The audit job: classify a window in chunks of nodes (or one shard) and store the run."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor import __version__
from auditor.errors import InputError
from auditor.jobs.audit_chunks import (
    AuditPlan,
    ChunkRows,
    SampleReader,
    cause_rows,
    in_process,
)
from auditor.jobs.common import one_cluster, open_store
from auditor.jobs.parts import (
    AUDIT_CHUNK_SAMPLES,
    MIN_CHUNKS,
    READ_MARGIN_MS,
    card_ranges,
    chunks,
    part_costs,
    planned_cost,
)
from auditor.jobs.workers import in_workers, workers_for
from auditor.model import DEFAULT_CLUSTER, Window
from auditor.settings import Thresholds

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pandas as pd
    from sqlalchemy import Connection, Engine

    from auditor.classify.tenures import MemoryInUse


@dataclass(frozen=True)
class SampleSource:
    """Where an audit's samples come from when they are not stored (`auditor audit
    --samples-from`): the span they cover, each card's memory in use over an evidence
    window, and the samples of cards over their ranges, as `read_card_samples` returns them."""

    span: Window | None
    """First sample to the end of the last one's coverage; None: no samples."""
    memory: Callable[[tuple[int, int]], MemoryInUse]
    samples: SampleReader


@dataclass(frozen=True)
class AuditStats:
    run_id: int
    window: Window
    cluster: str
    gpus: int
    samples: int
    tenures: int
    seconds: float
    workers: int = 1
    """Processes that read and classified its chunks (1: this one alone)."""


def data_window(url: str, *, period_s: float, cluster: str | None = None) -> Window:
    """The span of all stored samples (of `cluster`'s cards), raw or rolled up, for an audit
    given no window."""
    engine = open_store(url)
    try:
        with engine.connect() as conn:
            found = _data_span(conn, period_s=period_s, cluster=cluster)
    finally:
        engine.dispose()
    if found is None:
        raise InputError("no GPU samples stored yet: import some first", field="window")
    return found


def _data_span(conn: Connection, *, period_s: float, cluster: str | None) -> Window | None:
    """From the first stored sample (raw or rolled up, of `cluster`'s cards) to the end of
    the last one's coverage; None for a store without samples."""
    from auditor.store.reads import sample_span
    from auditor.store.rollup import rollup_span

    raw, rolled = sample_span(conn, cluster=cluster), rollup_span(conn, cluster=cluster)
    if raw is None and rolled is None:
        return None
    spans = [s for s in (raw, rolled) if s is not None]
    end = max(raw[1] + int(period_s * 1000) if raw else 0, rolled[1] if rolled else 0)
    return Window(min(s[0] for s in spans), end)


def audit(
    url: str,
    *,
    window: tuple[int, int] | None,
    thresholds: Thresholds,
    shard: tuple[int, int] | None = None,
    chunk_samples: int = AUDIT_CHUNK_SAMPLES,
    min_chunks: int = MIN_CHUNKS,
    now_ms: int | None = None,
    cluster: str | None = None,
    workers: int | None = None,
) -> AuditStats:
    """Classify a window of one cluster and store it as an audit run, replacing the runs it
    supersedes.

    `cluster`: the cluster audited (SPEC §11); None for the one the store holds (an error
    naming them where it holds several: `audit_clusters` audits each). A run reads only its
    cluster's cards, pods, nodes and waits, so it is what a store holding that cluster alone
    would store.

    Whole nodes are classified together, each chunk with the cards of its gangs on other
    nodes read as context, as many nodes per chunk as keep its samples within
    `chunk_samples`: a longer window means fewer nodes per chunk, so memory follows the
    chunk, not the fleet or the window. A fleet within fewer than `min_chunks` chunks is
    cut into that many where its nodes allow, so that reading the next chunk overlaps
    classifying this one. With `shard=(i, n)` only the nodes of shard i are
    audited; the n shards together store exactly what one unsharded run stores. Free time
    is split once every chunk's is known (each keeps it folded, `free_shares`), and where
    pods waited each shard keeps its shares in the store: the shard that completes the
    window's set splits them all at once (`auditor.store.free_split`).

    `workers`: processes that read and classify chunks side by side (None: one per usable
    CPU, once the audit plans to read `workers.PARALLEL_MIN_SAMPLES` or more; 1: all in
    this process). The rows stored are the same whatever the number.
    """
    started = time.perf_counter()
    if cluster is None:
        cluster = only_cluster(url)
    if window is None:
        window = data_window(url, period_s=thresholds.default_period_s, cluster=cluster)
    start_ms, end_ms = window
    if end_ms <= start_ms:
        raise InputError("the audit window ends before it starts", field="--end")
    audited = Window(start_ms, end_ms)
    engine = open_store(url)
    try:
        return _audit(
            cluster,
            engine,
            audited,
            thresholds=thresholds,
            shard=shard,
            chunk_samples=chunk_samples,
            min_chunks=min_chunks,
            now_ms=now_ms,
            started=started,
            workers=workers,
        )
    finally:
        engine.dispose()  # a service auditing now and then keeps no connections open


def stored_clusters(url: str) -> list[str]:
    """The clusters the store holds cards, pods or nodes of, sorted; [DEFAULT_CLUSTER] for an
    empty store."""
    from auditor.store.reads import clusters

    engine = open_store(url)
    try:
        with engine.connect() as conn:
            return clusters(conn) or [DEFAULT_CLUSTER]
    finally:
        engine.dispose()


def only_cluster(url: str) -> str:
    """The one cluster the store holds; an error naming them where it holds several."""
    return one_cluster(stored_clusters(url), what="the store")


def audit_clusters(
    url: str,
    *,
    window: tuple[int, int] | None,
    thresholds: Thresholds,
    shard: tuple[int, int] | None = None,
    chunk_samples: int = AUDIT_CHUNK_SAMPLES,
    now_ms: int | None = None,
    workers: int | None = None,
) -> list[AuditStats]:
    """`audit` of every cluster the store holds, one run each, in name order. Without a
    window, each cluster's over its own samples."""
    return [
        audit(
            url,
            window=window,
            thresholds=thresholds,
            shard=shard,
            chunk_samples=chunk_samples,
            now_ms=now_ms,
            cluster=name,
            workers=workers,
        )
        for name in stored_clusters(url)
    ]


def _audit(
    cluster: str,
    engine: Engine,
    audited: Window,
    *,
    thresholds: Thresholds,
    shard: tuple[int, int] | None,
    chunk_samples: int,
    now_ms: int | None,
    started: float,
    source: SampleSource | None = None,
    min_chunks: int = MIN_CHUNKS,
    workers: int | None = None,
) -> AuditStats:
    """The audit of `cluster` over `audited` on `engine`; samples from the store, else from
    `source`."""
    import pandas as pd

    from auditor.classify.causes import free_cause_frame
    from auditor.classify.free_time import card_maps, keyed_demand, split_free
    from auditor.store import reads
    from auditor.store.demand import read_demand
    from auditor.store.free_split import keep_free_shares, settle_free_split
    from auditor.store.placement import held_tenures
    from auditor.store.signals import read_node_outages, write_cause_rows
    from auditor.store.work_done import write_sm_rows
    from auditor.store.writes import replace_audit_run

    end_ms = audited.end_ms
    result_rows: list[dict[str, object]] = []
    finding_rows: list[dict[str, object]] = []
    sm_rows: list[dict[str, object]] = []
    causes: list[dict[str, object]] = []
    free_kept: list[pd.DataFrame] = []
    n_samples = n_gpus = 0
    rolled = 0.0
    with engine.connect() as conn:
        # A pod still holding its card holds it to where the data ends, not to where this
        # window does (SPEC §3 "Whole tenures"): its idle tail crossing the window's end is
        # one run, the same in every window that cuts it. `now` lies past every card's last
        # coverage, so the classifier's clip to each card's observed span ends the tenure,
        # whatever the window. Exact mappings first, then the evidence a guess uses (Run:ai's
        # links, memory in use), as explain and whatif place pods.
        data = (
            _data_span(conn, period_s=thresholds.default_period_s, cluster=cluster)
            if source is None
            else source.span
        )
        now = max(end_ms, data.end_ms + READ_MARGIN_MS) if data is not None else end_ms
        _, gpus, tenures = held_tenures(
            conn,
            now_ms=now,
            window=(audited.start_ms, end_ms),
            memory=None if source is None else source.memory,
            first_ms=None if source is None or data is None else data.start_ms,
            cluster=cluster,
        )
        ranges = card_ranges(gpus, tenures, window=audited)
        gpu_ids = {str(u): int(i) for u, i in zip(gpus["uuid"], gpus["id"], strict=True)}
        period_ms = max(1, round(thresholds.default_period_s * 1000))
        # the rows each card's range will read, not its length (none are stored for an
        # audit from the metrics store: there, the length)
        stored = reads.stored_spans(conn, cluster=cluster) if source is None else None
        cost = planned_cost(ranges, period_ms=period_ms, stored=stored)
        planned = sum(cost.values())
        # an audit from the metrics store reads through this process's client
        workers = 1 if source is not None else workers_for(workers, planned=planned)
        parts = chunks(
            gpus,
            tenures,
            shard=shard,
            budget=chunk_samples,
            cost=cost,
            least=min_chunks,
            workers=workers,
        )
        unavailable = read_node_outages(conn, window=audited, cluster=cluster)
        demand = read_demand(conn, window=audited, cluster=cluster)
    card_node, card_kind = card_maps(gpus)
    waited = keyed_demand(demand)
    plan = AuditPlan(
        window=audited,
        thresholds=thresholds,
        gpus=gpus,
        tenures=tenures,
        ranges=ranges,
        gpu_ids=gpu_ids,
        first_card={str(g): str(c) for g, c in tenures.groupby("gang")["gpu"].min().items()},
        card_node=card_node,
        card_kind=card_kind,
        unavailable=unavailable,
        waited=waited,
    )
    done: Iterator[ChunkRows]
    workers = max(1, min(workers, len(parts)))
    if workers > 1:
        engine.dispose()  # no connection of this process is open in a forked worker
        done = in_workers(engine, plan, parts, workers, costs=part_costs(parts, cost))
    else:
        done = in_process(engine, plan, parts, None if source is None else source.samples)
    for rows in done:
        result_rows += rows.results
        finding_rows += rows.findings
        sm_rows += rows.sm
        causes += rows.causes
        free_kept.append(rows.free)
        n_samples += rows.samples
        n_gpus += rows.gpus
        rolled += rows.rolled_s
    shares = pd.concat(free_kept, ignore_index=True) if free_kept else None
    if shares is not None:
        free_time = split_free(shares, demand=waited)
        causes += cause_rows(free_cause_frame(free_time, demand_known=not tenures.empty), gpu_ids)
    with engine.begin() as conn:
        run_id = replace_audit_run(
            conn,
            window=audited,
            shard="all" if shard is None else f"{shard[0]}/{shard[1]}",
            created_ms=now_ms if now_ms is not None else int(time.time() * 1000),
            thresholds=thresholds.as_dict(),
            version=__version__,
            results=result_rows,
            findings=finding_rows,
            rolled_up_seconds=rolled,
            hourly=True,
            cluster=cluster,
        )
        write_sm_rows(conn, run_id=run_id, rows=sm_rows)
        write_cause_rows(conn, run_id=run_id, rows=causes)
        if shard is not None:  # the shard completing the window splits every one's at once
            if shares is not None:
                keep_free_shares(conn, run_id=run_id, shares=shares, gpu_ids=gpu_ids)
            settle_free_split(
                conn,
                cluster=cluster,
                window=audited,
                shards=shard[1],
                demand=waited,
                demand_known=not tenures.empty,
            )
    return AuditStats(
        run_id=run_id,
        window=audited,
        cluster=cluster,
        gpus=n_gpus,
        samples=n_samples,
        tenures=len(tenures),
        seconds=time.perf_counter() - started,
        workers=workers,
    )
