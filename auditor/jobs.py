"""The programmatic API: one function per command, and the only place that wires parts together.

Each function opens the store, calls the pure parts, and writes or returns the outcome. The
CLI is one caller; tests and the in-cluster jobs are others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from auditor import __version__
from auditor.errors import AuditorError, InputError
from auditor.settings import Config, Thresholds

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Engine

    from auditor.report.explain import Explanation
    from auditor.report.render import Report
    from auditor.report.summary import GroupBy

Progress = Callable[[int], None]
T = TypeVar("T")
BATCH_ROWS = 20_000
AUDIT_CHUNK_NODES = 8
"""Nodes classified together: memory follows this, not the fleet."""
READ_MARGIN_MS = 15 * 60_000
"""Samples read past the last tenure end: enough for any sane period's successor sample."""


@dataclass(frozen=True)
class ImportStats:
    file: str
    rows: int
    gpus: int
    seconds: float


@dataclass(frozen=True)
class AuditStats:
    run_id: int
    window: tuple[int, int]
    gpus: int
    samples: int
    tenures: int
    seconds: float


def open_store(url: str) -> Engine:
    """An engine at the current schema. A new SQLite file is created and migrated on the spot;
    any other database must have been migrated with `auditor db upgrade`."""
    from sqlalchemy import inspect

    from auditor.store import migrate
    from auditor.store.engine import is_sqlite, make_engine

    engine = make_engine(url)
    try:
        if is_sqlite(engine) and not inspect(engine).get_table_names():
            migrate.upgrade(engine)
        migrate.ensure_current(engine)
    except AuditorError:
        raise
    except Exception as e:  # connection refused, bad credentials, locked file...
        raise_store_error(url, e)
    return engine


def raise_store_error(url: str, e: Exception) -> None:
    from sqlalchemy.engine import make_url

    from auditor.errors import StoreError

    try:
        safe = make_url(url).render_as_string(hide_password=True)
    except Exception:
        safe = "the database"
    cause = getattr(e, "orig", None) or e  # the driver's own message, not SQLAlchemy's wrapper
    text = str(cause).strip()
    first = text.splitlines()[0] if text else type(cause).__name__
    raise StoreError(f"cannot use {safe}: {first}") from e


def _batched(items: Iterator[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def import_nvidia_smi(
    url: str,
    path: Path,
    *,
    node: str,
    tz: tzinfo | None = None,
    ignore_unknown_columns: bool = False,
    progress: Progress | None = None,
) -> ImportStats:
    """Import one nvidia-smi CSV in one transaction: all of it, or nothing on bad input."""
    from datetime import UTC

    from auditor.collect.nvidia_smi import read_nvidia_smi
    from auditor.model import GpuRecord
    from auditor.store.writes import insert_samples, upsert_gpus

    started = time.perf_counter()
    engine = open_store(url)
    rows = 0
    known: dict[str, GpuRecord] = {}
    ids: dict[str, int] = {}
    with engine.begin() as conn:
        pairs = read_nvidia_smi(
            path,
            node=node,
            tz=tz or UTC,
            ignore_unknown_columns=ignore_unknown_columns,
            on_progress=progress,
        )
        for batch in _batched(pairs, BATCH_ROWS):
            new = [g for g, _ in batch if known.get(g.uuid) != g]
            if new:
                ids.update(upsert_gpus(conn, new))
                known.update((g.uuid, g) for g in new)
            rows += insert_samples(conn, [s for _, s in batch], ids)
        if rows == 0:
            raise InputError("no samples in file", file=str(path))
    return ImportStats(str(path), rows, len(ids), time.perf_counter() - started)


def import_pods(
    url: str, path: Path, *, config: Config, progress: Progress | None = None
) -> ImportStats:
    """Import a kubectl pod list or watch stream in one transaction."""
    from auditor.collect.kubectl_json import read_kubectl_pods
    from auditor.store.writes import upsert_pods

    started = time.perf_counter()
    engine = open_store(url)
    rows = 0
    with engine.begin() as conn:
        records = read_kubectl_pods(path, teams=config.teams, on_progress=progress)
        for batch in _batched(records, BATCH_ROWS):
            upsert_pods(conn, batch)
            rows += len(batch)
    return ImportStats(str(path), rows, 0, time.perf_counter() - started)


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
            res["gpu"], _none(res["pod_uid"]), res["category"], res["seconds"], strict=True
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
            fnd["kind"], _none(fnd["gang"]), _none(fnd["gpu"]), _none(fnd["pod_uid"]),
            _none(fnd["start_ms"]), _none(fnd["end_ms"]), fnd["seconds"], _none(fnd["detail"]),
            strict=True,
        )
    ]  # fmt: skip


def covering_runs(runs: pd.DataFrame, *, start_ms: int, end_ms: int, what: str) -> list[int]:
    """The stored runs that cover [start, end) exactly once; an error names what is missing."""
    from auditor.report.windows import choose_runs

    choice = choose_runs(runs, start_ms=start_ms, end_ms=end_ms)
    if choice.incomplete:
        a, b = choice.incomplete[0]
        raise InputError(
            f"{what} is not fully audited: the sharded run of {_iso(a)} to {_iso(b)} lacks "
            "shards; run the missing shards or an unsharded audit of that window",
            field="window",
        )
    if choice.missing:
        a, b = choice.missing[0]
        raise InputError(
            f"{what} is not fully audited: nothing covers {_iso(a)} to {_iso(b)}; "
            f"run `auditor audit --start {_iso(a)} --end {_iso(b)}`",
            field="window",
        )
    return choice.run_ids


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _none(series: pd.Series) -> list[object]:
    """Values with NaN/NA as None, for writing to the database."""
    import pandas as pd

    return [None if pd.isna(v) else v for v in series.tolist()]


def build_report(
    url: str,
    *,
    start_ms: int | None,
    end_ms: int | None,
    by: GroupBy,
    team: str | None,
    top: int = 3,
) -> Report:
    """Read stored audit results for a window (default: the latest audited) into a Report."""
    from auditor.report.offenders import STRAGGLER_COLUMNS, stragglers, top_offenders
    from auditor.report.render import Report
    from auditor.report.summary import GroupBy, summarise, totals
    from auditor.store import reads

    engine = open_store(url)
    with engine.connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=start_ms, end_ms=end_ms)
        if runs.empty:
            raise InputError(
                "no audit results for this window: run `auditor audit` first", field="window"
            )
        run_ids = covering_runs(
            runs,
            start_ms=int(runs["window_start_ms"].min()) if start_ms is None else start_ms,
            end_ms=int(runs["window_end_ms"].max()) if end_ms is None else end_ms,
            what="the window",
        )
        runs = runs[runs["id"].isin(run_ids)]
        results = reads.read_results(conn, run_ids)
        findings = reads.read_findings(conn, run_ids)
    if team is not None:
        results_team = results[results["team"] == team]
        if results_team.empty:
            raise InputError(f"no team {team!r} in this window", field="--team")
    rows = summarise(results, by=by, team=team)
    if by is GroupBy.JOB:
        slow = stragglers(findings)[["namespace", "job", *STRAGGLER_COLUMNS]]
        rows = rows.merge(slow, on=["namespace", "job"], how="left")
        no_wait = rows["straggler_wait_gpu_hours"] <= 0
        rows.loc[no_wait, STRAGGLER_COLUMNS] = None
    scope = results if team is None else results[results["team"] == team]
    window = (int(runs["window_start_ms"].min()), int(runs["window_end_ms"].max()))
    return Report(
        window=window,
        by=by.value,
        rows=rows,
        totals=totals(scope),
        offenders=top_offenders(scope, findings, top=top),
    )


def explain(url: str, target: str, *, thresholds: Thresholds, buckets: int = 600) -> Explanation:
    """Each card of a job or pod over its whole tenure: timeline, findings, next steps.

    Classifies the target's gang(s) afresh from the stored samples (no audit run needed), so
    the totals are the classifier's for exactly the span the target held its cards."""
    from auditor.classify.engine import Window, classify
    from auditor.classify.tenures import build_tenures
    from auditor.report.explain import build_explanation
    from auditor.report.targets import resolve_target
    from auditor.report.timeline import bucketise, clip_to_observed, sample_segments
    from auditor.store import reads

    engine = open_store(url)
    with engine.connect() as conn:
        pods = reads.read_pods(conn)
        gpus = reads.read_gpus(conn)
        label, uids = resolve_target(pods, target)
        span = reads.sample_span(conn)
        now_ms = span[1] if span else int(time.time() * 1000)
        tenures = build_tenures(pods, gpus, reads.read_assignments(conn), now_ms=now_ms)
        mine = tenures[tenures["pod_uid"].isin(uids)]
        if mine.empty:
            raise InputError(
                f"{label} held no GPU: no pod of it was bound to a node", field="JOB_OR_POD"
            )
        gang = tenures[tenures["gang"].isin(set(mine["gang"]))]
        g_lo, g_hi = int(gang["start_ms"].min()), int(gang["end_ms"].max())
        cards = set(gang["gpu"])
        ids = [int(i) for i, u in zip(gpus["id"], gpus["uuid"], strict=True) if u in cards]
        samples = reads.read_samples(conn, start_ms=g_lo, end_ms=g_hi, gpu_ids=ids)
    mine = clip_to_observed(mine, samples, thresholds=thresholds)
    if mine.empty:
        raise InputError(f"no GPU samples of {label}'s cards", field="JOB_OR_POD")
    lo, hi = int(mine["start_ms"].min()), int(mine["end_ms"].max())
    found = classify(samples, gang, window=Window(lo, hi), thresholds=thresholds)
    segments = sample_segments(samples, gang, found.findings, thresholds=thresholds)
    timelines = bucketise(
        segments[segments["pod_uid"].isin(uids)], mine, span=(lo, hi), buckets=buckets
    )
    return build_explanation(
        target=label,
        window=(lo, hi),
        timelines=timelines,
        results=found.results,
        findings=found.findings,
        pods=pods,
        gpus=gpus,
    )


def build_report_html(
    url: str,
    *,
    start_ms: int | None,
    end_ms: int | None,
    by: GroupBy,
    team: str | None,
    thresholds: Thresholds,
    timelines: int = 8,
) -> str:
    """The report as one HTML page, with the per-card utilisation and the timelines of the
    `timelines` jobs that lead the offenders table."""
    from auditor.report.html import render_report_html
    from auditor.report.summary import card_utilisation
    from auditor.store import reads

    report = build_report(url, start_ms=start_ms, end_ms=end_ms, by=by, team=team)
    engine = open_store(url)
    with engine.connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=report.window[0], end_ms=report.window[1])
        ids = covering_runs(
            runs, start_ms=report.window[0], end_ms=report.window[1], what="the window"
        )
        results = reads.read_results(conn, ids)
    if team is not None:
        results = results[results["team"] == team]
    util = card_utilisation(results)["util_pct"].tolist()
    off = report.offenders.sort_values("gpu_hours", ascending=False, kind="stable")
    offenders = [
        str(o)
        for o, t in zip(off["offender"], off["team"], strict=True)
        if isinstance(t, str) and str(o).count("/") == 2
    ]
    shown: list[Explanation] = []
    for target in dict.fromkeys(offenders):
        if len(shown) >= timelines:
            break
        try:
            shown.append(explain(url, target, thresholds=thresholds, buckets=200))
        except InputError:
            continue  # a job whose pods are gone from the store: no timeline to draw
    return render_report_html(report, card_util=util, timelines=shown)


@dataclass(frozen=True)
class SimulateStats:
    out_dir: Path
    summary: str


def simulate(out_dir: Path, *, scenario: str, seed: int | None = None) -> SimulateStats:
    """Write a preset scenario's input files and ground truth into `out_dir`."""
    from dataclasses import replace

    from auditor.simulate import SCENARIOS
    from auditor.simulate import simulate as run_simulation

    if scenario not in SCENARIOS:
        raise InputError(f"unknown scenario (known: {', '.join(SCENARIOS)})", field="--scenario")
    chosen = SCENARIOS[scenario] if seed is None else replace(SCENARIOS[scenario], seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_simulation(out_dir, scenario=chosen)
    gpus = chosen.nodes * chosen.gpus_per_node
    return SimulateStats(
        out_dir,
        f"{chosen.nodes} nodes, {gpus} GPUs, {chosen.hours:g} h, {len(result.node_csvs)} "
        "nvidia-smi files, pods.json, truth.csv",
    )


def demo(workdir: Path, *, scenario: str = "demo", log: Callable[[str], None]) -> str:
    """Simulate → import → audit → report on a fresh SQLite database in `workdir`.

    Ends with the team report and a check of the audit against the simulator's ground truth.
    """
    from auditor.report.render import render_table
    from auditor.report.summary import GroupBy
    from auditor.simulate import SCENARIOS
    from auditor.simulate import simulate as run_simulation

    started = time.perf_counter()
    chosen = SCENARIOS[scenario]
    data = workdir / "cluster"
    data.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{workdir / 'auditor.db'}"
    log(f"simulating {chosen.nodes} nodes × {chosen.gpus_per_node} GPUs for {chosen.hours:g} h ...")
    sim = run_simulation(data, scenario=chosen)
    samples = 0
    for node, path in sorted(sim.node_csvs.items()):
        samples += import_nvidia_smi(url, path, node=node).rows
    pods = import_pods(url, sim.pods_json, config=Config()).rows
    log(f"imported {samples:,} samples and {pods} pod records into {url}")
    stats = audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    log(f"audited {stats.gpus} GPUs in {stats.seconds:.1f}s")
    report = build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    text = render_table(report)
    text += "\n" + truth_check(report.rows, sim.truth)
    log(f"demo finished in {time.perf_counter() - started:.1f}s (files in {workdir})")
    return text


def truth_check(rows: pd.DataFrame, truth: pd.DataFrame) -> str:
    """Audit vs simulator ground truth per category, fleet-wide, in GPU-hours."""
    from auditor.model import CATEGORIES

    audited = {c.value: float(rows[f"{c.value}_gpu_hours"].sum()) for c in CATEGORIES}
    true = truth.groupby("category")["gpu_seconds"].sum() / 3600.0
    lines = [
        "Audit vs the simulator's ground truth (GPU-hours):",
        f"  {'category':<16}{'truth':>10}{'audit':>10}",
    ]
    for c in CATEGORIES:
        lines.append(
            f"  {c.value:<16}{float(true.get(c.value, 0.0)):>10.2f}{audited[c.value]:>10.2f}"
        )
    return "\n".join(lines) + "\n"


def export_finance(url: str, *, week: str, config: Config) -> str:
    """The finance CSV of one ISO week, from the stored audit runs that cover it exactly."""
    from auditor.report.finance import finance_rows, parse_week, render_finance_csv
    from auditor.store import reads

    wk = parse_week(week)
    engine = open_store(url)
    with engine.connect() as conn:
        runs = reads.runs_in_window(conn, start_ms=wk.start_ms, end_ms=wk.end_ms)
        run_ids = covering_runs(
            runs, start_ms=wk.start_ms, end_ms=wk.end_ms, what=f"week {wk.label}"
        )
        results = reads.read_results(conn, run_ids)
    rows = finance_rows(results, week=wk, prices=config.prices, cost_centres=config.cost_centres)
    return render_finance_csv(rows)


# ---------------------------------------------------------------- node sampler


@dataclass(frozen=True)
class SampleOptions:
    """How `auditor sample` runs on a node (each default suits a DaemonSet)."""

    node: str
    buffer_dir: Path
    period_s: float = 5.0
    flush_every_s: float = 30.0
    max_buffered_passes: int = 17_280
    """A day of 5 s passes: the oldest are dropped (and counted) beyond it."""
    pod_resources_socket: Path | None = None
    """The kubelet's pod-resources socket; None: record no GPU -> pod mapping."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 9402
    max_passes: int | None = None
    """Stop after this many passes (tests, benchmarks); None: run until stopped."""


def sample(url: str, options: SampleOptions, *, log: Callable[[str], None]) -> None:
    """Run the node sampler until stopped: NVML every period, pod-resources, buffered writes.

    NVML that cannot be initialised is a `DriverError` at once (the DaemonSet restarts the
    sampler); the database may be down at start: passes wait in the on-disk buffer."""
    import signal
    import threading

    from prometheus_client import CollectorRegistry

    from auditor.collect.buffer import DiskBuffer
    from auditor.collect.nvml import NvmlReader
    from auditor.collect.podresources import PodResourcesClient
    from auditor.collect.sampler import Sampler, SamplerSettings
    from auditor.collect.sampler_metrics import SamplerMetrics, serve
    from auditor.collect.sink import StoreSink

    reader = NvmlReader(node=options.node, period_s=options.period_s)
    reader.open()
    holders = (
        None
        if options.pod_resources_socket is None
        else PodResourcesClient(options.pod_resources_socket)
    )
    buffer = DiskBuffer(
        options.buffer_dir / "sampler-buffer.db", max_batches=options.max_buffered_passes
    )
    metrics = SamplerMetrics(CollectorRegistry())
    sampler = Sampler(
        reader=reader,
        holders=holders,
        sink=StoreSink(lambda: open_store(url)),
        buffer=buffer,
        metrics=metrics,
        settings=SamplerSettings(period_s=options.period_s, flush_every_s=options.flush_every_s),
    )
    server = None
    if options.metrics_port is not None:
        server = serve(
            metrics,
            address=options.metrics_host,
            port=options.metrics_port,
            max_age_s=3 * options.period_s + options.flush_every_s,
        )
        log(f"metrics on http://{options.metrics_host}:{server.server_address[1]}/metrics")
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: sampler.stop.set())
    log(f"sampling node {options.node} every {options.period_s:g}s, buffer in {buffer.path}")
    try:
        sampler.run(max_passes=options.max_passes)
    finally:
        if server is not None:
            server.shutdown()
        if holders is not None:
            holders.close()
        reader.close()
        buffer.close()


# ---------------------------------------------------------------- pod watcher


@dataclass(frozen=True)
class WatchOptions:
    """How `auditor watch` runs (each default suits the single-replica Deployment)."""

    kubeconfig: str | None = None
    """A kubeconfig file; None: in-cluster, else `KUBECONFIG` / ~/.kube/config."""
    context: str | None = None
    namespace: str | None = None
    """Watch pods of this namespace only; None: all namespaces."""
    selector: str | None = None
    """Label selector of the pods to watch."""
    nodes: bool = True
    """Watch nodes too (GPU model, capacity, cordoned)."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 9403
    """Port of /metrics and /healthz; 0: any free port; None: no server."""
    health_max_age_s: float = 600.0
    """/healthz fails when a watched kind has not synced for this long."""
    watch_timeout_s: int = 300
    """The server ends each watch after this long (it is then resumed)."""
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 90.0
    """A stream silent this long counts as dead (servers bookmark about every minute)."""
    json_logs: bool = False


def watch(
    url: str,
    options: WatchOptions,
    *,
    config: Config,
    log: Callable[[str], None],
    stop: threading.Event | None = None,
) -> None:
    """Record GPU pods (and nodes) from the Kubernetes API until stopped (SIGTERM).

    Each kind runs its own list/watch loop in a thread; a loop that fails unexpectedly stops
    the watcher with an error, so that Kubernetes restarts it (it resumes from the store)."""
    import signal

    from auditor.collect import kube
    from auditor.collect.observe import WatchMetrics, serve, setup_logging
    from auditor.collect.sinks import NodeSink, PodSink, requests_gpus, scope_filter
    from auditor.collect.watcher import LoopOptions, Reflector

    setup_logging(json_format=options.json_logs)
    in_scope = scope_filter(options.namespace, options.selector)  # a bad selector fails here
    engine = open_store(url)
    api = kube.connect(kubeconfig=options.kubeconfig, context=options.context)
    timeouts = kube.Timeouts(options.connect_timeout_s, options.read_timeout_s)
    stop = stop or threading.Event()
    pod_source = kube.KubeSource(
        api,
        kind=kube.Kind.PODS,
        namespace=options.namespace,
        selector=options.selector,
        timeouts=timeouts,
    )
    pairs: list[tuple[kube.KubeSource, Any]] = [
        (pod_source, PodSink(engine, scope=pod_source.scope, teams=config.teams, in_scope=in_scope))
    ]
    if options.nodes:
        node_source = kube.KubeSource(api, kind=kube.Kind.NODES, timeouts=timeouts)
        pairs.append((node_source, NodeSink(engine, scope=node_source.scope)))
    metrics = WatchMetrics(tuple(str(source.kind) for source, _ in pairs))
    loop = LoopOptions(watch_timeout_s=options.watch_timeout_s)
    failures: list[BaseException] = []

    def run(reflector: Reflector) -> None:
        try:
            reflector.run()
        except BaseException as e:
            failures.append(e)
            stop.set()

    threads = [
        threading.Thread(
            target=run,
            args=(
                Reflector(
                    source,
                    sink,
                    metrics=metrics,
                    stop=stop,
                    options=loop,
                    keep=requests_gpus if source.kind is kube.Kind.PODS else None,
                ),
            ),
            name=f"watch-{source.kind}",
            daemon=True,
        )
        for source, sink in pairs
    ]
    server = None
    if options.metrics_port is not None:
        try:
            server = serve(
                metrics,
                address=options.metrics_host,
                port=options.metrics_port,
                max_age_s=options.health_max_age_s,
            )
        except OSError as e:
            raise InputError(f"cannot listen: {e.strerror}", field="--metrics-port") from e
        log(f"metrics on http://{options.metrics_host}:{server.server_address[1]}/metrics")
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    log(f"watching {', '.join(metrics.kinds)} ({pod_source.scope})")
    for thread in threads:
        thread.start()
    try:
        stop.wait()
    finally:
        stop.set()
        for source, _ in pairs:
            source.interrupt()
        for thread in threads:
            thread.join(timeout=10)  # no daemon thread may be writing a log line at exit
        if server is not None:
            server.shutdown()
    if failures:
        raise AuditorError(f"watch loop failed: {failures[0]!r}") from failures[0]


# ---------------------------------------------------------------- Prometheus import


@dataclass(frozen=True)
class PrometheusImportStats:
    samples: int
    gpus: int
    holdings: int
    """(pod, GPU) pairs recorded from the pod labels."""
    unresolved: int
    """Spans naming a pod the store does not know (import pods, then re-run: harmless)."""
    seconds: float


def import_prometheus(
    url: str,
    *,
    prometheus_url: str,
    window: tuple[int, int],
    step_s: float = 15.0,
    max_points: int = 10_000,
    progress: Callable[[int, int], None] | None = None,
) -> PrometheusImportStats:
    """Import dcgm-exporter samples and pod labels of a window in one transaction.

    `progress(done, total)` is called after each chunk."""
    from auditor.collect.prometheus import PrometheusClient, chunks, read_chunk
    from auditor.collect.sink import resolve_holdings
    from auditor.model import GpuRecord
    from auditor.store.writes import insert_samples, upsert_assignments, upsert_gpus

    started = time.perf_counter()
    start_ms, end_ms = window
    if end_ms <= start_ms:
        raise InputError("the window ends before it starts", field="--end")
    if step_s <= 0:
        raise InputError("the step must be positive", field="--step")
    step_ms = round(step_s * 1000)
    client = PrometheusClient(prometheus_url)
    parts = list(chunks(start_ms, end_ms, step_ms=step_ms, max_points=max_points))
    engine = open_store(url)
    known: dict[str, GpuRecord] = {}
    ids: dict[str, int] = {}
    samples = unresolved = 0
    pairs: set[tuple[str, int]] = set()
    with engine.begin() as conn:
        for done, (first_ms, last_ms) in enumerate(parts, 1):
            chunk = read_chunk(client, first_ms=first_ms, last_ms=last_ms, step_ms=step_ms)
            new = [g for g in chunk.gpus.values() if known.get(g.uuid) != g]
            if new:
                ids.update(upsert_gpus(conn, new))
                known.update((g.uuid, g) for g in new)
            for batch in _batched(iter(chunk.samples), BATCH_ROWS):
                samples += insert_samples(conn, batch, ids)
            seen, left = resolve_holdings(conn, chunk.holdings, ids, slack_ms=step_ms)
            upsert_assignments(conn, seen, source="dcgm-exporter")
            pairs.update((uid, gpu_id) for uid, gpu_id, _ in seen)
            unresolved += len(left)
            if progress is not None:
                progress(done, len(parts))
        if samples == 0:
            raise InputError(
                f"no dcgm-exporter samples in Prometheus at {prometheus_url} for this window",
                field="--start",
            )
    return PrometheusImportStats(
        samples, len(ids), len(pairs), unresolved, time.perf_counter() - started
    )
