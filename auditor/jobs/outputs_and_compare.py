"""Jobs of SPEC §8: import outputs (Prometheus counters and histograms, an outputs CSV) and
compare two selections of work, each over its own window."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.errors import InputError
from auditor.jobs.common import open_store
from auditor.model import Selection, Window
from auditor.redact import redact
from auditor.timespec import parse_instant

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Connection

    from auditor.collect.prometheus import Auth
    from auditor.report.compare import Comparison, Side


@dataclass(frozen=True)
class OutputsImportStats:
    rows: int
    latency_rows: int
    pods: int
    unresolved: int
    """Rows or series naming pods or jobs not in the database (skipped)."""
    resets: int
    seconds: float
    queue_rows: int = 0
    """Serving queue rows stored (requests running and waiting per pod and grid time)."""
    queue_unresolved: int = 0
    """Queue readings of pods not in the database (skipped)."""
    queue_bad: Mapping[str, int] = field(default_factory=dict)
    """Metric -> queue readings skipped as bad input."""


Holder = tuple[str, int | None, int | None]


def _holder_at(holders: Sequence[Holder], ms: int) -> str | None:
    """The pod of that name that existed at `ms` (else the latest bound before it)."""
    best: tuple[int, str] | None = None
    for uid, bound, end in holders:
        if (bound is None or bound <= ms) and (end is None or ms < end):
            return uid
        if bound is not None and bound <= ms and (best is None or bound > best[0]):
            best = (bound, uid)
    return best[1] if best else (holders[0][0] if len(holders) == 1 else None)


def import_outputs_csv(url: str, path: Path) -> OutputsImportStats:
    """Store an outputs CSV in one transaction. A job's row is shared among its pods in
    proportion to the time each held within the row's interval."""
    from auditor.collect.useful_output import read_outputs_csv
    from auditor.store.work_done import pods_by_name, pods_of_jobs, write_outputs

    started = time.perf_counter()
    rows = read_outputs_csv(path)
    engine = open_store(url)
    with engine.begin() as conn:
        named = pods_by_name(conn, [(r.namespace, r.name) for r in rows if r.kind == "pod"])
        jobs = pods_of_jobs(conn, [(r.namespace, r.name) for r in rows if r.kind == "job"])
        out: list[dict[str, Any]] = []
        for r in rows:
            shares: list[tuple[str, float]] = []
            if r.kind == "pod":
                uid = _holder_at(named.get((r.namespace, r.name), []), r.start_ms)
                shares = [(uid, 1.0)] if uid else []
            else:
                span = r.end_ms - r.start_ms
                held = [
                    (uid, min(r.end_ms, end or r.end_ms) - max(r.start_ms, bound or r.start_ms))
                    for uid, bound, end in jobs.get((r.namespace, r.name), [])
                ]
                held = [(u, h) for u, h in held if h > 0]
                total = sum(h for _, h in held)
                shares = [(u, h / total) for u, h in held] if total > 0 and span > 0 else []
            if not shares:
                what = f"{r.namespace}/{r.name}"
                raise InputError(
                    f"no {r.kind} {what!r} in the database over this interval: import pods first",
                    file=str(path),
                    line=r.line,
                    field=r.kind,
                )
            for uid, share in shares:
                out.append(
                    {
                        "pod_uid": uid,
                        "metric": f"csv:{r.unit}",
                        "start_ms": r.start_ms,
                        "end_ms": r.end_ms,
                        "outputs": r.outputs * share,
                        "unit": r.unit,
                        "source": "csv",
                        "quality": r.quality,
                        "quality_better": r.quality_better,
                    }
                )
        _refuse_duplicates(out, path)
        write_outputs(conn, out)
        _record(conn, source=str(path.absolute()), options={}, rows=len(out))
    return OutputsImportStats(
        rows=len(out),
        latency_rows=0,
        pods=len({r["pod_uid"] for r in out}),
        unresolved=0,
        resets=0,
        seconds=time.perf_counter() - started,
    )


def _record(conn: Connection, *, source: str, options: dict[str, Any], rows: int) -> None:
    """The outputs import's ledger row (listed; it cannot be taken back: `store.ledger`)."""
    from auditor.store import ledger

    import_id = ledger.begin(
        conn, kind="outputs", source=source, options=options, now_ms=int(time.time() * 1000)
    )
    ledger.finish(conn, import_id, rows_written=rows)


def _refuse_duplicates(rows: list[dict[str, Any]], path: Path) -> None:
    seen: set[tuple[str, str, int]] = set()
    for r in rows:
        key = (r["pod_uid"], r["metric"], r["start_ms"])
        if key in seen:
            raise InputError(
                "two rows of one pod or job, unit and start", file=str(path), field="start"
            )
        seen.add(key)


def import_outputs_prometheus(
    url: str,
    *,
    prometheus_url: str,
    window: tuple[int, int],
    step_s: float,
    metrics: Sequence[tuple[str, str]] | None = None,
    latency: str | None = None,
    auth: Auth | None = None,
    timeout_s: float = 60.0,
    interval_s: int = 300,
) -> OutputsImportStats:
    """Read output counters and the latency histogram, store them per pod and interval."""
    from auditor.collect.prometheus import PrometheusClient
    from auditor.collect.useful_output import (
        DEFAULT_COUNTERS,
        DEFAULT_LATENCY,
        QueueStats,
        ReadStats,
        read_counters,
        read_serving_queues,
    )
    from auditor.store.signals import write_pod_signals
    from auditor.store.work_done import pods_by_name, write_latency, write_outputs

    started = time.perf_counter()
    if window[1] <= window[0]:
        raise InputError("the window ends before it starts", field="--end")
    client = PrometheusClient(prometheus_url, auth=auth, timeout_s=timeout_s)
    stats = ReadStats()
    chosen = list(metrics) if metrics else list(DEFAULT_COUNTERS.items())
    units = dict(chosen)
    counters = [
        inc
        for name, _ in chosen
        for inc in read_counters(
            client, name, window=window, step_s=step_s, interval_s=interval_s, stats=stats
        )
    ]
    hist_name = latency if latency is not None else DEFAULT_LATENCY
    buckets = (
        read_counters(
            client,
            hist_name,
            window=window,
            step_s=step_s,
            interval_s=interval_s,
            stats=stats,
            bucket=True,
        )
        if hist_name
        else []
    )
    queue_stats = QueueStats()
    queues = read_serving_queues(client, window=window, step_s=step_s, stats=queue_stats)
    engine = open_store(url)
    unresolved = queue_unresolved = 0
    with engine.begin() as conn:
        names = [(i.namespace, i.pod) for i in [*counters, *buckets]]
        named = pods_by_name(conn, names + [(q.namespace, q.pod) for q in queues])
        out: dict[tuple[str, str, int], dict[str, Any]] = {}
        lat: dict[tuple[str, str, int, float], dict[str, Any]] = {}
        for inc in counters:
            uid = _holder_at(named.get((inc.namespace, inc.pod), []), inc.start_ms)
            if uid is None:
                unresolved += 1
                continue
            key = (uid, inc.metric, inc.start_ms)
            row = out.setdefault(
                key,
                {
                    "pod_uid": uid,
                    "metric": inc.metric,
                    "start_ms": inc.start_ms,
                    "end_ms": inc.end_ms,
                    "outputs": 0.0,
                    "unit": units[inc.metric],
                    "source": "prometheus",
                    "quality": None,
                    "quality_better": None,
                },
            )
            row["outputs"] += inc.value
        for inc in buckets:
            uid = _holder_at(named.get((inc.namespace, inc.pod), []), inc.start_ms)
            if uid is None or inc.le is None:
                unresolved += 1
                continue
            lkey = (uid, inc.metric, inc.start_ms, inc.le)
            lrow = lat.setdefault(
                lkey,
                {
                    "pod_uid": uid,
                    "metric": inc.metric,
                    "start_ms": inc.start_ms,
                    "end_ms": inc.end_ms,
                    "le": inc.le,
                    "count": 0.0,
                },
            )
            lrow["count"] += inc.value
        queue_rows: list[dict[str, Any]] = []
        for q in queues:
            uid = _holder_at(named.get((q.namespace, q.pod), []), q.ts_ms)
            if uid is None:
                queue_unresolved += 1
                continue
            queue_rows.append(
                {"pod_uid": uid, "source": "serving", "ts_ms": q.ts_ms,
                 "requests_running": q.running, "requests_waiting": q.waiting}
            )  # fmt: skip
        n = write_outputs(conn, list(out.values()))
        m = write_latency(conn, list(lat.values()))
        q_rows = write_pod_signals(conn, queue_rows)
        _record(
            conn,
            source=redact(prometheus_url),
            options={"start_ms": window[0], "end_ms": window[1], "step_s": step_s},
            rows=n,
        )
    return OutputsImportStats(
        rows=n,
        latency_rows=m,
        pods=len({k[0] for k in out} | {k[0] for k in lat} | {r["pod_uid"] for r in queue_rows}),
        unresolved=unresolved,
        resets=stats.resets,
        seconds=time.perf_counter() - started,
        queue_rows=q_rows,
        queue_unresolved=queue_unresolved,
        queue_bad=dict(sorted(queue_stats.bad.items())),
    )


def store_latency_rows(url: str, rows: Sequence[dict[str, Any]]) -> int:
    """Store latency bucket increases given per (namespace, pod): what the demo computed from
    its simulated servers' own histograms, where no Prometheus runs."""
    from auditor.store.work_done import pods_by_name, write_latency

    engine = open_store(url)
    with engine.begin() as conn:
        named = pods_by_name(conn, [(str(r["namespace"]), str(r["pod"])) for r in rows])
        out = []
        for r in rows:
            uid = _holder_at(
                named.get((str(r["namespace"]), str(r["pod"])), []), int(r["start_ms"])
            )
            if uid is None:
                raise InputError(f"no pod {r['namespace']}/{r['pod']} in the database", field="pod")
            out.append(
                {k: r[k] for k in ("metric", "start_ms", "end_ms", "le", "count")}
                | {"pod_uid": uid}
            )
        return write_latency(conn, out)


# ---------------------------------------------------------------- compare

_SIDE = re.compile(r"^(job|team|label)=(.+)@(.+)\.\.(.+)$")


def parse_side(text: str, *, option: str) -> Selection:
    """`job=NS/Kind/name@START..END`, `team=T@...` or `label=KEY=VALUE@...`."""
    m = _SIDE.match(text.strip())
    if m is None:
        raise InputError(
            f"{text[:80]!r} is not SELECTOR@START..END (job=NS/Kind/name, team=T, label=K=V)",
            field=option,
        )
    kind, value, a, b = m.groups()
    if kind == "job" and len(value.split("/")) != 3:
        raise InputError(f"job {value[:80]!r} is not namespace/Kind/name", field=option)
    if kind == "label" and "=" not in value:
        raise InputError(f"label {value[:80]!r} is not KEY=VALUE", field=option)
    window = Window(parse_instant(a, option=option), parse_instant(b, option=option))
    if window[1] <= window[0]:
        raise InputError(f"{option}: the window ends before it starts", field=option)
    return Selection(kind, value, window, text.strip())


def side(url: str, sel: Selection) -> Side:
    """One side's figures: the selected pods' audit results over the side's window."""
    from auditor.jobs.reports import covering_runs
    from auditor.report.compare import Side, outputs_in_window, side_figures
    from auditor.store import reads
    from auditor.store.work_done import read_latency, read_outputs, selected_pods

    engine = open_store(url)
    with engine.connect() as conn:
        uids = selected_pods(conn, sel)
        if not uids:
            raise InputError(f"no pods match {sel.kind}={sel.value!r}", field="A/B")
        runs = reads.runs_in_window(conn, start_ms=sel.window[0], end_ms=sel.window[1])
        # the runs of the clusters the pods ran in: another cluster's coverage is not asked
        runs = runs[runs["cluster"].isin(reads.clusters_of(conn, sorted(uids)))]
        run_ids = covering_runs(
            runs,
            start_ms=sel.window[0],
            end_ms=sel.window[1],
            what=f"the window of {sel.text}",
            flags=False,
        )
        results: pd.DataFrame = reads.read_results(conn, run_ids)
        results = results[results["pod_uid"].isin(uids)]
        produced = read_outputs(conn, window=sel.window)
        produced = outputs_in_window(produced[produced["pod_uid"].isin(uids)], window=sel.window)
        latency = read_latency(conn, window=sel.window, pod_uids=sorted(uids))
    if len(latency):
        from auditor.store.work_done import overlap_share

        latency = latency.assign(count=latency["count"] * overlap_share(latency, window=sel.window))
    return Side(sel.text, sel.window, side_figures(results, produced, latency, window=sel.window))


def compare(url: str, a: Selection, b: Selection, *, tolerance: float = 0.05) -> Comparison:
    """Both sides' figures, the confounders and the verdict (SPEC §8)."""
    from auditor.report.compare import compare_sides

    return compare_sides(side(url, a), side(url, b), tol=tolerance)
