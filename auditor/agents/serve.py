"""What both services share: the HTTP server of `/metrics` and `/healthz`, and the logging
setup (text or one JSON object a line, every record redacted).

The watcher and the sampler each bring their own registry and health rule; this module
serves them the same way and configures the `auditor` loggers the same way.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from auditor.redact import RedactingFilter


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
