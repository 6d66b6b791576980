"""SPEC §10's infrastructure signals out of Prometheus: cAdvisor's per-container CPU,
throttling, pressure and network series into per-pod rows, dcgm-exporter's PCIe and NVLink
traffic into per-card rows, on the same grid as the GPU samples.

cAdvisor (the kubelet's `/metrics/cadvisor`) labels each series with `namespace`, `pod`
and `container`. A pod has one row per container, and two more that stand for the whole
pod: `container=""` (the pod's own cgroup, the sum of its containers) and, where a runtime
still reports its sandbox, `container="POD"`. CPU is summed over the real containers only
(the pod rows would count it twice); pressure is the pod's own cgroup's where it is
reported (a share of time in which any task of the pod waited: summing containers could
exceed 1), else the most pressed container's; network is the pod's (the sandbox holds the
network namespace), from the `""` row, else the `POD` row, else the busiest container's,
summed over interfaces but `lo`.

Counters are read through `rate()` over `rate_window_ms(step)` (at least two steps and a
minute, so that two scrapes fall in it; a counter reset is `rate()`'s business); gauges
(the CPU quota and period, dcgm-exporter's PROF fields, already bytes per second) through
`last_over_time()`. A series that is absent gives no row: a signal not recorded is left
unexplained downstream, never guessed. A point that is not a number, infinite, negative, or
a ratio beyond `BOUNDS` is counted in `SignalStats.bad` and skipped; it never stops the
import.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from auditor.collect.prometheus.decode import Series
from auditor.collect.prometheus.matchers import selector as series_selector

RATE_WINDOW_MIN_MS = 60_000
"""The shortest `rate()` window: the kubelet's cAdvisor is scraped every 15-60 s, and
`rate()` needs two scrapes in its window."""

BOUNDS: Mapping[str, float] = {
    "cpu_limit_ratio": 16.0,
    "throttled_ratio": 1.0,
    "cpu_pressure": 1.0,
    "io_pressure": 1.0,
    "net_bytes_s": 1e12,
    "pcie_bytes_s": 1e12,
    "nvlink_bytes_s": 1e13,
}
"""The largest value a signal can take (bytes per second: 1 TB/s over PCIe or a pod's
network, 10 TB/s over NVLink are past any card); a larger one is bad input, counted and
skipped. CPU use may pass its quota a little within a period (CFS burst), never 16 times."""
RATIO_SLACK = 0.05
"""Two counters read in one scrape are still read at slightly different instants: a share
up to 5 % past 1 is 1; beyond that it is bad input."""

CADVISOR = {
    "cpu": "container_cpu_usage_seconds_total",
    "periods": "container_cpu_cfs_periods_total",
    "throttled": "container_cpu_cfs_throttled_periods_total",
    "quota": "container_spec_cpu_quota",
    "period": "container_spec_cpu_period",
    "cpu_pressure": "container_pressure_cpu_waiting_seconds_total",
    "io_pressure": "container_pressure_io_waiting_seconds_total",
    "rx": "container_network_receive_bytes_total",
    "tx": "container_network_transmit_bytes_total",
}
"""What each cAdvisor series is read as."""
GAUGES = frozenset({"quota", "period"})

DCGM = {
    "pcie_rx": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "pcie_tx": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "nvlink_rx": "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "nvlink_tx": "DCGM_FI_PROF_NVLINK_TX_BYTES",
}
"""dcgm-exporter's profiling fields 1009-1012: gauges in bytes per second (the exporter's
shipped CSVs type them `gauge`, "the rate of data ... in bytes per second")."""

POD_LEVEL = ("", "POD")
"""The `container` values of cAdvisor's rows for a whole pod."""
MAX_NAMED_PODS = 2_000
"""Pods named one by one in a query's selector; past that, only their namespaces."""


class RangeQuerier(Protocol):
    """What the readers ask of a client (`PrometheusClient` is one)."""

    matchers: str
    """Label matchers every selector carries (one cluster's series)."""

    def query_range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> Iterable[Series]: ...


@dataclass
class SignalStats:
    """What the signal readers saw: series read per metric, points skipped per metric or
    signal (bad input)."""

    series: dict[str, int] = field(default_factory=dict)
    bad: dict[str, int] = field(default_factory=dict)

    def skip(self, what: str, n: int = 1) -> None:
        self.bad[what] = self.bad.get(what, 0) + n


@dataclass(frozen=True)
class PodSignalRow:
    """One pod's cAdvisor signals at one grid time; None where not recorded."""

    namespace: str
    pod: str
    ts_ms: int
    cpu_limit_ratio: float | None = None
    throttled_ratio: float | None = None
    cpu_pressure: float | None = None
    io_pressure: float | None = None
    net_bytes_s: float | None = None


@dataclass(frozen=True)
class CardSignalRow:
    """One card's PCIe and NVLink traffic (bytes per second, both directions) at one time."""

    uuid: str
    ts_ms: int
    pcie_bytes_s: float | None = None
    nvlink_bytes_s: float | None = None


def rate_window_ms(step_ms: int) -> int:
    """The `rate()` window for a grid of `step_ms`."""
    return max(2 * step_ms, RATE_WINDOW_MIN_MS)


def pod_selector(pods: Iterable[tuple[str, str]]) -> str:
    """Label matchers naming these (namespace, pod) pairs (only their namespaces past
    `MAX_NAMED_PODS`), so that a query reads the GPU pods the store knows, not the
    cluster's every pod."""
    wanted = sorted(set(pods))
    namespaces = sorted({ns for ns, _ in wanted})
    parts = [f'namespace=~"{_alternatives(namespaces)}"']
    if len(wanted) <= MAX_NAMED_PODS:
        parts.append(f'pod=~"{_alternatives(sorted({p for _, p in wanted}))}"')
    return ",".join(parts)


def _alternatives(values: Sequence[str]) -> str:
    regex = "|".join(re.escape(v) for v in values)
    return regex.replace("\\", "\\\\").replace('"', '\\"')


_Key = tuple[str, str, str]  # namespace, pod, container ("" for the pod's own cgroup)


def _points(
    client: RangeQuerier,
    query: str,
    *,
    metric: str,
    first_ms: int,
    last_ms: int,
    step_ms: int,
    stats: SignalStats,
) -> dict[_Key, dict[int, float]]:
    """(namespace, pod, container) -> ms -> value of a `sum by` answer; bad points counted
    under `metric` and skipped."""
    out: dict[_Key, dict[int, float]] = {}
    answer = client.query_range(
        query, start_s=first_ms / 1000, end_s=last_ms / 1000, step_s=step_ms / 1000
    )
    for labels, values in answer:
        ns, pod = labels.get("namespace"), labels.get("pod")
        if not ns or not pod:
            continue
        stats.series[metric] = stats.series.get(metric, 0) + 1
        times = out.setdefault((ns, pod, labels.get("container", "")), {})
        for ts, text in values:
            value = _number(text)
            if value is None:
                stats.skip(metric)
                continue
            times[round(ts * 1000)] = value
    return out


def _number(text: object) -> float | None:
    """A finite, non-negative reading, else None (bad)."""
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _bounded(value: float | None, signal: str, stats: SignalStats) -> float | None:
    """`value` within `BOUNDS[signal]` (a share a little past 1 is 1), else counted, None."""
    if value is None:
        return None
    high = BOUNDS[signal]
    if value <= high:
        return value
    if high == 1.0 and value <= 1.0 + RATIO_SLACK:
        return 1.0
    stats.skip(signal)
    return None


def read_cadvisor_chunk(
    client: RangeQuerier,
    *,
    first_ms: int,
    last_ms: int,
    step_ms: int,
    selector: str,
    stats: SignalStats,
) -> list[PodSignalRow]:
    """The pod rows of one chunk of the grid, for the pods `selector` matches
    (`pod_selector`)."""
    window = f"{rate_window_ms(step_ms)}ms"
    of_pods = ",".join(m for m in (selector, client.matchers) if m)
    containers = f'{of_pods},container!="",container!="POD"'
    read: dict[str, dict[_Key, dict[int, float]]] = {}
    for what, metric in CADVISOR.items():
        by = "by (namespace, pod, container)"
        if what in GAUGES:
            expr = f"max {by} (last_over_time({metric}{{{containers}}}[{window}]))"
        else:
            chosen = containers if what in {"cpu", "periods", "throttled"} else of_pods
            if what in {"rx", "tx"}:
                chosen += ',interface!="lo"'
            expr = f"sum {by} (rate({metric}{{{chosen}}}[{window}]))"
        read[what] = _points(
            client,
            expr,
            metric=metric,
            first_ms=first_ms,
            last_ms=last_ms,
            step_ms=step_ms,
            stats=stats,
        )
    pods: dict[tuple[str, str], dict[str, dict[str, dict[int, float]]]] = {}
    for what, series in read.items():
        for (ns, pod, container), times in series.items():
            pods.setdefault((ns, pod), {}).setdefault(what, {})[container] = times
    rows: list[PodSignalRow] = []
    for (ns, pod), by_what in sorted(pods.items()):
        stamps = sorted({ms for c in by_what.values() for t in c.values() for ms in t})
        for ms in stamps:
            values = {
                "cpu_limit_ratio": _limit_ratio(by_what, ms),
                "throttled_ratio": _throttled(by_what, ms),
                "cpu_pressure": _pod_level(by_what, "cpu_pressure", ms),
                "io_pressure": _pod_level(by_what, "io_pressure", ms),
                "net_bytes_s": _network(by_what, ms),
            }
            kept = {k: _bounded(v, k, stats) for k, v in values.items()}
            if any(v is not None for v in kept.values()):
                rows.append(PodSignalRow(ns, pod, ms, **kept))
    return rows


_ByWhat = Mapping[str, Mapping[str, Mapping[int, float]]]


def _limit_ratio(by_what: _ByWhat, ms: int) -> float | None:
    """CPU used / CPU limit, over the containers that have a limit (quota/period, cores)
    and a usage reading; None where none has."""
    used = limit = 0.0
    found = False
    quotas, periods = by_what.get("quota", {}), by_what.get("period", {})
    for container, times in by_what.get("cpu", {}).items():
        usage = times.get(ms)
        quota = quotas.get(container, {}).get(ms)
        period = periods.get(container, {}).get(ms)
        if usage is None or not quota or not period:
            continue  # no quota: the container may use the node's every core
        used += usage
        limit += quota / period
        found = True
    return used / limit if found and limit > 0 else None


def _throttled(by_what: _ByWhat, ms: int) -> float | None:
    """Throttled periods / periods over the containers with CFS periods elapsed."""
    throttled = by_what.get("throttled", {})
    total = hit = 0.0
    for container, times in by_what.get("periods", {}).items():
        periods = times.get(ms)
        count = throttled.get(container, {}).get(ms)
        if periods is None or count is None:
            continue
        total += periods
        hit += count
    return hit / total if total > 0 else None


def _pod_level(by_what: _ByWhat, what: str, ms: int) -> float | None:
    """The pod cgroup's share, else the most pressed container's (a lower bound)."""
    series = by_what.get(what, {})
    own = series.get("", {}).get(ms)
    if own is not None:
        return own
    values = [t[ms] for c, t in series.items() if c not in POD_LEVEL and ms in t]
    return max(values) if values else None


def _network(by_what: _ByWhat, ms: int) -> float | None:
    """Received + sent bytes per second of the pod's network namespace; None unless both
    directions were read (one alone would understate the traffic)."""
    total = 0.0
    for what in ("rx", "tx"):
        series = by_what.get(what, {})
        value = next((series[c][ms] for c in POD_LEVEL if ms in series.get(c, {})), None)
        if value is None:
            others = [t[ms] for c, t in series.items() if c not in POD_LEVEL and ms in t]
            value = max(others) if others else None
        if value is None:
            return None
        total += value
    return total


def read_dcgm_traffic_chunk(
    client: RangeQuerier, *, first_ms: int, last_ms: int, step_ms: int, stats: SignalStats
) -> list[CardSignalRow]:
    """The card rows of one chunk: PCIe rx+tx and NVLink rx+tx, each where both directions
    were read (one alone would understate the traffic). MIG instances' series are left out:
    the traffic is the physical card's (DCGM gives PCIe for whole cards only)."""
    read: dict[str, dict[str, dict[int, float]]] = {}
    for what, metric in DCGM.items():
        answer = client.query_range(
            f"last_over_time({series_selector(metric, client.matchers)}[{max(step_ms - 1, 1)}ms])",
            start_s=first_ms / 1000,
            end_s=last_ms / 1000,
            step_s=step_ms / 1000,
        )
        high = BOUNDS["nvlink_bytes_s" if what.startswith("nvlink") else "pcie_bytes_s"]
        for labels, values in answer:
            uuid = labels.get("UUID")
            if not uuid or labels.get("GPU_I_ID"):
                continue
            stats.series[metric] = stats.series.get(metric, 0) + 1
            times = read.setdefault(what, {}).setdefault(uuid, {})
            for ts, text in values:
                value = _number(text)
                if value is None or value > high:
                    stats.skip(metric)
                    continue
                ms = round(ts * 1000)
                times[ms] = max(value, times.get(ms, 0.0))
    rows: list[CardSignalRow] = []
    uuids = sorted({u for series in read.values() for u in series})
    for uuid in uuids:
        got = {what: read.get(what, {}).get(uuid, {}) for what in DCGM}
        stamps = sorted({ms for t in got.values() for ms in t})
        for ms in stamps:
            pcie = _both(got["pcie_rx"].get(ms), got["pcie_tx"].get(ms))
            nvlink = _both(got["nvlink_rx"].get(ms), got["nvlink_tx"].get(ms))
            if pcie is not None or nvlink is not None:
                rows.append(CardSignalRow(uuid, ms, pcie, nvlink))
    return rows


def _both(rx: float | None, tx: float | None) -> float | None:
    return rx + tx if rx is not None and tx is not None else None
