"""dcgm-exporter metrics out of Prometheus: a small `query_range` client and the reader.

Each metric is read over the window on a `step` grid (dcgm-exporter's scrape interval), in
chunks of at most `max_points` points per series (Prometheus refuses more than 11,000), and
the series of one GPU are joined by timestamp into `GpuSample`s.

Labels are dcgm-exporter's: `UUID` (with `GPU_I_ID` for a MIG instance, which becomes the
GPU `UUID/gi<ID>` with the card as its parent and `GPU_I_PROFILE` as its MIG profile, SPEC
§7), `Hostname` (else `instance`) as the node,
`gpu` as the index, `modelName`; and `namespace`, `pod` of the pod holding the card, an
exact GPU -> pod mapping. Prometheus drops empty labels, so a series without `pod` is a
card no pod held.

Nothing from the server is trusted: each query has a deadline (to the last byte) and a size
cap, every part of an answer's shape is checked, and every value must be one a GPU can
report (`BOUNDS`); anything else is a one-line InputError, and the import stores nothing.
Credentials (basic auth, also from the URL's userinfo, or a bearer token) go in a header
that is never logged; the URL requested and printed has no userinfo.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import math
import os
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from auditor import limits
from auditor.errors import GpuConflictError, InputError
from auditor.model import GpuRecord, GpuSample, Holding
from auditor.redact import redact, remember
from auditor.settings import PROMETHEUS_PASSWORD_ENV, PROMETHEUS_TOKEN_ENV

MAX_POINTS = 10_000
DEADLINE_S = 60.0
"""Longest one query may take, connecting to the last byte (a socket timeout alone restarts
with every byte a slow server sends)."""
MAX_RESPONSE_BYTES = 64 << 20
"""Largest answer read; a larger one asks for a narrower window or a larger --step."""
_READ_BYTES = 1 << 16
TOKEN_ENV = PROMETHEUS_TOKEN_ENV
PASSWORD_ENV = PROMETHEUS_PASSWORD_ENV

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
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
}
"""dcgm-exporter metric -> GpuSample field (FB_FREE only completes the memory total;
GR_ENGINE_ACTIVE x 100 is the utilisation where GPU_UTIL is absent)."""

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
"""A MIG instance exports no GPU_UTIL; its graphics-engine activity (0-1) stands in for it."""

NODE_LABELS: tuple[str, ...] = ("kubernetes_node", "node", "nodename")
"""Labels that name the node, first present wins (`--node-label`): what Prometheus
relabelling adds in kube-prometheus-stack and usual ServiceMonitor configs."""

KUBE_POD_INFO = "kube_pod_info"
"""kube-state-metrics' series of each pod, with its node: how an exporter pod's name
(dcgm-exporter's `Hostname` without host networking) becomes the node it ran on."""

BOUNDS: Mapping[str, tuple[float, float]] = {
    "util": (0.0, 100.0),
    "memory_used_mib": (0.0, 1e7),
    "memory_free_mib": (0.0, 1e7),
    "power_w": (0.0, 1e5),
    "sm_clock_mhz": (0.0, 1e5),
    "temperature_c": (0.0, 200.0),
    "sm_active": (0.0, 1.0),
    "tensor_active": (0.0, 1.0),
    "dram_active": (0.0, 1.0),
    "gr_engine_active": (0.0, 1.0),
}
"""The values a GPU can report, inclusive; anything else refuses the import, as a CSV cell
out of range does (throttle reasons: an integer bitmask below 2**64)."""


def _short(value: object, limit: int = 60) -> str:
    """`value` as a string (`repr` unless it is one), redacted, cut to `limit` characters."""
    text = redact(value if isinstance(value, str) else repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Auth:
    """How to authenticate to Prometheus: HTTP basic, or a bearer token. `repr` shows no
    secret; the header it makes is sent, never logged."""

    user: str | None = field(default=None)
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    def header(self) -> str | None:
        if self.token:
            return f"Bearer {self.token}"
        if self.user is not None:
            pair = f"{self.user}:{self.password or ''}".encode()
            return f"Basic {base64.b64encode(pair).decode()}"
        return None


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """(`url` without userinfo, user, password), percent-decoded. The last `@` ends the
    userinfo, so an unescaped `@` or `:` in a password stays in it."""
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0:
        return url, None, None
    info, host = rest[:at], rest[at + 1 :]
    user, colon, password = info.partition(":")
    return (
        f"{scheme}://{host}",
        urllib.parse.unquote(user),
        urllib.parse.unquote(password) if colon else None,
    )


def _read_secret(path: Path, *, option: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or "not UTF-8 text"
        raise InputError(f"cannot read: {why}", file=str(path), field=option) from e
    if not text:
        raise InputError("the file is empty", file=str(path), field=option)
    return text


def credentials(
    url: str,
    *,
    user: str | None = None,
    password_file: Path | None = None,
    token_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, Auth | None]:
    """The URL to request (no userinfo) and the credentials to send: a bearer token from
    `token_file` or AUDITOR_PROMETHEUS_TOKEN, else basic auth as `user` (else the URL's user)
    with the password from `password_file`, AUDITOR_PROMETHEUS_PASSWORD or the URL."""
    env = os.environ if environ is None else environ
    clean, url_user, url_password = split_userinfo(url)
    remember(url_password)
    token = _read_secret(token_file, option="--bearer-token-file") if token_file else None
    token = token or env.get(TOKEN_ENV) or None
    password = (
        _read_secret(password_file, option="--basic-auth-password-file")
        if password_file
        else env.get(PASSWORD_ENV) or None
    )
    remember(token)
    remember(password)
    name = user or url_user or None
    if token and (user or password_file):
        raise InputError("give a bearer token or basic auth, not both", field="--basic-auth-user")
    if token:
        return clean, Auth(token=token)
    if (password or url_password) and not name:
        raise InputError("a basic auth password needs a user name", field="--basic-auth-user")
    if name:
        return clean, Auth(user=name, password=password or url_password)
    return clean, None


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
    ) -> None:
        clean, user, password = split_userinfo(url.strip())
        remember(password)
        if auth is None and user:
            auth = Auth(user=user, password=password)
        self.url = clean.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise InputError(f"not an http(s) URL: {_short(self.url)}", field="--url")
        try:
            self._port = parts.port
        except ValueError:
            raise InputError(f"not a port in {_short(self.url)}", field="--url") from None
        self._parts = parts
        self._auth = auth
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    def query_range(
        self, query: str, *, start_s: float, end_s: float, step_s: float
    ) -> Iterator[Series]:
        """The (labels, [[ts, value text], ...]) series of a matrix answer, one at a time: the
        answer's JSON of each is freed as it is handed out."""
        form = {"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}"}
        form["step"] = f"{step_s:g}"
        status, body = self._post("/api/v1/query_range", _form(form))
        return _matrix(self._answer(status, body, query=query), query)

    def series_count(self, metric: str, *, start_s: float, end_s: float) -> int | None:
        """How many series of `metric` the window holds (`/api/v1/series`: the index only, no
        samples read); None where the server does not offer that endpoint."""
        form = {"match[]": metric, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}"}
        status, body = self._post("/api/v1/series", _form(form))
        if status in {404, 405}:
            return None
        data = self._answer(status, body, query=f"series of {metric}").get("data")
        if not isinstance(data, list):
            raise _shape(f"series of {metric}", "'data' is not a list")
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

    def _too_large(self) -> InputError:
        return InputError(
            f"Prometheus at {self.url} answered more than {self.max_bytes >> 20} MiB: "
            "narrow the window or use a larger --step",
            field="--url",
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
                    f"Prometheus at {self.url} answered HTTP {status} to {_short(query)}",
                    field="--url",
                ) from None
            raise InputError(
                f"Prometheus at {self.url} did not answer JSON to {_short(query)}: "
                f"{_short(bytes(body[:60]))}",
                field="--url",
            ) from None
        body.clear()
        if not isinstance(answer, dict):
            raise _shape(query, f"the answer is {type(answer).__name__}, not an object")
        if answer.get("status") != "success":
            error = answer.get("error")
            kind = answer.get("errorType")
            detail = f"{kind}: {error}" if kind and error else error or f"HTTP {status}"
            raise InputError(
                f"Prometheus refused {_short(query)}: {_short(str(detail), 160)}", field="--url"
            )
        if status >= 300:
            raise InputError(f"Prometheus at {self.url} answered HTTP {status}", field="--url")
        return answer


def _form(fields: Mapping[str, str]) -> bytes:
    return urllib.parse.urlencode(fields).encode()


def _shape(query: str, what: str) -> InputError:
    return InputError(f"Prometheus answered {_short(query)} oddly: {what}", field="--url")


Series = tuple[dict[str, str], list[list[Any]]]
"""A series' labels and its [timestamp, "value"] points, shapes checked."""


def _matrix(answer: Mapping[str, Any], query: str) -> Iterator[Series]:
    """The series of a `query_range` answer, every part's shape checked (the envelope at
    once, each series as it is reached)."""
    data = answer.get("data")
    if not isinstance(data, dict):
        raise _shape(query, "no 'data' object")
    if data.get("resultType") != "matrix":
        kind = data.get("resultType")
        raise _shape(query, f"resultType {_short(repr(kind))}, not 'matrix'")
    result = data.get("result")
    if not isinstance(result, list):
        raise _shape(query, "'result' is not a list")
    return _series(result, query)


def _series(result: list[Any], query: str) -> Iterator[Series]:
    for i, item in enumerate(result):
        result[i] = None  # free the JSON of each series once read
        if not isinstance(item, dict):
            raise _shape(query, f"a series is {_short(item)}, not an object")
        labels = item.get("metric", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise _shape(query, f"labels {_short(labels)} are not an object of strings")
        values = item.get("values", [])
        if not isinstance(values, list):
            raise _shape(query, f"values {_short(values)} are not a list")
        for pair in values:
            if not (
                type(pair) is list
                and len(pair) == 2
                and type(pair[1]) is str
                and (type(pair[0]) is int or (type(pair[0]) is float and math.isfinite(pair[0])))
            ):
                raise _shape(query, f'a point {_short(pair)} is not [timestamp, "value"]')
        del item
        yield labels, values


POINT_BUDGET = 200_000
"""Most points (series x grid points) one query asks for: what bounds the memory of a chunk
where the cluster has many GPUs."""


def points_per_query(
    client: PrometheusClient, *, start_s: float, end_s: float, max_points: int
) -> int:
    """Grid points per chunk: `max_points`, fewer where many series would make a large
    answer (POINT_BUDGET in all)."""
    count = client.series_count("DCGM_FI_DEV_GPU_UTIL", start_s=start_s, end_s=end_s)
    if not count:
        return max_points
    return max(1, min(max_points, POINT_BUDGET // count))


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
    node_sources: dict[str, str] = field(default_factory=dict)
    """GPU UUID -> where its node came from: `label NAME`, `kube_pod_info`, `Hostname`,
    `instance`."""


def _gpu(labels: Mapping[str, str], node: str) -> GpuRecord:
    uuid = labels["UUID"]
    index = labels.get("gpu")
    instance = labels.get("GPU_I_ID")
    if instance:
        profile = labels.get("GPU_I_PROFILE")
        return GpuRecord(
            f"{uuid}/gi{instance}",
            node,
            None,
            labels.get("modelName"),
            None,
            uuid,
            mig_profile=profile if profile and len(profile) <= limits.SHARE_TEXT_MAX else None,
        )
    return GpuRecord(
        uuid,
        node,
        int(index) if index and index.isascii() and index.isdigit() else None,
        labels.get("modelName"),
    )


_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A Kubernetes pod name (a DNS subdomain): only such a `Hostname` is looked up."""


@dataclass
class NodeResolver:
    """Which node each series of a GPU names (SPEC §2.1): the first of `labels` present;
    else, where `Hostname` is an exporter pod that kube-state-metrics' `kube_pod_info` knows,
    the node that pod ran on at the time; else `Hostname` (else `instance`).

    An exporter pod is replaced now and then, so a card's series come under several pod
    names over a window: each name is resolved at the times of its samples, from the spans
    kube_pod_info shows it on a node (kept across chunks, merged where contiguous)."""

    labels: tuple[str, ...] = NODE_LABELS
    spans: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    """Exporter pod name -> [(first_ms, last_ms, node)], sorted."""

    def node_label(self, labels: Mapping[str, str]) -> tuple[str, str] | None:
        """(node, `label NAME`) where a node label is present."""
        for name in self.labels:
            value = labels.get(name)
            if value:
                return value, f"label {name}"
        return None

    def learn(
        self,
        client: PrometheusClient,
        names: set[str],
        *,
        first_ms: int,
        last_ms: int,
        step_ms: int,
    ) -> None:
        """Read kube_pod_info of the pods named `names` over the chunk into `spans`."""
        wanted = sorted(n for n in names if _POD_NAME.fullmatch(n))
        for i in range(0, len(wanted), 200):
            pattern = "|".join(n.replace(".", "\\\\.") for n in wanted[i : i + 200])
            window = f"[{max(step_ms - 1, 1)}ms]"
            query = (
                f'last_over_time({KUBE_POD_INFO}{{pod=~"{pattern}"}}{window}) or '
                f'last_over_time({KUBE_POD_INFO}{{exported_pod=~"{pattern}"}}{window})'
            )
            series = client.query_range(
                query, start_s=first_ms / 1000, end_s=last_ms / 1000, step_s=step_ms / 1000
            )
            for labels, points in series:
                pod = labels.get("exported_pod") or labels.get("pod")
                node = labels.get("exported_node") or labels.get("node")
                kind = labels.get("created_by_kind")
                if not pod or not node or not points or pod not in names:
                    continue
                if kind is not None and kind != "DaemonSet" and "dcgm" not in pod.lower():
                    continue  # a pod of the same name that is no exporter
                for ts, _ in points:
                    self._add(pod, round(ts * 1000), node, step_ms=step_ms)

    def _add(self, pod: str, ms: int, node: str, *, step_ms: int) -> None:
        spans = self.spans.setdefault(pod, [])
        for i, (a, b, n) in enumerate(spans):
            if n == node and a - step_ms <= ms <= b + step_ms:
                spans[i] = (min(a, ms), max(b, ms), n)
                return
        spans.append((ms, ms, node))
        spans.sort()

    def pod_node(self, pod: str, ms: int) -> str | None:
        """The node exporter pod `pod` ran on at `ms`: the span holding it, else the
        nearest (kube-state-metrics and the exporter are scraped apart); None if unknown."""
        best: tuple[int, str] | None = None
        for a, b, node in self.spans.get(pod, ()):
            gap = 0 if a <= ms <= b else min(abs(ms - a), abs(ms - b))
            if best is None or gap < best[0]:
                best = (gap, node)
        return None if best is None else best[1]


def _series_name(labels: Mapping[str, str]) -> str:
    parts = (
        labels.get("UUID"),
        labels.get("gpu"),
        labels.get("Hostname") or labels.get("instance"),
    )
    return _short("/".join(p if p is not None else "?" for p in parts), 80)


def _value(
    text: str, *, metric: str, column: str, labels: Mapping[str, str], ts: float
) -> float | None:
    """The reading `text` as stored: None for NaN (not read); a value no GPU can report is
    an InputError naming the metric, the series, the time and the value."""
    try:
        value = float(text)
    except ValueError:
        value, problem = math.inf, "not a number"
    else:
        if math.isnan(value):
            return None
        problem = _out_of_bounds(column, value)
    if problem:
        at = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        raise InputError(
            f"{metric} of {_series_name(labels)} at {at}: {_short(repr(text))} is {problem}",
            field="--url",
        )
    return value


def _out_of_bounds(column: str, value: float) -> str:
    if column == "throttle_reasons":
        if math.isfinite(value) and value.is_integer() and 0 <= value < 2**64:
            return ""
        return "not a bitmask (an integer 0 <= n < 2**64)"
    low, high = BOUNDS[column]
    return "" if math.isfinite(value) and low <= value <= high else f"outside {low:g}..{high:g}"


_COLUMNS = tuple(dict.fromkeys(METRICS.values()))
_SLOT = {c: i for i, c in enumerate(_COLUMNS)}


def read_chunk(
    client: PrometheusClient,
    *,
    first_ms: int,
    last_ms: int,
    step_ms: int,
    resolver: NodeResolver | None = None,
) -> ChunkResult:
    """Every dcgm-exporter metric over one chunk, joined per GPU and timestamp (one row of
    slots per GPU and time, filled metric by metric: a chunk's memory is its samples).

    The node of each GPU comes from `resolver` (a new one with the default labels unless
    given; pass one across chunks to keep what it learnt). A GPU whose series name two
    nodes is refused, as the store refuses a card moved to another node."""
    resolver = resolver or NodeResolver()
    rows: dict[str, dict[int, list[float | None]]] = {}
    held: dict[tuple[str, int], tuple[str, str]] = {}
    out = ChunkResult()
    width = len(_COLUMNS)
    # (UUID, Hostname or instance, which) of series no node label names -> first, last ms
    unnamed: dict[tuple[str, str, str], tuple[int, int]] = {}
    named: dict[str, tuple[str, str]] = {}  # UUID -> (node, source), first series that said
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
        slot = _SLOT[column]
        low, high = BOUNDS.get(column, (0.0, 0.0))  # throttle reasons: always checked in full
        for labels, points in series:
            uuid_label = labels.get("UUID")
            host = labels.get("Hostname") or labels.get("instance")
            if not uuid_label or not host or not points:
                continue
            gpu = _gpu(labels, host)
            uuid = gpu.uuid
            labelled = resolver.node_label(labels)
            if labelled is not None:
                _same_node(named, uuid, labelled)
                out.gpus.setdefault(uuid, replace(gpu, node=labelled[0]))
            else:
                key = (uuid, host, "Hostname" if labels.get("Hostname") else "instance")
                lo, hi = round(points[0][0] * 1000), round(points[-1][0] * 1000)
                seen = unnamed.get(key)
                unnamed[key] = (lo, hi) if seen is None else (min(lo, seen[0]), max(hi, seen[1]))
                out.gpus.setdefault(uuid, gpu)
            times = rows.setdefault(uuid, {})
            pod, namespace = labels.get("pod"), labels.get("namespace")
            holder = (namespace, pod) if pod and namespace else None
            for ts, text in points:
                ms = round(ts * 1000)
                row = times.get(ms)
                if row is None:
                    row = times[ms] = [None] * width
                try:
                    value: float | None = float(text)
                except ValueError:
                    value = None
                if value is None or not low <= value <= high:  # NaN, too: not read, or bad
                    value = _value(text, metric=metric, column=column, labels=labels, ts=ts)
                row[slot] = value
                if holder is not None:
                    held[(uuid, ms)] = holder
    hosts = {h for _, h, which in unnamed if which == "Hostname"}
    if hosts:
        resolver.learn(client, hosts, first_ms=first_ms, last_ms=last_ms, step_ms=step_ms)
    for (uuid, host, which), (lo, hi) in unnamed.items():
        if which == "instance":
            _same_node(named, uuid, (host, which))
            continue
        nodes = {resolver.pod_node(host, lo), resolver.pod_node(host, hi)}
        if None in nodes:
            _same_node(named, uuid, (host, "Hostname"))
        elif len(nodes) > 1:
            raise InputError(
                f"exporter pod {_short(host)} of GPU {_short(uuid)} ran on nodes "
                f"{' and '.join(sorted(map(_short, nodes)))} in this window per "
                f"{KUBE_POD_INFO}: name the node label with --node-label",
                field="--url",
            )
        else:
            _same_node(named, uuid, (nodes.pop() or host, KUBE_POD_INFO + " (exporter pods)"))
    for uuid in sorted(rows):
        times = rows.pop(uuid)
        node, source = named[uuid]
        gpu = replace(out.gpus[uuid], node=node)
        out.node_sources[uuid] = source
        from_util = from_engine = 0
        for ms in sorted(times):
            sample, engine = _sample(uuid, ms, times.pop(ms))
            out.samples.append(sample)
            if sample.util is not None:
                from_engine += engine
                from_util += not engine
            if sample.memory_total_mib is not None and gpu.memory_total_mib is None:
                gpu = replace(gpu, memory_total_mib=sample.memory_total_mib)
        if from_util or from_engine:
            gpu = replace(gpu, util_source=GR_ENGINE if from_engine > from_util else GPU_UTIL)
        out.gpus[uuid] = gpu
    for gpu in list(out.gpus.values()):  # a MIG instance's physical card: its uncarved slices
        if gpu.parent_uuid is not None and gpu.parent_uuid not in out.gpus:
            out.gpus[gpu.parent_uuid] = GpuRecord(gpu.parent_uuid, gpu.node, None, gpu.model)
    out.holdings = spans(held, step_ms=step_ms)
    return out


HOSTNAME_CAVEAT = (
    "no node label and no kube_pod_info: if dcgm-exporter does not run with host "
    "networking these are pod names; see --node-label"
)


def describe_sources(nodes: Mapping[str, int], utils: Mapping[str, int]) -> str:
    """What the import summary says of where nodes (and, where not GPU_UTIL, utilisation)
    came from: `nodes from label kubernetes_node`, with GPU counts where mixed."""

    def gpus(n: int) -> str:
        return f"{n} GPU" if n == 1 else f"{n} GPUs"

    parts = [source if len(nodes) == 1 else f"{source} ({gpus(n)})" for source, n in nodes.items()]
    text = f"nodes from {', '.join(parts)}" if parts else ""
    if "Hostname" in nodes:
        text += f" ({HOSTNAME_CAVEAT})"
    if "instance" in nodes:
        text += " (no Hostname label: the scrape target)"
    if utils.get(GR_ENGINE):
        text += f"; utilisation of {gpus(utils[GR_ENGINE])} from {GR_ENGINE} (MIG instances)"
    return text


def _same_node(named: dict[str, tuple[str, str]], uuid: str, found: tuple[str, str]) -> None:
    """Record the node one series of `uuid` names; another node than an earlier series
    named is the card on two nodes, refused."""
    seen = named.setdefault(uuid, found)
    if seen[0] != found[0]:
        raise GpuConflictError(uuid=uuid, field="node", stored=seen[0], new=found[0])


def _sample(uuid: str, ms: int, row: list[float | None]) -> tuple[GpuSample, bool]:
    """The sample of one row, and whether its utilisation is GR_ENGINE_ACTIVE x 100 (no
    GPU_UTIL at that time)."""
    v = dict(zip(_COLUMNS, row, strict=True))
    used, free = v["memory_used_mib"], v["memory_free_mib"]
    throttle = v["throttle_reasons"]
    util, engine = v["util"], v["gr_engine_active"]
    from_engine = util is None and engine is not None
    if engine is not None and util is None:
        util = round(engine * 100.0, 6)  # 0.07 x 100 is 7.000000000000001
    sample = GpuSample(
        uuid,
        ms,
        util,
        used,
        used + free if used is not None and free is not None else None,
        v["power_w"],
        v["sm_clock_mhz"],
        None if throttle is None else f"0x{int(throttle):016x}",
        v["temperature_c"],
        v["sm_active"],
        v["tensor_active"],
        v["dram_active"],
    )
    return sample, from_engine


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
