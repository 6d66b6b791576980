"""dcgm-exporter metrics out of Prometheus: a small `query_range` client and the reader.

Each metric is read over the window on a `step` grid (dcgm-exporter's scrape interval), in
chunks of at most `max_points` points per series (Prometheus refuses more than 11,000), and
the series of one GPU are joined by timestamp into `GpuSample`s.

Labels are dcgm-exporter's: `UUID` (with `GPU_I_ID` for a MIG instance, which becomes the
GPU `UUID/gi<ID>` with the card as its parent), `Hostname` (else `instance`) as the node,
`gpu` as the index, `modelName`; and `namespace`, `pod` of the pod holding the card, an
exact GPU -> pod mapping. Prometheus drops empty labels, so a series without `pod` is a
card no pod held.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from auditor.collect.buffer import Holding
from auditor.errors import InputError
from auditor.model import GpuRecord, GpuSample

MAX_POINTS = 10_000

METRICS: Mapping[str, str] = {
    "DCGM_FI_DEV_GPU_UTIL": "util",
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "memory_free_mib",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
}
"""dcgm-exporter metric -> GpuSample field (FB_FREE only completes the memory total)."""


class PrometheusClient:
    """`query_range` over HTTP (stdlib urllib); failures become one-line InputErrors."""

    def __init__(self, url: str, *, timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def query_range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> list[dict[str, Any]]:
        form = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}"}
        form["step"] = f"{step_s:g}"
        body = urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/query_range", data=body)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as e:
            answer = _error_body(e)
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise InputError(
                f"cannot reach Prometheus at {self.url}: {reason}", field="--url"
            ) from e
        except ValueError as e:
            raise InputError(f"{self.url} did not answer JSON: {e}", field="--url") from e
        if not isinstance(answer, dict) or answer.get("status") != "success":
            error = answer.get("error") if isinstance(answer, dict) else None
            raise InputError(f"Prometheus refused {query}: {error or answer}", field="--url")
        data = answer.get("data") or {}
        if data.get("resultType") != "matrix":
            raise InputError(f"Prometheus answered {query} with no matrix", field="--url")
        result: list[dict[str, Any]] = data.get("result") or []
        return result


def _error_body(e: urllib.error.HTTPError) -> Any:
    try:
        return json.load(e)
    except ValueError:
        return {"status": "error", "error": f"HTTP {e.code} {e.reason}"}


def chunks(
    start_ms: int, end_ms: int, *, step_ms: int, max_points: int
) -> Iterator[tuple[int, int]]:
    """(first, last) evaluation times of each query: the grid start + k*step below end_ms,
    at most `max_points` per chunk."""
    total = max(0, math.ceil((end_ms - start_ms) / step_ms))
    for first in range(0, total, max_points):
        last = min(first + max_points, total) - 1
        yield start_ms + first * step_ms, start_ms + last * step_ms


@dataclass
class ChunkResult:
    """What one chunk of the window held."""

    gpus: dict[str, GpuRecord] = field(default_factory=dict)
    samples: list[GpuSample] = field(default_factory=list)
    holdings: list[Holding] = field(default_factory=list)


def _gpu(labels: Mapping[str, str]) -> GpuRecord | None:
    uuid = labels.get("UUID")
    node = labels.get("Hostname") or labels.get("instance")
    if not uuid or not node:
        return None
    index = labels.get("gpu")
    instance = labels.get("GPU_I_ID")
    if instance:
        return GpuRecord(f"{uuid}/gi{instance}", node, None, labels.get("modelName"), None, uuid)
    return GpuRecord(
        uuid, node, int(index) if index and index.isdigit() else None, labels.get("modelName")
    )


def read_chunk(
    client: PrometheusClient, *, first_ms: int, last_ms: int, step_ms: int
) -> ChunkResult:
    """Every dcgm-exporter metric over one chunk, joined per GPU and timestamp."""
    columns: dict[str, dict[tuple[str, int], float | None]] = {c: {} for c in METRICS.values()}
    held: dict[tuple[str, int], tuple[str, str]] = {}
    out = ChunkResult()
    for metric, column in METRICS.items():
        series = client.query_range(
            # each grid point takes the one sample scraped in the step before it: no value
            # repeated from the 5-minute lookback where a series ended (a pod released the
            # card) without a staleness marker, as in backfilled or federated data
            f"last_over_time({metric}[{max(step_ms - 1, 1)}ms])",
            start_s=first_ms / 1000,
            end_s=last_ms / 1000,
            step_s=step_ms / 1000,
        )
        values = columns[column]
        for s in series:
            labels: dict[str, str] = s.get("metric", {})
            gpu = _gpu(labels)
            if gpu is None:
                continue
            out.gpus.setdefault(gpu.uuid, gpu)
            uuid = gpu.uuid
            keyed = [((uuid, round(ts * 1000)), float(text)) for ts, text in s.get("values", [])]
            values.update((k, None if math.isnan(v) else v) for k, v in keyed)  # NaN: unread
            pod, namespace = labels.get("pod"), labels.get("namespace")
            if pod and namespace:
                held.update((k, (namespace, pod)) for k, _ in keyed)
    keys = sorted(set().union(*(c.keys() for c in columns.values())))
    get = {c: values.get for c, values in columns.items()}
    for key in keys:
        used, free = get["memory_used_mib"](key), get["memory_free_mib"](key)
        total = used + free if used is not None and free is not None else None
        throttle = get["throttle_reasons"](key)
        out.samples.append(
            GpuSample(
                key[0],
                key[1],
                get["util"](key),
                used,
                total,
                get["power_w"](key),
                get["sm_clock_mhz"](key),
                None if throttle is None else f"0x{int(throttle):016x}",
                get["temperature_c"](key),
                get["sm_active"](key),
                get["tensor_active"](key),
                get["dram_active"](key),
            )
        )
        if total is not None and out.gpus[key[0]].memory_total_mib is None:
            g = out.gpus[key[0]]
            out.gpus[key[0]] = GpuRecord(g.uuid, g.node, g.index, g.model, total, g.parent_uuid)
    out.holdings = spans(held, step_ms=step_ms)
    return out


def spans(held: Mapping[tuple[str, int], tuple[str, str]], *, step_ms: int) -> list[Holding]:
    """Consecutive grid points of one GPU held by one pod, as one holding each."""
    result: list[Holding] = []
    current: dict[str, Holding] = {}
    for (uuid, ts), (namespace, pod) in sorted(held.items()):
        h = current.get(uuid)
        if h is not None and (h.namespace, h.pod) == (namespace, pod) and ts - h.last_ms <= step_ms:
            current[uuid] = Holding(namespace, pod, uuid, h.first_ms, ts)
            continue
        if h is not None:
            result.append(h)
        current[uuid] = Holding(namespace, pod, uuid, ts, ts)
    return result + list(current.values())
