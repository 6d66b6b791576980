"""The `shared` preset: MIG inference, time-sliced notebooks, HAMi vGPU pods and whole cards.

Four nodes, ten physical cards, over a four-hour window (samplers started 30 min before):

- `gpu-a100-mig-01`: two A100 80GB cards in MIG mode. Card 0 is carved like MIG manager's
  `all-balanced` (3g.40gb, 2g.20gb, 2 × 1g.10gb; one 1g.10gb instance held by no pod),
  card 1 as 2 × 3g.40gb (one compute slice left uncarved). Inference Deployments ask for
  `nvidia.com/mig-<profile>: 1`; dcgm-exporter reports each instance's engine activity.
- `gpu-h100-ts-01`: four H100 cards time-sliced four ways (`nvidia.com/gpu.replicas=4`);
  Kubeflow notebooks ask for one or two replicas. A notebook may use more than its share
  while the others on its card are quiet; when several compute at once they split the card's
  time in proportion to what they ask. One card is never used, one half-used.
- `gpu-h100-hami-01`: two H100 cards under HAMi; serving pods ask `nvidia.com/gpu: 1` with
  `nvidia.com/gpucores` and `nvidia.com/gpumem` (one only `gpumem`), the scheduler's
  `hami.io/vgpu-devices-allocated` annotation names the card. HAMi caps a pod's cores, so
  none exceeds its share.
- `gpu-h100-01`: two whole cards, a fine-tuning Job and an inference replica.

Teams mix on the shared cards, so §7's estimated attribution (the card's utilisation split
by share) differs from the truth: a notebook away for an hour on a card where another one
computes is charged busy and compute-idle time by the estimate, `reserved_idle` by the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from auditor.simulate.plan import Activity, Ending, Namer, Owner, PodPlan
from auditor.simulate.scenario import TEAMS
from auditor.simulate.sharedcluster import (
    MILLI,
    FitRequest,
    MigInstance,
    PhysicalCard,
    SharedCluster,
    SharedResult,
    Tenancy,
    fit_cards,
    set_times,
    write_cluster,
)
from auditor.simulate.utilisation import Grid, inference_block, notebook_block
from auditor.simulate.writers import node_object

MINUTE_MS = 60_000
H100 = ("NVIDIA H100 80GB HBM3", 81559)
A100 = ("NVIDIA A100-SXM4-80GB", 81920)
TS_REPLICAS = 4
IDLE_PCT = 5.0


@dataclass(frozen=True, slots=True)
class SharedScenario:
    name: str
    seed: int
    start_ms: int
    hours: float = 4.0
    lead_in_minutes: float = 30.0
    period_s: float = 5.0

    @property
    def data_start_ms(self) -> int:
        return self.start_ms - int(self.lead_in_minutes * MINUTE_MS)

    @property
    def end_ms(self) -> int:
        return self.start_ms + int(self.hours * 3600_000)

    def with_seed(self, seed: int) -> SharedScenario:
        return SharedScenario(
            self.name, seed, self.start_ms, self.hours, self.lead_in_minutes, self.period_s
        )


SHARED_SCENARIOS = {
    "shared": SharedScenario(
        name="shared",
        seed=15,
        start_ms=int(datetime(2026, 11, 23, 8, tzinfo=UTC).timestamp()) * 1000,
    )
}


@dataclass(frozen=True, slots=True)
class _Want:
    """One shared pod of the preset, before its card and activity are known."""

    kind: str
    node: str
    team: str
    namespace: str
    name: str
    bind_min: float
    """Minutes after the window starts (negative: in the lead-in)."""
    pull_s: int
    release_min: float | None
    style: str
    """inference, notebook or training: how it uses its share."""
    milli: int = MILLI
    card: int | None = None
    """Exact card (HAMi's annotation, dcgm's labels); None: §7's first-fit."""
    instance: int | None = None
    cores: int = 0
    mem_mib: int = 0
    peak: float = 75.0


NOTEBOOK_IMAGE = "kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.9.0"

WANTS = (
    # MIG inference on gpu-a100-mig-01
    _Want("mig", "gpu-a100-mig-01", "recsys", "recsys-serving", "ranker-mig", -25, 70, None,
          "inference", card=0, instance=0, peak=82),
    _Want("mig", "gpu-a100-mig-01", "nlp", "nlp-serving", "llm-small", -22, 90, None,
          "inference", card=0, instance=1, peak=70),
    _Want("mig", "gpu-a100-mig-01", "vision", "vision-serving", "embed-mig", 30, 45, 180,
          "inference", card=0, instance=2, peak=60),
    _Want("mig", "gpu-a100-mig-01", "research", "research", "eval-mig", -24, 60, None,
          "inference", card=1, instance=0, peak=88),
    _Want("mig", "gpu-a100-mig-01", "nlp", "nlp-serving", "llm-small-b", 60, 90, None,
          "inference", card=1, instance=1, peak=66),
    # time-sliced notebooks on gpu-h100-ts-01 (first-fit on the share left)
    _Want("time-slicing", "gpu-h100-ts-01", "research", "kubeflow-user-alice", "alice-dev",
          -27, 60, None, "notebook", milli=250),
    _Want("time-slicing", "gpu-h100-ts-01", "vision", "kubeflow-user-bob", "bob-explore",
          -26, 80, None, "notebook", milli=500),
    _Want("time-slicing", "gpu-h100-ts-01", "nlp", "kubeflow-user-chen", "chen-finetune",
          -24, 70, 200, "notebook", milli=250),
    _Want("time-slicing", "gpu-h100-ts-01", "research", "kubeflow-user-dana", "dana-eda",
          -20, 90, None, "notebook", milli=500),
    _Want("time-slicing", "gpu-h100-ts-01", "recsys", "kubeflow-user-eve", "eve-features",
          20, 60, 150, "notebook", milli=250),
    _Want("time-slicing", "gpu-h100-ts-01", "vision", "kubeflow-user-farid", "farid-seg",
          40, 50, None, "notebook", milli=250),
    _Want("time-slicing", "gpu-h100-ts-01", "nlp", "kubeflow-user-gita", "gita-rlhf",
          55, 75, None, "notebook", milli=500),
    _Want("time-slicing", "gpu-h100-ts-01", "recsys", "kubeflow-user-hao", "hao-ctr",
          165, 60, None, "notebook", milli=250),
    # HAMi vGPU serving on gpu-h100-hami-01 (the annotation names the card)
    _Want("hami", "gpu-h100-hami-01", "nlp", "nlp-serving", "llm-serve-a", -25, 90, None,
          "inference", card=0, cores=50, mem_mib=40000, peak=85),
    _Want("hami", "gpu-h100-hami-01", "recsys", "recsys-serving", "ranker-b", -23, 60, None,
          "inference", card=0, cores=30, mem_mib=10000, peak=70),
    _Want("hami", "gpu-h100-hami-01", "vision", "vision-serving", "ocr", -21, 60, None,
          "inference", card=1, cores=30, mem_mib=10000, peak=75),
    _Want("hami", "gpu-h100-hami-01", "research", "research", "batch-embed", 45, 50, 190,
          "training", card=1, mem_mib=20000, peak=70),
    # whole cards on gpu-h100-01
    _Want("whole", "gpu-h100-01", "vision", "vision", "vit-finetune", -20, 80, 150,
          "training", peak=88),
    _Want("whole", "gpu-h100-01", "nlp", "nlp-serving", "llm-chat", -18, 100, None,
          "inference", peak=80),
)  # fmt: skip

MIG_CARDS = (
    (MigInstance(1, "3g.40gb"), MigInstance(2, "2g.20gb"), MigInstance(3, "1g.10gb"),
     MigInstance(4, "1g.10gb")),
    (MigInstance(1, "3g.40gb"), MigInstance(2, "3g.40gb")),
)  # fmt: skip


def _cards(namer: Namer) -> list[PhysicalCard]:
    cards = [
        PhysicalCard("gpu-a100-mig-01", i, namer.gpu_uuid(), *A100, mig=MIG_CARDS[i])
        for i in range(2)
    ]
    cards += [PhysicalCard("gpu-h100-ts-01", i, namer.gpu_uuid(), *H100) for i in range(4)]
    cards += [PhysicalCard("gpu-h100-hami-01", i, namer.gpu_uuid(), *H100) for i in range(2)]
    cards += [PhysicalCard("gpu-h100-01", i, namer.gpu_uuid(), *H100) for i in range(2)]
    return cards


def _nodes(cards: list[PhysicalCard], namer: Namer, created_ms: int) -> list[dict[str, object]]:
    product = {"gpu.product": "NVIDIA-H100-80GB-HBM3", "gpu.count": "2"}
    gfd = {f"nvidia.com/{k}": v for k, v in product.items()}
    mig_counts: dict[str, int] = {}
    for card in cards:
        for m in card.mig:
            mig_counts[m.profile] = mig_counts.get(m.profile, 0) + 1
    return [
        node_object(
            "gpu-a100-mig-01",
            labels={
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/mig.capable": "true",
                "nvidia.com/mig.config": "inference-mixed",
                "nvidia.com/mig.config.state": "success",
                "nvidia.com/mig.strategy": "mixed",
            },
            resources={f"nvidia.com/mig-{p}": str(n) for p, n in sorted(mig_counts.items())},
            created_ms=created_ms,
            uid=namer.uid(),
        ),
        node_object(
            "gpu-h100-ts-01",
            labels={
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED",
                "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.replicas": str(TS_REPLICAS),
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
            },
            resources={"nvidia.com/gpu": str(4 * TS_REPLICAS)},
            created_ms=created_ms,
            uid=namer.uid(),
        ),
        node_object(
            "gpu-h100-hami-01",
            labels={**gfd, "gpu": "on"},
            resources={"nvidia.com/gpu": "20"},
            created_ms=created_ms,
            uid=namer.uid(),
            annotations={
                "hami.io/node-handshake": "Requesting_2026.11.23 07:29:55",
                "hami.io/node-nvidia-register": "".join(
                    f"{c.uuid},10,{c.memory_mib},100,NVIDIA-{c.model},0,true:"
                    for c in cards
                    if c.node == "gpu-h100-hami-01"
                ),
            },
        ),
        node_object(
            "gpu-h100-01",
            labels=gfd,
            resources={"nvidia.com/gpu": "2"},
            created_ms=created_ms,
            uid=namer.uid(),
        ),
    ]


def _pod(want: _Want, namer: Namer) -> PodPlan:
    labels = {"team": want.team}
    if want.style == "notebook":
        owner = Owner("apps/v1", "StatefulSet", want.name, namer.uid())
        labels |= {"app": want.name, "notebook-name": want.name, "statefulset": want.name}
        name, image = f"{want.name}-0", NOTEBOOK_IMAGE
    elif want.style == "training":
        owner = Owner("batch/v1", "Job", want.name, namer.uid())
        labels |= {"batch.kubernetes.io/job-name": want.name, "job-name": want.name}
        name, image = f"{want.name}-{namer.suffix()}", f"registry.internal/{want.team}/job:1"
    else:
        rs = f"{want.name}-{namer.suffix(10)}"
        owner = Owner("apps/v1", "ReplicaSet", rs, namer.uid())
        labels |= {"app": want.name, "pod-template-hash": rs.rsplit("-", 1)[1]}
        name, image = f"{rs}-{namer.suffix()}", "nvcr.io/nvidia/tritonserver:24.10-py3"
    pod = PodPlan(
        name=name,
        namespace=want.namespace,
        team=want.team,
        gpus=1 if want.kind != "time-slicing" else want.milli * TS_REPLICAS // MILLI,
        owner=owner,
        labels=labels,
        image=image,
        container=want.name if want.style == "notebook" else "main",
    )
    if want.kind == "mig":
        profile = MIG_CARDS[want.card or 0][want.instance or 0].profile
        pod.gpu_limits = {f"nvidia.com/mig-{profile}": "1"}
    elif want.kind == "hami":
        pod.gpu_limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(want.mem_mib)}
        if want.cores:
            pod.gpu_limits["nvidia.com/gpucores"] = str(want.cores)
    pod.uid = namer.uid()
    return pod


def _share_series(
    rng: np.random.Generator, grid: Grid, want: _Want, ka: int, ke: int
) -> np.ndarray:
    """Utilisation in percent of the pod's own share (its demand, for a time-sliced
    notebook: percent of the card) over ticks [ka, ke)."""
    m = ke - ka
    quiet = np.zeros(m, dtype=bool)
    quiet[:4] = quiet[-4:] = True
    if want.style == "notebook":
        util, _ = notebook_block(rng, m=m, pauses=1, quiet=quiet, grid=grid)
    else:
        floor = 15.0 if want.style == "inference" else want.peak - 8
        act = Activity(floor=floor, peak=want.peak, peak_hour=float(rng.uniform(9, 16)))
        util, _ = inference_block(rng, act=act, cards=1, a=ka, b=ke, quiet=quiet, grid=grid)
    out: np.ndarray = util[0].astype(np.float64)
    return out


def build_shared(scenario: SharedScenario) -> SharedCluster:
    """The preset's cards, nodes and tenancies; deterministic in `scenario.seed`."""
    r_ids, r_fill = (
        np.random.default_rng(s) for s in np.random.SeedSequence(scenario.seed).spawn(2)
    )
    namer = Namer(r_ids)
    cards = _cards(namer)
    nodes = _nodes(cards, namer, scenario.data_start_ms - 40 * 86_400_000)
    grid = Grid(
        scenario.data_start_ms,
        int(scenario.period_s * 1000),
        (scenario.end_ms - scenario.data_start_ms) // int(scenario.period_s * 1000),
    )
    first_card: dict[str, int] = {}
    for c, physical in enumerate(cards):
        first_card.setdefault(physical.node, c)
    pods = []
    for want in WANTS:
        pod = _pod(want, namer)
        bound = scenario.start_ms + int(want.bind_min * MINUTE_MS)
        release = (
            None
            if want.release_min is None
            else scenario.start_ms + int(want.release_min * MINUTE_MS)
        )
        ending = Ending.COMPLETE if want.style == "training" else Ending.DELETE
        set_times(pod, bound_ms=bound, pull_s=want.pull_s, release_ms=release, ending=ending)
        pods.append(pod)
    fitted = fit_cards(
        [
            FitRequest(pod, want.node, 1, want.milli)
            for want, pod in zip(WANTS, pods, strict=True)
            if want.card is None
        ],
        {"gpu-h100-ts-01": 4, "gpu-h100-01": 2},
    )
    tenancies = []
    for want, pod in zip(WANTS, pods, strict=True):
        index = fitted[pod.uid][0] if want.card is None else want.card
        card = first_card[want.node] + index
        physical = cards[card]
        if want.kind == "mig":
            share = physical.mig[want.instance or 0].slices / physical.mig_slices
        elif want.kind == "hami":
            share = want.cores / 100 if want.cores else want.mem_mib / physical.memory_mib
            uuid = physical.uuid
            alloc = f"{uuid},NVIDIA,{want.mem_mib},{want.cores}:;"
            pod.annotations = {
                "hami.io/bind-phase": "success",
                "hami.io/bind-time": str(pod.bound_ms // 1000),
                "hami.io/vgpu-devices-allocated": alloc,
                "hami.io/vgpu-devices-to-allocate": ";",
                "hami.io/vgpu-node": want.node,
                "hami.io/vgpu-time": str(pod.bound_ms // 1000),
            }
        else:
            share = want.milli / MILLI
        k0, k1 = grid.tick(pod.bound_ms), grid.tick(pod.released_ms)
        ka = grid.tick(pod.started_ms + int(rng_s(r_fill, 20, 90)) * 1000)
        teardown = 0 if pod.released_ms is None else int(rng_s(r_fill, 60, 240))
        ke = k1 if pod.released_ms is None else grid.tick(pod.released_ms - teardown * 1000)
        g = _share_series(r_fill, grid, want, ka, ke)
        if want.kind == "time-slicing":
            card_pct = g  # demand on the whole card; contention is applied per card below
        elif want.kind == "mig":
            card_pct = g * share
        else:
            card_pct = within_share(g, share)
        act = np.zeros(k1 - k0)
        act[ka - k0 : ke - k0] = card_pct
        mem = want.mem_mib or int(r_fill.integers(6000, 30000))
        tenancies.append(
            Tenancy(
                pod=pod,
                card=card,
                share=share,
                kind=want.kind,
                k0=k0,
                act=act,
                mem_mib=mem,
                instance=want.instance if want.kind == "mig" else None,
            )
        )
    _time_slice(tenancies, grid.n)
    return SharedCluster(
        name=scenario.name,
        seed=scenario.seed,
        data_start_ms=scenario.data_start_ms,
        start_ms=scenario.start_ms,
        end_ms=scenario.end_ms,
        period_ms=grid.period_ms,
        cards=cards,
        tenancies=tenancies,
        nodes=nodes,
        teams=TEAMS,
    )


def within_share(g: np.ndarray, share: float) -> np.ndarray:
    """Whole percents of the card for utilisation `g` of a capped share (HAMi's gpucores,
    gpu-milli): rounded up so an active sample stays active, never above the share."""
    out: np.ndarray = np.where(
        g > 0, np.minimum(np.ceil(g * share), np.floor(share * 100 + 1e-9)), 0.0
    )
    return out


def rng_s(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def _time_slice(tenancies: list[Tenancy], n: int) -> None:
    """Tenants of a time-sliced card that compute at once share its time in proportion to
    their demand (whole percents, never above 100 together); each stays active."""
    by_card: dict[int, list[Tenancy]] = {}
    for x in tenancies:
        if x.kind == "time-slicing":
            by_card.setdefault(x.card, []).append(x)
    for group in by_card.values():
        demand = np.zeros((len(group), n))
        for j, x in enumerate(group):
            demand[j, x.k0 : x.k0 + x.act.size] = x.act
        total = demand.sum(axis=0)
        scale = np.where(total > 100, 100 / np.where(total > 0, total, 1), 1.0)
        for j, x in enumerate(group):
            got = np.floor(demand[j] * scale)[x.k0 : x.k0 + x.act.size]
            busy = x.act > 0
            if busy.any() and float((got[busy] / x.share).min()) <= IDLE_PCT:
                raise AssertionError(f"{x.pod.name}: contention made an active sample idle")
            x.act = got


def simulate_shared(out_dir: Path, *, scenario: SharedScenario) -> SharedResult:
    """Generate the shared `scenario` into `out_dir` (see `write_cluster` for the files)."""
    return write_cluster(out_dir, build_shared(scenario))
