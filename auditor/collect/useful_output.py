"""Useful output per pod (SPEC §8): serving counters and latency histograms from Prometheus,
and an outputs CSV for training.

Prometheus: each counter is read raw over the window on a `step` grid (through the dcgm
reader's `PrometheusClient`: the same deadline, size cap, shape checks and credentials), and
its increase between consecutive points is summed per pod and `interval` (default 5 min,
aligned to the epoch). A value below its predecessor is a counter reset (the server
restarted): the increase is the new value, as Prometheus' `increase()` counts it. Series
are matched to pods by their `namespace` and `pod` labels; the several series of one pod
(models, routes) add up. A latency histogram is read the same way from its `_bucket`
series, one row per pod, interval and bucket bound `le`. Serving queue gauges (SPEC §10:
requests running and waiting, `read_serving_queues`) are read on the same grid.

CSV: a header naming `job` or `pod`, and `start`, `end`, `outputs`, `unit`; optional
`quality` and `quality_better` (`lower`|`higher`). `job` is `namespace/Kind/name`, `pod`
`namespace/name`. Times are ISO 8601 (UTC when no zone is given) or epoch seconds.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from auditor.collect.prometheus import MAX_POINTS, PrometheusClient, chunks
from auditor.errors import InputError
from auditor.limits import METRIC_MAX, UNIT_MAX

DEFAULT_COUNTERS: Mapping[str, str] = {
    "vllm:generation_tokens_total": "tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:request_success_total": "requests",
    "nv_inference_count": "inferences",
    "tgi_request_generated_tokens_sum": "tokens",
}
"""SPEC §8's default output counters (vLLM, Triton, TGI) and the unit each counts."""
DEFAULT_LATENCY = "vllm:e2e_request_latency_seconds"
"""The latency histogram read by default (its `_bucket` series)."""
DEFAULT_INTERVAL_S = 300

_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UNIT = re.compile(r"[a-zA-Z0-9_./-]{1,64}")


@dataclass(frozen=True)
class Increase:
    """What a counter or a histogram bucket grew by, for one pod and interval."""

    namespace: str
    pod: str
    metric: str
    start_ms: int
    end_ms: int
    value: float
    le: float | None = None


@dataclass
class ReadStats:
    series: int = 0
    resets: int = 0
    unlabelled: int = 0
    """Series without `namespace`/`pod` labels: skipped."""
    by_metric: dict[str, int] = field(default_factory=dict)


def parse_metric(text: str) -> tuple[str, str]:
    """`NAME[:unit]` of `--metric`; a name with colons (vLLM's) keeps them: the unit is what
    follows the last colon only when that is not part of a known default name."""
    text = text.strip()
    if text in DEFAULT_COUNTERS:
        return text, DEFAULT_COUNTERS[text]
    name, unit = text, "outputs"
    if ":" in text:
        head, _, tail = text.rpartition(":")
        if head and _UNIT.fullmatch(tail) and not tail.endswith(("_total", "_count", "_sum")):
            name, unit = head, tail
    if not _METRIC.fullmatch(name) or len(name) > METRIC_MAX:
        raise InputError(f"not a Prometheus metric name: {name[:80]!r}", field="--metric")
    return name, unit


def _increases(points: list[list[object]]) -> Iterator[tuple[int, int, float, bool]]:
    """(from_ms, to_ms, increase, was_reset) between consecutive points of a counter."""
    prev_t: int | None = None
    prev_v = 0.0
    for t_raw, v_raw in points:
        t = round(float(str(t_raw)) * 1000)
        try:
            v = float(str(v_raw))
        except ValueError:
            continue
        if not math.isfinite(v) or v < 0:
            continue
        if prev_t is not None:
            reset = v < prev_v
            yield prev_t, t, v if reset else v - prev_v, reset
        prev_t, prev_v = t, v


def read_counters(
    client: PrometheusClient,
    metric: str,
    *,
    window: tuple[int, int],
    step_s: float,
    interval_s: int = DEFAULT_INTERVAL_S,
    stats: ReadStats | None = None,
    bucket: bool = False,
) -> list[Increase]:
    """Increases of `metric` (its `_bucket` series when `bucket`) per pod (and `le`) and
    interval; intervals are `interval_s` long, aligned to the epoch, clipped to the window."""
    stats = stats if stats is not None else ReadStats()
    query = f"{metric}_bucket" if bucket else metric
    sums: dict[tuple[str, str, int, float | None], float] = {}
    step_ms = max(1, round(step_s * 1000))
    # the grid runs to the window's end; each chunk's query starts one step early, so the
    # increase into its first point is counted (once: only increases ending in the chunk are)
    grid = chunks(window[0], window[1] + 1, step_ms=step_ms, max_points=MAX_POINTS)
    for first, last in grid:
        answer = client.query_range(
            query, start_s=(first - step_ms) / 1000, end_s=last / 1000, step_s=step_s
        )
        for labels, values in answer:
            stats.series += 1
            ns, pod = labels.get("namespace"), labels.get("pod")
            if not ns or not pod:
                stats.unlabelled += 1
                continue
            le: float | None = None
            if bucket:
                try:
                    le = float(labels.get("le", "nan"))
                except ValueError:
                    le = math.nan
                if math.isnan(le):
                    raise InputError(
                        f"{query} series of {ns}/{pod} has no numeric 'le' label", field="--url"
                    )
            for t0, t1, inc, reset in _increases(values):
                stats.resets += int(reset)
                if t1 < first or t1 <= window[0] or t1 > window[1] or t1 - t0 > 2 * step_ms:
                    continue  # outside, or across a gap where the counter was not scraped
                start = t1 - 1 - (t1 - 1) % (interval_s * 1000)
                key = (ns, pod, start, le)
                sums[key] = sums.get(key, 0.0) + inc
    out = [
        Increase(ns, pod, metric, max(s, window[0]), min(s + interval_s * 1000, window[1]), v, le)
        for (ns, pod, s, le), v in sorted(sums.items(), key=lambda kv: str(kv[0]))
    ]
    stats.by_metric[metric] = stats.by_metric.get(metric, 0) + len(out)
    return out


# ---------------------------------------------------------------- serving queues (SPEC §10)

SERVING_GAUGES: Mapping[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "tgi_batch_current_size": "running",
    "tgi_queue_size": "waiting",
    "nv_inference_pending_request_count": "waiting",
}
"""Servers' queue gauges and what each counts: requests in the running batch, or waiting."""
TRITON_EXECUTING = "nv_inference_compute_infer_duration_us"
"""Triton has no gauge of requests executing; its counter of each request's compute time
(microseconds) grows, per second, by the mean number executing (Little's law), which
stands for Triton's running requests: `rate(...) / 1e6`."""
QUEUE_MAX = 1e7
"""More requests in one server's queue than any serves; past it a reading is bad input."""
QUEUE_RATE_WINDOW_MIN_MS = 60_000


@dataclass(frozen=True)
class QueueReading:
    """A serving pod's requests running and waiting at one grid time, each summed over the
    pod's series (models, engines) and servers; None where the pod's servers give none."""

    namespace: str
    pod: str
    ts_ms: int
    running: float | None
    waiting: float | None


@dataclass
class QueueStats:
    series: int = 0
    unlabelled: int = 0
    """Series without `namespace`/`pod` labels: skipped."""
    bad: dict[str, int] = field(default_factory=dict)
    """Metric -> points skipped as bad input (not a number, infinite, negative, too many)."""


def read_serving_queues(
    client: PrometheusClient,
    *,
    window: tuple[int, int],
    step_s: float,
    stats: QueueStats | None = None,
) -> list[QueueReading]:
    """Every serving pod's queue on a `step` grid over the window: gauges through
    `last_over_time` over one step (no value carried past a series' end), Triton's running
    requests through `rate()` (`TRITON_EXECUTING`). A pod with none of these series has
    no reading (it is not known to be a serving pod)."""
    stats = stats if stats is not None else QueueStats()
    step_ms = max(1, round(step_s * 1000))
    rate_ms = max(2 * step_ms, QUEUE_RATE_WINDOW_MIN_MS)
    queries = [(m, kind, f"last_over_time({m}[{max(step_ms - 1, 1)}ms])", 1.0)
               for m, kind in SERVING_GAUGES.items()]  # fmt: skip
    queries.append((TRITON_EXECUTING, "running", f"rate({TRITON_EXECUTING}[{rate_ms}ms])", 1e-6))
    sums: dict[tuple[str, str, int], dict[str, float]] = {}
    for first, last in chunks(window[0], window[1], step_ms=step_ms, max_points=MAX_POINTS):
        for metric, kind, query, scale in queries:
            answer = client.query_range(
                query, start_s=first / 1000, end_s=last / 1000, step_s=step_ms / 1000
            )
            for labels, values in answer:
                stats.series += 1
                ns, pod = labels.get("namespace"), labels.get("pod")
                if not ns or not pod:
                    stats.unlabelled += 1
                    continue
                for t_raw, v_raw in values:
                    try:
                        value = float(str(v_raw)) * scale
                    except ValueError:
                        value = math.nan
                    if not (math.isfinite(value) and 0 <= value <= QUEUE_MAX):
                        stats.bad[metric] = stats.bad.get(metric, 0) + 1
                        continue
                    at = sums.setdefault((ns, pod, round(float(str(t_raw)) * 1000)), {})
                    at[kind] = at.get(kind, 0.0) + value
    return [
        QueueReading(ns, pod, ms, got.get("running"), got.get("waiting"))
        for (ns, pod, ms), got in sorted(sums.items())
    ]


# ---------------------------------------------------------------- the outputs CSV


@dataclass(frozen=True)
class CsvOutput:
    """One row of an outputs CSV: a job (`namespace/Kind/name`) or pod (`namespace/name`)."""

    line: int
    kind: str
    """`job` or `pod`."""
    namespace: str
    name: str
    start_ms: int
    end_ms: int
    outputs: float
    unit: str
    quality: float | None
    quality_better: str | None


REQUIRED = ("start", "end", "outputs", "unit")


def _time(text: str, *, file: str, line: int, column: str) -> int:
    text = text.strip()
    try:
        return round(float(text) * 1000)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"not a time (ISO 8601 or epoch seconds): {text[:40]!r}",
            file=file,
            line=line,
            field=column,
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return round(when.timestamp() * 1000)


def _number(text: str, *, file: str, line: int, column: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise InputError(
            f"not a number: {text[:40]!r}", file=file, line=line, field=column
        ) from None
    if not math.isfinite(value):
        raise InputError(f"not a finite number: {text!r}", file=file, line=line, field=column)
    return value


def read_outputs_csv(path: Path) -> list[CsvOutput]:
    """Every row of an outputs CSV, checked; the first bad cell is a one-line InputError."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read: {e}", file=file) from e
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise InputError("empty file: expected a header", file=file, line=1)
    header = [h.strip().lower() for h in rows[0]]
    target = [c for c in ("job", "pod") if c in header]
    missing = [c for c in REQUIRED if c not in header]
    if len(target) != 1 or missing:
        need = "one of job or pod" if len(target) != 1 else ", ".join(missing)
        raise InputError(f"header lacks {need}", file=file, line=1, field="header")
    col = {h: i for i, h in enumerate(header)}
    out: list[CsvOutput] = []
    for n, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise InputError(f"{len(row)} fields, the header has {len(header)}", file=file, line=n)

        def cell(name: str, row: list[str] = row) -> str:
            return row[col[name]].strip()

        kind = target[0]
        parts = cell(kind).split("/")
        if (
            (kind == "job" and len(parts) != 3)
            or (kind == "pod" and len(parts) != 2)
            or not all(parts)
        ):
            shape = "namespace/Kind/name" if kind == "job" else "namespace/name"
            raise InputError(
                f"{kind} {cell(kind)[:80]!r} is not {shape}", file=file, line=n, field=kind
            )
        start = _time(cell("start"), file=file, line=n, column="start")
        end = _time(cell("end"), file=file, line=n, column="end")
        if end <= start:
            raise InputError("end is not after start", file=file, line=n, field="end")
        value = _number(cell("outputs"), file=file, line=n, column="outputs")
        if value < 0:
            raise InputError("outputs is negative", file=file, line=n, field="outputs")
        unit = cell("unit")
        if not _UNIT.fullmatch(unit) or len(unit) > UNIT_MAX:
            raise InputError(f"not a unit: {unit[:40]!r}", file=file, line=n, field="unit")
        quality: float | None = None
        better: str | None = None
        if "quality" in col and cell("quality"):
            quality = _number(cell("quality"), file=file, line=n, column="quality")
            better = cell("quality_better").lower() if "quality_better" in col else "lower"
            if better not in {"lower", "higher"}:
                raise InputError(
                    f"quality_better is {better[:20]!r}, not lower or higher",
                    file=file,
                    line=n,
                    field="quality_better",
                )
        ns = parts[0]
        name = "/".join(parts[1:])
        out.append(CsvOutput(n, kind, ns, name, start, end, value, unit, quality, better))
    return out
