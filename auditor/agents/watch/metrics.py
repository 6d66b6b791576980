"""What the watcher tells its operators: Prometheus metrics, a health check, JSON logs.

`setup_logging` serves the sampler too; its handler redacts secrets from every record.

`WatchMetrics` lives on a registry of its own (never the global one), so tests and several
watchers in one process do not collide. `serve` answers `/metrics` and `/healthz` on one
port: the health check fails (503) when some kind being watched has not synced (a list
committed, a batch of events committed, or a watch ended cleanly) within `max_age_s`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from auditor.redact import RedactingFilter


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


def serve_http(
    registry: CollectorRegistry,
    unhealthy: Callable[[], str | None],
    *,
    address: str,
    port: int,
    name: str,
) -> ThreadingHTTPServer:
    """/metrics from `registry`; /healthz (and /livez, /readyz) 200 "ok", or 503 with the
    reason `unhealthy()` gives. Served from a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in {"/healthz", "/livez", "/readyz"}:
                reason = unhealthy()
                body = b"ok\n" if reason is None else f"{reason}\n".encode()
                self._send(200 if reason is None else 503, body, "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds would drown the service's own log

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=str)


def setup_logging(*, json_format: bool, level: int = logging.INFO) -> None:
    """The `auditor` loggers to stderr, every record redacted (`auditor.redact`) first: a
    database or Prometheus URL in a message or a driver's traceback loses its password."""
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter())
    handler.setFormatter(
        JsonFormatter()
        if json_format
        else logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger("auditor")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
