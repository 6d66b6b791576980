"""A fake kubelet pod-resources server: real gRPC on a unix socket, answering `List`.

Tests set `pods` (namespace, name, container, resource, device IDs) and may make it fail;
the response is encoded in the protobuf wire format of podresources/v1.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from auditor.agents.sample.podresources import LIST_METHOD, encode_field


@dataclass
class FakeContainer:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: Sequence[str]


def encode_response(containers: Sequence[FakeContainer]) -> bytes:
    """ListPodResourcesResponse bytes, one PodResources per (namespace, pod)."""
    by_pod: dict[tuple[str, str], list[FakeContainer]] = {}
    for c in containers:
        by_pod.setdefault((c.namespace, c.pod), []).append(c)
    out = b""
    for (namespace, pod), items in by_pod.items():
        body = encode_field(1, pod) + encode_field(2, namespace)
        for c in items:
            devices = encode_field(1, c.resource)
            for d in c.device_ids:
                devices += encode_field(2, d)
            # cpu_ids (field 3, packed int64) as a kubelet sends them: must be skipped
            body += encode_field(
                3,
                encode_field(1, c.container)
                + encode_field(2, devices)
                + encode_field(3, b"\x02\x03"),
            )
        out += encode_field(1, body)
    return out


@dataclass
class FakePodResources:
    socket: Path
    containers: list[FakeContainer] = field(default_factory=list)
    fail_with: grpc.StatusCode | None = None
    calls: int = 0
    _server: Any = None

    def _list(self, _request: bytes, context: Any) -> bytes:
        self.calls += 1
        if self.fail_with is not None:
            context.abort(self.fail_with, "scripted failure")
        return encode_response(self.containers)

    def start(self) -> FakePodResources:
        handler = grpc.method_handlers_generic_handler(
            LIST_METHOD.split("/")[1],
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=lambda b: b,
                    response_serializer=lambda b: b,
                )
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
