"""The pod-resources client against a fake kubelet: real gRPC on a unix socket.

What users rely on: the GPUs (and MIG instances) each pod holds are read exactly, whatever
else the kubelet lists; a kubelet that does not answer is a clear error, not a hang.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest
from fake_podresources import FakeContainer, FakePodResources, encode_response

from auditor.agents.sample.podresources import (
    DeviceHolder,
    PodResourcesClient,
    PodResourcesError,
    decode_list_response,
    encode_field,
    normalise_device_id,
)
from auditor.agents.sample.sampler import holdings
from auditor.model import GpuRecord, Holding


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[FakePodResources]:
    server = FakePodResources(socket_dir / "kubelet.sock").start()
    yield server
    server.stop()


TRAIN = FakeContainer("ml", "train-0", "trainer", "nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"])
MIG = FakeContainer("ml", "notebook-1", "lab", "nvidia.com/mig-1g.10gb", ["MIG-1111"])
NIC = FakeContainer("ml", "train-0", "trainer", "rdma/hca", ["mlx5_0"])


def test_lists_every_gpu_and_mig_device_each_pod_holds(kubelet: FakePodResources) -> None:
    kubelet.containers = [TRAIN, NIC, MIG]
    client = PodResourcesClient(kubelet.socket)
    try:
        found = client.list_gpu_holders()
    finally:
        client.close()
    assert sorted(found, key=lambda h: h.device_id) == [
        DeviceHolder("ml", "train-0", "trainer", "nvidia.com/gpu", "GPU-aaaa"),
        DeviceHolder("ml", "train-0", "trainer", "nvidia.com/gpu", "GPU-bbbb"),
        DeviceHolder("ml", "notebook-1", "lab", "nvidia.com/mig-1g.10gb", "MIG-1111"),
    ]


def test_an_unreachable_kubelet_is_a_clear_error(socket_dir: Path) -> None:
    client = PodResourcesClient(socket_dir / "absent.sock", timeout_s=0.5)
    with pytest.raises(PodResourcesError, match=r"pod-resources List on .*absent\.sock"):
        client.list_gpu_holders()
    client.close()


def test_a_failing_kubelet_is_a_clear_error(kubelet: FakePodResources) -> None:
    kubelet.fail_with = grpc.StatusCode.UNAVAILABLE
    client = PodResourcesClient(kubelet.socket)
    with pytest.raises(PodResourcesError, match="scripted failure"):
        client.list_gpu_holders()
    client.close()


def test_decoding_skips_fields_it_does_not_know() -> None:
    body = encode_response([TRAIN])
    # a future field 9 on the response, varint and fixed64 fields, as newer kubelets may send
    extra = encode_field(9, b"future") + b"\x50\x01" + b"\x59" + bytes(8)
    assert [h.device_id for h in decode_list_response(body + extra)] == ["GPU-aaaa", "GPU-bbbb"]


def test_truncated_answer_is_refused() -> None:
    with pytest.raises(ValueError, match="truncated"):
        decode_list_response(encode_response([TRAIN])[:-3])


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [("GPU-aaaa", "GPU-aaaa"), ("GPU-aaaa::3", "GPU-aaaa"), ("MIG-1111", "MIG-1111"), ("0", "0")],
)
def test_device_ids_are_normalised(device_id: str, expected: str) -> None:
    assert normalise_device_id(device_id) == expected


class _Reading:
    def __init__(self, gpus: tuple[GpuRecord, ...]) -> None:
        self.taken_ms = 1_000
        self.gpus = gpus
        self.samples = ()
        self.problems = ()


def test_holders_become_holdings_by_uuid_replica_or_index() -> None:
    reading = _Reading((GpuRecord("GPU-aaaa", "n", 0), GpuRecord("GPU-bbbb", "n", 1)))
    holders = [
        DeviceHolder("ml", "a", "c", "nvidia.com/gpu", "GPU-aaaa::2"),  # time-slicing replica
        DeviceHolder("ml", "a", "d", "nvidia.com/gpu", "GPU-aaaa::5"),  # another, same card
        DeviceHolder("ml", "b", "c", "nvidia.com/gpu", "1"),  # device plugin index strategy
        DeviceHolder("ml", "c", "c", "nvidia.com/gpu", "GPU-gone"),  # not read this pass
    ]
    assert holdings(reading, holders) == (
        Holding("ml", "a", "GPU-aaaa", 1_000, 1_000, replicas=2),
        Holding("ml", "b", "GPU-bbbb", 1_000, 1_000),  # a whole card: no replicas
    )
