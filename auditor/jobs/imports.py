"""Imports from files and from Prometheus: one transaction each, all of it or nothing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.errors import InputError
from auditor.jobs.common import (
    BATCH_ROWS,
    ImportStats,
    Progress,
    batched,
    open_store,
    read_ahead,
)
from auditor.model import DEFAULT_CLUSTER
from auditor.settings import Config

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from auditor.collect.nvidia_smi import SampleBlock
    from auditor.collect.prometheus import Auth, CardSamples, PrometheusClient, SignalStats
    from auditor.store.bulk import Columns

FUTURE_MARGIN_S = 86_400
"""How far past this machine's clock a sample may be dated (clocks of nodes and laptops
differ, and a log may be read in another zone); later is a clock set wrong."""


def import_nvidia_smi(
    url: str,
    path: Path,
    *,
    node: str,
    tz: tzinfo | None = None,
    ignore_unknown_columns: bool = False,
    progress: Progress | None = None,
    columns: Sequence[str] | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> ImportStats:
    """Import one nvidia-smi CSV of a node of `cluster` in one transaction: all of it, or
    nothing on bad input.

    The file is read a block of lines at a time, column by column, and each block goes to
    the store as one bulk write (`auditor.store.bulk`): no object per sample."""
    from datetime import UTC

    import numpy as np

    from auditor.collect.nvidia_smi import read_nvidia_smi_blocks
    from auditor.model import GpuRecord
    from auditor.store import ledger
    from auditor.store.bulk import Columns, write_columns
    from auditor.store.writes import upsert_gpus

    started = time.perf_counter()
    engine = open_store(url)
    rows = offered = 0
    known: dict[str, GpuRecord] = {}
    ids: dict[str, int] = {}
    lines: dict[str, int] = {}
    span: tuple[int, int] | None = None
    options: dict[str, Any] = {"node": node, "tz": str(tz or UTC), **_cluster_option(cluster)}
    if columns is not None:
        options["columns"] = ",".join(columns)
    with engine.begin() as conn:
        import_id = ledger.begin(
            conn,
            kind="nvidia-smi",
            source=str(path.absolute()),
            options=options,
            now_ms=int(time.time() * 1000),
        )
        before = ledger.last_gpu_id(conn)
        blocks = read_nvidia_smi_blocks(
            path,
            node=node,
            tz=tz or UTC,
            ignore_unknown_columns=ignore_unknown_columns,
            on_progress=progress,
            gpu_lines=lines,
            not_after_ms=int((time.time() + FUTURE_MARGIN_S) * 1000),
            columns=columns,
        )
        shifted: int | None = None
        first = True
        for block in read_ahead(blocks):
            new = [g for g in block.records if known.get(g.uuid) != g]
            if new:  # a GPU stored on another node or as another model: refused, rolled back
                ids.update(
                    upsert_gpus(
                        conn,
                        new,
                        file=str(path),
                        lines=lines,
                        util_source="nvidia-smi",
                        cluster=cluster,
                    )
                )
                known.update((g.uuid, g) for g in new)
            gpu_of = np.array([ids[r.uuid] for r in block.records], np.int64)
            if first:  # before writing: is the file's start stored already, hours away?
                shifted = _shifted(conn, block, gpu_of)
                first = False
            batch = Columns(gpu_of[block.which], block.ts_ms, block.columns)
            rows += write_columns(conn, batch, import_id=import_id)
            offered += len(block)
            if len(block):
                lo, hi = int(block.ts_ms.min()), int(block.ts_ms.max())
                span = (lo, hi) if span is None else (min(span[0], lo), max(span[1], hi))
        ledger.finish(
            conn,
            import_id,
            rows_written=rows,
            gpu_ids=ids.values(),
            gpus_created=[i for i in ids.values() if i > before],
            span=span,
        )
    return ImportStats(
        str(path),
        rows,
        len(ids),
        time.perf_counter() - started,
        already=offered - rows,
        shifted_ms=shifted,
        import_id=import_id,
    )


SHIFT_READINGS = 8
"""Readings of the file's first card compared with what the store holds at each offset."""
SHIFT_STEP_MS = 15 * 60_000
"""Time zones differ by whole quarter hours."""
SHIFT_REACH_MS = 14 * 3_600_000
"""As far as two zones' offsets differ (UTC-12 to UTC+14 from a log's point of view)."""


def _shifted(conn: Connection, block: SampleBlock, gpu_of: Any) -> int | None:
    """The offset at which the store already holds the block's first readings of its first
    card (`reads.shifted_copy`), or None; needs `SHIFT_READINGS` readable ones."""
    import numpy as np

    from auditor.store import reads

    if "util" not in block.columns or not len(block):
        return None
    rows = np.flatnonzero(block.which == 0)
    util = block.columns["util"][rows]
    readable = rows[~np.isnan(util)][:SHIFT_READINGS]
    if readable.size < SHIFT_READINGS or np.unique(block.columns["util"][readable]).size < 2:
        return None  # too few, or all alike (an idle card matches itself at any offset)
    return reads.shifted_copy(
        conn,
        gpu_id=int(gpu_of[0]),
        ts_ms=[int(t) for t in block.ts_ms[readable]],
        util=[float(u) for u in block.columns["util"][readable]],
        step_ms=SHIFT_STEP_MS,
        reach_ms=SHIFT_REACH_MS,
    )


@dataclass(frozen=True)
class PodImportStats:
    file: str
    rows: int
    """GPU pod records read (observations; the store merges those of one pod)."""
    nodes: int
    """Node rows stored."""
    seconds: float
    claims: int = 0
    """ResourceClaims read (Dynamic Resource Allocation)."""
    dra_assignments: int = 0
    """(pod, card) pairs the claims and slices gave exactly."""
    dra_pending: int = 0
    """Claims reserved for a pod the store does not hold, or naming a device no slice of
    the file publishes: they gave nothing."""
    import_id: int | None = None
    """The import's id in the ledger (`auditor import list`)."""


def import_pods(
    url: str,
    path: Path,
    *,
    config: Config,
    progress: Progress | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> PodImportStats:
    """Import one kubectl file of `cluster` (JSON or YAML: pod and node lists, pods, nodes, watch
    streams; ResourceClaims and ResourceSlices) in one transaction: all of it, or nothing on
    bad input. Nodes are stamped with the file's modification time
    (`auditor.collect.kubectl_files`), and so are the pods still waiting to be scheduled in
    it (their wait is known to last until then); the outages the nodes show become
    stretches (`auditor.store.outages`). The file's claims are joined to its slices at its
    end (`auditor.jobs.dra`), for its pods and those already stored."""
    from auditor.collect.dra import DraClaim, DraSlice, DraState
    from auditor.collect.kubectl_files import read_kubectl
    from auditor.collect.shares import hami_assignments
    from auditor.jobs.dra import write_cards, write_holds
    from auditor.model import PodRecord
    from auditor.store import ledger
    from auditor.store.outages import record_node_states
    from auditor.store.pod_writes import upsert_pods
    from auditor.store.writes import upsert_exact_assignments, upsert_nodes

    started = time.perf_counter()
    engine = open_store(url)
    rows = 0
    nodes: set[str] = set()
    dra = DraState()
    with engine.begin() as conn:
        import_id = ledger.begin(
            conn,
            kind="pods",
            source=str(path.absolute()),
            options=_cluster_option(cluster),
            now_ms=int(time.time() * 1000),
        )
        records = read_kubectl(
            path, teams=config.teams, on_progress=progress, sharing=config.sharing
        )
        for batch in batched(records, BATCH_ROWS):
            pods = [r for r in batch if isinstance(r, PodRecord)]
            node_rows = [r for r in batch if isinstance(r, dict)]
            for r in batch:
                if isinstance(r, DraClaim):
                    dra.add_claim(r)
                elif isinstance(r, DraSlice):
                    dra.add_slice(r.devices)
            try:
                upsert_pods(conn, pods, cluster=cluster)
                upsert_nodes(conn, node_rows, cluster=cluster)
                record_node_states(
                    conn, [r["state"] for r in node_rows if "state" in r], cluster=cluster
                )
                upsert_exact_assignments(
                    conn, hami_assignments(pods), source="hami", cluster=cluster
                )
            except InputError as e:  # a row no column holds: name the file it came from
                if e.file is not None:
                    raise
                raise InputError(e.message, file=str(path), field=e.field) from e
            rows += len(pods)
            nodes.update(r["name"] for r in node_rows)
        write_cards(conn, dra.devices.values(), file=str(path), cluster=cluster)
        written = write_holds(conn, dra)
        ledger.finish(conn, import_id, rows_written=rows)
    return PodImportStats(
        str(path),
        rows,
        len(nodes),
        time.perf_counter() - started,
        claims=len(dra.claims),
        dra_assignments=written.assignments,
        dra_pending=len(written.pending),
        import_id=import_id,
    )


@dataclass(frozen=True)
class PrometheusImportStats:
    samples: int
    gpus: int
    holdings: int
    """(pod, GPU) pairs recorded from the pod labels."""
    unresolved: int
    """Spans naming a pod the store does not know (import pods, then re-run: harmless)."""
    seconds: float
    already: int = 0
    """Samples read that were stored already (a re-run over the same window)."""
    node_sources: Mapping[str, int] = field(default_factory=dict)
    """Where the GPUs' nodes came from (`label kubernetes_node`, `kube_pod_info (exporter
    pods)`, `Hostname`, `instance`) -> how many GPUs."""
    util_sources: Mapping[str, int] = field(default_factory=dict)
    """The metric each GPU's utilisation came from -> how many GPUs."""
    pod_signals: int = 0
    """cAdvisor signal rows stored (one per pod and grid time, SPEC §10)."""
    card_signals: int = 0
    """PCIe/NVLink traffic rows stored (one per card and grid time)."""
    signals_unmatched: int = 0
    """Signal rows of a pod or card the store does not hold at that time (skipped)."""
    signals_bad: Mapping[str, int] = field(default_factory=dict)
    """Metric or signal -> points skipped as bad input (not a number, infinite, negative,
    or past its bound)."""
    import_id: int | None = None
    """The import's id in the ledger (`auditor import list|undo`)."""


def store_query_options(
    *,
    step_s: float,
    timeout_s: float,
    node_labels: Sequence[str] | None,
    nodes: Mapping[str, str] | None,
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The options every read of a metrics store takes, checked (one-line errors naming the
    flag): the node labels to try (default `NODE_LABELS`) and the nodes given by hand."""
    from auditor.collect.prometheus import NODE_LABELS

    if step_s <= 0:
        raise InputError("the step must be positive", field="--step")
    if timeout_s <= 0:
        raise InputError("the timeout must be positive", field="--timeout")
    labels = tuple(node_labels) if node_labels is not None else NODE_LABELS
    if not labels or not all(labels):
        raise InputError("a node label name cannot be empty", field="--node-label")
    given = dict(nodes or {})
    if not all(given) or not all(given.values()):
        raise InputError("--node takes HOSTNAME=NODE or UUID=NODE", field="--node")
    return labels, given


def import_prometheus(
    url: str,
    *,
    prometheus_url: str,
    window: tuple[int, int],
    step_s: float = 15.0,
    max_points: int = 10_000,
    progress: Callable[[int, int], None] | None = None,
    auth: Auth | None = None,
    timeout_s: float = 60.0,
    node_labels: Sequence[str] | None = None,
    nodes: Mapping[str, str] | None = None,
    cluster: str = DEFAULT_CLUSTER,
    cluster_label: str | None = None,
) -> PrometheusImportStats:
    """Import dcgm-exporter samples and pod labels of a window in one transaction.

    `progress(done, total)` is called after each chunk; `auth`: credentials (else those in
    the URL's userinfo); `timeout_s`: the deadline of each query; `node_labels`: the labels
    that name a GPU's node, first present wins (default `NODE_LABELS`; see `NodeResolver`);
    `nodes`: GPU UUID or `Hostname` -> node, as the user says (`--node`,
    `parse_node_options`), where no node label names it. A card the store already holds
    keeps its stored node where only its `Hostname` (an exporter pod's name) says
    otherwise. Its cards are `cluster`'s; with `cluster_label`, the label naming clusters
    in a store holding several, only that cluster's series are read."""
    from sqlalchemy import select

    from auditor.collect.prometheus import (
        NodeResolver,
        PrometheusClient,
        SignalStats,
        chunks,
        pod_selector,
        points_per_query,
        read_chunk,
    )
    from auditor.model import GpuRecord
    from auditor.redact import redact
    from auditor.store import ledger
    from auditor.store.bulk import write_columns
    from auditor.store.sample_sink import resolve_holdings
    from auditor.store.schema import gpus
    from auditor.store.signals import pods_in_window
    from auditor.store.writes import upsert_assignments, upsert_gpus

    started = time.perf_counter()
    start_ms, end_ms = window
    if end_ms <= start_ms:
        raise InputError("the window ends before it starts", field="--end")
    labels, given = store_query_options(
        step_s=step_s, timeout_s=timeout_s, node_labels=node_labels, nodes=nodes
    )
    step_ms = round(step_s * 1000)
    client = PrometheusClient(
        prometheus_url,
        auth=auth,
        timeout_s=timeout_s,
        matchers=cluster_matchers(cluster_label, cluster),
    )
    per_query = points_per_query(
        client, start_s=start_ms / 1000, end_s=end_ms / 1000, max_points=max_points
    )
    parts = list(chunks(start_ms, end_ms, step_ms=step_ms, max_points=per_query))
    engine = open_store(url)
    known: dict[str, GpuRecord] = {}
    ids: dict[str, int] = {}
    samples = offered = unresolved = 0
    pairs: set[tuple[str, int]] = set()
    node_of: dict[str, str] = {}  # GPU UUID -> where its node came from, first chunk's
    signal_stats = SignalStats()
    written = [0, 0, 0]  # pod rows, card rows, unmatched rows
    span: tuple[int, int] | None = None
    with engine.begin() as conn:
        import_id = ledger.begin(
            conn,
            kind="prometheus",
            source=redact(client.url),
            options={
                "start_ms": start_ms,
                "end_ms": end_ms,
                "step_s": step_s,
                **({"node": dict(sorted(given.items()))} if given else {}),
                **({"node_label": list(labels)} if node_labels is not None else {}),
                **_cluster_option(cluster),
                **({"cluster_label": cluster_label} if cluster_label else {}),
            },
            now_ms=int(time.time() * 1000),
        )
        before = ledger.last_gpu_id(conn)
        stored = {str(u): str(n) for u, n in conn.execute(select(gpus.c.uuid, gpus.c.node))}
        resolver = NodeResolver(labels, given=given, stored=stored)
        card_ids = {str(u): int(i) for u, i in conn.execute(select(gpus.c.uuid, gpus.c.id))}
        tenures = pods_in_window(
            conn, start_ms=start_ms - step_ms, end_ms=end_ms + step_ms, cluster=cluster
        )
        selector = pod_selector(tenures) if tenures else None
        for done, (first_ms, last_ms) in enumerate(parts, 1):
            chunk = read_chunk(
                client, first_ms=first_ms, last_ms=last_ms, step_ms=step_ms, resolver=resolver
            )
            for uuid, source in chunk.node_sources.items():
                node_of.setdefault(uuid, source)
            new = [g for g in chunk.gpus.values() if known.get(g.uuid) != g]
            if new:
                ids.update(upsert_gpus(conn, new, cluster=cluster))
                known.update((g.uuid, g) for g in new)
            batch = _chunk_columns(chunk.cards, ids)
            if len(batch):  # one bulk write of the chunk's columns
                samples += write_columns(conn, batch, import_id=import_id)
                offered += len(batch)
                lo, hi = int(batch.ts_ms.min()), int(batch.ts_ms.max())
                span = (lo, hi) if span is None else (min(span[0], lo), max(span[1], hi))
            seen, left = resolve_holdings(
                conn, chunk.holdings, ids, slack_ms=step_ms, cluster=cluster
            )
            upsert_assignments(conn, seen, source="dcgm-exporter")
            pairs.update((uid, gpu_id) for uid, gpu_id, _ in seen)
            unresolved += len(left)
            card_ids.update(ids)
            _import_signals(
                conn,
                client,
                span=(first_ms, last_ms, step_ms),
                selector=selector,
                tenures=tenures,
                card_ids=card_ids,
                stats=signal_stats,
                written=written,
            )
            if progress is not None:
                progress(done, len(parts))
        if offered == 0:
            raise InputError(
                f"no dcgm-exporter samples in Prometheus at {client.url} for this window",
                field="--start",
            )
        ledger.finish(
            conn,
            import_id,
            rows_written=samples,
            gpu_ids=ids.values(),
            gpus_created=[i for i in ids.values() if i > before],
            span=span,
        )
    return PrometheusImportStats(
        samples,
        len(node_of),  # GPUs with samples (not a MIG instance's card, recorded for its slices)
        len(pairs),
        unresolved,
        time.perf_counter() - started,
        already=offered - samples,
        node_sources=_counts(node_of.values()),
        util_sources=_counts(g.util_source for g in known.values() if g.util_source),
        pod_signals=written[0],
        card_signals=written[1],
        signals_unmatched=written[2],
        signals_bad=dict(sorted(signal_stats.bad.items())),
        import_id=import_id,
    )


def _chunk_columns(cards: Sequence[CardSamples], ids: Mapping[str, int]) -> Columns:
    """The samples of a chunk's cards as one batch of columns (their stored GPU ids)."""
    import numpy as np

    from auditor.model import SAMPLE_FIELDS
    from auditor.store.bulk import Columns

    if not cards:
        empty = np.empty(0, np.int64)
        return Columns(empty, empty, {})
    sizes = [len(c) for c in cards]
    gpu_id = np.repeat(np.array([ids[c.uuid] for c in cards], np.int64), sizes)
    ts_ms = np.concatenate([c.ts_ms for c in cards])
    values = {name: np.concatenate([c.values[name] for c in cards]) for name in SAMPLE_FIELDS}
    return Columns(gpu_id, ts_ms, values)


def _import_signals(
    conn: Connection,
    client: PrometheusClient,
    *,
    span: tuple[int, int, int],
    selector: str | None,
    tenures: Mapping[tuple[str, str], Sequence[tuple[str, int | None, int | None]]],
    card_ids: Mapping[str, int],
    stats: SignalStats,
    written: list[int],
) -> None:
    """SPEC §10's signals of one chunk (`span`: first, last, step ms) into the store:
    cAdvisor's per pod (the pods `selector` names; matched to the stored pod of that name
    that held the time), dcgm-exporter's PCIe/NVLink traffic per card (by UUID)."""
    from auditor.collect.prometheus import read_cadvisor_chunk, read_dcgm_traffic_chunk
    from auditor.store.signals import write_card_signals, write_pod_signals

    first_ms, last_ms, step_ms = span
    if selector is not None:
        pod_rows: list[dict[str, Any]] = []
        for r in read_cadvisor_chunk(
            client,
            first_ms=first_ms,
            last_ms=last_ms,
            step_ms=step_ms,
            selector=selector,
            stats=stats,
        ):
            uid = pod_at(tenures.get((r.namespace, r.pod), ()), r.ts_ms, slack_ms=step_ms)
            if uid is None:
                written[2] += 1
                continue
            pod_rows.append(
                {"pod_uid": uid, "source": "cadvisor", "ts_ms": r.ts_ms,
                 "cpu_limit_ratio": r.cpu_limit_ratio, "throttled_ratio": r.throttled_ratio,
                 "cpu_pressure": r.cpu_pressure, "io_pressure": r.io_pressure,
                 "net_bytes_s": r.net_bytes_s}
            )  # fmt: skip
        written[0] += write_pod_signals(conn, pod_rows)
    card_rows: list[dict[str, Any]] = []
    for c in read_dcgm_traffic_chunk(
        client, first_ms=first_ms, last_ms=last_ms, step_ms=step_ms, stats=stats
    ):
        gpu_id = card_ids.get(c.uuid)
        if gpu_id is None:
            written[2] += 1
            continue
        card_rows.append(
            {"gpu_id": gpu_id, "ts_ms": c.ts_ms, "pcie_bytes_s": c.pcie_bytes_s,
             "nvlink_bytes_s": c.nvlink_bytes_s}
        )  # fmt: skip
    written[1] += write_card_signals(conn, card_rows)


def pod_at(
    tenures: Sequence[tuple[str, int | None, int | None]], ms: int, *, slack_ms: int
) -> str | None:
    """The pod of that name that existed at `ms` (the latest bound where tenures overlap);
    else one that existed within `slack_ms` (a grid step) of it. None where no pod of that
    name existed then: a name reused later maps to its own pod, never to one long gone."""
    for slack in (0, slack_ms):
        best: tuple[int, str] | None = None
        for uid, bound, end in tenures:
            if bound is None or bound > ms + slack or (end is not None and ms >= end + slack):
                continue
            if best is None or bound > best[0]:
                best = (bound, uid)
        if best is not None:
            return best[1]
    return None


def parse_node_options(values: Sequence[str]) -> dict[str, str]:
    """`--node KEY=NODE` options (KEY a GPU UUID or a dcgm-exporter `Hostname`, the exporter
    pod's name) -> {KEY: NODE}; anything else is a one-line InputError."""
    out: dict[str, str] = {}
    for value in values:
        key, sep, node = (part.strip() for part in value.partition("="))
        if not sep or not key or not node:
            raise InputError(
                f"--node takes HOSTNAME=NODE or UUID=NODE, not {value!r}", field="--node"
            )
        if out.get(key, node) != node:
            raise InputError(f"--node names {key} twice: {out[key]!r} and {node!r}", field="--node")
        out[key] = node
    return out


def _counts(values: Iterable[str]) -> dict[str, int]:
    """How often each value occurs, most frequent first."""
    from collections import Counter

    return dict(Counter(values).most_common())


def _cluster_option(cluster: str) -> dict[str, str]:
    """The ledger's record of an import's cluster: none for the default one, so the ledger
    of a store of one cluster reads as before."""
    return {} if cluster == DEFAULT_CLUSTER else {"cluster": cluster}


def cluster_matchers(label: str | None, cluster: str) -> str:
    """The matchers that keep a store's queries to `cluster`'s series: `label="cluster"`
    where the store names clusters by `label` (a Thanos or Mimir over several), else none
    (a Prometheus of that one cluster)."""
    from auditor.collect.prometheus import label_matchers

    return "" if not label else label_matchers({label: cluster})
