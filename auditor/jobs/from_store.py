"""The audit straight from the cluster's metrics store (`auditor audit --samples-from URL`,
SPEC §11): GPU samples are read from Prometheus (or Thanos Query, Mimir, VictoriaMetrics)
and classified; the database keeps pods, cards, holdings and results, never a sample.

Two passes over raw points (`collect.prometheus.raw`, range selectors through
`/api/v1/query`, no resampling):

1. Discovery, the whole fleet over the window and the audit's read margin, in time
   chunks: dcgm-exporter's utilisation and framebuffer series say which cards exist, on
   which node, which pod held each when (its `pod` label, as `import prometheus` stores
   it: cards and holdings are stored), and each card's minutes of memory in use (the
   evidence a guessed placement uses, kept per minute in memory).
2. Classification, per chunk of whole nodes as the audit chunks them (`--shard i/N`: the
   shard's nodes), reading only the metrics the classifier uses for those cards over
   their ranges.

Memory follows the chunk: one time chunk's points in discovery, one node chunk's samples
in classification. The results equal `import prometheus` then `audit` on the same series.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from auditor.errors import InputError
from auditor.jobs.audit import AuditStats, SampleSource, _audit
from auditor.jobs.audit_chunks import NEIGHBOUR_SAMPLES
from auditor.jobs.common import open_store
from auditor.jobs.imports import cluster_matchers, store_query_options
from auditor.jobs.parts import AUDIT_CHUNK_SAMPLES, READ_MARGIN_MS
from auditor.model import DEFAULT_CLUSTER, Window
from auditor.settings import Thresholds

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    from auditor.classify.tenures import MemoryInUse
    from auditor.collect.prometheus import Auth, RawSource

NEIGHBOUR_READ_MS = 3_600_000
"""How far beyond a card's range its `NEIGHBOUR_SAMPLES` are looked for (the stored audit
finds them however far; a store is read in ranges): an hour."""


@dataclass(frozen=True)
class FromStoreStats:
    audit: AuditStats
    cards: int
    """Cards the store showed in the window (MIG instances each one)."""
    holdings: int
    """Pod -> card pairs its `pod` labels gave, joined to stored pods."""
    unresolved: int
    """Spans of a `pod` label naming no stored pod of that time."""
    queries: int
    points: int
    """Raw points read, both passes."""
    shrunk: int
    """Queries the store refused as too large, asked again over half the time."""
    discovery_s: float = 0.0
    """Seconds of the discovery pass (the whole fleet's cards and holdings, every shard)."""


def audit_from_store(
    url: str,
    *,
    samples_from: str,
    window: tuple[int, int],
    thresholds: Thresholds,
    shard: tuple[int, int] | None = None,
    auth: Auth | None = None,
    timeout_s: float = 60.0,
    step_s: float = 15.0,
    points: int | None = None,
    chunk_s: float | None = None,
    node_labels: Sequence[str] | None = None,
    nodes: Mapping[str, str] | None = None,
    chunk_samples: int = AUDIT_CHUNK_SAMPLES,
    now_ms: int | None = None,
    cluster: str = DEFAULT_CLUSTER,
    cluster_label: str | None = None,
) -> FromStoreStats:
    """Audit `window` from the samples in the store at `samples_from` and store the run.

    `step_s`: dcgm-exporter's scrape interval (what a holding's gaps and a query's points
    are counted in); `points`: raw points one query may ask for (default `POINT_BUDGET`);
    `chunk_s`: the time one query covers, where given (else from `points`); `auth`,
    `timeout_s`, `node_labels`, `nodes`: as `import_prometheus` takes them. `cluster`: the
    cluster audited; `cluster_label`: the series label naming clusters in a store holding
    several (its queries then select `cluster`'s series), None for a store of one."""
    from auditor.collect.prometheus import (
        POINT_BUDGET,
        PrometheusClient,
        RawSource,
    )

    started = time.perf_counter()
    start_ms, end_ms = window
    if end_ms <= start_ms:
        raise InputError("the audit window ends before it starts", field="--end")
    labels, given = store_query_options(
        step_s=step_s, timeout_s=timeout_s, node_labels=node_labels, nodes=nodes
    )
    if points is not None and points < 1:
        raise InputError("the points per query must be at least 1", field="--store-points")
    if chunk_s is not None and chunk_s < step_s:
        raise InputError("a query's chunk must be at least one --step", field="--store-chunk")
    step_ms = round(step_s * 1000)
    client = PrometheusClient(
        samples_from,
        auth=auth,
        timeout_s=timeout_s,
        matchers=cluster_matchers(cluster_label, cluster),
    )
    source = RawSource(
        client,
        period_ms=step_ms,
        budget=POINT_BUDGET if points is None else points,
        chunk_ms=None if chunk_s is None else round(chunk_s * 1000),
    )
    audited = Window(start_ms, end_ms)
    engine = open_store(url)
    try:
        discovering = time.perf_counter()
        found = _discover(
            engine,
            source,
            Window(start_ms - READ_MARGIN_MS, end_ms + READ_MARGIN_MS),
            labels=labels,
            given=given,
            cluster=cluster,
        )
        discovery_s = time.perf_counter() - discovering
        if found.span is None:
            raise InputError(
                f"no dcgm-exporter samples in {client.url} for this window", field="--start"
            )
        period_ms = round(thresholds.default_period_s * 1000)
        span = Window(found.span[0], found.span[1] + period_ms)
        stats = _audit(
            cluster,
            engine,
            audited,
            thresholds=thresholds,
            shard=shard,
            chunk_samples=chunk_samples,
            now_ms=now_ms,
            started=started,
            source=SampleSource(
                span=span,
                memory=found.memory,
                samples=lambda wanted: _card_samples(source, wanted),
            ),
        )
    finally:
        engine.dispose()
    return FromStoreStats(
        audit=stats,
        cards=found.cards,
        holdings=found.holdings,
        unresolved=found.unresolved,
        queries=source.queries,
        points=source.points,
        shrunk=source.shrunk,
        discovery_s=discovery_s,
    )


@dataclass
class _Found:
    span: tuple[int, int] | None
    minutes: dict[str, npt.NDArray[np.int64]]
    """GPU UUID -> its minutes with memory in use, in time order: rows of the first and
    the last ms of its samples with memory in use in that minute (a (k, 2) array)."""
    cards: int
    holdings: int
    unresolved: int

    def memory(self, evidence: tuple[int, int]) -> MemoryInUse:
        """The cards' memory in use over `evidence`, as `store.placement.memory_in_use`
        reads it from stored samples: minutes merged where under two minutes apart."""
        import numpy as np

        from auditor.classify.tenures import MemoryInUse, memory_spans

        lo, hi = evidence
        spans: dict[str, list[tuple[int, int]]] = {}
        for uuid, minutes in self.minutes.items():
            first, last = minutes[:, 0], minutes[:, 1]
            keep = (last >= lo) & (first < hi)
            if keep.any():
                inside = zip(
                    np.maximum(first[keep], lo).tolist(),
                    np.minimum(last[keep], hi - 1).tolist(),
                    strict=True,
                )
                spans[uuid] = memory_spans(inside)
        return MemoryInUse(spans, from_ms=lo)


def _discover(
    engine: object,
    source: RawSource,
    reach: Window,
    *,
    labels: tuple[str, ...],
    given: Mapping[str, str],
    cluster: str = DEFAULT_CLUSTER,
) -> _Found:
    """Pass 1: the cards, their nodes and holdings over `reach` stored in one transaction
    (as `import prometheus` stores them), their minutes of memory in use kept."""
    from sqlalchemy import Engine, select

    from auditor.collect.prometheus import DISCOVERED, GPU_UTIL, NodeResolver, read_chunk
    from auditor.model import GpuRecord
    from auditor.store.sample_sink import resolve_holdings
    from auditor.store.schema import gpus
    from auditor.store.writes import upsert_assignments, upsert_gpus

    assert isinstance(engine, Engine)
    client = source.client
    count = client.series_count(GPU_UTIL, start_s=reach.start_ms / 1000, end_s=reach.end_ms / 1000)
    series = max(1, count or 1)
    step_ms = source.period_ms
    known: dict[str, GpuRecord] = {}
    ids: dict[str, int] = {}
    minutes: dict[str, list[npt.NDArray[np.int64]]] = {}
    pairs: set[tuple[str, int]] = set()
    unresolved = 0
    lo: int | None = None
    hi: int | None = None
    with engine.begin() as conn:
        stored = {str(u): str(n) for u, n in conn.execute(select(gpus.c.uuid, gpus.c.node))}
        resolver = NodeResolver(labels, given=given, stored=stored)
        at = reach.start_ms
        while at < reach.end_ms:
            stop = min(reach.end_ms, at + source.chunk_for(series))
            first, end = at, stop

            def fetch(metric: str, first: int = first, end: int = end) -> object:
                return source.read(metric, first_ms=first, end_ms=end, series=series)

            chunk = read_chunk(
                client,
                first_ms=first,
                last_ms=end - 1,
                step_ms=step_ms,
                resolver=resolver,
                fetch=fetch,  # type: ignore[arg-type]
                metrics=DISCOVERED,
            )
            new = [g for g in chunk.gpus.values() if known.get(g.uuid) != g]
            if new:
                ids.update(upsert_gpus(conn, new, cluster=cluster))
                known.update((g.uuid, g) for g in new)
            for card in chunk.cards:  # columns, no object per sample
                if not card.ts_ms.size:
                    continue
                first_ms, last_ms = int(card.ts_ms[0]), int(card.ts_ms[-1])
                lo = first_ms if lo is None else min(lo, first_ms)
                hi = last_ms if hi is None else max(hi, last_ms)
                in_use = _minutes_in_use(card.ts_ms, card.values["memory_used_mib"])
                if in_use is not None:
                    minutes.setdefault(card.uuid, []).append(in_use)
            seen_pairs, left = resolve_holdings(
                conn, chunk.holdings, ids, slack_ms=step_ms, cluster=cluster
            )
            upsert_assignments(conn, seen_pairs, source="dcgm-exporter")
            pairs.update((uid, gpu_id) for uid, gpu_id, _ in seen_pairs)
            unresolved += len(left)
            del chunk
            at = stop
    return _Found(
        span=None if lo is None or hi is None else (lo, hi),
        minutes={uuid: _merged(parts) for uuid, parts in minutes.items()},
        cards=len(known),
        holdings=len(pairs),
        unresolved=unresolved,
    )


def _minutes_in_use(
    ts_ms: npt.NDArray[np.int64], used_mib: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64] | None:
    """Per minute of these samples (sorted by time) with memory in use, its minute and the
    first and last ms of those samples (a (k, 3) array); None where there are none."""
    import numpy as np

    from auditor.classify.tenures import MEMORY_IN_USE_MIB, MEMORY_MINUTE_MS

    with np.errstate(invalid="ignore"):  # NaN (not read) is not in use
        at = ts_ms[used_mib > MEMORY_IN_USE_MIB]
    if not at.size:
        return None
    minute = at // MEMORY_MINUTE_MS
    starts = np.flatnonzero(np.concatenate(([True], minute[1:] != minute[:-1])))
    ends = np.concatenate((starts[1:] - 1, [at.size - 1]))
    return np.stack((minute[starts], at[starts], at[ends]), axis=1)


def _merged(parts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """A card's minutes in use from its chunks' (in time order): a minute two chunks share
    (a chunk's edge inside it) is one, from its first to its last ms."""
    import numpy as np

    rows = np.concatenate(parts)
    minute = rows[:, 0]
    starts = np.flatnonzero(np.concatenate(([True], minute[1:] != minute[:-1])))
    if starts.size == minute.size:
        return rows[:, 1:].copy()
    first = np.minimum.reduceat(rows[:, 1], starts)
    last = np.maximum.reduceat(rows[:, 2], starts)
    return np.stack((first, last), axis=1)


def _card_samples(source: RawSource, wanted: list[tuple[str, int, int]]) -> pd.DataFrame:
    """Pass 2: the samples of these cards over their ranges (and `NEIGHBOUR_SAMPLES` either
    side, within `NEIGHBOUR_READ_MS`), as `store.reads.read_card_samples` returns them."""
    import numpy as np
    import pandas as pd

    from auditor.collect.prometheus import read_cards

    columns = (
        read_cards(
            source,
            [u for u, _, _ in wanted],
            first_ms=min(lo for _, lo, _ in wanted) - NEIGHBOUR_READ_MS,
            end_ms=max(hi for _, _, hi in wanted) + NEIGHBOUR_READ_MS,
        )
        if wanted
        else {}
    )
    cards: list[str] = []
    cuts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for uuid, lo, hi in wanted:
        card = columns.get(uuid)
        if card is None:
            continue
        a = max(0, int(np.searchsorted(card.ts_ms, lo)) - NEIGHBOUR_SAMPLES)
        b = min(card.ts_ms.size, int(np.searchsorted(card.ts_ms, hi)) + NEIGHBOUR_SAMPLES)
        if a < b:
            cards.append(uuid)
            cuts.append(
                (card.ts_ms[a:b], card.util[a:b], card.throttle_reasons[a:b], card.sm_active[a:b])
            )
    dtypes = (np.int64, np.float64, object, np.float64)
    ts, util, throttle, sm = (
        np.concatenate([c[k] for c in cuts]) if cuts else np.zeros(0, dtype=dtypes[k])
        for k in range(4)
    )
    codes = np.repeat(np.arange(len(cards), dtype=np.int64), [c[0].size for c in cuts])
    return pd.DataFrame(
        {
            "gpu": pd.Categorical.from_codes(codes, categories=pd.Index(cards, dtype=object)),
            "ts_ms": ts,
            "util": util,
            "throttle_reasons": throttle,
            "sm_active": sm,
        }
    )
