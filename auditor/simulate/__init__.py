"""`auditor simulate`: a realistic, seeded cluster written as real input files plus its truth.

`simulate(out_dir, scenario=SCENARIOS["demo"])` writes per-node nvidia-smi CSVs, a kubectl pod
list and the ground truth (GPU-seconds per team and category, by construction under SPEC §3).
"""

from auditor.simulate.cluster import Outage, SimulationResult, simulate
from auditor.simulate.scenario import SCENARIOS, TEAMS, Scenario

__all__ = ["SCENARIOS", "TEAMS", "Outage", "Scenario", "SimulationResult", "simulate"]
