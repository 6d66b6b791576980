"""The sampler's SPEC §10 signals: GPU pods' cgroups, cards' PCIe and NVLink.

What users rely on: each GPU pod's CPU limit use, throttling and pressure between two passes
reach `pod_signals` (source `cgroup`) under either kubelet driver and cgroup version; each
card's PCIe/NVLink traffic reaches `card_signals`; a signal that cannot be read is NULL and
counted, a bad cgroup file costs that pod this pass only, never the pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_nvml.build import SCRIPT_ENV, fake_nvml_library, render_script, write_script
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from auditor.agents.sample.buffer import DiskBuffer, decode_batch, encode_batch
from auditor.agents.sample.cgroup_signals import (
    CgroupFileError,
    CgroupSignals,
    parse_cpu_max,
    parse_flat_keyed,
    parse_pressure_some_total,
    pod_dir_names,
)
from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.nvml import NvmlReader, pcie_link_bytes_s
from auditor.agents.sample.sampler import Sampler
from auditor.jobs import open_store
from auditor.model import Batch, CardSignal, PodSignal
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.sample_sink import StoreSink
from auditor.store.schema import card_signals, pod_signals

__all__ = ["fake_nvml_library"]

FIXTURES = Path(__file__).parents[1] / "fixtures" / "signals"
UID = "2fdafb62-3de2-43e6-900a-eda4bf1982db"
T0 = 1_700_000_000.0


def test_the_real_files_parse() -> None:
    stat = parse_flat_keyed((FIXTURES / "cgroupv2-pod-cpu.stat").read_text(), what="cpu.stat")
    assert stat["usage_usec"] == 8099091679
    assert (stat["nr_periods"], stat["nr_throttled"]) == (7607, 4174)
    container = parse_flat_keyed((FIXTURES / "cgroupv2-cpu.stat").read_text(), what="cpu.stat")
    assert container["throttled_usec"] == 395384834
    pressure = (FIXTURES / "cgroupv2-cpu.pressure").read_text()
    assert parse_pressure_some_total(pressure, what="cpu.pressure") == 27907960587


def test_cpu_max() -> None:
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("200000 100000\n") == 2.0
    with pytest.raises(CgroupFileError):
        parse_cpu_max("lots\n")


def test_pod_dirs_under_both_drivers() -> None:
    names = list(pod_dir_names(UID))
    under = UID.replace("-", "_")
    assert f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice" in names
    assert f"kubepods.slice/kubepods-pod{under}.slice" in names
    assert f"kubepods/burstable/pod{UID}" in names
    assert f"kubepods/pod{UID}" in names


def v2_pod(root: Path, *, usage: int, periods: int, throttled: int, cpu_some: int) -> Path:
    """A cgroup v2 tree (systemd driver) holding one burstable pod."""
    (root / "cgroup.controllers").parent.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    under = UID.replace("-", "_")
    pod = root / f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice"
    pod.mkdir(parents=True, exist_ok=True)
    real = (FIXTURES / "cgroupv2-pod-cpu.stat").read_text()
    text = (
        real.replace("8099091679", str(usage))
        .replace("7607", str(periods))
        .replace("4174", str(throttled))
    )
    (pod / "cpu.stat").write_text(text)
    (pod / "cpu.max").write_text("200000 100000\n")
    real_p = (FIXTURES / "cgroupv2-cpu.pressure").read_text()
    (pod / "cpu.pressure").write_text(real_p.replace("27907960587", str(cpu_some)))
    (pod / "io.pressure").write_text(
        f"some avg10=0.00 avg60=0.00 avg300=0.00 total={cpu_some // 10}\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    return pod


def test_v2_signals_between_two_passes(tmp_path: Path) -> None:
    v2_pod(tmp_path, usage=8099091679, periods=7607, throttled=4174, cpu_some=27907960587)
    reader = CgroupSignals(tmp_path)
    assert reader.read([UID], now_ms=1_000_000) == ([], [])  # a first reading: no rate yet
    # 5 s later: 9 CPU-seconds of 10 allowed (2 CPUs), 50 periods of which 20 throttled,
    # 1.5 s of CPU pressure
    v2_pod(tmp_path, usage=8099091679 + 9_000_000, periods=7657, throttled=4194,
           cpu_some=27907960587 + 1_500_000)  # fmt: skip
    (signal,), errors = reader.read([UID], now_ms=1_005_000)
    assert errors == []
    assert signal.pod_uid == UID
    assert signal.ts_ms == 1_000_000
    assert signal.cpu_limit_ratio == pytest.approx(0.9)
    assert signal.throttled_ratio == pytest.approx(0.4)
    assert signal.cpu_pressure == pytest.approx(0.3)
    assert signal.io_pressure == pytest.approx(0.03)


def test_v1_cgroupfs_has_no_pressure_and_no_limit_without_quota(tmp_path: Path) -> None:
    for controller in ("cpu,cpuacct",):
        pod = tmp_path / controller / f"kubepods/besteffort/pod{UID}"
        pod.mkdir(parents=True)
        (pod / "cpuacct.usage").write_text("1000000000\n")
        (pod / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
        (pod / "cpu.cfs_quota_us").write_text("-1\n")
        (pod / "cpu.cfs_period_us").write_text("100000\n")
    reader = CgroupSignals(tmp_path)
    reader.read([UID], now_ms=0)
    pod = tmp_path / "cpu,cpuacct" / f"kubepods/besteffort/pod{UID}"
    (pod / "cpuacct.usage").write_text("3000000000\n")
    (signal,), _ = reader.read([UID], now_ms=10_000)
    assert signal == PodSignal(UID, 0, None, None, None, None)


def test_a_bad_file_costs_that_pod_only(tmp_path: Path) -> None:
    pod = v2_pod(tmp_path, usage=1, periods=1, throttled=0, cpu_some=1)
    reader = CgroupSignals(tmp_path)
    (pod / "cpu.stat").write_text("usage_usec lots\n")
    found, errors = reader.read([UID, "00000000-0000-0000-0000-000000000000"], now_ms=0)
    assert found == []
    assert len(errors) == 1
    assert "cpu.stat" in str(errors[0])


def test_pcie_link_bandwidth() -> None:
    assert pcie_link_bytes_s(4, 16) == pytest.approx(16e9 * 128 / 130 * 16 / 8)
    assert pcie_link_bytes_s(1, 1) == pytest.approx(2.5e9 * 0.8 / 8)
    assert pcie_link_bytes_s(None, 16) is None


def test_a_batch_with_signals_survives_the_buffer() -> None:
    batch = Batch((), (), (), (), (PodSignal(UID, 1, 0.5),), (CardSignal("GPU-a", 1, 1.0),))
    assert decode_batch(encode_batch(batch)) == batch


GPU = {"uuid": "GPU-aaaa", "name": "NVIDIA H100", "mem_total": 81559, "mem_used": 1, "util": 0}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def script(fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml-script"
    monkeypatch.setenv(SCRIPT_ENV, str(path))
    return path


def test_card_signals_from_nvml(script: Path) -> None:
    fast = {**GPU, "pcie_tx": 1000, "pcie_rx": 3000, "pcie_gen": 5, "pcie_width": 16,
            "nvlinks": 18, "nvlink_tx": 1, "nvlink_rx": 1}  # fmt: skip
    bare = {**GPU, "uuid": "GPU-bbbb"}
    write_script(script, render_script([fast, bare]))
    clock = Clock(T0)
    reader = NvmlReader(node="n", clock=clock)
    reader.open()
    first = reader.read()
    clock.t += 5
    second = reader.read()
    a, b = second.card_signals
    assert a.pcie_bytes_s == 4_000_000.0
    assert a.pcie_link_bytes_s == pytest.approx(32e9 * 128 / 130 * 2)
    assert first.card_signals[0].nvlink_bytes_s is None  # no previous counter yet
    assert a.nvlink_bytes_s == pytest.approx(36 * 1024 / 5)  # 18 links, tx + rx, 1 KiB each
    assert (b.pcie_bytes_s, b.pcie_link_bytes_s, b.nvlink_bytes_s) == (None, None, None)
    assert second.unsupported_signals == 3
    reader.close()


def test_a_pass_stores_pod_and_card_signals(script: Path, tmp_path: Path, db_url: str) -> None:
    migrate.upgrade(make_engine(db_url))
    pid = 4242
    proc = tmp_path / "proc" / str(pid)
    proc.mkdir(parents=True)
    under = UID.replace("-", "_")
    (proc / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/"
        "cri-containerd-d30a53.scope\n"
    )
    card = {**GPU, "pcie_tx": 10, "pcie_rx": 10, "pcie_gen": 4, "pcie_width": 16}
    write_script(script, render_script([card], procs={0: [{"pid": pid, "sm": 0}]}))
    cgroups = tmp_path / "cgroup"
    clock = Clock(T0)
    reader = NvmlReader(node="n", clock=clock, proc_root=tmp_path / "proc")
    reader.open()
    metrics = SamplerMetrics(CollectorRegistry(), clock=clock)
    sampler = Sampler(
        reader=reader,
        holders=None,
        sink=StoreSink(lambda: open_store(db_url)),
        buffer=DiskBuffer(tmp_path / "buffer.db"),
        metrics=metrics,
        clock=clock,
        cgroups=CgroupSignals(cgroups),
    )
    v2_pod(cgroups, usage=0, periods=0, throttled=0, cpu_some=0)
    sampler.sample_once()
    clock.t += 5
    v2_pod(cgroups, usage=9_000_000, periods=50, throttled=20, cpu_some=1_500_000)
    sampler.sample_once()
    clock.t += 5
    (cgroups / "cgroup.controllers").parent.joinpath(
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/cpu.stat"
    ).write_text("garbage\n")
    sampler.sample_once()  # a bad file: counted, the pass goes on
    assert sampler.flush()
    reader.close()
    with open_store(db_url).connect() as conn:
        pods = conn.execute(select(pod_signals)).mappings().all()
        cards = conn.execute(select(card_signals).order_by(card_signals.c.ts_ms)).all()
    (row,) = pods
    assert row["pod_uid"] == UID
    assert row["source"] == "cgroup"
    assert row["ts_ms"] == int(T0 * 1000)
    assert row["cpu_limit_ratio"] == pytest.approx(0.9)
    assert row["throttled_ratio"] == pytest.approx(0.4)
    assert row["cpu_pressure"] == pytest.approx(0.3)
    assert row["net_bytes_s"] is None
    assert len(cards) == 3
    assert cards[0].pcie_bytes_s == 20_000.0
    assert metrics.registry.get_sample_value("auditor_sampler_cgroup_errors_total") == 1
    assert metrics.registry.get_sample_value("auditor_sampler_pod_signals_total") == 1
    assert metrics.registry.get_sample_value("auditor_sampler_passes_total") == 3
