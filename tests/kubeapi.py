"""A stand-in Kubernetes API server on loopback: pods and nodes, list and watch, and faults.

It speaks the real protocol well enough for the official Python client and for `kubectl get
pods -A [--watch]`: discovery (`/api`, `/apis`, `/api/v1`, `/version`), paginated lists
(`limit`/`continue`, one snapshot per list) with a resourceVersion, and watch streams as
chunked JSON lines from a resourceVersion, with BOOKMARKs when asked for them and the
stream ended after `timeoutSeconds`. A watch from a compacted resourceVersion gets the
real server's answer: an ERROR event carrying a 410 Status.

Faults are scripted: each watch request takes the next `Fault` from the queue, if any:
410 at connect, 410 in the stream, a connection dropped in the middle of a chunk, a stream
that stalls without a byte. `duplicate` sends every event twice; `reorder` swaps each pair
of events in a backlog. Objects are plain dicts in API shape; `pod()` builds GPU pods.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]
KIND_NAMES = {
    "pods": ("Pod", "PodList"),
    "nodes": ("Node", "NodeList"),
    "resourceclaims": ("ResourceClaim", "ResourceClaimList"),
    "resourceslices": ("ResourceSlice", "ResourceSliceList"),
}
DRA_KINDS = ("resourceclaims", "resourceslices")


@dataclass(frozen=True)
class Fault:
    """What the next watch request meets. `what`: gone_at_connect, too_large_at_connect
    (a resourceVersion the server never reached), gone_in_stream, drop_mid_chunk or
    stall; the fault strikes after `after` events of the stream."""

    what: str
    after: int = 0
    seconds: float = 30.0


@dataclass
class FakeCluster:
    rv: int = 1000
    objects: dict[str, dict[tuple[str, str], Obj]] = field(
        default_factory=lambda: {kind: {} for kind in KIND_NAMES}
    )
    dra_versions: tuple[str, ...] = ()
    """The `resource.k8s.io` versions served (`v1`, `v1beta1`...); none: no DRA."""
    log: list[tuple[int, str, str, Obj]] = field(default_factory=list)
    log_rvs: list[int] = field(default_factory=list)
    compacted_to: int = 0
    faults: deque[Fault] = field(default_factory=deque)
    duplicate: bool = False
    reorder: bool = False
    bookmark_interval_s: float = 0.5
    requests: list[str] = field(default_factory=list)
    closed: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)
    snapshots: dict[str, tuple[int, list[Obj]]] = field(default_factory=dict)

    # ---------------------------------------------------------------- changes

    def put(self, kind: str, obj: Obj) -> Obj:
        """Create or replace an object (by namespace and name); returns the stored copy."""
        with self.cond:
            obj = copy.deepcopy(obj)
            key = _key(obj)
            etype = "MODIFIED" if key in self.objects[kind] else "ADDED"
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[kind][key] = obj
            self._record(kind, etype, obj)
            return obj

    def delete(self, kind: str, namespace: str | None, name: str) -> Obj:
        with self.cond:
            obj = self.objects[kind].pop((namespace or "", name))
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._record(kind, "DELETED", obj)
            return obj

    def _record(self, kind: str, etype: str, obj: Obj) -> None:
        self.log.append((self.rv, kind, etype, obj))
        self.log_rvs.append(self.rv)
        self.cond.notify_all()

    def compact(self) -> None:
        """Forget every event so far: a watch from an older resourceVersion gets 410."""
        with self.cond:
            self.compacted_to = self.rv
            self.snapshots.clear()

    def add_faults(self, *faults: Fault) -> None:
        with self.cond:
            self.faults.extend(faults)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # ---------------------------------------------------------------- reads

    def list_page(
        self, kind: str, *, namespace: str | None, selector: str | None, limit: int, token: str
    ) -> tuple[int, list[Obj], str | None] | None:
        """(resourceVersion, items, next token) of one page; None for an expired token."""
        with self.cond:
            if token:
                snap_id, _, offset_text = token.partition(":")
                if snap_id not in self.snapshots:
                    return None
                rv, items = self.snapshots[snap_id]
                offset = int(offset_text)
            else:
                objs = sorted(self.objects[kind].items())
                # stored objects are never changed in place (put and delete store copies)
                items = [o for _, o in objs if _selected(o, namespace, selector)]
                rv, offset = self.rv, 0
                snap_id = f"s{len(self.snapshots) + 1}-{rv}"
                self.snapshots[snap_id] = (rv, items)
        end = offset + limit if limit > 0 else len(items)
        nxt = f"{snap_id}:{end}" if end < len(items) else None
        return rv, items[offset:end], nxt

    def pending(
        self, kind: str, *, after_index: int, namespace: str | None, selector: str | None
    ) -> tuple[list[Obj], int]:
        """Events logged at or after `after_index` that the watch selects, and the new index."""
        out = [
            {"type": etype, "object": obj}
            for _rv, k, etype, obj in self.log[after_index:]
            if k == kind and _selected(obj, namespace, selector)
        ]
        return out, len(self.log)

    def index_after(self, rv: int) -> int:
        return bisect.bisect_right(self.log_rvs, rv)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _selected(obj: Obj, namespace: str | None, selector: str | None) -> bool:
    meta = obj["metadata"]
    if namespace and meta.get("namespace") != namespace:
        return False
    labels = meta.get("labels") or {}
    for part in (selector or "").split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            if labels.get(k.strip().rstrip("=")) != v.strip():
                return False
    return True


def status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


RESOURCES = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        {
            "name": "pods",
            "singularName": "pod",
            "namespaced": True,
            "kind": "Pod",
            "verbs": ["get", "list", "watch"],
            "shortNames": ["po"],
        },
        {
            "name": "nodes",
            "singularName": "node",
            "namespaced": False,
            "kind": "Node",
            "verbs": ["get", "list", "watch"],
            "shortNames": ["no"],
        },
    ],
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cluster: FakeCluster
    server_version = "fake-kube-apiserver"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = [p for p in url.path.split("/") if p]
        self.cluster.requests.append(self.path)
        if url.path == "/version":
            self._json(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fake"})
        elif url.path == "/api":
            self._json(
                200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        elif url.path == "/apis":
            groups = [self._dra_group()] if self.cluster.dra_versions else []
            self._json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        elif url.path.rstrip("/") == "/apis/resource.k8s.io" and self.cluster.dra_versions:
            self._json(200, {"kind": "APIGroup", "apiVersion": "v1", **self._dra_group()})
        elif (
            parts[:2] == ["apis", "resource.k8s.io"]
            and len(parts) == 4
            and parts[2] in self.cluster.dra_versions
            and parts[3] in DRA_KINDS
        ):
            self._collection(parts[3], None, query)
        elif url.path == "/api/v1":
            self._json(200, RESOURCES)
        elif parts[:2] == ["api", "v1"] and len(parts) == 3 and parts[2] in KIND_NAMES:
            self._collection(parts[2], None, query)
        elif parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 5 and parts[4] == "pods":
            self._collection("pods", parts[3], query)
        else:
            self._json(404, status(404, "NotFound", f"the server could not find {url.path}"))

    def _dra_group(self) -> Obj:
        versions = [
            {"groupVersion": f"resource.k8s.io/{v}", "version": v}
            for v in self.cluster.dra_versions
        ]
        return {"name": "resource.k8s.io", "versions": versions, "preferredVersion": versions[0]}

    def _json(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _collection(self, kind: str, namespace: str | None, query: dict[str, str]) -> None:
        selector = query.get("labelSelector")
        if query.get("watch") in {"true", "1"}:
            self._watch(kind, namespace, selector, query)
            return
        page = self.cluster.list_page(
            kind,
            namespace=namespace,
            selector=selector,
            limit=int(query.get("limit") or 0),
            token=query.get("continue", ""),
        )
        if page is None:
            self._json(410, status(410, "Expired", "The provided continue parameter is too old"))
            return
        rv, items, nxt = page
        meta: Obj = {"resourceVersion": str(rv)}
        if nxt:
            meta["continue"] = nxt
        self._json(
            200, {"kind": KIND_NAMES[kind][1], "apiVersion": "v1", "metadata": meta, "items": items}
        )

    # ---------------------------------------------------------------- watch

    def _watch(
        self, kind: str, namespace: str | None, selector: str | None, query: dict[str, str]
    ) -> None:
        cluster = self.cluster
        with cluster.cond:
            fault = cluster.faults.popleft() if cluster.faults else None
            since = query.get("resourceVersion", "")
            start_rv = cluster.rv if since in {"", "0"} else int(since)
            initial = (
                [
                    {"type": "ADDED", "object": copy.deepcopy(o)}
                    for o in cluster.objects[kind].values()
                    if _selected(o, namespace, selector)
                ]
                if since in {"", "0"}
                else []
            )
            expired = since not in {"", "0"} and start_rv < cluster.compacted_to
            index = cluster.index_after(start_rv)
        if fault is not None and fault.what == "gone_at_connect":
            self._json(410, status(410, "Expired", f"too old resource version: {since}"))
            return
        if fault is not None and fault.what == "too_large_at_connect":
            message = f"Too large resource version: {since}, current: {cluster.rv}"
            self._json(504, status(504, "Timeout", message))
            return
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._stream(
                kind,
                namespace,
                selector,
                query,
                fault=fault,
                expired=expired,
                initial=initial,
                index=index,
            )

    def _chunk(self, events: list[Obj]) -> None:
        data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _stream(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None,
        query: dict[str, str],
        *,
        fault: Fault | None,
        expired: bool,
        initial: list[Obj],
        index: int,
    ) -> None:
        cluster = self.cluster
        if expired:
            self._chunk(
                [{"type": "ERROR", "object": status(410, "Expired", "too old resource version")}]
            )
            self.wfile.write(b"0\r\n\r\n")
            return
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        sent = 0
        backlog = initial
        last_write = time.monotonic()
        while True:
            if backlog:
                if cluster.reorder:
                    backlog = _swap_pairs(backlog)
                if cluster.duplicate:
                    backlog = [e for e in backlog for _ in (0, 1)]
                if fault is not None and sent + len(backlog) > fault.after:
                    self._strike(fault, backlog[: fault.after - sent], backlog[fault.after - sent])
                    return
                self._chunk(backlog)
                sent += len(backlog)
                last_write = time.monotonic()
            elif fault is not None and sent >= fault.after and fault.what != "drop_mid_chunk":
                self._strike(fault, [], None)
                return
            with cluster.cond:
                now = time.monotonic()
                if cluster.closed or now >= deadline:
                    break
                if bookmarks and now - last_write >= cluster.bookmark_interval_s:
                    mark = {
                        "kind": KIND_NAMES[kind][0],
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(cluster.rv)},
                    }
                    backlog = [{"type": "BOOKMARK", "object": mark}]
                    index = len(cluster.log)
                    continue
                if index >= len(cluster.log):
                    wait = (
                        min(
                            deadline,
                            last_write + (cluster.bookmark_interval_s if bookmarks else 3600),
                        )
                        - now
                    )
                    cluster.cond.wait(max(wait, 0.001))
                backlog, index = cluster.pending(
                    kind, after_index=index, namespace=namespace, selector=selector
                )
        self.wfile.write(b"0\r\n\r\n")

    def _strike(self, fault: Fault, before: list[Obj], victim: Obj | None) -> None:
        if before:
            self._chunk(before)
        if fault.what == "gone_in_stream":
            self._chunk(
                [{"type": "ERROR", "object": status(410, "Expired", "too old resource version")}]
            )
            self.wfile.write(b"0\r\n\r\n")
        elif fault.what == "drop_mid_chunk":
            data = json.dumps(victim).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s" % (len(data), data[: len(data) // 2]))
            self.connection.shutdown(socket.SHUT_RDWR)
        elif fault.what == "stall":
            with self.cluster.cond:
                self.cluster.cond.wait_for(lambda: self.cluster.closed, timeout=fault.seconds)
            self.connection.shutdown(socket.SHUT_RDWR)


def _swap_pairs(events: list[Obj]) -> list[Obj]:
    out = list(events)
    for i in range(0, len(out) - 1, 2):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


class FakeApiServer:
    """The server on 127.0.0.1 (a free port), serving `cluster` from a daemon thread."""

    def __init__(self, cluster: FakeCluster | None = None) -> None:
        self.cluster = cluster or FakeCluster()
        handler = type("BoundHandler", (Handler,), {"cluster": self.cluster})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cluster.close()
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig (JSON is YAML) whose current context is this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path


def wait_until(predicate: Any, *, timeout: float = 10.0, every: float = 0.02) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout`."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"not true within {timeout}s: {predicate}")
        time.sleep(every)


def iter_pages(items: list[Obj], size: int) -> Iterator[list[Obj]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
