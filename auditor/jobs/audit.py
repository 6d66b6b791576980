"""The audit job: classify a window in chunks of nodes (or one shard) and store the run."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor import __version__
from auditor.errors import InputError
from auditor.jobs.common import nulls, one_cluster, open_store
from auditor.jobs.parts import (
    AUDIT_CHUNK_SAMPLES,
    MIN_CHUNKS,
    READ_MARGIN_MS,
    card_ranges,
    chunks,
)
from auditor.model import DEFAULT_CLUSTER, Window
from auditor.settings import Thresholds

if TYPE_CHECKING:
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
    samples: Callable[[list[tuple[str, int, int]]], pd.DataFrame]
    """(GPU UUID, lo, hi) per card, sorted by UUID -> gpu, ts_ms, util, throttle_reasons,
    sm_active, with `NEIGHBOUR_SAMPLES` either side of each card's range."""


NEIGHBOUR_SAMPLES = 16
"""Samples read beyond that margin, however far, either side: the card's period is the
median spacing of what is read, and a window inside an outage must still see the period
the card was sampled at, not the outage's length."""


SPLIT_CATEGORIES = ("compute_idle", "unallocated")
"""The categories split by cause (SPEC §10): the only pieces the audit keeps."""


@dataclass(frozen=True)
class Loaded:
    """What one chunk of the audit is classified from: samples, tenants' activity."""

    samples: pd.DataFrame
    activity: pd.DataFrame


@dataclass(frozen=True)
class Signals:
    """What one chunk's causes are judged on (SPEC §10): pod and card signals."""

    pods: pd.DataFrame
    cards: pd.DataFrame


@dataclass(frozen=True)
class AuditStats:
    run_id: int
    window: Window
    cluster: str
    gpus: int
    samples: int
    tenures: int
    seconds: float


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
) -> AuditStats:
    """The audit of `cluster` over `audited` on `engine`; samples from the store, else from
    `source`."""
    import pandas as pd

    from auditor.classify.causes import free_cause_frame, idle_causes
    from auditor.classify.efficiency import efficiency
    from auditor.classify.free_time import card_maps, free_shares, keyed_demand, split_free
    from auditor.classify.hours import HOUR_MS, cut_at_hours
    from auditor.classify.pipeline import classify
    from auditor.classify.rollup import rolled_up_seconds, with_rolled
    from auditor.store import reads
    from auditor.store.demand import read_demand
    from auditor.store.free_split import keep_free_shares, settle_free_split
    from auditor.store.placement import held_tenures
    from auditor.store.rollup import read_rolled_card_samples
    from auditor.store.signals import (
        read_card_signals,
        read_node_outages,
        read_pod_signals,
        write_cause_rows,
    )
    from auditor.store.work_done import write_sm_rows
    from auditor.store.writes import replace_audit_run

    end_ms = audited.end_ms
    result_rows: list[dict[str, object]] = []
    finding_rows: list[dict[str, object]] = []
    sm_rows: list[dict[str, object]] = []
    cause_rows: list[dict[str, object]] = []
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
        gpu_ids = dict(zip(gpus["uuid"], gpus["id"], strict=True))
        uuids = {int(i): str(u) for u, i in gpu_ids.items()}
        first_card = tenures.groupby("gang")["gpu"].min()
        period_ms = max(1, round(thresholds.default_period_s * 1000))
        cost = {u: (hi - lo) // period_ms for u, (lo, hi) in ranges.items()}
        parts = chunks(
            gpus, tenures, shard=shard, budget=chunk_samples, cost=cost, least=min_chunks
        )

    with engine.connect() as conn:
        unavailable = read_node_outages(conn, window=audited, cluster=cluster)
        demand = read_demand(conn, window=audited, cluster=cluster)
    card_node, card_kind = card_maps(gpus)
    waited = keyed_demand(demand)
    # a piece the window cuts is judged at its whole midpoint, up to a sample's coverage
    # outside the window: its signal may lie that far out, and up to `signal_stale_s` before
    stale = round(thresholds.signal_stale_s * 1000)
    margin = stale + READ_MARGIN_MS

    def load(context: set[str]) -> Loaded:
        """The cards' raw samples and, where raw data was rolled up, 1-minute pseudo-samples;
        the tenants' own utilisation of shared cards."""
        wanted = [(int(gpu_ids[u]), *ranges[u]) for u in sorted(context)]
        with engine.connect() as conn:
            if source is None:
                raw = reads.read_card_samples(conn, wanted, uuids, neighbours=NEIGHBOUR_SAMPLES)
            else:
                raw = source.samples([(uuids[g], lo, hi) for g, lo, hi in wanted])
            return Loaded(
                samples=with_rolled(raw, read_rolled_card_samples(conn, wanted)),
                activity=reads.read_tenant_util(conn, wanted, uuids),
            )

    def load_signals(context: set[str]) -> Signals:
        """The signals the causes of the cards' idle time are judged on: their pods' and
        their own, the latter only while a pod held the card (`held_spans`)."""
        on = tenures[tenures["gpu"].isin(context)]
        with engine.connect() as conn:
            return Signals(
                pods=read_pod_signals(
                    conn, list(on["pod_uid"].astype(str)), window=audited, margin_ms=margin
                ),
                cards=read_card_signals(
                    conn,
                    window=audited,
                    margin_ms=margin,
                    cards={int(gpu_ids[u]): u for u in sorted(context)},
                    spans=held_spans(on, gpu_ids, stale_ms=stale),
                ),
            )

    # Reading the next chunk (waiting on the database, building its rows) overlaps
    # classifying this one: at most two chunks' samples are in memory at once. A chunk's
    # signals are read after its samples, while it is classified: they are needed only
    # once it is, so even the first chunk waits for its samples alone.
    def submit(context: set[str]) -> tuple[Future[Loaded], Future[Signals]]:
        return pool.submit(load, context), pool.submit(load_signals, context)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-read") as pool:
        ahead = [submit(parts[0][1])] if parts else []
        for i, (own, context) in enumerate(parts):
            loading, signalling = ahead.pop()
            got = loading.result()
            samples, activity = got.samples, got.activity
            if i + 1 < len(parts):
                ahead.append(submit(parts[i + 1][1]))
            part = tenures[tenures["gpu"].isin(context)]
            result = classify(
                samples,
                part,
                window=audited,
                thresholds=thresholds,
                cards=gpus,
                activity=activity,
                keep_pieces=True,
                piece_categories=SPLIT_CATEGORIES,
                hour_ms=HOUR_MS,
            )
            assert result.pieces is not None
            assert result.hourly is not None
            # stored per UTC hour (SPEC §11): any whole-hour window inside the run is served
            res = result.hourly[result.hourly["gpu"].isin(own)]
            signals = signalling.result()
            cut = cut_at_hours(result.pieces[result.pieces["gpu"].isin(own)], window=audited)
            # Free time is split once every chunk's is known: waiting demand is shared among
            # the free cards of the whole run, so a card's `blocked` seconds do not depend on
            # which cards shared its chunk. A chunk keeps a row per card and hour, and its
            # pieces that overlap a wait (`free_shares`).
            free_kept.append(
                free_shares(
                    cut, card_node=card_node, card_kind=card_kind, unavailable=unavailable,
                    demand=waited,
                )
            )  # fmt: skip
            cause_rows += _cause_rows(
                idle_causes(
                    cut,
                    tenures=part,
                    pod_signals=signals.pods,
                    card_signals=signals.cards,
                    thresholds=thresholds.causes,
                ),
                gpu_ids,
            )
            # a finding about a whole gang (a checkpoint series) has no card: the part that
            # owns the gang's first card stores it, so it is stored once
            fnd = result.findings
            fnd = fnd[fnd["gpu"].fillna(fnd["gang"].map(first_card)).isin(own)]
            result_rows += _result_rows(res, part, gpu_ids)
            finding_rows += _finding_rows(fnd, gpu_ids)
            eff = efficiency(samples, part, window=audited, thresholds=thresholds, hour_ms=HOUR_MS)
            finding_rows += _finding_rows(eff.findings[eff.findings["gpu"].isin(own)], gpu_ids)
            sm_rows += [
                {
                    "gpu_id": int(gpu_ids[g]),
                    "pod_uid": p,
                    "sm_active_seconds": a,
                    "sm_busy_seconds": b,
                    "hour_ms": int(h),
                }
                for g, p, a, b, h in eff.sm[eff.sm["gpu"].isin(own)].itertuples(index=False)
            ]
            mine = samples["gpu"].isin(own)
            n_samples += int(mine.sum())
            n_gpus += int(samples.loc[mine, "gpu"].nunique())
            rolled += rolled_up_seconds(samples, window=audited, gpus=own)
            del got, signals, samples, activity, result, res, fnd, mine, cut
    shares = pd.concat(free_kept, ignore_index=True) if free_kept else None
    if shares is not None:
        free_time = split_free(shares, demand=waited)
        cause_rows += _cause_rows(
            free_cause_frame(free_time, demand_known=not tenures.empty), gpu_ids
        )
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
        write_cause_rows(conn, run_id=run_id, rows=cause_rows)
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
    )


def held_spans(
    tenures: pd.DataFrame, gpu_ids: Mapping[str, int], *, stale_ms: int
) -> dict[int, list[tuple[int, int]]]:
    """Per GPU id, the spans in which its signals can decide a cause: a held card's idle
    piece lies inside a tenure of its pod on that card (the classifier cuts the time line
    at every tenure's ends) and is judged at its midpoint, by the last signal row at most
    `stale_ms` older. So `[start - stale, end]` of every tenure; a free card's time needs
    none (`unallocated` is split by nodes' state and demand)."""
    out: dict[int, list[tuple[int, int]]] = {}
    known = tenures["start_ms"].notna() & tenures["end_ms"].notna()
    for uuid, lo, hi in zip(
        tenures.loc[known, "gpu"].astype(str),
        tenures.loc[known, "start_ms"],
        tenures.loc[known, "end_ms"],
        strict=True,
    ):
        out.setdefault(int(gpu_ids[uuid]), []).append((int(lo) - stale_ms, int(hi) + 1))
    return out


def _result_rows(
    res: pd.DataFrame, tenures: pd.DataFrame, gpu_ids: dict[str, int]
) -> list[dict[str, object]]:
    inferred = {
        (g, p): bool(i)
        for g, p, i in zip(tenures["gpu"], tenures["pod_uid"], tenures["inferred"], strict=True)
    }
    shares: dict[tuple[object, object], float] = {}
    if "share" in tenures.columns:  # a pod's share of the card (its largest, if it came back)
        for g, p, sh in zip(tenures["gpu"], tenures["pod_uid"], tenures["share"], strict=True):
            if not math.isnan(sh):  # an unknown share (an equal split) is stored as NULL
                shares[(g, p)] = max(float(sh), shares.get((g, p), 0.0))
    return [
        {
            "gpu_id": int(gpu_ids[g]),
            "pod_uid": p,
            "category": c,
            "seconds": float(s),
            "inferred": inferred.get((g, p), False) if p is not None else False,
            "estimated": bool(e),
            "share": shares.get((g, p)) if p is not None else None,
            "hour_ms": int(h),
        }
        for g, p, c, s, e, h in zip(
            res["gpu"],
            nulls(res["pod_uid"]),
            res["category"],
            res["seconds"],
            res["estimated"],
            res["hour_ms"],
            strict=True,
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


def _cause_rows(causes: pd.DataFrame, gpu_ids: dict[str, int]) -> list[dict[str, object]]:
    return [
        {
            "gpu_id": int(gpu_ids[str(g)]),
            "pod_uid": p,
            "category": c,
            "cause": k,
            "seconds": float(s),
            "signalled_seconds": float(x),
            "hour_ms": int(h),
        }
        for g, p, c, k, s, x, h in zip(
            causes["gpu"], nulls(causes["pod_uid"]), causes["category"], causes["cause"],
            causes["seconds"], causes["signalled_seconds"], causes["hour_ms"], strict=True,
        )
    ]  # fmt: skip
