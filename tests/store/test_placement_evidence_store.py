"""Placement evidence through the store, as a user runs it (SQLite and PostgreSQL): Run:ai
pods in the shape Run:ai writes them (a `gpu-fraction: 0.5` pod and its reservation pod in
`runai-reservation`, sharing a `runai-gpu-group` label; the reservation pod's
`run.ai/reserve_for_gpu_index` names its card), an nvidia-smi log of the node (card 0 idle,
card 1 at 80 % with 30 GB used), imported, audited and reported. First fit would put the
fraction pod on idle card 0 and call its time reserved_idle; it is on card 1, busy."""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor import jobs
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds

FIXTURE = Path(__file__).parents[1] / "fixtures" / "pods" / "sharing" / "runai-group.json"
NODE = "gpu-runai-1"
CARD_0 = "GPU-4f2e8d3c-9b7a-4c6d-8e5f-00000000a000"
CARD_1 = "GPU-4f2e8d3c-9b7a-4c6d-8e5f-00000000b001"  # the reservation pod's
START_MS = 1_795_420_800_000  # 2026-11-23T08:00:00Z
END_MS = START_MS + 2 * 3_600_000


def write_log(path: Path) -> None:
    lines = [
        "timestamp, index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"
    ]
    for minute in range(120):
        ts = f"2026/11/23 {8 + minute // 60:02d}:{minute % 60:02d}:00.000"
        lines.append(f"{ts}, 0, {CARD_0}, NVIDIA A100-SXM4-80GB, 0 MiB, 81920 MiB, 0 %")
        lines.append(f"{ts}, 1, {CARD_1}, NVIDIA A100-SXM4-80GB, 30000 MiB, 81920 MiB, 80 %")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_runai_fraction_pod_is_on_its_reservation_pods_card(db_url: str, tmp_path: Path) -> None:
    jobs.db_upgrade(db_url)
    log = tmp_path / f"{NODE}.csv"
    write_log(log)
    jobs.import_nvidia_smi(db_url, log, node=NODE)
    jobs.import_pods(db_url, FIXTURE, config=Config())
    jobs.audit(db_url, window=(START_MS, END_MS), thresholds=Thresholds(default_period_s=60))
    by_gpu = jobs.build_report(db_url, start_ms=None, end_ms=None, by=GroupBy.GPU, team=None)
    by_pod = jobs.build_report(db_url, start_ms=None, end_ms=None, by=GroupBy.POD, team=None)
    gpus = by_gpu.rows.set_index("gpu")
    pods = by_pod.rows.set_index("pod")
    frac = next(p for p in pods.index if "frac-job-0-0" in str(p))
    assert gpus.loc[CARD_0, "unallocated_gpu_hours"] == pytest.approx(2.0)
    assert gpus.loc[CARD_1, "allocated_gpu_hours"] > 0
    assert pods.loc[frac, "reserved_idle_gpu_hours"] == pytest.approx(0.0)
    assert pods.loc[frac, "busy_gpu_hours"] > 0
    assert not any("runai-reservation" in str(p) for p in pods.index)  # never a tenant
