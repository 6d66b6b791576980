"""The kubelet pod-resources client: which pod holds which GPU on this node, exactly.

The kubelet serves `v1.PodResourcesLister` (k8s.io/kubelet/pkg/apis/podresources/v1) over
gRPC on a unix socket under `/var/lib/kubelet/pod-resources/`, the source dcgm-exporter uses.
Only `List` is needed, and its messages are few, so they are decoded here by hand from the
protobuf wire format rather than through generated stubs:

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources       { string name = 1; string namespace = 2;
                         repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices   { string resource_name = 1; repeated string device_ids = 2; ... }

Pod-resources names pods by namespace/name (no UID); the store joins them to pods by name
and time. Device IDs are GPU or MIG UUIDs (`GPU-…`, `MIG-…`), with a `::N` replica suffix
under time-slicing, or GPU indexes under the device plugin's index strategy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc  # type: ignore[import-untyped]

from auditor.errors import AuditorError

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE_PREFIX = "nvidia.com/"


class PodResourcesError(AuditorError):
    """The kubelet's pod-resources socket could not be asked (absent, refused, timed out)."""


@dataclass(frozen=True, slots=True)
class DeviceHolder:
    """One device held by one container of one pod."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


# ---------------------------------------------------------------- protobuf wire format


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a message: ints for varint/fixed, bytes for length-delimited."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            yield number, data[pos : pos + length]
            pos += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            yield number, int.from_bytes(data[pos : pos + size], "little")
            pos += size
        else:
            raise ValueError(f"unsupported wire type {wire}")


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_field(number: int, value: bytes | str) -> bytes:
    """A length-delimited field (strings and sub-messages are all List needs)."""
    raw = value.encode() if isinstance(value, str) else value
    return encode_varint(number << 3 | 2) + encode_varint(len(raw)) + raw


def _strings(data: bytes, wanted: int) -> list[str]:
    return [v.decode() for n, v in fields(data) if n == wanted and isinstance(v, bytes)]


def _messages(data: bytes, wanted: int) -> list[bytes]:
    return [v for n, v in fields(data) if n == wanted and isinstance(v, bytes)]


def decode_list_response(data: bytes) -> tuple[DeviceHolder, ...]:
    """Every (pod, container, resource, device) of a ListPodResourcesResponse."""
    found: list[DeviceHolder] = []
    for pod in _messages(data, 1):
        name = next(iter(_strings(pod, 1)), "")
        namespace = next(iter(_strings(pod, 2)), "")
        for container in _messages(pod, 3):
            cname = next(iter(_strings(container, 1)), "")
            for devices in _messages(container, 2):
                resource = next(iter(_strings(devices, 1)), "")
                for device_id in _strings(devices, 2):
                    found.append(DeviceHolder(namespace, name, cname, resource, device_id))
    return tuple(found)


def normalise_device_id(device_id: str) -> str:
    """A GPU/MIG UUID without a time-slicing replica suffix (`GPU-x::3` -> `GPU-x`)."""
    return device_id.split("::", 1)[0]


# ---------------------------------------------------------------- client


class PodResourcesClient:
    """Asks the kubelet which containers hold which `nvidia.com/*` devices."""

    def __init__(self, socket_path: Path = DEFAULT_SOCKET, *, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix://{socket_path.absolute()}")
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=lambda _request: b"",
            response_deserializer=decode_list_response,
        )

    def list_gpu_holders(self) -> tuple[DeviceHolder, ...]:
        """GPU devices (any `nvidia.com/` resource, MIG included) held right now."""
        try:
            holders: tuple[DeviceHolder, ...] = self._list(None, timeout=self.timeout_s)
        except grpc.RpcError as e:
            detail = e.details() if hasattr(e, "details") else str(e)
            raise PodResourcesError(f"pod-resources List on {self.socket_path}: {detail}") from e
        except ValueError as e:
            raise PodResourcesError(f"pod-resources answer unreadable: {e}") from e
        return tuple(h for h in holders if h.resource.startswith(GPU_RESOURCE_PREFIX))

    def close(self) -> None:
        self._channel.close()
