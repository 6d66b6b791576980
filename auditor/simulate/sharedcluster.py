"""A cluster of shared physical cards, written as real input files with its SPEC §7 truth.

The pieces: `PhysicalCard` (a MIG-enabled card lists its carved instances), `Tenancy` (one
pod's share of one card, with its activity per tick as a percent of the WHOLE card) and
`SharedCluster` (the window, the cards, the tenancies and the Node objects). `write_cluster`
turns one into:

- `nodes/<node>.csv`: nvidia-smi CSV for every card that is not MIG-enabled, its utilisation
  the sum of its tenants' activities (nvidia-smi's `--query-gpu` has no MIG instances);
- `dcgm.om.txt`: dcgm-exporter series of every MIG instance (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`,
  relative to the instance, and `DCGM_FI_DEV_FB_USED`), with `UUID` of the parent card,
  `GPU_I_ID`, `GPU_I_PROFILE`, and `namespace`/`pod`/`container` while a pod holds it: the
  input of `promtool tsdb create-blocks-from openmetrics`, scraped exactly on the tick grid;
- `pods.json` and `nodes.json`: `kubectl get pods -A -o json` and `kubectl get nodes -o json`;
- `truth.csv` (from the tenants' TRUE activities), `truth_estimated.csv` (what §7's
  estimated attribution gives from the cards' utilisation alone, where no per-tenant source
  exists), `truth_detail.csv` (both, per card, pod and category) and `scenario.json`.

`fit_cards` is §7's inference rule for shares no source names: on each node, in order of
binding (ties by namespace, then name), the lowest-index cards with enough share left.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from auditor.model import CATEGORIES, PLATFORM_TEAM, Window
from auditor.settings import Thresholds
from auditor.simulate.plan import Ending, Namer, PodPlan
from auditor.simulate.sharedtruth import Holder, estimated_activity, shared_card_truth
from auditor.simulate.telemetry import derive
from auditor.simulate.utilisation import Frames, Grid
from auditor.simulate.writers import (
    NodeGpus,
    PodContext,
    Series,
    pod_object,
    rfc3339,
    write_node_list,
    write_nvidia_smi,
    write_openmetrics,
    write_pod_list,
)

MILLI = 1000
"""Shares are fitted in thousandths of a card (exact for replicas of 2, 4, 5, 8, 10...)."""


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One carved GPU instance: its ID on the card and its profile (`3g.40gb`)."""

    gi: int
    profile: str

    @property
    def slices(self) -> int:
        return int(self.profile.split("g.", 1)[0].rsplit(".", 1)[-1])


@dataclass(frozen=True, slots=True)
class PhysicalCard:
    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig: tuple[MigInstance, ...] = ()
    """Non-empty: MIG is enabled and these instances are carved; sampled through dcgm only."""
    mig_slices: int = 7
    """Compute slices of the whole card (7 on A100/H100/H200/B200, 4 on A30)."""


@dataclass(slots=True)
class Tenancy:
    """One pod's share of one card (placed: the pod's times are set)."""

    pod: PodPlan
    card: int
    share: float
    kind: str
    """whole, time-slicing, hami, mig, milli."""
    k0: int
    """The tick `act` starts at."""
    act: np.ndarray
    """Percent of the whole card per tick from `k0`; 0 while idle."""
    mem_mib: int
    instance: int | None = None
    """Index into the card's `mig`."""


@dataclass
class SharedCluster:
    name: str
    seed: int
    data_start_ms: int
    start_ms: int
    end_ms: int
    period_ms: int
    cards: list[PhysicalCard]
    tenancies: list[Tenancy]
    nodes: list[dict[str, Any]]
    teams: tuple[str, ...]
    jitter_ms: int = 40
    bystanders: list[tuple[PodPlan, str]] = field(default_factory=list)
    """Pods (with their node) in the pod list that hold no card in the sampled time: gone
    before the samplers started, yet part of the history §7's first-fit inference replays."""

    @property
    def grid(self) -> Grid:
        return Grid(
            self.data_start_ms, self.period_ms, (self.end_ms - self.data_start_ms) // self.period_ms
        )


@dataclass(frozen=True)
class SharedResult:
    out_dir: Path
    node_csvs: dict[str, Path]
    openmetrics: Path | None
    pods_json: Path
    nodes_json: Path
    truth: pd.DataFrame
    """team, category, gpu_seconds from the tenants' true activities."""
    truth_estimated: pd.DataFrame
    """The same where per-tenant activity is §7's estimate (card utilisation split by share)."""
    truth_detail: pd.DataFrame
    window_start_ms: int
    window_end_ms: int
    data_start_ms: int
    period_s: float
    samples: int
    physical_cards: int
    tenancies: pd.DataFrame = field(default_factory=pd.DataFrame)
    """pod_uid, namespace, pod, team, kind, node, gpu_uuid, share, bound_ms, released_ms."""


@dataclass(frozen=True, slots=True)
class FitRequest:
    """A pod asking for `count` cards with `milli` thousandths of each on one node."""

    pod: PodPlan
    node: str
    count: int
    milli: int


def fit_cards(requests: list[FitRequest], cards_per_node: dict[str, int]) -> dict[str, list[int]]:
    """SPEC §7's inference: pod uid -> card indices on its node (raises if none fit)."""
    out: dict[str, list[int]] = {}
    by_node: dict[str, list[FitRequest]] = {}
    for r in requests:
        by_node.setdefault(r.node, []).append(r)
    for node, reqs in by_node.items():
        held: list[list[tuple[int, int]]] = [[] for _ in range(cards_per_node[node])]
        for r in sorted(reqs, key=lambda x: (x.pod.bound_ms, x.pod.namespace, x.pod.name)):
            t = r.pod.bound_ms
            free = []
            for i, spans in enumerate(held):
                spans[:] = [(until, m) for until, m in spans if until > t]
                if MILLI - sum(m for _, m in spans) >= r.milli:
                    free.append(i)
            if len(free) < r.count:
                raise AssertionError(f"{node}: no room for {r.pod.name} at {t}")
            chosen = free[: r.count]
            release = r.pod.released_ms
            for i in chosen:
                held[i].append((2**62 if release is None else release, r.milli))
            out[r.pod.uid] = chosen
    return out


def set_times(
    pod: PodPlan, *, bound_ms: int, pull_s: int, release_ms: int | None, ending: Ending
) -> None:
    """Fill a pod's lifecycle the way placement does for the whole-card scenarios."""
    pod.bound_ms = bound_ms
    pod.created_ms = bound_ms - pod.queued_s * 1000
    pod.started_ms = bound_ms + pull_s * 1000
    pod.ending = ending if release_ms is not None else Ending.OPEN
    if release_ms is None:
        return
    if ending is Ending.DELETE:
        pod.deleted_ms = release_ms
        pod.finished_ms = pod.main_finished_ms = release_ms + pod.grace_s * 1000
    else:
        pod.finished_ms = pod.main_finished_ms = release_ms


def _sample_times(cluster: SharedCluster, rng: np.random.Generator) -> np.ndarray:
    """(cards × ticks) sample times: nvidia-smi rows jitter per node; MIG instances are
    scraped exactly on the grid (Prometheus evaluates the import on that grid)."""
    grid = cluster.grid
    nominal = grid.data_start_ms + np.arange(grid.n, dtype=np.int64) * grid.period_ms
    nodes = sorted({c.node for c in cluster.cards})
    offset = dict(zip(nodes, rng.integers(0, 400, size=len(nodes)).tolist(), strict=True))
    jitter = {n: rng.integers(0, cluster.jitter_ms + 1, size=grid.n) for n in nodes}
    ts = np.empty((len(cluster.cards), grid.n), dtype=np.int64)
    for c, card in enumerate(cluster.cards):
        if card.mig:
            ts[c] = nominal
        else:
            ts[c] = nominal + offset[card.node] + jitter[card.node] + card.index // 3
    return ts


def _card_activity(cluster: SharedCluster, c: int, ten: list[int]) -> np.ndarray:
    n = cluster.grid.n
    act = np.zeros((len(ten), n))
    for j, t in enumerate(ten):
        x = cluster.tenancies[t]
        act[j, x.k0 : x.k0 + x.act.size] = x.act[: max(0, n - x.k0)]
    return act / 100.0


def _truths(
    cluster: SharedCluster, ts: np.ndarray, util: np.ndarray, on_card: list[list[int]]
) -> pd.DataFrame:
    rows = []
    th = Thresholds()
    window = Window(cluster.start_ms, cluster.end_ms)
    for c, card in enumerate(cluster.cards):
        ten = on_card[c]
        holders = [
            Holder(t, cluster.tenancies[t].share, x.bound_ms, x.released_ms)
            for t in ten
            for x in [cluster.tenancies[t].pod]
        ]
        act = _card_activity(cluster, c, ten)
        u = util[c] / 100.0
        est = act if card.mig else estimated_activity(u, ts[c].astype(np.float64), holders)
        for how, a in (("true", act), ("estimated", est)):
            pod, cat, sec = shared_card_truth(
                ts=ts[c],
                util=u,
                activity=a,
                holders=holders,
                window=window,
                data_end_ms=cluster.end_ms,
                thresholds=th,
                estimated=how == "estimated" and not card.mig,
            )
            rows.append(pd.DataFrame({"card": c, "how": how, "t": pod, "cat": cat, "sec": sec}))
    raw = pd.concat(rows, ignore_index=True)
    per_card = raw.groupby(["card", "how"])["sec"].sum()
    length = (cluster.end_ms - cluster.start_ms) / 1000
    if not np.allclose(per_card.to_numpy(), length, rtol=1e-9):
        raise AssertionError("the truth of a card does not sum to the window")
    ten_of = raw["t"].to_numpy()
    pods = [x.pod for x in cluster.tenancies]

    def field_of(name: str, platform: str) -> list[str]:
        return [platform if t < 0 else str(getattr(pods[t], name)) for t in ten_of]

    return pd.DataFrame(
        {
            "gpu_uuid": [cluster.cards[c].uuid for c in raw["card"]],
            "node": [cluster.cards[c].node for c in raw["card"]],
            "gpu_index": [cluster.cards[c].index for c in raw["card"]],
            "pod_uid": field_of("uid", ""),
            "namespace": field_of("namespace", ""),
            "pod": field_of("name", ""),
            "team": field_of("team", PLATFORM_TEAM),
            "attribution": raw["how"],
            "category": [CATEGORIES[k].value for k in raw["cat"]],
            "gpu_seconds": raw["sec"].astype("float64"),
        }
    )


def team_table(detail: pd.DataFrame, teams: tuple[str, ...]) -> pd.DataFrame:
    """team × category GPU-seconds, every team (and the platform) × every category."""
    names = [*teams, *sorted(set(detail["team"]) - {*teams, PLATFORM_TEAM}), PLATFORM_TEAM]
    index = pd.MultiIndex.from_product(
        [names, [c.value for c in CATEGORIES]], names=["team", "category"]
    )
    sums = detail.groupby(["team", "category"])["gpu_seconds"].sum()
    return sums.reindex(index, fill_value=0.0).rename("gpu_seconds").reset_index()


def _mig_series(
    cluster: SharedCluster, ts: np.ndarray, on_card: list[list[int]]
) -> dict[str, list[Series]]:
    grid = cluster.grid
    util: list[Series] = []
    fb: list[Series] = []
    for c, card in enumerate(cluster.cards):
        for k, inst in enumerate(card.mig):
            share = inst.slices / card.mig_slices
            value = np.zeros(grid.n)
            mem = np.zeros(grid.n)
            holder = np.full(grid.n, -1)
            for t in on_card[c]:
                x = cluster.tenancies[t]
                if x.instance != k:
                    continue
                end = min(grid.n, x.k0 + x.act.size)
                value[x.k0 : end] = x.act[: end - x.k0] / 100.0 / share
                k1 = grid.tick(x.pod.released_ms)
                holder[grid.tick(x.pod.bound_ms) : k1] = t
                mem[grid.tick(x.pod.started_ms) : k1] = x.mem_mib
            base = {
                "gpu": str(card.index),
                "UUID": card.uuid,
                "device": f"nvidia{card.index}",
                "modelName": card.model,
                "Hostname": card.node,
                "GPU_I_PROFILE": inst.profile,
                "GPU_I_ID": str(inst.gi),
            }
            change = np.flatnonzero(np.diff(holder)) + 1
            for a, b in zip([0, *change.tolist()], [*change.tolist(), grid.n], strict=True):
                labels = dict(base)
                if holder[a] >= 0:
                    pod = cluster.tenancies[int(holder[a])].pod
                    labels |= {"container": pod.container, "namespace": pod.namespace}
                    labels["pod"] = pod.name
                times = ts[c, a:b] // 1000
                util.append(Series(labels, times, np.round(value[a:b], 4)))
                fb.append(Series(labels, times, mem[a:b]))
    if not util:
        return {}
    return {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": util, "DCGM_FI_DEV_FB_USED": fb}


def write_cluster(out_dir: Path, cluster: SharedCluster) -> SharedResult:
    """Write every file of `cluster` into `out_dir`; deterministic in `cluster.seed`."""
    r_time, r_tele, r_ids = (
        np.random.default_rng(s) for s in np.random.SeedSequence(cluster.seed + 77).spawn(3)
    )
    namer = Namer(r_ids)
    grid = cluster.grid
    ts = _sample_times(cluster, r_time)
    on_card: list[list[int]] = [[] for _ in cluster.cards]
    for t, x in enumerate(cluster.tenancies):
        on_card[x.card].append(t)
    util = np.zeros((len(cluster.cards), grid.n))
    mem = np.zeros((len(cluster.cards), grid.n), dtype=np.int64)
    for c, card in enumerate(cluster.cards):
        total = _card_activity(cluster, c, on_card[c]).sum(axis=0) * 100.0
        util[c] = total if card.mig else np.minimum(100, np.rint(total))
        for t in on_card[c]:
            x = cluster.tenancies[t]
            mem[c, grid.tick(x.pod.started_ms) : grid.tick(x.pod.released_ms)] += x.mem_mib
        mem[c] = np.minimum(mem[c], card.memory_mib)

    detail = _truths(cluster, ts, util, on_card)
    true_detail = detail[detail["attribution"] == "true"]
    est_detail = detail[detail["attribution"] == "estimated"]
    truth = team_table(true_detail, cluster.teams)
    truth_est = team_table(est_detail, cluster.teams)

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "nodes").mkdir(exist_ok=True)
    plain = [c for c, card in enumerate(cluster.cards) if not card.mig]
    frames = Frames.empty(len(cluster.cards), grid.n)
    frames.util[:] = np.where(np.array([not c.mig for c in cluster.cards])[:, None], util, 0)
    frames.mem[:] = mem
    tele = derive(frames, r_tele)
    node_csvs: dict[str, Path] = {}
    samples = 0
    for node in sorted({cluster.cards[c].node for c in plain}):
        rows = sorted(
            (c for c in plain if cluster.cards[c].node == node),
            key=lambda c: cluster.cards[c].index,
        )
        first = cluster.cards[rows[0]]
        path = out_dir / "nodes" / f"{node}.csv"
        samples += write_nvidia_smi(
            path,
            gpus=NodeGpus(rows, [cluster.cards[c].uuid for c in rows]),
            ts=ts,
            present=np.ones(grid.n, dtype=bool),
            frames=frames,
            tele=tele,
            gpu_model=first.model,
            memory_total_mib=first.memory_mib,
        )
        node_csvs[node] = path
    families = _mig_series(cluster, ts, on_card)
    openmetrics = None
    if families:
        openmetrics = out_dir / "dcgm.om.txt"
        samples += write_openmetrics(openmetrics, families) // 2

    node_index = {n["metadata"]["name"]: i for i, n in enumerate(cluster.nodes)}
    objects = []
    seen: set[str] = set()
    listed = [(x.pod, cluster.cards[x.card].node) for x in cluster.tenancies]
    for version, (pod, node) in enumerate([*listed, *cluster.bystanders]):
        if pod.uid in seen:
            continue
        seen.add(pod.uid)
        i = node_index.get(node, 0)
        ctx = PodContext(
            node_name=node,
            host_ip=f"10.20.{i // 200}.{10 + i % 200}",
            pod_ip=f"10.{64 + i % 128}.{version // 250}.{2 + version % 250}",
            resource_version=4_100_000 + version,
            now_ms=cluster.end_ms,
        )
        objects.append(pod_object(pod, ctx, namer))
    pods_json = out_dir / "pods.json"
    write_pod_list(pods_json, objects)
    nodes_json = out_dir / "nodes.json"
    write_node_list(nodes_json, cluster.nodes)
    for name, frame in (
        ("truth.csv", truth),
        ("truth_estimated.csv", truth_est),
        ("truth_detail.csv", detail),
    ):
        frame.to_csv(out_dir / name, index=False, float_format="%.3f", lineterminator="\n")

    tenancies = pd.DataFrame(
        [
            {
                "pod_uid": x.pod.uid,
                "namespace": x.pod.namespace,
                "pod": x.pod.name,
                "team": x.pod.team,
                "kind": x.kind,
                "node": cluster.cards[x.card].node,
                "gpu_uuid": cluster.cards[x.card].uuid,
                "mig_profile": None
                if x.instance is None
                else cluster.cards[x.card].mig[x.instance].profile,
                "share": x.share,
                "bound_ms": x.pod.bound_ms,
                "released_ms": x.pod.released_ms,
            }
            for x in cluster.tenancies
        ]
    )
    meta = {
        "scenario": cluster.name,
        "seed": cluster.seed,
        "window": {
            "start_ms": cluster.start_ms,
            "end_ms": cluster.end_ms,
            "start": rfc3339(cluster.start_ms),
            "end": rfc3339(cluster.end_ms),
        },
        "data_start_ms": cluster.data_start_ms,
        "period_s": cluster.period_ms / 1000,
        "thresholds": Thresholds().as_dict(),
        "cards": [
            {
                "node": c.node,
                "index": c.index,
                "uuid": c.uuid,
                "model": c.model,
                "memory_mib": c.memory_mib,
                "mig": [{"gi": m.gi, "profile": m.profile} for m in c.mig],
            }
            for c in cluster.cards
        ],
        "tenancies": json.loads(tenancies.to_json(orient="records")),
        "samples": samples,
    }
    (out_dir / "scenario.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return SharedResult(
        out_dir=out_dir,
        node_csvs=node_csvs,
        openmetrics=openmetrics,
        pods_json=pods_json,
        nodes_json=nodes_json,
        truth=truth,
        truth_estimated=truth_est,
        truth_detail=detail,
        window_start_ms=cluster.start_ms,
        window_end_ms=cluster.end_ms,
        data_start_ms=cluster.data_start_ms,
        period_s=cluster.period_ms / 1000,
        samples=samples,
        physical_cards=len(cluster.cards),
        tenancies=tenancies,
    )
