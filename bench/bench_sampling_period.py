"""How far the audit of the simulated demo cluster is from its truth at each sampling period.

Simulates the demo cluster sampled every P seconds (default 5, 15, 30 and 60: what
nvidia-smi loops and dcgm-exporter scrapes commonly use), imports its nvidia-smi logs and
pods, audits the window and prints, per period, the worst team x category difference as a
share of that team's held GPU-hours (tests/simulate/test_sixty_seconds.py holds 60 s to
1.5 %).

    .venv/bin/python bench/bench_sampling_period.py [--periods 5 15 30 60] [--seed N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

from auditor import jobs
from auditor.model import CATEGORIES
from auditor.report.summary import GroupBy
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate

NAMES = [c.value for c in CATEGORIES]


def off_by_team(period_s: float, seed: int | None, root: Path) -> pd.DataFrame:
    """Per team and category, |audit − truth| in % of the team's held GPU-hours."""
    scenario = replace(SCENARIOS["demo"], period_s=period_s)
    scenario = scenario if seed is None else scenario.with_seed(seed)
    sim = simulate(root / "cluster", scenario=scenario)
    url = f"sqlite:///{root / 'a.db'}"
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, sim.pods_json, config=Config())
    jobs.audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    rows = jobs.build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None).rows
    audited = rows.set_index("team")[[f"{c}_gpu_hours" for c in NAMES]]
    audited.columns = pd.Index(NAMES)
    truth = (
        sim.truth.pivot_table(
            index="team", columns="category", values="gpu_seconds", aggfunc="sum", fill_value=0.0
        ).reindex(columns=NAMES, fill_value=0.0)
        / 3600.0
    )
    audited = audited.reindex(truth.index)
    return (audited - truth).div(truth.sum(axis=1), axis=0).abs() * 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--periods", type=float, nargs="+", default=[5.0, 15.0, 30.0, 60.0])
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    for period in args.periods:
        with tempfile.TemporaryDirectory() as tmp:
            off = off_by_team(period, args.seed, Path(tmp))
        cells = off.stack()
        team, category = cells.idxmax()
        print(f"{period:>5.0f} s: worst {team} {category} {cells.max():.3f} % of held hours")
    return 0


if __name__ == "__main__":
    sys.exit(main())
