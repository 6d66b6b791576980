"""The demo cluster sampled every 60 s, as many clusters scrape dcgm-exporter, audited
against the simulator's truth per team and category."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from auditor import jobs
from auditor.model import CATEGORIES
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate

NAMES = [c.value for c in CATEGORIES]


def test_the_demo_cluster_at_60_s_is_audited_to_its_truth(tmp_path: Path) -> None:
    sim = simulate(tmp_path / "cluster", scenario=replace(SCENARIOS["demo"], period_s=60.0))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, sim.pods_json, config=Config())
    jobs.audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    report = jobs.build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    audited = report.rows.set_index("team")[[f"{c}_gpu_hours" for c in NAMES]]
    audited.columns = pd.Index(NAMES)
    truth = (
        sim.truth.pivot_table(
            index="team", columns="category", values="gpu_seconds", aggfunc="sum", fill_value=0.0
        ).reindex(columns=NAMES, fill_value=0.0)
        / 3600.0
    )
    audited = audited.reindex(truth.index)
    off = (audited - truth).div(truth.sum(axis=1), axis=0).abs() * 100  # % of held time
    # every team and category, checkpoint and compute_idle included: an input stall is
    # one or two samples at 60 s and never joins a checkpoint series (measured: worst
    # 0.007 %, the platform's busy time; 1.98 % for research before)
    worst = off.stack().sort_values().tail(3)
    assert (off <= 1.5).all().all(), worst.to_dict()
