"""A scripted Prometheus on 127.0.0.1 for the answers a real one never gives.

`FakeProm` answers every `/api/v1/query_range` with what `respond(query)` returns (and
`/api/v1/series` with `series`, one series unless told otherwise): a
`Reply` (status, body bytes, optional delay between bytes) — out-of-range values, odd
shapes, a slow drip, an oversized body, 401 without the right Authorization header. It
records the Authorization header of each request, so tests can check what was sent.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    drip_s: float = 0.0
    """Send the body one byte at a time, this long apart."""
    length: bool = True
    """Send Content-Length (else the body runs to the connection's close)."""


def matrix(series: Sequence[dict[str, Any]]) -> Reply:
    payload = {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}
    return Reply(body=json.dumps(payload).encode())


def card(values: Sequence[tuple[float, str]], **labels: str) -> dict[str, Any]:
    """One dcgm-exporter series of GPU-0 on node-a (labels override or add)."""
    metric = {"UUID": "GPU-0", "gpu": "0", "Hostname": "node-a", "modelName": "NVIDIA H100"}
    return {"metric": {**metric, **labels}, "values": [[t, v] for t, v in values]}


@dataclass
class FakeProm:
    respond: Callable[[str], Reply]
    require: str | None = None
    """The Authorization header every request must carry (else 401)."""
    series: Reply = field(default_factory=lambda: Reply(body=b'{"status":"success","data":[{}]}'))
    seen: list[str | None] = field(default_factory=list)
    """The Authorization header of each request (None: none sent)."""
    url: str = ""


@contextmanager
def fake_prometheus(
    respond: Callable[[str], Reply], *, require: str | None = None, series: Reply | None = None
) -> Iterator[FakeProm]:
    fake = FakeProm(respond, require)
    if series is not None:
        fake.series = series

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(size).decode())
            auth = self.headers.get("Authorization")
            fake.seen.append(auth)
            if fake.require is not None and auth != fake.require:
                reply = Reply(401, b'{"status":"error","error":"unauthorized"}')
            elif self.path.endswith("/api/v1/series"):
                reply = fake.series
            else:
                reply = fake.respond(form.get("query", [""])[0])
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            if reply.length:
                self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                if reply.drip_s:
                    for i in range(len(reply.body)):
                        self.wfile.write(reply.body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(reply.drip_s)
                else:
                    self.wfile.write(reply.body)
            except OSError:
                pass  # the client gave up: what the test wants
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
