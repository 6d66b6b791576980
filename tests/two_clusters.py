"""Two clusters for the several-clusters tests: the small scenario twice, another seed for
the second, so their audits differ while their node and pod names collide."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from auditor import jobs
from auditor.settings import Config
from auditor.simulate import SCENARIOS, SimulationResult, simulate

CLUSTERS = ("east", "west")


def simulate_clusters(tmp: Path) -> dict[str, SimulationResult]:
    small = SCENARIOS["small"]
    return {
        "east": simulate(tmp / "east", scenario=small),
        "west": simulate(tmp / "west", scenario=replace(small, seed=small.seed + 1)),
    }


def load(url: str, sim: SimulationResult, cluster: str) -> None:
    """One cluster's nvidia-smi logs and pods into the store at `url`, as `cluster`'s."""
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node, cluster=cluster)
    jobs.import_pods(url, sim.pods_json, config=Config(), cluster=cluster)
