"""The whole pipeline on simulated clusters: files → import → audit → report, against the
simulator's ground truth (per team and category within 1% of the team's held GPU-hours)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from auditor import jobs
from auditor.model import CATEGORIES, PLATFORM_TEAM
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate


def run_pipeline(tmp_path: Path, name: str, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    scenario = SCENARIOS[name].with_seed(seed)
    sim = simulate(tmp_path / "cluster", scenario=scenario)
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, sim.pods_json, config=Config())
    jobs.audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    report = jobs.build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    audited = report.rows.set_index("team")[[f"{c.value}_gpu_hours" for c in CATEGORIES]]
    audited.columns = pd.Index([c.value for c in CATEGORIES])
    truth = (
        sim.truth.pivot_table(
            index="team", columns="category", values="gpu_seconds", aggfunc="sum", fill_value=0.0
        ).reindex(columns=[c.value for c in CATEGORIES], fill_value=0.0)
        / 3600.0
    )
    return audited.sort_index(), truth.sort_index()


@pytest.mark.parametrize(
    ("name", "seed"),
    [
        pytest.param("small", 7, id="small-seed7"),
        pytest.param("small", 1234, id="small-seed1234"),
        pytest.param("demo", 48, id="demo"),
        pytest.param("large", 2026, id="large-64gpus-24h", marks=pytest.mark.slow),
    ],
)
def test_audit_matches_ground_truth(tmp_path: Path, name: str, seed: int) -> None:
    audited, truth = run_pipeline(tmp_path, name, seed)
    assert set(audited.index) == set(truth.index)
    # conservation: every capacity second once, in the audit as in the truth
    assert audited.to_numpy().sum() == pytest.approx(truth.to_numpy().sum(), rel=1e-9)
    for team in truth.index:
        held = truth.loc[team].sum()
        for cat in truth.columns:
            diff = abs(audited.loc[team, cat] - truth.loc[team, cat])
            assert diff <= 0.01 * held, (
                f"{team}/{cat}: audit {audited.loc[team, cat]:.3f} h, "
                f"truth {truth.loc[team, cat]:.3f} h, held {held:.1f} h"
            )
    if name == "demo":
        # the demo shows every category somewhere
        assert (audited.sum() > 0).all()
        assert PLATFORM_TEAM in audited.index
