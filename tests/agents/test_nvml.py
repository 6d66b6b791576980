"""The NVML reader against the real `pynvml` loading a fake libnvidia-ml.so.1 (built with gcc).

What users rely on: every GPU and MIG instance is read; utilisation covers the whole period
from the driver's buffer; what the driver does not support is NULL, never 0; a lost GPU or a
failing call costs that device only; no driver is a clear error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_nvml.build import SCRIPT_ENV, fake_nvml_library, render_script, write_script

from auditor.agents.sample.nvml import DriverError, NvmlReader

__all__ = ["fake_nvml_library"]

T0 = 1_700_000_000.0
H100 = {
    "uuid": "GPU-aaaa",
    "name": "NVIDIA H100 80GB HBM3",
    "mem_total": 81559,
    "mem_used": 20480,
    "util": 40,
    "power_mw": 312500,
    "sm_clock": 1980,
    "throttle": 4,
    "temp": 61,
}


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


def reader_for(script: Path, text: str, clock: Clock) -> NvmlReader:
    write_script(script, text)
    reader = NvmlReader(node="node-a", period_s=5.0, clock=clock)
    reader.open()
    return reader


def test_reads_every_field_of_every_gpu(script: Path) -> None:
    second = {**H100, "uuid": "GPU-bbbb", "util": 0, "mem_used": 0}
    reader = reader_for(script, render_script([H100, second]), Clock(T0))
    reading = reader.read()
    assert [(g.uuid, g.index, g.node, g.model) for g in reading.gpus] == [
        ("GPU-aaaa", 0, "node-a", "NVIDIA H100 80GB HBM3"),
        ("GPU-bbbb", 1, "node-a", "NVIDIA H100 80GB HBM3"),
    ]
    assert {g.util_source for g in reading.gpus} == {"nvml"}
    first = reading.samples[0]
    assert first.util == 40.0
    assert first.memory_used_mib == 20480.0
    assert first.memory_total_mib == 81559.0
    assert first.power_w == 312.5
    assert first.sm_clock_mhz == 1980.0
    assert first.throttle_reasons == "0x0000000000000004"
    assert first.temperature_c == 61.0
    assert reading.samples[1].util == 0.0  # a real zero stays zero
    assert reading.problems == ()


def test_unsupported_fields_are_none_never_zero(script: Path) -> None:
    bare = {"uuid": "GPU-old", "name": "Tesla K80"}
    reading = reader_for(script, render_script([bare]), Clock(T0)).read()
    (s,) = reading.samples
    assert (s.util, s.memory_used_mib, s.power_w, s.sm_clock_mhz) == (None, None, None, None)
    assert (s.throttle_reasons, s.temperature_c) == (None, None)
    assert reading.gpus[0].memory_total_mib is None


def test_utilisation_is_the_mean_of_the_buffer_since_the_last_read(script: Path) -> None:
    us = 1_000_000
    base = int(T0 * us)
    samples = {
        0: [
            (base - 6 * us, 100),  # before the first period: not counted
            (base - 4 * us, 10),
            (base - 2 * us, 30),
            (base + 1 * us, 90),  # read by the second pass only
            (base + 3 * us, 70),
        ]
    }
    clock = Clock(T0)
    reader = reader_for(
        script, render_script([{**H100, "samples": "scripted"}], samples=samples), clock
    )
    first = reader.read()
    assert first.samples[0].util == 20.0  # (10 + 30) / 2, not the point reading 40
    assert first.samples[0].ts_ms == int(T0 * 1000) - 5000  # stamped at the start it covers
    clock.t = T0 + 5
    second = reader.read()
    assert second.samples[0].util == 80.0
    assert second.samples[0].ts_ms == int(T0 * 1000)


def test_empty_buffer_falls_back_to_the_point_reading(script: Path) -> None:
    samples = {0: [(int(T0 * 1e6) - 1_000_000, 10)]}
    clock = Clock(T0)
    reader = reader_for(
        script, render_script([{**H100, "samples": "scripted"}], samples=samples), clock
    )
    assert reader.read().samples[0].util == 10.0
    clock.t = T0 + 5
    assert reader.read().samples[0].util == 40.0  # nothing new buffered: the point reading


def test_without_buffer_support_the_point_reading_is_used(script: Path) -> None:
    reading = reader_for(script, render_script([{**H100, "samples": "none"}]), Clock(T0)).read()
    assert reading.samples[0].util == 40.0


def test_synthetic_driver_buffer_covers_the_period(script: Path) -> None:
    import time

    dev = {**H100, "util": 55, "samples": "synthetic"}
    reader = reader_for(script, render_script([dev]), Clock(time.time()))
    assert reader.read().samples[0].util == 55.0


def test_mig_instances_are_gpus_of_their_own_without_utilisation(script: Path) -> None:
    migs = {
        0: [
            {"uuid": "MIG-1111", "name": "NVIDIA A100 1g.10gb", "mem_total": 9984, "mem_used": 12},
            {"uuid": "MIG-2222", "name": "NVIDIA A100 3g.40gb", "mem_total": 40192, "mem_used": 0},
        ]
    }
    parent = {**H100, "uuid": "GPU-a100", "mig_max": 7}
    reading = reader_for(script, render_script([parent], migs=migs), Clock(T0)).read()
    assert [(g.uuid, g.parent_uuid, g.memory_total_mib, g.mig_profile) for g in reading.gpus] == [
        ("MIG-1111", "GPU-a100", 9984.0, "1g.10gb"),
        ("MIG-2222", "GPU-a100", 40192.0, "3g.40gb"),
    ]
    assert [s.util for s in reading.samples] == [None, None]  # NVML: not supported on MIG
    assert reading.samples[0].memory_used_mib == 12.0


def test_memory_used_above_the_total_skips_that_device_only(script: Path) -> None:
    """A whole card is skipped with its signals; a MIG instance alone, its siblings kept.
    Used equal to the total is a full card, and is read."""
    full = {**H100, "uuid": "GPU-full", "mem_used": 81559}
    over = {**H100, "uuid": "GPU-over", "mem_used": 81560}
    migs = {
        2: [
            {
                "uuid": "MIG-1111",
                "name": "NVIDIA A100 1g.10gb",
                "mem_total": 9984,
                "mem_used": 9985,
            },
            {"uuid": "MIG-2222", "name": "NVIDIA A100 3g.40gb", "mem_total": 40192, "mem_used": 0},
        ]
    }
    parent = {**H100, "uuid": "GPU-a100", "mig_max": 7}
    reading = reader_for(script, render_script([full, over, parent], migs=migs), Clock(T0)).read()
    assert [s.gpu_uuid for s in reading.samples] == ["GPU-full", "MIG-2222"]
    assert [c.gpu_uuid for c in reading.card_signals] == ["GPU-full"]
    assert [(p.index, p.uuid) for p in reading.problems] == [(1, "GPU-over"), (2, "MIG-1111")]
    assert all("above its total" in p.error for p in reading.problems)


def test_a_lost_gpu_costs_only_itself_and_comes_back(script: Path) -> None:
    second = {**H100, "uuid": "GPU-bbbb"}
    reader = reader_for(script, render_script([H100, {**second, "lost": 1}]), Clock(T0))
    reading = reader.read()
    assert [g.uuid for g in reading.gpus] == ["GPU-aaaa"]
    assert [(p.index, p.error) for p in reading.problems] == [(1, "GPU is lost")]
    write_script(script, render_script([H100, second]))
    assert [g.uuid for g in reader.read().gpus] == ["GPU-aaaa", "GPU-bbbb"]


def test_an_nvml_error_on_one_field_nulls_that_field_only(script: Path) -> None:
    broken = {**H100, "uuid": "GPU-bbbb", "util": "E999", "power_mw": "E999"}
    reading = reader_for(script, render_script([H100, broken]), Clock(T0)).read()
    assert [(s.gpu_uuid, s.util, s.power_w) for s in reading.samples] == [
        ("GPU-aaaa", 40.0, 312.5),
        ("GPU-bbbb", None, None),
    ]
    assert reading.samples[1].memory_used_mib == 20480.0


def test_a_gpu_lost_while_reading_is_a_problem_not_a_crash(script: Path) -> None:
    dying = {**H100, "uuid": "GPU-bbbb", "util": "E15"}
    reading = reader_for(script, render_script([H100, dying]), Clock(T0)).read()
    assert [g.uuid for g in reading.gpus] == ["GPU-aaaa"]
    assert [(p.uuid, p.error) for p in reading.problems] == [("GPU-bbbb", "GPU is lost")]


def test_driver_not_loaded_is_a_clear_error(script: Path) -> None:
    write_script(script, render_script([H100], init_fail=9))
    with pytest.raises(DriverError, match="cannot initialise NVML: Driver Not Loaded"):
        NvmlReader(node="n").open()
