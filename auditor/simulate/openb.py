"""A day of Alibaba's OpenB GPU-sharing trace replayed as a `SharedCluster`.

The trace (`openb_pod_list_*.csv`, `openb_node_list_gpu_node.csv`; Weng et al., "Beware of
Fragmentation", USENIX ATC'23) lists pods with `num_gpu`, `gpu_milli` (thousandths of one card
for a sharing pod), `gpu_spec` (allowed models) and creation, scheduled and deletion times in
seconds from an anonymised origin; nodes with their card count and model. It has no node per
pod and no utilisation; this module adds both:

- **Placement.** Every pod of the trace is replayed in order of its scheduled time (releases
  first at equal times, then by name) onto the nodes whose model its `gpu_spec` allows: a
  sharing pod goes to the node with the least free capacity on which one card still has its
  milli free, a whole-card pod to the node with the fewest free cards that has enough. On
  the node, cards are taken as SPEC §7 infers them (the lowest-index card with enough share
  left; the lowest-index free cards), so the auditor's inference finds the same cards.
- **Utilisation model** (per pod, in percent of its own share; fixed by the seed):
  an idle start of 1-5 min after binding (pull, load), then activity until 0.5-3 min before
  its release; 5 % of pods never touch their card. Whole-card pods run like training:
  a level of 55-95 % with ±4 points of noise per sample. Sharing pods serve like inference:
  a daily curve between a floor of 8-25 % and a peak of 50-90 %, peaking at a random hour.
  A sharing pod never exceeds its share (the card percent is rounded up, capped at the
  share), so a card's utilisation is the sum of its tenants'.
- **Sampling.** One nvidia-smi sample per card every 60 s, on the nodes that host a pod
  during the day (or a subset of them).

The replayed window is the 24 h of the trace in which the most pods were scheduled
(`busiest_day`); times are shifted so that it starts at `start_ms`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from auditor.simulate.plan import Ending, Namer, Owner, PodPlan
from auditor.simulate.sharedcluster import (
    MILLI,
    PhysicalCard,
    SharedCluster,
    Tenancy,
    set_times,
)
from auditor.simulate.sharedpreset import within_share
from auditor.simulate.utilisation import Grid
from auditor.simulate.writers import node_object

DAY_S = 86_400
FRACTIONAL_TEAM = "fractional"
WHOLE_TEAM = "whole"
NAMESPACE = "openb"
IDLE_POD_SHARE = 0.05

MODELS = {
    # trace model -> (nvidia-smi name, memory.total MiB); G1-G3 are undisclosed in the trace
    "P100": ("Tesla P100-PCIE-16GB", 16280),
    "T4": ("Tesla T4", 15360),
    "V100M16": ("Tesla V100-SXM2-16GB", 16160),
    "V100M32": ("Tesla V100-SXM2-32GB", 32510),
    "A10": ("NVIDIA A10", 23028),
    "G1": ("Alibaba G1", 24576),
    "G2": ("Alibaba G2", 24576),
    "G3": ("Alibaba G3", 24576),
}


@dataclass(frozen=True)
class OpenbTrace:
    pods: pd.DataFrame
    """name, num_gpu, gpu_milli, gpu_spec, scheduled_time, deletion_time (GPU pods that were
    scheduled)."""
    nodes: pd.DataFrame
    """sn, gpu, model (GPU nodes)."""


def load_openb(root: Path, *, pod_list: str = "openb_pod_list_default.csv") -> OpenbTrace:
    pods = pd.read_csv(root / pod_list)
    nodes = pd.read_csv(root / "openb_node_list_gpu_node.csv")
    pods = pods[(pods["num_gpu"] > 0) & pods["scheduled_time"].notna()].copy()
    pods["scheduled_time"] = pods["scheduled_time"].astype("int64")
    pods["deletion_time"] = pods["deletion_time"].astype("int64")
    pods["gpu_spec"] = ["" if pd.isna(v) else str(v) for v in pods["gpu_spec"]]
    pods = pods[pods["deletion_time"] > pods["scheduled_time"]]
    nodes = nodes[nodes["gpu"] > 0].reset_index(drop=True)
    return OpenbTrace(pods.reset_index(drop=True), nodes)


def busiest_day(trace: OpenbTrace) -> int:
    """Start (trace seconds) of the 24 h in which the most pods were scheduled."""
    s = np.sort(trace.pods["scheduled_time"].to_numpy())
    count = np.searchsorted(s, s + DAY_S) - np.arange(s.size)
    return int(s[int(np.argmax(count))])


def is_fractional(pods: pd.DataFrame) -> pd.Series:
    return (pods["num_gpu"] == 1) & (pods["gpu_milli"] < MILLI)


def place(trace: OpenbTrace, *, until_s: int) -> pd.DataFrame:
    """Node and card indices of every pod scheduled before `until_s` (see the module doc);
    pods that fit nowhere get node -1."""
    pods = trace.pods[trace.pods["scheduled_time"] < until_s].sort_values(
        ["scheduled_time", "name"], kind="stable"
    )
    n_nodes = len(trace.nodes)
    width = int(trace.nodes["gpu"].max())
    free = np.full((n_nodes, width), -1, dtype=np.int64)
    for i, count in enumerate(trace.nodes["gpu"].tolist()):
        free[i, :count] = MILLI
    model = trace.nodes["model"].to_numpy()
    releases: list[tuple[int, int, list[int], int]] = []  # (time, node, cards, milli)
    node_of = np.full(len(pods), -1, dtype=np.int64)
    cards_of: list[tuple[int, ...]] = [()] * len(pods)
    frac = is_fractional(pods).to_numpy()
    heap: list[tuple[int, int]] = []
    for j, (sched, delete, num, milli, spec) in enumerate(
        zip(
            pods["scheduled_time"].tolist(),
            pods["deletion_time"].tolist(),
            pods["num_gpu"].tolist(),
            pods["gpu_milli"].tolist(),
            pods["gpu_spec"].tolist(),
            strict=True,
        )
    ):
        while heap and heap[0][0] <= sched:
            _, r = heapq.heappop(heap)
            _, node, cards, m = releases[r]
            free[node, cards] += m
        allowed = np.isin(model, spec.split("|")) if spec else np.ones(n_nodes, dtype=bool)
        if frac[j]:
            fits = allowed & (free >= milli).any(axis=1)
            need = int(milli)
        else:
            fits = allowed & ((free == MILLI).sum(axis=1) >= num)
            need = MILLI
        if not fits.any():
            continue
        left = np.where(free > 0, free, 0).sum(axis=1)
        node = int(np.flatnonzero(fits)[np.argmin(left[fits])])
        if frac[j]:
            cards = [int(np.flatnonzero(free[node] >= milli)[0])]
        else:
            cards = np.flatnonzero(free[node] == MILLI)[: int(num)].tolist()
        free[node, cards] -= need
        node_of[j] = node
        cards_of[j] = tuple(cards)
        releases.append((int(delete), node, cards, need))
        heapq.heappush(heap, (int(delete), len(releases) - 1))
    out = pods.copy()
    out["node"] = node_of
    out["cards"] = cards_of
    return out


@dataclass(frozen=True)
class Replay:
    cluster: SharedCluster
    placed: pd.DataFrame
    """Every placed pod on the sampled nodes: the trace's columns, node, cards, share, uid."""
    day_start_s: int
    dropped: int
    """Pods of the day that fit on no node."""


def _share_util(
    rng: np.random.Generator, grid: Grid, *, fractional: bool, ka: int, ke: int
) -> np.ndarray:
    m = ke - ka
    if fractional:
        floor, peak = rng.uniform(8, 25), rng.uniform(50, 90)
        hours = grid.utc_hours(ka, ke)
        phase = (1 + np.cos(2 * np.pi * (hours - rng.uniform(0, 24)) / 24)) / 2
        level = floor + (peak - floor) * phase**1.6
    else:
        level = np.full(m, rng.uniform(55, 95))
    out: np.ndarray = np.clip(np.rint(level + rng.normal(0, 4.0, m)), 6, 100)
    return out


def replay_day(
    trace: OpenbTrace,
    *,
    start_ms: int,
    hours: float = 24.0,
    day_start_s: int | None = None,
    max_nodes: int | None = None,
    period_s: int = 60,
    lead_in_minutes: int = 30,
    seed: int = 2023,
) -> Replay:
    """The busiest day (or `hours` of it) of the trace as a cluster (see the module doc).

    `max_nodes`: sample only this many of the nodes hosting pods that day, evenly spaced in
    the node list (all their pods come with them)."""
    first = busiest_day(trace) if day_start_s is None else day_start_s
    span_s = int(hours * 3600)
    lead_s = lead_in_minutes * 60
    placed = place(trace, until_s=first + span_s)
    dropped = int(((placed["node"] < 0) & (placed["deletion_time"] > first)).sum())
    placed = placed[placed["node"] >= 0]
    live = placed[(placed["deletion_time"] > first - lead_s)]
    hosts = np.unique(live["node"].to_numpy())
    if max_nodes is not None and hosts.size > max_nodes:
        hosts = hosts[np.linspace(0, hosts.size - 1, max_nodes).round().astype(int)]
    # all pods ever placed on a sampled node before the day ends: the auditor's first-fit
    # inference replays them to find the cards of the ones that are still there
    placed = placed[placed["node"].isin(hosts)].reset_index(drop=True)

    rng_ids, rng_util = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    namer = Namer(rng_ids)
    offset_ms = start_ms - first * 1000
    data_start = start_ms - lead_s * 1000
    end_ms = start_ms + span_s * 1000
    grid = Grid(data_start, period_s * 1000, (end_ms - data_start) // (period_s * 1000))

    cards: list[PhysicalCard] = []
    card_at: dict[tuple[int, int], int] = {}
    nodes = []
    for node in hosts.tolist():
        row: dict[str, Any] = trace.nodes.iloc[node].to_dict()
        name, memory = MODELS.get(str(row["model"]), (str(row["model"]), 16384))
        for i in range(int(row["gpu"])):
            card_at[node, i] = len(cards)
            cards.append(PhysicalCard(str(row["sn"]), i, namer.gpu_uuid(), name, memory))
        count = int(row["gpu"])
        nodes.append(
            node_object(
                str(row["sn"]),
                labels={
                    "alibabacloud.com/gpu-card-model": str(row["model"]),
                    "nvidia.com/gpu.product": name.replace(" ", "-"),
                    "nvidia.com/gpu.count": str(count),
                },
                resources={
                    "alibabacloud.com/gpu-count": str(count),
                    "alibabacloud.com/gpu-milli": str(count * MILLI),
                    "nvidia.com/gpu": str(count),
                },
                created_ms=data_start - 90 * DAY_S * 1000,
                uid=namer.uid(),
            )
        )

    frac = is_fractional(placed).to_numpy()
    tenancies = []
    bystanders: list[tuple[PodPlan, str]] = []
    uids = []
    shares = []
    for j, rec in enumerate(placed.to_dict("records")):
        fractional = bool(frac[j])
        team = FRACTIONAL_TEAM if fractional else WHOLE_TEAM
        pod = PodPlan(
            name=str(rec["name"]),
            namespace=NAMESPACE,
            team=team,
            gpus=1 if fractional else int(rec["num_gpu"]),
            owner=Owner("apps/v1", "ReplicaSet", f"{rec['name']}-rs", namer.uid()),
            labels={"team": team, "qos": str(rec["qos"])},
            image="registry.openb.example/workload:1",
            queued_s=0,
        )
        if fractional:
            pod.gpu_limits = {"alibabacloud.com/gpu-milli": str(int(rec["gpu_milli"]))}
        pod.uid = namer.uid()
        bound = offset_ms + int(rec["scheduled_time"]) * 1000
        release = offset_ms + int(rec["deletion_time"]) * 1000
        set_times(
            pod,
            bound_ms=bound,
            pull_s=int(rng_util.integers(30, 120)),
            release_ms=release if release <= end_ms else None,
            ending=Ending.COMPLETE,
        )
        pod.created_ms = offset_ms + int(rec["creation_time"]) * 1000
        share = float(rec["gpu_milli"]) / MILLI if fractional else 1.0
        uids.append(pod.uid)
        shares.append(share)
        k0, k1 = grid.tick(pod.bound_ms), grid.tick(pod.released_ms)
        idle_start = int(rng_util.integers(60, 300))
        idle_end = int(rng_util.integers(30, 180))
        never = rng_util.random() < IDLE_POD_SHARE
        if pod.released_ms is not None and pod.released_ms <= data_start:
            bystanders.append((pod, str(trace.nodes.iloc[int(rec["node"])]["sn"])))
            continue  # over before the samplers started
        ka = grid.tick(pod.bound_ms + idle_start * 1000)
        # the last active sample's coverage ends before the release, so a card's utilisation
        # is always the sum of its holders' activities (a sample covers until the next)
        ke = (
            k1
            if pod.released_ms is None
            else min(grid.tick(pod.released_ms - idle_end * 1000), k1 - 2)
        )
        act = np.zeros(max(0, k1 - k0))
        if not never and ke > ka:
            g = _share_util(rng_util, grid, fractional=fractional, ka=ka, ke=ke)
            act[ka - k0 : ke - k0] = within_share(g, share)
        for c in rec["cards"]:
            tenancies.append(
                Tenancy(
                    pod=pod,
                    card=card_at[int(rec["node"]), int(c)],
                    share=share,
                    kind="milli" if fractional else "whole",
                    k0=k0,
                    act=act,
                    mem_mib=math.floor(
                        cards[card_at[int(rec["node"]), int(c)]].memory_mib * share * 0.8
                    ),
                )
            )
    placed = placed.assign(uid=uids, share=shares)
    cluster = SharedCluster(
        name="openb-day",
        seed=seed,
        data_start_ms=data_start,
        start_ms=start_ms,
        end_ms=end_ms,
        period_ms=period_s * 1000,
        cards=cards,
        tenancies=tenancies,
        nodes=nodes,
        teams=(FRACTIONAL_TEAM, WHOLE_TEAM),
        bystanders=bystanders,
    )
    return Replay(cluster, placed, first, dropped)


def trace_shares(replay: Replay) -> tuple[float, float]:
    """(fractional pods' GPU-seconds, all pods' GPU-seconds) held within the window, straight
    from the trace: Σ gpu_milli/1000 (or num_gpu) × overlap, over the sampled nodes' pods."""
    p = replay.placed
    a = replay.day_start_s
    b = a + (replay.cluster.end_ms - replay.cluster.start_ms) // 1000
    overlap = (np.minimum(p["deletion_time"], b) - np.maximum(p["scheduled_time"], a)).clip(0)
    frac = is_fractional(p)
    held = np.where(frac, p["gpu_milli"] / MILLI, p["num_gpu"]) * overlap
    return float(held[frac.to_numpy()].sum()), float(held.sum())
