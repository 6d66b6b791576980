"""What the watcher tells its operators: Prometheus metrics, a health check, JSON logs.

`auditor.agents.serve` serves them and sets up the logs, for the sampler too.

`WatchMetrics` lives on a registry of its own (never the global one), so tests and several
watchers in one process do not collide. `serve` answers `/metrics` and `/healthz` on one
port: the health check fails (503) when some kind being watched has not synced (a list
committed, a batch of events committed, or a watch ended cleanly) within `max_age_s`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge

from auditor.agents.serve import serve_http


class WatchMetrics:
    def __init__(
        self, kinds: tuple[str, ...], *, registry: CollectorRegistry | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.kinds = kinds
        self._events = Counter(
            "auditor_watch_events",
            "Watch events processed, by kind and event type.",
            ["kind", "type"],
            registry=self.registry,
        )
        self._relists = Counter(
            "auditor_watch_relists",
            "Full lists reconciled into the store.",
            ["kind"],
            registry=self.registry,
        )
        self._errors = Counter(
            "auditor_watch_errors",
            "Failures by reason (expired, unavailable, storeerror).",
            ["kind", "reason"],
            registry=self.registry,
        )
        self._skipped = Counter(
            "auditor_watch_skipped_objects",
            "Objects logged and skipped, by reason: unreadable (a field that cannot be read), "
            "unstorable (a value the store cannot hold), refused (the database refused it).",
            ["kind", "reason"],
            registry=self.registry,
        )
        self._last_sync = Gauge(
            "auditor_watch_last_sync_timestamp_seconds",
            "Unix time of the last successful sync.",
            ["kind"],
            registry=self.registry,
        )
        self._synced: dict[str, float] = {}
        self._lock = threading.Lock()

    def event(self, kind: str, etype: str) -> None:
        self._events.labels(kind, etype).inc()

    def relist(self, kind: str) -> None:
        self._relists.labels(kind).inc()

    def error(self, kind: str, reason: str) -> None:
        self._errors.labels(kind, reason).inc()

    def skipped(self, kind: str, reason: str) -> None:
        self._skipped.labels(kind, reason).inc()

    def synced(self, kind: str, at_s: float) -> None:
        self._last_sync.labels(kind).set(at_s)
        with self._lock:
            self._synced[kind] = at_s

    def stale(self, *, now_s: float, max_age_s: float) -> list[str]:
        """The kinds whose last sync is older than `max_age_s` (or that never synced)."""
        with self._lock:
            return [k for k in self.kinds if now_s - self._synced.get(k, float("-inf")) > max_age_s]


def serve(
    metrics: WatchMetrics,
    *,
    address: str,
    port: int,
    max_age_s: float,
    clock: Callable[[], float] = time.time,
) -> ThreadingHTTPServer:
    """Start answering /metrics and /healthz in a daemon thread; returns the server
    (`server_address` has the port actually bound; `shutdown()` stops it)."""

    def unhealthy() -> str | None:
        stale = metrics.stale(now_s=clock(), max_age_s=max_age_s)
        return f"not synced within {max_age_s:g}s: {', '.join(stale)}" if stale else None

    return serve_http(metrics.registry, unhealthy, address=address, port=port, name="metrics")
