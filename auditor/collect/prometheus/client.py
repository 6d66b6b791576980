"""A small `query_range` client over HTTP(S) that trusts nothing from the server.

Each query has a deadline to the last byte (a socket timeout alone restarts with every byte
a slow server sends) and a cap on the answer's size (`query_plan`); every failure, and
every answer of an unexpected shape (`decode`), is a one-line InputError naming `--url`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from auditor.collect.prometheus.auth import Auth, split_userinfo
from auditor.collect.prometheus.decode import Series, matrix, shape, short
from auditor.collect.prometheus.matchers import selector
from auditor.collect.prometheus.query_plan import DEADLINE_S, MAX_RESPONSE_BYTES
from auditor.errors import InputError
from auditor.redact import remember

_READ_BYTES = 1 << 16


class QueryRefused(InputError):
    """The server answered a query with an error (`status` other than success): a bad
    query, or one over the server's limits (`too_large`)."""

    def __init__(self, message: str, *, too_large: bool) -> None:
        super().__init__(message, field="--url")
        self.too_large = too_large


_TOO_LARGE = ("sample", "too many", "too large", "exceed", "limit")
"""Words of a refusal over a limit: Prometheus' `--query.max-samples` ("query processing
would load too many samples into memory"), VictoriaMetrics' `-search.maxSamplesPerQuery`
("cannot select more than ... samples"), Mimir's and Thanos' per-query limits."""


class PrometheusClient:
    """`query_range` over HTTP(S) with a deadline per query and a cap on the answer's size;
    every failure, and every answer of an unexpected shape, is a one-line InputError."""

    def __init__(
        self,
        url: str,
        *,
        auth: Auth | None = None,
        timeout_s: float = DEADLINE_S,
        max_bytes: int = MAX_RESPONSE_BYTES,
        matchers: str = "",
    ) -> None:
        clean, user, password = split_userinfo(url.strip())
        remember(password)
        if auth is None and user:
            auth = Auth(user=user, password=password)
        self.url = clean.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise InputError(f"not an http(s) URL: {short(self.url)}", field="--url")
        try:
            self._port = parts.port
        except ValueError:
            raise InputError(f"not a port in {short(self.url)}", field="--url") from None
        self._parts = parts
        self._auth = auth
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.matchers = matchers
        """Label matchers every selector the readers build carries (`matchers.selector`),
        and `series_count`'s: one cluster's series of a store holding several."""

    def query_range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> Iterator[Series]:
        """The (labels, [[ts, value text], ...]) series of a matrix answer, one at a time: the
        answer's JSON of each is freed as it is handed out."""
        form = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}"}
        form["step"] = f"{step_s:g}"
        status, body = self._post("/api/v1/query_range", _form(form))
        return matrix(self._answer(status, body, query=query), query)

    def query(self, query: str, *, time_s: float) -> Iterator[Series]:
        """The series of an instant query whose answer is a matrix: a range selector such as
        `m[1h]` evaluated at `time_s`, the raw points scraped in that range (no grid, no
        lookback), one series at a time."""
        form = {"query": query, "time": f"{time_s:.3f}"}
        status, body = self._post("/api/v1/query", _form(form))
        return matrix(self._answer(status, body, query=query), query)

    def series_count(self, metric: str, *, start_s: float, end_s: float) -> int | None:
        """How many series of `metric` the window holds (`/api/v1/series`: the index only, no
        samples read); None where the server does not offer that endpoint."""
        form = {
            "match[]": selector(metric, self.matchers),
            "start": f"{start_s:.3f}",
            "end": f"{end_s:.3f}",
        }
        status, body = self._post("/api/v1/series", _form(form))
        if status in {404, 405}:
            return None
        data = self._answer(status, body, query=f"series of {metric}").get("data")
        if not isinstance(data, list):
            raise shape(f"series of {metric}", "'data' is not a list")
        return len(data)

    def _post(self, path: str, body: bytes) -> tuple[int, bytearray]:
        started = time.monotonic()
        expired = threading.Event()
        parts = self._parts
        host = parts.hostname or ""
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                host, self._port, timeout=self.timeout_s, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(host, self._port, timeout=self.timeout_s)

        def expire() -> None:  # wakes a read blocked on a server that sends bytes slowly
            expired.set()
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.timeout_s, expire)
        timer.daemon = True
        timer.start()
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        }
        header = self._auth.header() if self._auth is not None else None
        if header is not None:
            headers["Authorization"] = header
        try:
            conn.request("POST", f"{parts.path.rstrip('/')}{path}", body=body, headers=headers)
            response = conn.getresponse()
            declared = response.getheader("Content-Length")
            if declared and declared.isdigit() and int(declared) > self.max_bytes:
                raise self._too_large()
            data = bytearray()
            while not expired.is_set():
                piece = response.read1(_READ_BYTES)
                if not piece:
                    break
                data += piece
                if len(data) > self.max_bytes:
                    raise self._too_large()
            if expired.is_set():
                raise self._late(started)
            return response.status, data
        except InputError:
            raise
        except (OSError, http.client.HTTPException) as e:
            if expired.is_set():
                raise self._late(started) from e
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InputError(
                f"cannot reach Prometheus at {self.url}: {reason or type(e).__name__}"[:240],
                field="--url",
            ) from e
        finally:
            timer.cancel()
            conn.close()

    def _late(self, started: float) -> InputError:
        return InputError(
            f"Prometheus at {self.url} did not answer within {self.timeout_s:g}s "
            f"({time.monotonic() - started:.1f}s): narrow the window or use a larger --step",
            field="--url",
        )

    def _too_large(self) -> QueryRefused:
        """An answer over `max_bytes`: refused as too large, so that a reader in chunks
        (`raw.RawSource`) asks again over less time; elsewhere a one-line error."""
        return QueryRefused(
            f"Prometheus at {self.url} answered more than {self.max_bytes >> 20} MiB: "
            "narrow the window or use a larger --step",
            too_large=True,
        )

    def _answer(self, status: int, body: bytearray, *, query: str) -> dict[str, Any]:
        """The JSON object of a success; `body` is emptied once parsed."""
        if status in {401, 403}:
            raise InputError(
                f"Prometheus at {self.url} answered HTTP {status}: authentication failed "
                "(see --basic-auth-user, --bearer-token-file)",
                field="--url",
            )
        try:
            answer = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            if status >= 300:
                raise InputError(
                    f"Prometheus at {self.url} answered HTTP {status} to {short(query)}",
                    field="--url",
                ) from None
            raise InputError(
                f"Prometheus at {self.url} did not answer JSON to {short(query)}: "
                f"{short(bytes(body[:60]))}",
                field="--url",
            ) from None
        body.clear()
        if not isinstance(answer, dict):
            raise shape(query, f"the answer is {type(answer).__name__}, not an object")
        if answer.get("status") != "success":
            error = answer.get("error")
            kind = answer.get("errorType")
            detail = f"{kind}: {error}" if kind and error else error or f"HTTP {status}"
            text = str(detail)
            raise QueryRefused(
                f"Prometheus refused {short(query)}: {short(text, 160)}",
                too_large=any(w in text.lower() for w in _TOO_LARGE),
            )
        if status >= 300:
            raise InputError(f"Prometheus at {self.url} answered HTTP {status}", field="--url")
        return answer


def _form(fields: Mapping[str, str]) -> bytes:
    return urllib.parse.urlencode(fields).encode()
