"""A made-up fleet for the scale benchmarks: N GPUs × D days sampled every 5 s, vectorised.

Nodes of 8 GPUs, taken in pairs. Along each pair's time line, jobs come and go: single
pods of 1, 2, 4 or 8 cards on each node, or one 16-card job of two 8-card pods spanning
both nodes (a gang across nodes, so chunks and shards need context). Between jobs a pair
may stand free for up to an hour. A job idles through a startup of 1-10 min, then runs at
its own level with noise and a gang-wide checkpoint pause every 30 min, then idles through
a teardown of 0.5-5 min; one job in twelve never touches its cards. Samples jitter by up to
±200 ms; one in 500 is unreadable. All exact assignments (as the sampler records them).

Samples are made a time slice at a time (`sample_batches`), so memory follows the slice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.model import GpuRecord, PodRecord, WorkloadKind

DAY_MS = 86_400_000
BASE_MS = 1_790_000_000_000 - 1_790_000_000_000 % DAY_MS  # a midnight in 2026
TEAMS = ("vision", "speech", "search", "ads", "research", "platform-ml")


@dataclass(frozen=True)
class Fleet:
    gpus: list[GpuRecord]
    pods: list[PodRecord]
    assignments: list[tuple[str, str]]
    """(pod uid, GPU UUID)."""
    start_ms: int
    end_ms: int
    period_ms: int
    # per tenure, sorted by (card, start): what `sample_batches` needs
    t_card: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    t_level: np.ndarray
    t_startup: np.ndarray
    t_teardown: np.ndarray
    seed: int

    @property
    def ticks(self) -> int:
        return (self.end_ms - self.start_ms) // self.period_ms


def make_fleet(*, gpus: int, days: float, period_s: float = 5.0, seed: int = 1) -> Fleet:
    rng = np.random.default_rng(seed)
    n_nodes = max(1, -(-gpus // 8))
    span = int(days * DAY_MS)
    records = [
        GpuRecord(
            uuid=f"GPU-{n:04d}-{i}",
            node=f"node-{n:04d}",
            index=i,
            model="NVIDIA H100 80GB HBM3",
            memory_total_mib=81559.0,
        )
        for n in range(n_nodes)
        for i in range(8)
        if n * 8 + i < gpus
    ]
    cards_of = {n: [r.uuid for r in records if r.node == f"node-{n:04d}"] for n in range(n_nodes)}
    card_no = {r.uuid: k for k, r in enumerate(records)}
    pods: list[PodRecord] = []
    assignments: list[tuple[str, str]] = []
    tenures: list[tuple[int, int, int, float, int, int]] = []
    job_no = 0

    def add_job(nodes: list[int], size: int, start: int, end: int) -> None:
        nonlocal job_no
        job_no += 1
        team = TEAMS[job_no % len(TEAMS)]
        job = f"{team}/job-{job_no}"
        level = 0.0 if rng.random() < 1 / 12 else float(rng.uniform(25, 95))
        startup = int(rng.uniform(60, 600) * 1000)
        teardown = int(rng.uniform(30, 300) * 1000)
        for rank, node in enumerate(nodes):
            uid = f"uid-{job_no}-{rank}"
            cards = cards_of[node][:size]
            pods.append(
                PodRecord(
                    uid=uid,
                    namespace=team,
                    name=f"job-{job_no}-{rank}",
                    node=f"node-{node:04d}",
                    team=team,
                    job=job,
                    job_kind="Job",
                    workload=WorkloadKind.TRAINING,
                    gang=job,
                    gpu_count=len(cards),
                    rank=rank if len(nodes) > 1 else None,
                    created_ms=BASE_MS + start - 5_000,
                    bound_ms=BASE_MS + start,
                    started_ms=BASE_MS + start + 2_000,
                    finished_ms=BASE_MS + end if end < span else None,
                    phase="Succeeded" if end < span else "Running",
                )
            )
            for card in cards:
                assignments.append((uid, card))
                tenures.append((card_no[card], start, end, level, startup, teardown))

    for pair in range(0, n_nodes, 2):
        nodes = [n for n in (pair, pair + 1) if n < n_nodes]
        t = int(rng.uniform(0, 2) * 3_600_000)
        while t < span:
            length = int(rng.uniform(0.5, 10) * 3_600_000)
            end = min(t + length, span)
            if len(nodes) == 2 and rng.random() < 0.25:
                add_job(nodes, 8, t, end)
            else:
                for node in nodes:
                    add_job([node], int(rng.choice([1, 2, 4, 8])), t, end)
            t = end + int(rng.choice([0, 0, 1]) * rng.uniform(0, 3_600_000))
    arr = np.array(tenures, dtype=np.float64).reshape(-1, 6)
    order = np.lexsort((arr[:, 1], arr[:, 0]))
    arr = arr[order]
    return Fleet(
        gpus=records,
        pods=pods,
        assignments=assignments,
        start_ms=BASE_MS,
        end_ms=BASE_MS + span,
        period_ms=int(period_s * 1000),
        t_card=arr[:, 0].astype(np.int64),
        t_start=arr[:, 1].astype(np.int64) + BASE_MS,
        t_end=arr[:, 2].astype(np.int64) + BASE_MS,
        t_level=arr[:, 3],
        t_startup=arr[:, 4].astype(np.int64),
        t_teardown=arr[:, 5].astype(np.int64),
        seed=seed,
    )


def sample_batches(
    fleet: Fleet, gpu_ids: dict[str, int], *, rows_per_batch: int = 500_000
) -> Iterator[pd.DataFrame]:
    """Every GPU's samples, a time slice at a time, as frames `bulk.frame_rows` takes."""
    n_gpus = len(fleet.gpus)
    ids = np.array([gpu_ids[g.uuid] for g in fleet.gpus], dtype=np.int64)
    ticks_per = max(1, rows_per_batch // n_gpus)
    key = fleet.t_card * (1 << 42) + (fleet.t_start - BASE_MS)
    for first in range(0, fleet.ticks, ticks_per):
        rng = np.random.default_rng([fleet.seed, first])
        k = min(ticks_per, fleet.ticks - first)
        card = np.repeat(np.arange(n_gpus, dtype=np.int64), k)
        ts = (
            fleet.start_ms
            + np.tile(np.arange(first, first + k, dtype=np.int64), n_gpus) * fleet.period_ms
            + rng.integers(-200, 200, card.size)
        )
        at = np.searchsorted(key, card * (1 << 42) + (ts - BASE_MS), side="right") - 1
        at = np.maximum(at, 0)
        held = (fleet.t_card[at] == card) & (fleet.t_start[at] <= ts) & (ts < fleet.t_end[at])
        since = ts - fleet.t_start[at]
        until = fleet.t_end[at] - ts
        busy = (
            held
            & (since >= fleet.t_startup[at])
            & (until >= fleet.t_teardown[at])
            & ((since % 1_800_000) >= 90_000)  # the gang-wide checkpoint pause
        )
        util = np.where(busy, fleet.t_level[at] + rng.normal(0, 5, card.size), 0.0)
        util = np.clip(np.round(util), 0, 100)
        util[rng.random(card.size) < 0.002] = np.nan
        yield pd.DataFrame(
            {
                "gpu_id": ids[card],
                "ts_ms": ts,
                "util": util,
                "memory_used_mib": np.where(held, 60_000.0, 0.0),
                "memory_total_mib": 81559.0,
                "power_w": np.round(70 + np.nan_to_num(util) * 6.3, 1),
                "sm_clock_mhz": 1980.0,
                "temperature_c": np.round(35 + np.nan_to_num(util) * 0.4),
            }
        )
