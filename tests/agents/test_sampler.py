"""The node sampler end to end: fake NVML library, fake kubelet, a real store.

What users rely on: every pass reaches the store exactly once, with who held each GPU; a
database outage loses nothing up to the buffer's bound (then the oldest, counted); a lost
GPU, a failing kubelet, a pod the watcher has not recorded yet cost nothing else.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fake_nvml.build import SCRIPT_ENV, fake_nvml_library, render_script, write_script
from fake_podresources import FakeContainer, FakePodResources
from prometheus_client import CollectorRegistry
from records import bare_pod
from sqlalchemy import select

from auditor.agents.sample.buffer import DiskBuffer
from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.nvml import NvmlReader
from auditor.agents.sample.podresources import PodResourcesClient
from auditor.agents.sample.sampler import Sampler, SamplerSettings
from auditor.jobs import open_store
from auditor.model import PodRecord
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.sample_sink import StoreSink
from auditor.store.schema import gpu_assignments, gpu_samples, gpus

__all__ = ["fake_nvml_library"]

T0 = 1_700_000_000.0
GPU_A = {"uuid": "GPU-aaaa", "name": "NVIDIA H100", "mem_total": 81559, "mem_used": 1, "util": 40}
GPU_B = {**GPU_A, "uuid": "GPU-bbbb", "util": 0}


@pytest.fixture
def store(db_url: str) -> str:
    """A migrated store (`auditor db upgrade` prepares a PostgreSQL database)."""
    migrate.upgrade(make_engine(db_url))
    return db_url


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def pod(name: str, uid: str, *, bound_s: float) -> PodRecord:
    return bare_pod(name, uid, bound_ms=int(bound_s * 1000), gpu_count=2)


@pytest.fixture
def script(fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml-script"
    monkeypatch.setenv(SCRIPT_ENV, str(path))
    write_script(path, render_script([GPU_A, GPU_B]))
    return path


@pytest.fixture
def kubelet() -> Iterator[FakePodResources]:
    root = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))
    server = FakePodResources(root / "kubelet.sock").start()
    server.containers = [
        FakeContainer("ml", "train-0", "c", "nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"])
    ]
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


class Rig:
    """A sampler over the fake library and kubelet, writing to `url`, on a manual clock."""

    def __init__(
        self,
        url: str,
        *,
        tmp: Path,
        socket: Path | None,
        max_batches: int = 100,
        clock: Callable[[], float] | None = None,
    ):
        self.clock = Clock(T0)
        self.url = url
        self.reader = NvmlReader(node="node-a", clock=clock or self.clock)
        self.reader.open()
        self.metrics = SamplerMetrics(CollectorRegistry(), clock=self.clock)
        self.buffer = DiskBuffer(tmp / "buffer.db", max_batches=max_batches)
        self.sampler = Sampler(
            reader=self.reader,
            holders=None if socket is None else PodResourcesClient(socket, timeout_s=1),
            sink=StoreSink(lambda: open_store(self.url)),
            buffer=self.buffer,
            metrics=self.metrics,
            settings=SamplerSettings(holding_ttl_s=600),
            clock=clock or self.clock,
        )

    def passes(self, n: int) -> None:
        for _ in range(n):
            self.sampler.sample_once()
            self.clock.t += 5

    def metric(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(f"auditor_sampler_{name}")
        assert value is not None, name
        return value


def stored(url: str) -> list[tuple[str, int, float | None]]:
    with open_store(url).connect() as conn:
        rows = conn.execute(
            select(gpus.c.uuid, gpu_samples.c.ts_ms, gpu_samples.c.util)
            .join(gpus, gpus.c.id == gpu_samples.c.gpu_id)
            .order_by(gpu_samples.c.ts_ms, gpus.c.uuid)
        )
        return [(u, int(t), v) for u, t, v in rows]


def assignments(url: str) -> list[tuple[str, str, int, int, str]]:
    with open_store(url).connect() as conn:
        rows = conn.execute(
            select(
                gpu_assignments.c.pod_uid,
                gpus.c.uuid,
                gpu_assignments.c.first_seen_ms,
                gpu_assignments.c.last_seen_ms,
                gpu_assignments.c.source,
            )
            .join(gpus, gpus.c.id == gpu_assignments.c.gpu_id)
            .order_by(gpus.c.uuid)
        )
        return [(p, g, int(a), int(b), s) for p, g, a, b, s in rows]


def add_pods(url: str, *records: PodRecord) -> None:
    with open_store(url).begin() as conn:
        upsert_pods(conn, records)


def test_passes_store_samples_and_the_pod_holding_each_gpu(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    add_pods(store, pod("train-0", "uid-1", bound_s=T0 - 100))
    rig = Rig(store, tmp=tmp_path, socket=kubelet.socket)
    rig.passes(3)
    assert rig.sampler.flush()
    t0 = int(T0 * 1000)
    assert stored(store) == [
        (u, t0 + k * 5000 - 5000, util)
        for k in range(3)
        for u, util in (("GPU-aaaa", 40.0), ("GPU-bbbb", 0.0))
    ]
    assert assignments(store) == [
        ("uid-1", "GPU-aaaa", t0, t0 + 10_000, "pod-resources"),
        ("uid-1", "GPU-bbbb", t0, t0 + 10_000, "pod-resources"),
    ]
    assert len(rig.buffer) == 0
    assert rig.metric("stored_samples_total") == 6


def test_a_replayed_batch_is_harmless(store: str, script: Path, tmp_path: Path) -> None:
    rig = Rig(store, tmp=tmp_path, socket=None)
    rig.passes(2)
    batches = [b for _, b in rig.buffer.oldest(10)]
    rig.sampler.flush()
    rig.sampler.sink.write(batches, pending=[])  # as after a crash between commit and delete
    assert len(stored(store)) == 4


def test_a_holding_waits_for_the_watcher_to_record_its_pod(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    rig = Rig(store, tmp=tmp_path, socket=kubelet.socket)
    rig.passes(2)
    rig.sampler.flush()
    assert assignments(store) == []
    assert len(stored(store)) == 4  # samples do not wait
    assert rig.metric("unresolved_holdings") == 2
    add_pods(store, pod("train-0", "uid-1", bound_s=T0 - 1))
    rig.passes(1)
    rig.sampler.flush()
    t0 = int(T0 * 1000)
    assert [(p, g, a, b) for p, g, a, b, _ in assignments(store)] == [
        ("uid-1", "GPU-aaaa", t0, t0 + 10_000),
        ("uid-1", "GPU-bbbb", t0, t0 + 10_000),
    ]
    assert rig.metric("unresolved_holdings") == 0


def test_a_reused_pod_name_maps_to_the_pod_of_that_time(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    old = replace(pod("train-0", "uid-old", bound_s=T0 - 3600), finished_ms=int(T0 - 600) * 1000)
    add_pods(store, old, pod("train-0", "uid-new", bound_s=T0 - 5))
    rig = Rig(store, tmp=tmp_path, socket=kubelet.socket)
    rig.passes(1)
    rig.sampler.flush()
    assert {p for p, *_ in assignments(store)} == {"uid-new"}


def test_a_holding_whose_pod_never_appears_is_dropped_and_counted(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    rig = Rig(store, tmp=tmp_path, socket=kubelet.socket)
    rig.passes(1)
    rig.sampler.flush()
    rig.clock.t += 601  # past the holding TTL
    rig.sampler.flush()
    assert rig.metric("unresolved_holdings") == 0
    assert rig.metric("dropped_holdings_total") == 2


def test_the_loop_keeps_its_period_and_flushes_at_the_end(
    store: str, script: Path, tmp_path: Path
) -> None:
    import time

    rig = Rig(store, tmp=tmp_path, socket=None, clock=time.time)
    rig.sampler.settings = SamplerSettings(period_s=0.1, flush_every_s=0.15)
    started = time.monotonic()
    rig.sampler.run(max_passes=5)
    assert 0.35 < time.monotonic() - started < 3
    assert len(stored(store)) == 10
    assert len(rig.buffer) == 0
