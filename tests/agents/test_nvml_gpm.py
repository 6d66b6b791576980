"""SM activity in the sampler: NVML GPM (Hopper and later) through the real `pynvml` on the
fake libnvidia-ml.so.1. Where GPM is supported, each read after the first carries the SM
utilisation between the two reads as `sm_active` (0-1); elsewhere it is NULL, never 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_nvml.build import SCRIPT_ENV, fake_nvml_library, render_script, write_script

from auditor.agents.sample.nvml import NvmlReader

__all__ = ["fake_nvml_library"]

T0 = 1_700_000_000.0
HOPPER = {"uuid": "GPU-h100", "name": "NVIDIA H100 80GB HBM3", "util": 100, "sm_util": 3}
AMPERE = {"uuid": "GPU-a100", "name": "NVIDIA A100-SXM4-80GB", "util": 100}


@pytest.fixture
def script(fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml-script"
    monkeypatch.setenv(SCRIPT_ENV, str(path))
    return path


def reads(script: Path, devices: list[dict[str, object]], n: int) -> list[dict[str, object]]:
    write_script(script, render_script(devices))
    now = [T0]
    reader = NvmlReader(node="node-a", period_s=5.0, clock=lambda: now[0])
    reader.open()
    try:
        out = []
        for _ in range(n):
            out.append({s.gpu_uuid: s.sm_active for s in reader.read().samples})
            now[0] += 5.0
        return out
    finally:
        reader.close()


def test_sm_activity_from_gpm_after_the_first_read(script: Path) -> None:
    first, second, third = reads(script, [HOPPER, AMPERE], 3)

    assert first == {"GPU-h100": None, "GPU-a100": None}  # GPM needs two samples
    assert second == {"GPU-h100": pytest.approx(0.03), "GPU-a100": None}
    assert third["GPU-h100"] == pytest.approx(0.03)
    assert third["GPU-a100"] is None  # no GPM on this card: NULL, never 0


def test_a_failing_gpm_metric_is_null_and_the_rest_of_the_sample_stays(script: Path) -> None:
    failing = {**HOPPER, "sm_util": "E999"}

    _, second = reads(script, [failing], 2)

    assert second == {"GPU-h100": None}
