"""The sampler's own health: Prometheus metrics on `/metrics`, and `/healthz`.

Metrics live in a registry the caller passes (tests hand a fresh one). `/healthz` answers
200 while passes keep coming (the last within `stale_after_s`), 503 otherwise, so the
DaemonSet's liveness probe restarts a stuck sampler. The sampler's own CPU time and resident
memory are exported too, to keep them visibly small.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge

from auditor.agents.serve import serve_http

PREFIX = "auditor_sampler"


class SamplerMetrics:
    """Counters and gauges of one sampler, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry, *, clock: Callable[[], float] = time.time):
        self.registry = registry
        self.clock = clock
        self.passes = Counter(
            f"{PREFIX}_passes", "Passes over the node's devices.", registry=registry
        )
        self.gpu_samples = Counter(f"{PREFIX}_gpu_samples", "GPU samples read.", registry=registry)
        self.device_problems = Counter(
            f"{PREFIX}_device_problems",
            "Devices that could not be read in a pass (GPU lost, NVML errors).",
            registry=registry,
        )
        self.mapping_errors = Counter(
            f"{PREFIX}_pod_resources_errors", "Failed pod-resources List calls.", registry=registry
        )
        self.tenant_samples = Counter(
            f"{PREFIX}_tenant_samples",
            "Per-pod utilisation samples of cards read (--process-util).",
            registry=registry,
        )
        self.unattributed_processes = Counter(
            f"{PREFIX}_unattributed_processes",
            "Processes using a card that are in no pod (host processes, or gone before their "
            "cgroup was read), per pass (--process-util).",
            registry=registry,
        )
        self.pod_signals = Counter(
            f"{PREFIX}_pod_signals",
            "GPU pods' cgroup signal rows read (--cgroup-root).",
            registry=registry,
        )
        self.cgroup_errors = Counter(
            f"{PREFIX}_cgroup_errors",
            "GPU pods whose cgroup files could not be read or parsed in a pass (skipped).",
            registry=registry,
        )
        self.card_signals = Counter(
            f"{PREFIX}_card_signals", "Cards' PCIe/NVLink signal rows read.", registry=registry
        )
        self.unsupported_card_signals = Counter(
            f"{PREFIX}_unsupported_card_signals",
            "Card signals (PCIe throughput, link, NVLink) NVML could not give, per card and pass.",
            registry=registry,
        )
        self.store_errors = Counter(
            f"{PREFIX}_store_errors", "Failed writes to the store.", registry=registry
        )
        self.stored_samples = Counter(
            f"{PREFIX}_stored_samples", "GPU samples written to the store.", registry=registry
        )
        self.dropped_passes = Counter(
            f"{PREFIX}_dropped_passes",
            "Passes dropped, oldest first, because the on-disk buffer was full.",
            registry=registry,
        )
        self.refused_passes = Counter(
            f"{PREFIX}_refused_passes",
            "Passes the store refused for their data (not for being down): written alone, "
            "then dropped, so that one bad pass never holds up the ones after it.",
            registry=registry,
        )
        self.dropped_holdings = Counter(
            f"{PREFIX}_dropped_holdings",
            "Pod holdings dropped because the store never learned their pod.",
            registry=registry,
        )
        self.conflict_samples = Counter(
            f"{PREFIX}_gpu_conflict_samples",
            "GPU samples skipped because the store has that GPU UUID on another node or as "
            "another model (the card is not moved; see the sampler's warning).",
            registry=registry,
        )
        self.conflicting_gpus = Gauge(
            f"{PREFIX}_conflicting_gpus",
            "GPUs of this node whose samples are skipped as conflicting with the store.",
            registry=registry,
        )
        self.buffered = Gauge(
            f"{PREFIX}_buffered_passes", "Passes waiting for the store.", registry=registry
        )
        self.unresolved = Gauge(
            f"{PREFIX}_unresolved_holdings",
            "Pod holdings waiting for their pod to be recorded.",
            registry=registry,
        )
        self.gpus = Gauge(f"{PREFIX}_gpus", "GPUs read in the last pass.", registry=registry)
        self.last_pass = Gauge(
            f"{PREFIX}_last_pass_timestamp_seconds", "When the last pass ended.", registry=registry
        )
        self.pass_seconds = Gauge(
            f"{PREFIX}_last_pass_duration_seconds",
            "How long the last pass took.",
            registry=registry,
        )
        self.cpu_seconds = Gauge(
            f"{PREFIX}_cpu_seconds", "CPU time used by the sampler process.", registry=registry
        )
        self.max_rss = Gauge(
            f"{PREFIX}_max_resident_bytes",
            "Peak resident memory of the sampler process.",
            registry=registry,
        )
        self._last_pass_at: float | None = None

    def passed(
        self, *, gpus: int, problems: int, dropped: int, buffered: int, at: float, seconds: float
    ) -> None:
        self.passes.inc()
        self.gpu_samples.inc(gpus)
        self.device_problems.inc(problems)
        self.dropped_passes.inc(dropped)
        self.buffered.set(buffered)
        self.gpus.set(gpus)
        self.last_pass.set(at)
        self.pass_seconds.set(seconds)
        self._last_pass_at = at
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu_seconds.set(usage.ru_utime + usage.ru_stime)
        self.max_rss.set(usage.ru_maxrss * 1024)

    def stored(
        self, *, samples: int, holdings_dropped: int, unresolved: int, buffered: int
    ) -> None:
        self.stored_samples.inc(samples)
        self.dropped_holdings.inc(holdings_dropped)
        self.unresolved.set(unresolved)
        self.buffered.set(buffered)

    def healthy(self, *, stale_after_s: float) -> bool:
        return self._last_pass_at is not None and self.clock() - self._last_pass_at <= stale_after_s


def serve(
    metrics: SamplerMetrics, *, address: str, port: int, max_age_s: float
) -> ThreadingHTTPServer:
    """Answer /metrics and /healthz (also /livez, /readyz) from a daemon thread, as the
    watcher does; returns the server (`server_address` has the port bound)."""

    def unhealthy() -> str | None:
        return (
            None if metrics.healthy(stale_after_s=max_age_s) else f"no pass within {max_age_s:g}s"
        )

    return serve_http(metrics.registry, unhealthy, address=address, port=port, name="sampler-http")
