"""The node sampler on shared cards (SPEC §7), end to end: fake NVML library (real pynvml),
fake kubelet, a fake /proc tree, the sampler's loop and a real store.

What users rely on: time-slicing replicas held per card reach the assignments; MIG
instances carry their profile; with per-process utilisation on, each pod's own use of a
card is stored (its processes summed, host processes left out), and with it off nothing
is read from /proc.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_nvml.build import SCRIPT_ENV, fake_nvml_library, render_script, write_script
from fake_podresources import FakeContainer, FakePodResources
from prometheus_client import CollectorRegistry
from records import bare_pod
from sqlalchemy import select

from auditor.agents.sample.buffer import DiskBuffer, decode_batch, encode_batch
from auditor.agents.sample.cgroups import pod_uid_in
from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.nvml import NvmlReader
from auditor.agents.sample.podresources import PodResourcesClient
from auditor.agents.sample.sampler import Sampler, SamplerSettings
from auditor.jobs import open_store
from auditor.model import Batch, GpuRecord, GpuSample, Holding, TenantSample
from auditor.store import migrate, reads
from auditor.store.connection import make_engine
from auditor.store.sample_sink import StoreSink
from auditor.store.schema import gpus

__all__ = ["fake_nvml_library"]

T0 = 1_700_000_000.0
CARD = {"uuid": "GPU-aaaa", "name": "NVIDIA H100", "mem_total": 81559, "mem_used": 1, "util": 70}
A100 = {**CARD, "uuid": "GPU-a100", "name": "NVIDIA A100-SXM4-40GB", "mig_max": 7}
MIGS = [
    {"uuid": "MIG-1111", "name": "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "mem_total": 4864},
    {"uuid": "MIG-3333", "name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "mem_total": 19968},
]
UID_TRAIN = "0c5e9d1a-7b2f-4c3e-9a8d-1f2e3d4c5b6a"
UID_NB = "9f8e7d6c-5b4a-4321-8fed-cba987654321"

# --------------------------------------------------------------- cgroup paths, by setup

CGROUPS = {
    "v1 cgroupfs, burstable": (
        "12:memory:/kubepods/burstable/pod0c5e9d1a-7b2f-4c3e-9a8d-1f2e3d4c5b6a/"
        "4f1c9e0e2b7d6a5c\n11:cpu,cpuacct:/kubepods/burstable/"
        "pod0c5e9d1a-7b2f-4c3e-9a8d-1f2e3d4c5b6a/4f1c9e0e2b7d6a5c\n",
        UID_TRAIN,
    ),
    "v1 systemd, besteffort": (
        "4:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/"
        "kubepods-besteffort-pod0c5e9d1a_7b2f_4c3e_9a8d_1f2e3d4c5b6a.slice/"
        "cri-containerd-4f1c9e0e2b7d6a5c.scope\n1:name=systemd:/kubepods.slice\n",
        UID_TRAIN,
    ),
    "v2 systemd, guaranteed": (
        "0::/kubepods.slice/kubepods-pod9f8e7d6c_5b4a_4321_8fed_cba987654321.slice/"
        "cri-containerd-aa11bb22.scope\n",
        UID_NB,
    ),
    "v2 cgroupfs": (
        "0::/kubepods/besteffort/pod9f8e7d6c-5b4a-4321-8fed-cba987654321/aa11\n",
        UID_NB,
    ),
    "v2 systemd, crio": (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod9f8e7d6c_5b4a_4321_8fed_cba987654321.slice/crio-aa11.scope\n",
        UID_NB,
    ),
    "static pod (config hash)": (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod3b8f2c1d9e0a4b5c6d7e8f9a0b1c2d3e.slice/cri-containerd-aa.scope\n",
        "3b8f2c1d9e0a4b5c6d7e8f9a0b1c2d3e",
    ),
    "host process": ("0::/system.slice/nvidia-persistenced.service\n", None),
    "docker outside kubernetes": ("0::/system.slice/docker-4f1c9e0e2b7d6a5c.scope\n", None),
    "a pod-like name outside kubepods": (
        "0::/user.slice/pod0c5e9d1a-7b2f-4c3e-9a8d-1f2e3d4c5b6a\n",
        None,
    ),
    "empty": ("", None),
}


@pytest.mark.parametrize("case", list(CGROUPS))
def test_the_pod_of_a_process_from_its_cgroup(case: str) -> None:
    text, uid = CGROUPS[case]
    assert pod_uid_in(text) == uid


# --------------------------------------------------------------- the rig


@pytest.fixture
def store(db_url: str) -> str:
    migrate.upgrade(make_engine(db_url))
    return db_url


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A fake host /proc: two processes of the training pod, one of the notebook, one of
    the host, and pid 404 that exits before it is looked up."""
    root = tmp_path / "proc"
    for pid, case in (
        (101, "v1 systemd, besteffort"),
        (102, "v1 cgroupfs, burstable"),
        (201, "v2 systemd, guaranteed"),
        (999, "host process"),
    ):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(CGROUPS[case][0])
    return root


@pytest.fixture
def script(fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml-script"
    monkeypatch.setenv(SCRIPT_ENV, str(path))
    procs = [
        {"pid": 101, "sm": 30},
        {"pid": 102, "sm": 12},
        {"pid": 201, "sm": 25},
        {"pid": 999, "sm": 3},
        {"pid": 404, "sm": 9},
    ]
    write_script(path, render_script([CARD, A100], migs={1: MIGS}, procs={0: procs}))
    return path


@pytest.fixture
def kubelet() -> Iterator[FakePodResources]:
    root = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))
    server = FakePodResources(root / "kubelet.sock").start()
    server.containers = [
        # time-slicing: the trainer holds two replicas of the card, the notebook one
        FakeContainer("ml", "train-0", "main", "nvidia.com/gpu", ["GPU-aaaa::0"]),
        FakeContainer("ml", "train-0", "side", "nvidia.com/gpu", ["GPU-aaaa::3"]),
        FakeContainer("ml", "nb-0", "notebook", "nvidia.com/gpu", ["GPU-aaaa::1"]),
        FakeContainer("ml", "infer-0", "main", "nvidia.com/mig-3g.20gb", ["MIG-3333"]),
    ]
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def sampler(store: str, tmp: Path, socket: Path, *, proc_root: Path | None) -> Sampler:
    clock = Clock(T0)
    reader = NvmlReader(node="node-a", clock=clock, proc_root=proc_root)
    reader.open()
    with open_store(store).begin() as conn:
        from auditor.store.pod_writes import upsert_pods

        upsert_pods(
            conn,
            [
                bare_pod("train-0", UID_TRAIN, bound_ms=int(T0 * 1000) - 60_000),
                bare_pod("nb-0", UID_NB, bound_ms=int(T0 * 1000) - 60_000),
                bare_pod("infer-0", "uid-infer", bound_ms=int(T0 * 1000) - 60_000),
            ],
        )
    return Sampler(
        reader=reader,
        holders=PodResourcesClient(socket, timeout_s=1),
        sink=StoreSink(lambda: open_store(store)),
        buffer=DiskBuffer(tmp / "buffer.db"),
        metrics=SamplerMetrics(CollectorRegistry(), clock=clock),
        settings=SamplerSettings(),
        clock=clock,
    )


def test_replicas_profiles_and_each_pods_own_use_reach_the_store(
    store: str, script: Path, kubelet: FakePodResources, proc: Path, tmp_path: Path
) -> None:
    loop = sampler(store, tmp_path, kubelet.socket, proc_root=proc)
    loop.run(max_passes=1)  # the real loop: one pass, then the final flush
    with open_store(store).connect() as conn:
        mapping = reads.read_assignments(conn)
        cards = reads.read_gpus(conn).set_index("uuid")
        ids = dict(conn.execute(select(gpus.c.id, gpus.c.uuid)).all())
        tenants = reads.read_tenant_util(conn, [(i, 0, 2**62) for i in ids], ids)
    replicas = {
        (p, g): (None if pd_na(r) else int(r))
        for p, g, r in mapping[["pod_uid", "gpu_uuid", "replicas"]].itertuples(index=False)
    }
    assert replicas == {
        (UID_TRAIN, "GPU-aaaa"): 2,
        (UID_NB, "GPU-aaaa"): 1,
        ("uid-infer", "MIG-3333"): None,  # a MIG instance is no replica
    }
    assert cards.loc["MIG-1111", "mig_profile"] == "1g.5gb"
    assert cards.loc["MIG-3333", "mig_profile"] == "3g.20gb"
    assert cards.loc["MIG-3333", "parent_uuid"] == "GPU-a100"
    stamp = int(T0 * 1000) - 5000  # the start of the time the pass covers, as its samples
    assert [tuple(r) for r in tenants.itertuples(index=False)] == [
        ("GPU-aaaa", UID_TRAIN, stamp, 42.0),  # pids 101 and 102, summed
        ("GPU-aaaa", UID_NB, stamp, 25.0),
    ]
    counted = loop.metrics.registry.get_sample_value
    assert counted("auditor_sampler_unattributed_processes_total") == 2  # pids 999 and 404
    assert counted("auditor_sampler_tenant_samples_total") == 2


def pd_na(value: object) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def test_per_process_utilisation_is_off_by_default(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    loop = sampler(store, tmp_path, kubelet.socket, proc_root=None)
    loop.run(max_passes=1)
    with open_store(store).connect() as conn:
        assert reads.count_rows(conn)["gpu_samples"] == 3  # the card and two MIG instances
        ids = dict(conn.execute(select(gpus.c.id, gpus.c.uuid)).all())
        assert reads.read_tenant_util(conn, [(i, 0, 2**62) for i in ids], ids).empty


def test_a_card_without_process_utilisation_costs_nothing_else(
    store: str, script: Path, kubelet: FakePodResources, proc: Path, tmp_path: Path
) -> None:
    write_script(script, render_script([{**CARD}], procs={}) + "procs fail=3\n")
    loop = sampler(store, tmp_path, kubelet.socket, proc_root=proc)
    loop.run(max_passes=1)
    with open_store(store).connect() as conn:
        assert reads.count_rows(conn)["gpu_samples"] == 1
        ids = dict(conn.execute(select(gpus.c.id, gpus.c.uuid)).all())
        assert reads.read_tenant_util(conn, [(i, 0, 2**62) for i in ids], ids).empty


def test_buffered_passes_of_an_earlier_version_are_still_written(tmp_path: Path) -> None:
    """A buffer file kept over an upgrade: batches without tenants or replicas decode."""
    old = '[[["GPU-x","n",0,"H100",1.0,null,"nvml"]],[["GPU-x",1000,5.0]],[["ml","p","GPU-x",1,2]]]'
    batch = decode_batch(old)
    assert batch.holdings == (Holding("ml", "p", "GPU-x", 1, 2),)
    assert batch.tenants == ()
    new = Batch(
        (GpuRecord("GPU-x", "n", mig_profile="1g.10gb"),),
        (GpuSample("GPU-x", 1000, 5.0),),
        (Holding("ml", "p", "GPU-x", 1, 2, 3),),
        (TenantSample("GPU-x", "uid", 1000, 12.5),),
    )
    assert decode_batch(encode_batch(new)) == new
    buffer = DiskBuffer(tmp_path / "b.db")
    buffer.stored(upto_seq=0, unresolved=[Holding("ml", "p", "GPU-x", 1, 2, 3)], keep_after_ms=0)
    assert buffer.unresolved() == [Holding("ml", "p", "GPU-x", 1, 2, 3)]


def test_a_buffer_file_of_an_earlier_version_gains_replicas(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE unresolved (namespace TEXT NOT NULL, pod TEXT NOT NULL,"
        " gpu_uuid TEXT NOT NULL, first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL,"
        " PRIMARY KEY (namespace, pod, gpu_uuid));"
        "INSERT INTO unresolved VALUES ('ml', 'p', 'GPU-x', 1, 2);"
    )
    db.commit()
    db.close()
    buffer = DiskBuffer(path)
    assert buffer.unresolved() == [Holding("ml", "p", "GPU-x", 1, 2)]
