"""dcgm-exporter metrics out of Prometheus: a small `query_range` client and the reader.

Each metric is read over the window on a `step` grid (dcgm-exporter's scrape interval), in
chunks of at most `max_points` points per series (Prometheus refuses more than 11,000), and
the series of one GPU are joined by timestamp into its sample columns (`CardSamples`: numpy
arrays, no Python object per point).

Labels are dcgm-exporter's: `UUID` (with `GPU_I_ID` for a MIG instance, which becomes the
GPU `UUID/gi<ID>` with the card as its parent and `GPU_I_PROFILE` as its MIG profile, SPEC
§7), `Hostname` (else `instance`) as the node,
`gpu` as the index, `modelName`; and `namespace`, `pod` of the pod holding the card, an
exact GPU -> pod mapping. Prometheus drops empty labels, so a series without `pod` is a
card no pod held.

Nothing from the server is trusted: each query has a deadline (to the last byte) and a size
cap, every part of an answer's shape is checked, and every value must be one a GPU can
report (`BOUNDS`); anything else is a one-line InputError, and the import stores nothing.
Credentials (basic auth, also from the URL's userinfo, or a bearer token) go in a header
that is never logged; the URL requested and printed has no userinfo.

This package's entry is `read_chunk` (here); the parts are its modules: `query_plan` (the
chunks of a window, the limits of a query), `auth` and `client` (credentials, HTTP),
`decode` (answers checked, values checked), `card_samples` (a chunk's points into
per-card sample columns and holdings), `raw` (raw points of range selectors for
the audit from the store, in chunks within the store's limits), `node_resolver` (which node a series
names), `signals` (SPEC §10's cAdvisor and PCIe/NVLink signals, bad points counted and
skipped). Callers import every name from `auditor.collect.prometheus`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from auditor.collect.prometheus.auth import (
    PASSWORD_ENV,
    TOKEN_ENV,
    Auth,
    credentials,
    split_userinfo,
)
from auditor.collect.prometheus.card_samples import (
    CardSamples,
    Piece,
    assemble,
    holdings_of,
    point_columns,
)
from auditor.collect.prometheus.client import PrometheusClient, QueryRefused
from auditor.collect.prometheus.decode import (
    BOUNDS,
    GPU_UTIL,
    GR_ENGINE,
    METRICS,
    SLOT,
    Series,
    gpu_record,
    short,
)
from auditor.collect.prometheus.matchers import label_matchers, selector
from auditor.collect.prometheus.node_resolver import (
    HOSTNAME_CAVEAT,
    KUBE_POD_INFO,
    NODE_LABELS,
    NodeResolver,
    describe_sources,
    same_node,
)
from auditor.collect.prometheus.query_plan import (
    DEADLINE_S,
    MAX_POINTS,
    MAX_RESPONSE_BYTES,
    POINT_BUDGET,
    chunks,
    points_per_query,
)
from auditor.collect.prometheus.raw import (
    CLASSIFIED,
    DISCOVERED,
    CardColumns,
    RawSource,
    read_cards,
)
from auditor.collect.prometheus.signals import (
    CardSignalRow,
    PodSignalRow,
    SignalStats,
    pod_selector,
    rate_window_ms,
    read_cadvisor_chunk,
    read_dcgm_traffic_chunk,
)
from auditor.errors import InputError
from auditor.model import GpuRecord, GpuSample, Holding

__all__ = [
    "BOUNDS",
    "CLASSIFIED",
    "DEADLINE_S",
    "DISCOVERED",
    "GPU_UTIL",
    "GR_ENGINE",
    "HOSTNAME_CAVEAT",
    "KUBE_POD_INFO",
    "MAX_POINTS",
    "MAX_RESPONSE_BYTES",
    "METRICS",
    "NODE_LABELS",
    "PASSWORD_ENV",
    "POINT_BUDGET",
    "TOKEN_ENV",
    "Auth",
    "CardColumns",
    "CardSamples",
    "CardSignalRow",
    "ChunkResult",
    "Fetch",
    "NodeResolver",
    "PodSignalRow",
    "PrometheusClient",
    "QueryRefused",
    "RawSource",
    "Series",
    "SignalStats",
    "chunks",
    "credentials",
    "describe_sources",
    "label_matchers",
    "pod_selector",
    "points_per_query",
    "rate_window_ms",
    "read_cadvisor_chunk",
    "read_cards",
    "read_chunk",
    "read_dcgm_traffic_chunk",
    "split_userinfo",
]


@dataclass
class ChunkResult:
    """What one chunk of the window held."""

    gpus: dict[str, GpuRecord] = field(default_factory=dict)
    cards: list[CardSamples] = field(default_factory=list)
    """Each card's samples column by column, in UUID order."""
    holdings: list[Holding] = field(default_factory=list)
    node_sources: dict[str, str] = field(default_factory=dict)
    """GPU UUID -> where its node came from: `label NAME`, `kube_pod_info`, `Hostname`,
    `instance`."""

    @property
    def samples(self) -> list[GpuSample]:
        """The samples as objects, card by card in UUID order, each card's by time."""
        return [s for card in self.cards for s in card.samples()]


Fetch = Callable[[str], Iterable[Series]]
"""The series of one metric over a chunk: the grid of `query_range` (the import), or the raw
points of a range selector (`raw.RawSource`, the audit from the store)."""


def read_chunk(
    client: PrometheusClient,
    *,
    first_ms: int,
    last_ms: int,
    step_ms: int,
    resolver: NodeResolver | None = None,
    fetch: Fetch | None = None,
    metrics: Iterable[str] | None = None,
) -> ChunkResult:
    """Every dcgm-exporter metric over one chunk, joined per GPU and timestamp (each series
    two numpy arrays, aligned per GPU once all are read: a chunk's memory is its points).

    The node of each GPU comes from `resolver` (a new one with the default labels unless
    given; pass one across chunks to keep what it learnt). A card whose only evidence is
    its `Hostname` keeps its stored node, else the node it first came under (an exporter
    pod replaced is the same card on the same node); a GPU whose series name two nodes
    otherwise is refused, as the store refuses a card moved to another node.

    `fetch` reads one metric (default: `query_range` on the `step_ms` grid from `first_ms`
    to `last_ms`); `metrics`, the dcgm-exporter metrics to read (default all of `METRICS`):
    a sample's fields of the others stay None."""
    resolver = resolver or NodeResolver()
    if fetch is None:

        def fetch(metric: str) -> Iterable[Series]:
            return client.query_range(
                # each grid point takes the one sample scraped in the step before it: no
                # value repeated from the 5-minute lookback where a series ended (a pod
                # released the card) without a staleness marker, as in backfilled or
                # federated data
                f"last_over_time({selector(metric, client.matchers)}[{max(step_ms - 1, 1)}ms])",
                start_s=first_ms / 1000,
                end_s=last_ms / 1000,
                step_s=step_ms / 1000,
            )

    wanted = set(METRICS) if metrics is None else set(metrics)
    pieces: dict[str, list[Piece]] = {}
    holders: dict[tuple[str, str], int] = {}
    out = ChunkResult()
    # (UUID, Hostname or instance, which) of series no node label names -> first, last ms
    unnamed: dict[tuple[str, str, str], tuple[int, int]] = {}
    named: dict[str, tuple[str, str]] = {}  # UUID -> (node, source), first series that said
    for metric, column in METRICS.items():
        if metric not in wanted:
            continue
        series = fetch(metric)
        slot = SLOT[column]
        for labels, points in series:
            uuid_label = labels.get("UUID")
            host = labels.get("Hostname") or labels.get("instance")
            if not uuid_label or not host or not points:
                continue
            gpu = gpu_record(labels, host)
            uuid = gpu.uuid
            labelled = resolver.node_label(labels)
            if labelled is not None:
                same_node(named, uuid, labelled)
                out.gpus.setdefault(uuid, replace(gpu, node=labelled[0]))
            else:
                key = (uuid, host, "Hostname" if labels.get("Hostname") else "instance")
                lo, hi = round(points[0][0] * 1000), round(points[-1][0] * 1000)
                seen = unnamed.get(key)
                unnamed[key] = (lo, hi) if seen is None else (min(lo, seen[0]), max(hi, seen[1]))
                out.gpus.setdefault(uuid, gpu)
            pod, namespace = labels.get("pod"), labels.get("namespace")
            holder = holders.setdefault((namespace, pod), len(holders)) if pod and namespace else -1
            ms, values = point_columns(points, metric=metric, column=column, labels=labels)
            pieces.setdefault(uuid, []).append(Piece(slot, ms, values, holder))
    hosts = {h for _, h, which in unnamed if which == "Hostname"}
    if hosts:
        resolver.learn(client, hosts, first_ms=first_ms, last_ms=last_ms, step_ms=step_ms)
    fallbacks: list[tuple[int, str, str, str]] = []
    for (uuid, host, which), (lo, hi) in unnamed.items():
        given = resolver.named(uuid, host)
        if given is not None:
            same_node(named, uuid, given)
            continue
        nodes = {resolver.pod_node(host, lo), resolver.pod_node(host, hi)}
        if which == "instance" or None in nodes:
            fallbacks.append((lo, uuid, host, which))
        elif len(nodes) > 1:
            raise InputError(
                f"exporter pod {short(host)} of GPU {short(uuid)} ran on nodes "
                f"{' and '.join(sorted(map(short, nodes)))} in this window per "
                f"{KUBE_POD_INFO}: name the node label with --node-label",
                field="--url",
            )
        else:
            same_node(named, uuid, (nodes.pop() or host, KUBE_POD_INFO + " (exporter pods)"))
    for _, uuid, host, which in sorted(fallbacks):  # the first name a card came under wins
        if uuid not in named:  # else stronger evidence of this card in this chunk
            named[uuid] = resolver.fallback(uuid, host, which)
    for uuid, found in named.items():
        resolver.chosen.setdefault(uuid, found)
    for uuid in sorted(pieces):
        card = assemble(uuid, pieces.pop(uuid))
        out.cards.append(card)
        node, source = named[uuid]
        gpu = replace(out.gpus[uuid], node=node)
        out.node_sources[uuid] = source
        total = card.memory_total_mib()
        if total is not None and gpu.memory_total_mib is None:
            gpu = replace(gpu, memory_total_mib=total)
        if card.from_util or card.from_engine:
            engine = card.from_engine > card.from_util
            gpu = replace(gpu, util_source=GR_ENGINE if engine else GPU_UTIL)
        out.gpus[uuid] = gpu
    for gpu in list(out.gpus.values()):  # a MIG instance's physical card: its uncarved slices
        if gpu.parent_uuid is not None and gpu.parent_uuid not in out.gpus:
            out.gpus[gpu.parent_uuid] = GpuRecord(gpu.parent_uuid, gpu.node, None, gpu.model)
    out.holdings = holdings_of(out.cards, list(holders), step_ms=step_ms)
    return out
