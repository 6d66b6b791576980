"""The knobs of a simulated cluster (`Scenario`) and the named presets (`SCENARIOS`).

A scenario says how big the cluster is, which window it covers and how much of each kind of
workload it runs; the seed decides everything else. The same scenario always produces the same
files, byte for byte.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

TEAMS: tuple[str, ...] = ("vision", "nlp", "recsys", "research")
"""The teams that own the simulated workloads (the `team` pod label)."""


def _utc_ms(year: int, month: int, day: int, hour: int = 0) -> int:
    return int(datetime(year, month, day, hour, tzinfo=UTC).timestamp()) * 1000


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulated cluster over one audit window.

    The window is `[start_ms, start_ms + hours)`. The node samplers already ran for
    `lead_in_minutes` before it, so tenures that began before the window are classified
    over their whole length, as SPEC §3 ("Whole tenures") asks.
    """

    name: str
    seed: int
    nodes: int
    gpus_per_node: int
    hours: float
    start_ms: int
    period_s: float = 5.0
    """Sampling period of `nvidia-smi -l`."""
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    memory_total_mib: int = 81559
    lead_in_minutes: float = 30.0
    """How long the samplers ran before the window starts."""
    inference_gpus: int = 2
    """GPUs serving inference Deployments (diurnal traffic) for the whole window."""
    distributed_jobs: int = 2
    """PyTorchJobs over two or more nodes. The first has a thermally throttled slow rank,
    the second a lagging rank that also stalls now and then; the rest run clean."""
    notebooks: int = 1
    """Jupyter notebooks (Kubeflow Notebook StatefulSets) with long idle stretches."""
    special_pods: bool = True
    """A pod that never touches its GPU, one with a startup longer than the cap, one whose
    sidecar holds the card long after the work ended."""
    rollout: bool = True
    """Roll the first inference Deployment to a new ReplicaSet half-way through."""
    load: float = 0.8
    """Share of the cluster's GPU-hours the batch training Jobs aim to fill."""
    outages: int = 1
    """Sampler outages: a node's nvidia-smi is down and its rows are missing."""
    outage_minutes: float = 20.0
    jitter_ms: int = 40
    """Per-tick jitter of the sample timestamps."""
    node_prefix: str = "gpu-h100"

    def __post_init__(self) -> None:
        period_ms = self.period_s * 1000
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("a scenario needs at least one node with one GPU")
        if period_ms != int(period_ms) or period_ms < 1000:
            raise ValueError("period_s must be a whole number of milliseconds, at least 1 s")
        for what, value in (("hours", self.hours), ("lead_in_minutes", self.lead_in_minutes)):
            span_ms = value * (3600_000 if what == "hours" else 60_000)
            if span_ms != int(span_ms) or int(span_ms) % int(period_ms):
                raise ValueError(f"{what} must be a whole number of sampling periods")
        if self.hours <= 0:
            raise ValueError("hours must be positive")
        if self.start_ms % 1000:
            raise ValueError("start_ms must be on a whole second")
        if not 0 <= self.jitter_ms < 200:
            raise ValueError("jitter_ms must be within 0-199")
        if self.distributed_jobs and self.nodes < 2:
            raise ValueError("distributed jobs need at least two nodes")

    @property
    def period_ms(self) -> int:
        return int(self.period_s * 1000)

    @property
    def end_ms(self) -> int:
        return self.start_ms + int(self.hours * 3600_000)

    @property
    def data_start_ms(self) -> int:
        return self.start_ms - int(self.lead_in_minutes * 60_000)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def with_seed(self, seed: int) -> Scenario:
        return replace(self, seed=seed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


SCENARIOS: dict[str, Scenario] = {
    "small": Scenario(
        name="small",
        seed=7,
        nodes=3,
        gpus_per_node=4,
        hours=4,
        start_ms=_utc_ms(2026, 11, 23, 8),
        inference_gpus=2,
        distributed_jobs=2,
        notebooks=2,
        load=0.8,
    ),
    "demo": Scenario(
        name="demo",
        seed=48,
        nodes=4,
        gpus_per_node=8,
        hours=12,
        start_ms=_utc_ms(2026, 11, 23, 8),
        lead_in_minutes=60,
        inference_gpus=6,
        distributed_jobs=3,
        notebooks=3,
        load=0.75,
    ),
    "large": Scenario(
        name="large",
        seed=2026,
        nodes=8,
        gpus_per_node=8,
        hours=24,
        start_ms=_utc_ms(2026, 11, 24, 0),
        lead_in_minutes=60,
        inference_gpus=12,
        distributed_jobs=4,
        notebooks=6,
        load=0.8,
        outages=2,
    ),
}
"""Presets: `small` runs in well under a second (tests), `demo` is what `auditor demo`
shows (every category present), `large` is 64 GPUs over a day (about 1.1 M samples)."""
