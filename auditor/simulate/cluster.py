"""`simulate()`: plan a cluster, place it, generate its samples, write the files and the truth.

Output directory:

- `nodes/<node>.csv`: each node's `nvidia-smi --query-gpu=... --format=csv -l 5` output;
- `pods.json`: `kubectl get pods -A -o json` at the end of the window;
- `truth.csv`: GPU-seconds per team and category in the window (`(platform)` carries
  unallocated time and unobserved time of unheld cards);
- `truth_detail.csv`: the same per GPU and pod, to find where an audit disagrees;
- `scenario.json`: the window, the seed, the knobs, the GPUs and the sampler outages;
- SPEC §10's causes: `signals.om.txt` (cAdvisor, dcgm-exporter and vLLM series in
  OpenMetrics, `auditor.simulate.signals`), `nodes.json` (`kubectl get nodes -o json`, one
  node cordoned), `pods-watch.json` (the waiting pods Pending, `auditor.simulate.demand`)
  and `truth_causes.csv` (GPU-seconds per team, category and cause).

Everything follows from the scenario's seed through independent random streams (plan,
identifiers, timestamps, outages, utilisation, telemetry), with no clock and no other input.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from auditor.model import CATEGORIES, PLATFORM_TEAM, WasteCategory, Window
from auditor.settings import Thresholds
from auditor.simulate import catalogue
from auditor.simulate.cause_truth import idle_cause_truth
from auditor.simulate.demand import (
    Cordon,
    Wait,
    free_cause_truth,
    plan_cordon,
    plan_waits,
    scheduler_message,
)
from auditor.simulate.placement import Occupancy, Zone, first_fit, place
from auditor.simulate.plan import Ending, GangPlan, Label, Namer, Owner, PodPlan, Profile
from auditor.simulate.scenario import TEAMS, Scenario
from auditor.simulate.signals import (
    FREE_CAUSES,
    IDLE_CAUSES,
    Signals,
    plan_signals,
)
from auditor.simulate.telemetry import derive
from auditor.simulate.truth import NO_POD, Pieces, Tenure, card_pieces, straggler_points, summed
from auditor.simulate.utilisation import Frames, Grid, fill_gang
from auditor.simulate.writers import (
    NodeGpus,
    PodContext,
    node_object,
    pod_object,
    rfc3339,
    write_node_list,
    write_nvidia_smi,
    write_openmetrics,
    write_pod_list,
    write_watch_events,
)

OUTAGE_MARGIN_S = 300


@dataclass(frozen=True, slots=True)
class Outage:
    """A node's sampler was down: no rows stamped in [start_ms, end_ms)."""

    node: str
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class SimulationResult:
    """The files written and what they contain by construction."""

    out_dir: Path
    node_csvs: dict[str, Path]
    pods_json: Path
    truth_csv: Path
    truth_detail_csv: Path
    scenario_json: Path
    truth: pd.DataFrame
    """team, category, gpu_seconds: every team (and `(platform)`) × every category."""
    truth_detail: pd.DataFrame
    """gpu_uuid, node, gpu_index, pod_uid, namespace, pod, team, category, gpu_seconds."""
    assignments: pd.DataFrame
    """pod_uid, namespace, pod, team, node, gpu_index, gpu_uuid, bound_ms, released_ms."""
    window_start_ms: int
    window_end_ms: int
    now_ms: int
    samples: int
    outages: list[Outage] = field(default_factory=list)
    signals: Signals | None = None
    """The scraped readings behind SPEC §10's causes (`auditor.simulate.signals`)."""
    signals_om: Path | None = None
    """`signals.om.txt`: the same readings as cAdvisor, dcgm-exporter and vLLM series."""
    truth_causes: pd.DataFrame | None = None
    """team, category, cause, gpu_seconds: the causes inside `compute_idle` (per team) and
    `unallocated` (`(platform)`)."""
    truth_causes_csv: Path | None = None
    nodes_json: Path | None = None
    """`kubectl get nodes -o json` at the snapshot (one node cordoned, `cordon`)."""
    watch_json: Path | None = None
    """`kubectl get pods --watch --output-watch-events`: the waiting pods Pending."""
    cordon: Cordon | None = None
    waits: list[Wait] = field(default_factory=list)


def _node_name(scenario: Scenario, node: int) -> str:
    return f"{scenario.node_prefix}-{node + 1:02d}"


def _timestamps(scenario: Scenario, grid: Grid, rng: np.random.Generator) -> np.ndarray:
    """Per card and tick, the millisecond each row is stamped with (offset, jitter, row)."""
    g = scenario.gpus_per_node
    nominal = grid.data_start_ms + np.arange(grid.n, dtype=np.int64) * grid.period_ms
    offset = rng.integers(0, 400, size=scenario.nodes)
    jitter = rng.integers(0, scenario.jitter_ms + 1, size=(scenario.nodes, grid.n))
    row_step = rng.uniform(0.1, 0.4, size=scenario.nodes)
    rows = np.floor(np.arange(g)[None, :] * row_step[:, None]).astype(np.int64)
    ts = nominal[None, None, :] + (offset[:, None] + jitter)[:, None, :] + rows[:, :, None]
    return ts.reshape(scenario.nodes * g, grid.n)


def _plan_outages(scenario: Scenario, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """(node, start ms, end ms) of each sampler outage, on distinct nodes, whole minutes.

    Placement keeps the node around an outage to steady, single-node gangs with no tenure
    boundary nearby, so the outage removes samples without changing what any rule decides.
    """
    count = min(scenario.outages, scenario.nodes)
    length = int(scenario.outage_minutes * 60_000)
    lo = scenario.start_ms + int(scenario.hours * 0.2 * 3600_000)
    hi = scenario.end_ms - int(scenario.hours * 0.2 * 3600_000) - length
    outages = []
    for node in sorted(rng.permutation(scenario.nodes)[:count].tolist()):
        start = lo + int(rng.integers(0, max(1, (hi - lo) // 60_000 + 1))) * 60_000
        outages.append((int(node), start, start + length))
    return outages


def _held_seconds(gangs: list[GangPlan], *, start_ms: int, end_ms: int) -> float:
    total = 0.0
    for gang in gangs:
        for pod in gang.pods:
            release = end_ms if pod.released_ms is None else min(pod.released_ms, end_ms)
            total += pod.gpus * max(0, release - max(pod.bound_ms, start_ms)) / 1000
    return total


def _bystanders(scenario: Scenario, namer: Namer) -> list[tuple[PodPlan, int]]:
    """Pods without GPUs that any cluster has: the device plugin per node, DNS."""
    pods: list[tuple[PodPlan, int]] = []
    since = scenario.data_start_ms - 30 * 86_400_000
    ds_uid = namer.uid()
    for node in range(scenario.nodes):
        pod = PodPlan(
            name=f"nvidia-device-plugin-daemonset-{namer.suffix()}",
            namespace="kube-system",
            team="",
            gpus=0,
            owner=Owner("apps/v1", "DaemonSet", "nvidia-device-plugin-daemonset", ds_uid),
            labels={
                "app.kubernetes.io/name": "nvidia-device-plugin",
                "controller-revision-hash": "5d8f9c7b64",
                "pod-template-generation": "3",
            },
            image="nvcr.io/nvidia/k8s-device-plugin:v0.16.2",
            container="nvidia-device-plugin-ctr",
        )
        pods.append((pod, node))
    rs_hash = namer.suffix(10)
    rs_uid = namer.uid()
    for r in range(2):
        pod = PodPlan(
            name=f"coredns-{rs_hash}-{namer.suffix()}",
            namespace="kube-system",
            team="",
            gpus=0,
            owner=Owner("apps/v1", "ReplicaSet", f"coredns-{rs_hash}", rs_uid),
            labels={"k8s-app": "kube-dns", "pod-template-hash": rs_hash},
            image="registry.k8s.io/coredns/coredns:v1.11.3",
            container="coredns",
        )
        pods.append((pod, r % scenario.nodes))
    for pod, _ in pods:
        pod.uid = namer.uid()
        pod.bound_ms = since
        pod.created_ms = since - 2000
        pod.started_ms = since + 4000
        pod.ending = Ending.OPEN
    return pods


def _pod_objects(
    scenario: Scenario,
    gpu_pods: list[PodPlan],
    pending: list[PodPlan],
    namer: Namer,
    messages: dict[str, str],
) -> list[dict[str, Any]]:
    objects = []
    version = 4_100_000
    ip_rng = np.random.default_rng(scenario.seed + 1)
    for pod, node in [(p, p.node) for p in gpu_pods] + _bystanders(scenario, namer):
        version += int(ip_rng.integers(3, 40))
        octets = ip_rng.integers(2, 250, size=2)
        ctx = PodContext(
            node_name=_node_name(scenario, node),
            host_ip=f"10.20.0.{10 + node}",
            pod_ip=f"10.{64 + node}.{octets[0]}.{octets[1]}",
            resource_version=version,
            now_ms=scenario.end_ms,
        )
        objects.append(pod_object(pod, ctx, namer))
    for pod in pending:
        version += 1
        ctx = PodContext(
            node_name=None,
            host_ip="",
            pod_ip="",
            resource_version=version,
            now_ms=scenario.end_ms,
            unschedulable=messages[pod.uid],
        )
        objects.append(pod_object(pod, ctx, namer))
    return objects


def _truth(
    *,
    scenario: Scenario,
    pods: list[PodPlan],
    gang_of: list[GangPlan],
    grid: Grid,
    ts: np.ndarray,
    present: np.ndarray,
    frames: Frames,
    strag: np.ndarray,
    uuids: list[str],
    pieces: list[Pieces],
) -> pd.DataFrame:
    """Per card and pod, GPU-seconds per category; each card's `Pieces` go to `pieces`."""
    g = scenario.gpus_per_node
    tenures: dict[int, list[Tenure]] = {}
    for j, (pod, gang) in enumerate(zip(pods, gang_of, strict=True)):
        unused = gang.profile is Profile.UNUSED
        ke, k1 = grid.tick(gang.active_end_ms), grid.tick(pod.released_ms)
        for i in pod.gpu_indices:
            c = pod.node * g + i
            trail = None if unused or ke >= k1 else int(ts[c, ke])
            tenures.setdefault(c, []).append(
                Tenure(
                    pod=j,
                    bound_ms=pod.bound_ms,
                    released_ms=pod.released_ms,
                    lead=Label.RESERVED if unused else Label.LEAD,
                    trail_start_ms=trail,
                )
            )
    parts = []
    for c in range(scenario.total_gpus):
        got = card_pieces(
            ts=ts[c],
            present=present[c],
            util=frames.util[c],
            label=frames.label[c],
            strag=strag[c],
            tenures=tenures.get(c, []),
            window=Window(scenario.start_ms, scenario.end_ms),
            thresholds=Thresholds(),
        )
        pieces.append(got)
        pod_idx, cat_idx, secs = summed(got)
        parts.append(pd.DataFrame({"card": c, "pod": pod_idx, "cat": cat_idx, "sec": secs}))
    raw = pd.concat(parts, ignore_index=True)
    none = PodPlan(
        name="",
        namespace="",
        team=PLATFORM_TEAM,
        gpus=0,
        owner=Owner("", "", "", ""),
        labels={},
        image="",
    )
    look = [*pods, none]  # index -1 reads `none`
    return pd.DataFrame(
        {
            "gpu_uuid": [uuids[c] for c in raw["card"]],
            "node": [_node_name(scenario, c // g) for c in raw["card"]],
            "gpu_index": (raw["card"] % g).astype("int64"),
            "pod_uid": [look[p].uid if p != NO_POD else "" for p in raw["pod"]],
            "namespace": [look[p].namespace for p in raw["pod"]],
            "pod": [look[p].name for p in raw["pod"]],
            "team": [look[p].team for p in raw["pod"]],
            "category": [CATEGORIES[k].value for k in raw["cat"]],
            "gpu_seconds": raw["sec"].astype("float64"),
        }
    )


def _team_table(detail: pd.DataFrame) -> pd.DataFrame:
    teams = [*TEAMS, *sorted(set(detail["team"]) - {*TEAMS, PLATFORM_TEAM}), PLATFORM_TEAM]
    index = pd.MultiIndex.from_product(
        [teams, [c.value for c in CATEGORIES]], names=["team", "category"]
    )
    sums = detail.groupby(["team", "category"])["gpu_seconds"].sum()
    return sums.reindex(index, fill_value=0.0).rename("gpu_seconds").reset_index()


def _node_objects(scenario: Scenario, cordon: Cordon | None, namer: Namer) -> list[dict[str, Any]]:
    """`kubectl get nodes -o json` at the snapshot: GPU feature discovery's labels, the
    cordoned node unschedulable since its cordon."""
    created = scenario.data_start_ms - 40 * 86_400_000
    product = scenario.gpu_model.removeprefix("NVIDIA ").replace(" ", "-")
    return [
        node_object(
            _node_name(scenario, n),
            labels={
                "nvidia.com/gpu.count": str(scenario.gpus_per_node),
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": f"NVIDIA-{product}",
                "nvidia.com/gpu.memory": str(scenario.memory_total_mib),
            },
            resources={"nvidia.com/gpu": str(scenario.gpus_per_node)},
            created_ms=created,
            uid=namer.uid(),
            cordoned_ms=cordon.start_ms if cordon is not None and cordon.node == n else None,
        )
        for n in range(scenario.nodes)
    ]


def _wait_events(
    scenario: Scenario, waits: list[Wait], messages: dict[str, str]
) -> list[tuple[str, dict[str, Any]]]:
    """The watch stream of the waits: each waiting pod ADDED Pending, Unschedulable, with
    the scheduler's message (its binding and the rest are in the final `pods.json`)."""
    namer = Namer(np.random.default_rng(0))  # a Pending pod's object draws nothing from it
    events = []
    for i, w in enumerate(sorted(waits, key=lambda w: (w.start_ms, w.pod.uid))):
        ctx = PodContext(
            node_name=None,
            host_ip="",
            pod_ip="",
            resource_version=4_000_000 + i,
            now_ms=w.start_ms + 1000,
            unschedulable=messages[w.pod.uid],
        )
        events.append(("ADDED", pod_object(w.pod, ctx, namer)))
    return events


def _cause_table(idle: pd.DataFrame, pods: list[PodPlan], teams: list[str]) -> pd.DataFrame:
    """Every team × cause of `compute_idle`, GPU-seconds (0 where none)."""
    team = [pods[int(j)].team for j in idle["pod"]]
    sums = idle.assign(team=team).groupby(["team", "cause"])["sec"].sum()
    index = pd.MultiIndex.from_product([teams, list(IDLE_CAUSES)], names=["team", "cause"])
    table = sums.reindex(index, fill_value=0.0).rename("gpu_seconds").reset_index()
    table.insert(1, "category", WasteCategory.COMPUTE_IDLE.value)
    return table


def simulate(out_dir: Path, *, scenario: Scenario) -> SimulationResult:
    """Generate `scenario` into `out_dir` (created if missing); deterministic in the seed."""
    streams = np.random.SeedSequence(scenario.seed).spawn(6)
    r_plan, r_ids, r_time, r_out, r_fill, r_tele = (np.random.default_rng(s) for s in streams)
    namer = Namer(r_ids)
    data_start, end = scenario.data_start_ms, scenario.end_ms
    anchored = (
        catalogue.build_serving(scenario, r_plan, namer)
        + catalogue.build_distributed(scenario, r_plan, namer)
        + catalogue.build_notebooks(scenario, r_plan, namer)
        + catalogue.build_special(scenario, r_plan, namer)
    )
    pending = catalogue.build_pending(scenario, namer)
    occ = Occupancy(
        nodes=scenario.nodes,
        gpus=scenario.gpus_per_node,
        origin_ms=data_start - 2 * 3600_000,
        end_ms=end,
    )
    outages = _plan_outages(scenario, r_out)
    margin_ms = OUTAGE_MARGIN_S * 1000
    zones = [Zone(node, a - margin_ms, b + margin_ms) for node, a, b in outages]
    placed, dropped = place(anchored, occ, now_ms=end, data_start_ms=data_start, zones=zones)
    capacity = scenario.total_gpus * (end - data_start) / 1000
    target = scenario.load * capacity - _held_seconds(placed, start_ms=data_start, end_ms=end)
    fillers = catalogue.build_fillers(scenario, r_plan, namer, target_gpu_s=max(0.0, target))
    placed_f, dropped_f = place(fillers, occ, now_ms=end, data_start_ms=data_start, zones=zones)
    placed += placed_f
    pods = [pod for gang in placed for pod in gang.pods]
    gang_of = [gang for gang in placed for _ in gang.pods]
    for pod in [*pods, *pending]:
        pod.uid = namer.uid()
    first_fit(pods, gpus_per_node=scenario.gpus_per_node)
    # SPEC §10's free-card story: a cordon placed where nothing binds any more, and the pods
    # that waited; from a stream of their own, so nothing else changes with them
    r_dem = np.random.default_rng(np.random.SeedSequence(scenario.seed, spawn_key=(7,)))
    waits = plan_waits(pods, gang_of, pending, end_ms=end)
    cordon = plan_cordon(
        pods,
        nodes=scenario.nodes,
        gpus_per_node=scenario.gpus_per_node,
        window=(scenario.start_ms, end),
        not_before_ms=max((w.start_ms + 60_000 for w in waits), default=scenario.start_ms),
    )
    messages = {
        w.pod.uid: scheduler_message(
            w.gpus,
            w.start_ms + 1000,
            pods=pods,
            nodes=scenario.nodes,
            gpus_per_node=scenario.gpus_per_node,
            cordon=cordon,
        )
        for w in waits
    }

    grid = Grid(data_start, scenario.period_ms, (end - data_start) // scenario.period_ms)
    ts = _timestamps(scenario, grid, r_time)
    g = scenario.gpus_per_node
    present_nodes = np.ones((scenario.nodes, grid.n), dtype=bool)
    quiet_nodes = np.zeros((scenario.nodes, grid.n), dtype=bool)
    for node, a_ms, b_ms in outages:
        a, b = grid.tick(a_ms), grid.tick(b_ms)
        present_nodes[node, a:b] = False
        quiet_nodes[node, grid.tick(a_ms - margin_ms) : grid.tick(b_ms + margin_ms)] = True
    present = np.repeat(present_nodes, g, axis=0)

    frames = Frames.empty(scenario.total_gpus, grid.n)
    for gang in placed:
        fill_gang(frames, gang, grid=grid, gpus_per_node=g, quiet_nodes=quiet_nodes, rng=r_fill)
    strag = np.zeros(frames.util.shape, dtype=np.float32)
    tolerance = Thresholds().straggler_tolerance_pct
    for gang in placed:
        cards = [p.node * g + i for p in gang.pods for i in p.gpu_indices]
        ka, ke = grid.tick(gang.active_start_ms), grid.tick(gang.active_end_ms)
        if len(cards) > 1 and gang.profile is not Profile.UNUSED and ke > ka:
            strag[cards, ka:ke] = straggler_points(
                frames.util[cards, ka:ke],
                frames.label[cards, ka:ke],
                present[cards, ka:ke],
                tolerance=tolerance,
            )
    tele = derive(frames, r_tele)

    uuids = [namer.gpu_uuid() for _ in range(scenario.total_gpus)]
    pieces: list[Pieces] = []
    detail = _truth(
        scenario=scenario,
        pods=pods,
        gang_of=gang_of,
        grid=grid,
        ts=ts,
        present=present,
        frames=frames,
        strag=strag,
        uuids=uuids,
        pieces=pieces,
    )
    truth = _team_table(detail)
    # SPEC §10's signals come from a stream of their own: nothing above changes with them
    r_sig = np.random.default_rng(np.random.SeedSequence(scenario.seed, spawn_key=(6,)))
    signals = plan_signals(
        pods=pods,
        gang_of=gang_of,
        label=frames.label,
        grid=grid,
        gpus_per_node=g,
        nodes=[_node_name(scenario, n) for n in range(scenario.nodes)],
        uuids=uuids,
        gpu_model=scenario.gpu_model,
        end_ms=end,
        rng=r_sig,
    )
    idle_causes = idle_cause_truth(pieces=pieces, signals=signals, pods=pods, uuids=uuids)
    teams = list(truth["team"].drop_duplicates())
    truth_causes = _cause_table(idle_causes, pods, [t for t in teams if t != PLATFORM_TEAM])
    free_causes = free_cause_truth(
        pieces=pieces,
        gpus_per_node=g,
        cordon=cordon,
        waits=waits,
        window=(scenario.start_ms, end),
    )
    truth_causes = pd.concat(
        [
            truth_causes,
            pd.DataFrame(
                {
                    "team": PLATFORM_TEAM,
                    "category": WasteCategory.UNALLOCATED.value,
                    "cause": list(FREE_CAUSES),
                    "gpu_seconds": [free_causes[c] for c in FREE_CAUSES],
                }
            ),
        ],
        ignore_index=True,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "nodes").mkdir(exist_ok=True)
    node_csvs: dict[str, Path] = {}
    samples = 0
    for node in range(scenario.nodes):
        name = _node_name(scenario, node)
        path = out_dir / "nodes" / f"{name}.csv"
        rows = list(range(node * g, (node + 1) * g))
        samples += write_nvidia_smi(
            path,
            gpus=NodeGpus(rows, [uuids[c] for c in rows]),
            ts=ts,
            present=present_nodes[node],
            frames=frames,
            tele=tele,
            gpu_model=scenario.gpu_model,
            memory_total_mib=scenario.memory_total_mib,
        )
        node_csvs[name] = path
    pods_json = out_dir / "pods.json"
    write_pod_list(pods_json, _pod_objects(scenario, pods, pending, namer, messages))
    nodes_json = out_dir / "nodes.json"
    write_node_list(nodes_json, _node_objects(scenario, cordon, Namer(r_dem)))
    os.utime(nodes_json, (end / 1000, end / 1000))  # kubectl wrote it at the snapshot
    watch_json = out_dir / "pods-watch.json"
    write_watch_events(watch_json, _wait_events(scenario, waits, messages))
    truth_csv = out_dir / "truth.csv"
    truth.to_csv(truth_csv, index=False, float_format="%.3f", lineterminator="\n")
    detail_csv = out_dir / "truth_detail.csv"
    detail.to_csv(detail_csv, index=False, float_format="%.3f", lineterminator="\n")
    causes_csv = out_dir / "truth_causes.csv"
    truth_causes.to_csv(causes_csv, index=False, float_format="%.3f", lineterminator="\n")
    signals_om = out_dir / "signals.om.txt"
    write_openmetrics(signals_om, signals.families, counters=signals.counters, precise=True)

    assignments = pd.DataFrame(
        [
            {
                "pod_uid": p.uid,
                "namespace": p.namespace,
                "pod": p.name,
                "team": p.team,
                "node": _node_name(scenario, p.node),
                "gpu_index": i,
                "gpu_uuid": uuids[p.node * g + i],
                "bound_ms": p.bound_ms,
                "released_ms": p.released_ms,
            }
            for p in pods
            for i in p.gpu_indices
        ]
    )
    outage_records = [Outage(_node_name(scenario, node), a, b) for node, a, b in outages]
    meta = {
        "scenario": scenario.as_dict(),
        "seed": scenario.seed,
        "window": {
            "start_ms": scenario.start_ms,
            "end_ms": end,
            "start": rfc3339(scenario.start_ms),
            "end": rfc3339(end),
        },
        "data_start_ms": data_start,
        "now_ms": end,
        "thresholds": Thresholds().as_dict(),
        "nodes": [
            {
                "name": _node_name(scenario, n),
                "csv": f"nodes/{_node_name(scenario, n)}.csv",
                "gpus": [{"index": i, "uuid": uuids[n * g + i]} for i in range(g)],
            }
            for n in range(scenario.nodes)
        ],
        "outages": [
            {"node": o.node, "start_ms": o.start_ms, "end_ms": o.end_ms} for o in outage_records
        ],
        "gpu_pods": len(pods),
        "dropped_workloads": sorted(x.key for x in dropped + dropped_f if x.required),
        "samples": samples,
    }
    scenario_json = out_dir / "scenario.json"
    scenario_json.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return SimulationResult(
        out_dir=out_dir,
        node_csvs=node_csvs,
        pods_json=pods_json,
        truth_csv=truth_csv,
        truth_detail_csv=detail_csv,
        scenario_json=scenario_json,
        truth=truth,
        truth_detail=detail,
        assignments=assignments,
        window_start_ms=scenario.start_ms,
        window_end_ms=end,
        now_ms=end,
        samples=samples,
        outages=outage_records,
        signals=signals,
        signals_om=signals_om,
        truth_causes=truth_causes,
        truth_causes_csv=causes_csv,
        nodes_json=nodes_json,
        watch_json=watch_json,
        cordon=cordon,
        waits=waits,
    )
