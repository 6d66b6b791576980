"""The causes inside `compute_idle` and `unallocated` (SPEC §10) through the store: signals
written as the sampler writes them → `auditor audit` → every place a user reads them (the
report in JSON and as a table, the finance CSV, the /metrics figures), on SQLite and
PostgreSQL.

One training pod holds a card for 2 h, at full work but for three short idle gaps: in the first
its cgroup says it was CPU-throttled (`input_bound`), in the second its card moved data
over PCIe at 5 GB/s of an 8 GB/s link (`host_transfer`), in the third nothing was recorded
(`unexplained`). A second card on a node cordoned for the first hour and never held is
`unavailable` then, `no_demand` for half an hour after, and `blocked` for the last half
hour, while a pod waited for an H100.
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from sqlalchemy import Engine

from auditor import jobs
from auditor.model import GpuRecord, GpuSample, PodRecord, WorkloadKind
from auditor.report.causes import CAUSE_COLUMNS
from auditor.report.finance import COLUMNS
from auditor.settings import Config, Thresholds
from auditor.store import pod_writes, writes
from auditor.store.signals import write_card_signals, write_node_outages, write_pod_signals

T0 = 1_795_392_000_000  # Monday 2026-11-23 00:00 UTC
MIN = 60_000
HELD, FREE = "GPU-held-0000", "GPU-free-0000"
GAPS = ((30, 2), (55, 7), (90, 4))
"""(minute, length) of the pod's idle gaps: irregular, so that they are no checkpoints."""


def _store(engine: Engine) -> None:
    ts = np.arange(T0, T0 + 120 * MIN, 15_000)
    minute = (ts - T0) / MIN
    idle = np.zeros(ts.size, dtype=bool)
    for at, length in GAPS:
        idle |= (minute >= at) & (minute < at + length)
    with engine.begin() as conn:
        ids = writes.upsert_gpus(
            conn,
            [
                GpuRecord(HELD, "node-a", 0, "NVIDIA H100"),
                GpuRecord(FREE, "node-b", 0, "NVIDIA H100"),
            ],
        )
        samples = [
            GpuSample(HELD, int(t), 0.0 if i else 100.0) for t, i in zip(ts, idle, strict=True)
        ]
        samples += [GpuSample(FREE, int(t), 0.0) for t in ts]
        writes.insert_samples(conn, samples, ids)
        pod_writes.upsert_pods(
            conn,
            [
                PodRecord(
                    uid="pod-1", namespace="ml", name="train-0", node="node-a", team="vision",
                    job="Job/train", job_kind="Job", workload=WorkloadKind.TRAINING,
                    gang="pod-1", gpu_count=1, bound_ms=T0, finished_ms=T0 + 120 * MIN,
                ),
                PodRecord(  # waits for an H100 (as its node selector spells it) from 1:30
                    uid="pod-2", namespace="ml", name="train-big-0", node=None, team="vision",
                    job="Job/train-big", job_kind="Job", workload=WorkloadKind.TRAINING,
                    gang="pod-2", gpu_count=1, created_ms=T0 + 90 * MIN,
                    wait_reason="Unschedulable", wanted_model="NVIDIA-H100",
                    wait_message="0/2 nodes are available: 1 Insufficient nvidia.com/gpu.",
                    wait_seen_ms=T0 + 200 * MIN,
                ),
            ],
        )  # fmt: skip
        writes.upsert_assignments(conn, [("pod-1", ids[HELD], T0)], source="test")
        (a0, a1), (b0, b1) = ((m, m + n) for m, n in GAPS[:2])
        write_pod_signals(
            conn,
            [
                {"pod_uid": "pod-1", "source": "cgroup", "ts_ms": T0 + m * MIN + 3_000,
                 "throttled_ratio": 0.6 if a0 <= m < a1 else 0.0, "cpu_limit_ratio": 0.4}
                for m in range(0, 80)  # the sampler stopped reading cgroups at minute 80
            ],
        )  # fmt: skip
        write_card_signals(
            conn,
            [
                {"gpu_id": ids[HELD], "ts_ms": T0 + m * MIN + 1_000,
                 "pcie_bytes_s": 5e9 if b0 <= m < b1 else 1e8, "pcie_link_bytes_s": 8e9}
                for m in range(0, 80)
            ],
        )  # fmt: skip
        cordon = {
            "node": "node-b",
            "reason": "cordoned",
            "start_ms": T0 - MIN,
            "end_ms": T0 + 60 * MIN,
        }
        write_node_outages(conn, [cordon])


@pytest.fixture
def audited(db_url: str, engine: Engine) -> str:
    _store(engine)
    jobs.audit(db_url, window=(T0, T0 + 7 * 24 * 60 * MIN), thresholds=Thresholds())  # the week
    return db_url


def test_each_idle_gap_gets_the_cause_its_signal_tells_and_the_causes_sum_to_the_category(
    audited: str,
) -> None:
    from auditor.report.render import render_json
    from auditor.report.summary import GroupBy

    report = jobs.build_report(audited, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    rows = {r["team"]: r for r in json.loads(render_json(report))}
    vision, platform = rows["vision"], rows["(platform)"]

    gap_h = [n / 60 for _, n in GAPS]
    assert vision["compute_idle_input_bound_gpu_hours"] == pytest.approx(gap_h[0], abs=1e-3)
    assert vision["compute_idle_host_transfer_gpu_hours"] == pytest.approx(gap_h[1], abs=1e-3)
    assert vision["compute_idle_unexplained_gpu_hours"] == pytest.approx(gap_h[2], abs=1e-3)
    assert vision["compute_idle_no_signal_share"] == pytest.approx(4 / 13, abs=1e-3)
    for rec in (vision, platform):
        for cat in ("compute_idle", "unallocated"):
            parts = sum(
                rec[c]
                for c in CAUSE_COLUMNS
                if c.startswith(f"{cat}_") and c.endswith("_gpu_hours")
            )
            assert parts == pytest.approx(rec[f"{cat}_gpu_hours"], abs=1e-4)
    assert platform["unallocated_unavailable_gpu_hours"] == pytest.approx(1.0, abs=1e-3)
    assert platform["unallocated_blocked_gpu_hours"] == pytest.approx(0.5, abs=1e-3)
    assert platform["unallocated_no_demand_gpu_hours"] == pytest.approx(0.5, abs=1e-3)
    assert platform["unallocated_no_signal_share"] == 0.0  # pods were recorded

    # the table names each cause with its first step, and states the unexplained share
    from auditor.report.render import render_table

    text = render_table(report)
    assert "input_bound" in text
    assert "DataLoader workers" in text
    assert "repair, drain or uncordon" in text
    assert "31% of compute_idle rests on no recorded signal" in text
    offenders = report.offenders.set_index("category")
    assert offenders.loc["compute_idle", "next_step"].startswith("host_transfer (54%)")


def test_the_finance_csv_adds_the_causes_then_the_cluster_as_its_last_columns(
    audited: str,
) -> None:
    text = jobs.export_finance(audited, week="2026-W48", config=Config())
    table = list(csv.DictReader(io.StringIO(text)))

    assert list(table[0]) == COLUMNS
    assert COLUMNS[-len(CAUSE_COLUMNS) - 1 : -1] == CAUSE_COLUMNS
    assert COLUMNS[-1] == "cluster"
    assert {r["cluster"] for r in table} == {"default"}
    by_team = {r["team"]: r for r in table}
    assert float(by_team["vision"]["compute_idle_input_bound_gpu_hours"]) == pytest.approx(
        2 / 60, abs=1e-4
    )
    assert float(by_team["(platform)"]["unallocated_unavailable_gpu_hours"]) == pytest.approx(
        1.0, abs=1e-4
    )
    assert by_team["vision"]["unallocated_no_signal_share"] == ""  # the team held no free card


def test_the_metrics_serve_the_causes_per_team(audited: str) -> None:
    from auditor.jobs.common import open_store
    from auditor.jobs.metrics import latest_audit_figures
    from auditor.model import DEFAULT_CLUSTER
    from auditor.report.audit_metrics import audit_families

    engine = open_store(audited)
    try:
        figures = latest_audit_figures(engine, cluster=DEFAULT_CLUSTER)
    finally:
        engine.dispose()
    families = {f.name: f for f in audit_families(figures)}
    hours = {
        tuple(s.labels[k] for k in ("team", "category", "cause")): s.value
        for s in families["auditor_audit_cause_gpu_hours"].samples
    }
    assert hours[("vision", "compute_idle", "host_transfer")] == pytest.approx(7 / 60, abs=1e-3)
    assert hours[("(platform)", "unallocated", "unavailable")] == pytest.approx(1.0, abs=1e-3)
    blind = {s.labels["team"]: s.value for s in families["auditor_audit_no_signal_ratio"].samples}
    assert blind["vision"] == pytest.approx(4 / 13, abs=1e-3)


def test_explain_names_each_idle_cause_with_its_signal_and_when(audited: str) -> None:
    from auditor.report.explain import render_explain_text

    ex = jobs.explain(audited, "ml/Job/train", thresholds=Thresholds())
    text = render_explain_text(ex)

    why = text.split("Why the cards idled")[1].split("Next steps:")[0]
    lines = [line.split() for line in why.strip().splitlines()[1:]]
    assert [(w[0], w[1]) for w in lines] == [
        ("host_transfer", "pcie"),
        ("unexplained", "no"),
        ("input_bound", "cpu_throttled"),
    ]
    assert "2026-11-23 00:55:00" in why  # the PCIe gap's first piece starts at its minute
    assert "compute_idle: mostly host_transfer: larger, pinned" in text


def test_the_html_report_shows_the_causes_with_their_first_steps(audited: str) -> None:
    from auditor.report.summary import GroupBy

    page = jobs.build_report_html(
        audited, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None, thresholds=Thresholds()
    )

    why = page.split("Why held cards idled and free cards sat free")[1].split("</table>")[0]
    assert "<td>host_transfer</td>" in why
    assert "repair, drain or uncordon the node" in why


def test_report_by_job_carries_each_jobs_queue_wait_and_the_schedulers_word(
    audited: str,
) -> None:
    from auditor.report.render import render_json, render_table
    from auditor.report.summary import GroupBy

    report = jobs.build_report(audited, start_ms=None, end_ms=None, by=GroupBy.JOB, team=None)
    rows = {r["job"]: r for r in json.loads(render_json(report))}

    waited = rows["Job/train-big"]  # never held a card: its row is its wait
    assert waited["allocated_gpu_hours"] == 0.0
    # it waited from 1:30 to where it was last seen waiting, clipped to the audited window
    assert waited["queue_wait_gpu_hours"] == pytest.approx((200 - 90) / 60, abs=1e-3)
    assert waited["queue_wait_message"].startswith("0/2 nodes are available")
    assert rows["Job/train"]["queue_wait_gpu_hours"] == 0.0
    assert rows["Job/train"]["queue_wait_message"] is None
    text = render_table(report)
    assert "Jobs that waited to be scheduled" in text
    assert "Insufficient nvidia.com/gpu" in text


def test_a_teams_report_splits_its_own_time_alone(audited: str) -> None:
    """`report --team vision`: its row, its totals and its offenders carry the team's causes
    as the whole report has them, and none of the platform's free card."""
    from auditor.report.render import render_json
    from auditor.report.summary import GroupBy

    whole = jobs.build_report(audited, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    mine = jobs.build_report(audited, start_ms=None, end_ms=None, by=GroupBy.TEAM, team="vision")
    vision = {r["team"]: r for r in json.loads(render_json(whole))}["vision"]
    (row,) = json.loads(render_json(mine))
    assert {c: row[c] for c in CAUSE_COLUMNS} == {c: vision[c] for c in CAUSE_COLUMNS}
    for c in CAUSE_COLUMNS:
        if c.endswith("_gpu_hours"):
            assert mine.causes[c] == pytest.approx(row[c], abs=1e-6)  # JSON keeps 6 places
    assert mine.causes["unallocated_no_demand_gpu_hours"] == 0.0
    assert whole.causes["unallocated_no_demand_gpu_hours"] == pytest.approx(0.5, abs=1e-3)
    offenders = mine.offenders.set_index("category")
    assert offenders.loc["compute_idle", "next_step"].startswith("host_transfer (54%)")
    assert "unallocated" not in offenders.index
