"""The workloads of a scenario: serving Deployments, PyTorchJobs, notebooks, odd pods, batch Jobs.

Each builder returns unplaced `GangPlan`s whose pods carry the metadata the real controllers
put on them (owner references, well-known labels), so the pod JSON reads like a real cluster's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.simulate.plan import Activity, Ending, GangPlan, Namer, Owner, PodPlan, Profile
from auditor.simulate.scenario import TEAMS, Scenario

MINUTE = 60
HOUR = 3600

TRAINER_IMAGES = {
    "vision": "registry.internal/vision/trainer:2026.11.2",
    "nlp": "registry.internal/nlp/megatron:24.09-py3",
    "recsys": "registry.internal/recsys/torchrec:0.8.0-cu124",
    "research": "registry.internal/research/lab:2026.11",
}


@dataclass(frozen=True, slots=True)
class _Serving:
    team: str
    namespace: str
    name: str
    gpus: int
    image: str
    activity: Activity


SERVING = (
    _Serving(
        "recsys",
        "recsys-serving",
        "ranker",
        1,
        "nvcr.io/nvidia/tritonserver:24.10-py3",
        Activity(floor=11.0, peak=78.0, peak_hour=19.5, mem_mib=31000),
    ),
    _Serving(
        "nlp",
        "nlp-serving",
        "llm-chat",
        2,
        "vllm/vllm-openai:v0.6.3",
        Activity(floor=8.0, peak=86.0, peak_hour=15.0, mem_mib=74500),
    ),
    _Serving(
        "vision",
        "vision-serving",
        "image-embed",
        1,
        "registry.internal/vision/embed:3.2.0",
        Activity(floor=13.0, peak=62.0, peak_hour=12.5, mem_mib=21000),
    ),
)

# team, name, straggler, activity, start (fraction of the window), active (fraction)
DISTRIBUTED = (
    (
        "vision",
        "vit-h-pretrain",
        "throttled",
        Activity(
            level=66.0, stalls_per_hour=8.0, ckpt_interval_s=1200, ckpt_len_s=90, mem_mib=71000
        ),
        0.02,
        0.36,
    ),
    (
        "research",
        "moe-ablation",
        "lagging",
        Activity(
            level=86.0, stalls_per_hour=12.0, ckpt_interval_s=900, ckpt_len_s=60, mem_mib=64000
        ),
        0.10,
        0.30,
    ),
    (
        "nlp",
        "llm-pretrain-7b",
        "",
        Activity(
            level=91.0, stalls_per_hour=6.0, ckpt_interval_s=1800, ckpt_len_s=140, mem_mib=78200
        ),
        0.04,
        0.60,
    ),
    (
        "recsys",
        "dlrm-dist",
        "",
        Activity(
            level=55.0, stalls_per_hour=20.0, ckpt_interval_s=1500, ckpt_len_s=100, mem_mib=52000
        ),
        0.35,
        0.40,
    ),
)

NOTEBOOK_USERS = (
    ("alice", "research", "dev"),
    ("bob", "vision", "explore"),
    ("chen", "nlp", "finetune"),
    ("dana", "research", "eda"),
    ("eve", "recsys", "features"),
    ("farid", "vision", "seg"),
)

# team -> (job name base, lowest level, highest level)
FILLERS = {
    "vision": (("resnet50-ft", 80, 95), ("yolo-train", 72, 92), ("sam-distill", 70, 90)),
    "nlp": (("bert-distill", 75, 93), ("llama-sft", 82, 96), ("tokenizer-bench", 40, 60)),
    "recsys": (("dlrm-train", 35, 58), ("two-tower", 45, 65)),
    "research": (("ablation", 60, 92), ("diffusion-toy", 70, 95)),
}
FILLER_TEAM_WEIGHTS = np.array([0.32, 0.28, 0.2, 0.2])
FILLER_GPU_CHOICES = np.array([1, 1, 1, 1, 1, 1, 2, 2, 4, 4, 8])


def apart_from_checkpoints(seconds: int, activity: Activity) -> int:
    """A startup or teardown long enough never to pass for one of the gang's checkpoints.

    Whether the leading and trailing idle runs take part in the search for a regular series
    of gang-wide gaps is not settled by SPEC §3; keeping them over twice the length of any
    checkpoint makes the answer the same either way.
    """
    if activity.ckpt_interval_s <= 0:
        return seconds
    return max(seconds, int(np.ceil(3 * activity.ckpt_len_s)))


def _secs(rng: np.random.Generator, low: float, high: float) -> int:
    return int(rng.integers(int(low), int(high) + 1))


def job_pod(namer: Namer, *, team: str, namespace: str, job: str, gpus: int, image: str) -> PodPlan:
    """The pod of a plain Kubernetes Job (its own gang)."""
    job_uid = namer.uid()
    labels = {
        "batch.kubernetes.io/controller-uid": job_uid,
        "batch.kubernetes.io/job-name": job,
        "controller-uid": job_uid,
        "job-name": job,
        "team": team,
    }
    return PodPlan(
        name=f"{job}-{namer.suffix()}",
        namespace=namespace,
        team=team,
        gpus=gpus,
        owner=Owner("batch/v1", "Job", job, job_uid),
        labels=labels,
        image=image,
    )


def serving_pods(namer: Namer, serving: _Serving, replicas: int) -> tuple[str, list[PodPlan]]:
    """Replicas of one ReplicaSet of a Deployment; returns the pod-template hash too."""
    template_hash = namer.suffix(10)
    rs_name = f"{serving.name}-{template_hash}"
    owner = Owner("apps/v1", "ReplicaSet", rs_name, namer.uid())
    pods = []
    for _ in range(replicas):
        labels = {"app": serving.name, "pod-template-hash": template_hash, "team": serving.team}
        pods.append(
            PodPlan(
                name=f"{rs_name}-{namer.suffix()}",
                namespace=serving.namespace,
                team=serving.team,
                gpus=serving.gpus,
                owner=owner,
                labels=labels,
                image=serving.image,
                container=serving.name,
            )
        )
    return template_hash, pods


def build_serving(scenario: Scenario, rng: np.random.Generator, namer: Namer) -> list[GangPlan]:
    """Inference replicas bound days before the window, plus one rolling update."""
    replicas = [0] * len(SERVING)
    budget = scenario.inference_gpus
    while True:
        grown = False
        for i, serving in enumerate(SERVING):
            if serving.gpus <= budget and serving.gpus <= scenario.gpus_per_node:
                replicas[i] += 1
                budget -= serving.gpus
                grown = True
        if not grown:
            break
    gangs: list[GangPlan] = []
    rollout_at = scenario.start_ms + int(scenario.hours * 0.45 * HOUR) * 1000
    for i, serving in enumerate(SERVING):
        if not replicas[i]:
            continue
        _, pods = serving_pods(namer, serving, replicas[i])
        rolled = scenario.rollout and not gangs
        new_pods = serving_pods(namer, serving, replicas[i])[1] if rolled else []
        for r, pod in enumerate(pods):
            placed = scenario.data_start_ms - _secs(rng, 1 * 86400, 9 * 86400) * 1000
            pod.pull_s = _secs(rng, 20, 90)
            pod.restarts = int(rng.choice([0, 0, 0, 1, 2]))
            startup = pod.pull_s + _secs(rng, 60, 150)
            active_s: int | None = None
            if rolled:
                # maxSurge 1: replica r's successor starts r*4 min after the rollout begins;
                # the old pod is deleted a minute after its successor serves.
                new_pods[r].pull_s = _secs(rng, 20, 40)
                new_startup = new_pods[r].pull_s + _secs(rng, 60, 100)
                new_at = rollout_at + r * 4 * MINUTE * 1000
                gone = new_at + (new_startup + MINUTE) * 1000
                active_s = (gone - placed) // 1000 - startup
                pod.ending, pod.teardown_s = Ending.DELETE, 0
                gangs.append(
                    GangPlan(
                        key=f"{serving.namespace}/{new_pods[r].name}",
                        profile=Profile.INFERENCE,
                        team=serving.team,
                        pods=[new_pods[r]],
                        activity=serving.activity,
                        startup_s=new_startup,
                        active_s=None,
                        earliest_ms=new_at,
                        max_wait_s=2 * HOUR,
                        outage_safe=True,
                    )
                )
            else:
                pod.ending = Ending.OPEN
            gangs.append(
                GangPlan(
                    key=f"{serving.namespace}/{pod.name}",
                    profile=Profile.INFERENCE,
                    team=serving.team,
                    pods=[pod],
                    activity=serving.activity,
                    startup_s=startup,
                    active_s=active_s,
                    earliest_ms=placed,
                    max_wait_s=0,
                    outage_safe=True,
                )
            )
    # The old replicas first: they are placed at a fixed time, days ago.
    return sorted(gangs, key=lambda g: g.earliest_ms)


def build_distributed(scenario: Scenario, rng: np.random.Generator, namer: Namer) -> list[GangPlan]:
    """Kubeflow PyTorchJobs: a master and workers on distinct nodes, one gang."""
    gangs = []
    g = scenario.gpus_per_node
    for j in range(scenario.distributed_jobs):
        team, base, straggler, activity, start_frac, active_frac = DISTRIBUTED[j % 4]
        name = base if j < 4 else f"{base}-{j // 4 + 1}"
        per_pod = g if j % 4 == 2 else max(1, g // 2)
        n_pods = 4 if j % 4 == 3 and scenario.nodes >= 8 else 2
        active_s = int(scenario.hours * active_frac * HOUR)
        interval = min(activity.ckpt_interval_s, active_s / 6)
        activity = Activity(
            level=activity.level,
            stalls_per_hour=activity.stalls_per_hour,
            ckpt_interval_s=interval,
            ckpt_len_s=min(activity.ckpt_len_s, interval / 6),
            straggler=straggler,
            mem_mib=activity.mem_mib,
        )
        job_uid = namer.uid()
        owner = Owner("kubeflow.org/v1", "PyTorchJob", name, job_uid)
        pods = []
        for rank in range(n_pods):
            rtype, index = ("master", 0) if rank == 0 else ("worker", rank - 1)
            labels = {
                "team": team,
                "training.kubeflow.org/job-name": name,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-index": str(index),
                "training.kubeflow.org/replica-type": rtype,
            }
            if rank == 0:
                labels["training.kubeflow.org/job-role"] = "master"
            pods.append(
                PodPlan(
                    name=f"{name}-{rtype}-{index}",
                    namespace=team,
                    team=team,
                    gpus=per_pod,
                    owner=owner,
                    labels=labels,
                    image=TRAINER_IMAGES[team],
                    container="pytorch",
                    rank=rank,
                    bind_offset_s=0 if rank == 0 else _secs(rng, 1, 12),
                    queued_s=_secs(rng, 2, 20),
                    pull_s=_secs(rng, 90, 300),
                    teardown_s=_secs(rng, 30, 120),
                    init_container="" if rank == 0 else "init-pytorch",
                )
            )
        startup = max(p.bind_offset_s + p.pull_s for p in pods) + _secs(rng, 60, 180)
        startup = apart_from_checkpoints(startup, activity)
        for pod in pods:
            pod.teardown_s = apart_from_checkpoints(pod.teardown_s, activity)
        gangs.append(
            GangPlan(
                key=f"{team}/PyTorchJob/{name}",
                profile=Profile.DISTRIBUTED,
                team=team,
                pods=pods,
                activity=activity,
                startup_s=startup,
                active_s=active_s,
                earliest_ms=scenario.start_ms + int(scenario.hours * start_frac * HOUR) * 1000,
                max_wait_s=int(scenario.hours * HOUR),
            )
        )
    return gangs


def build_notebooks(scenario: Scenario, rng: np.random.Generator, namer: Namer) -> list[GangPlan]:
    """Kubeflow notebook servers: a StatefulSet pod each, used in sessions, idle for hours."""
    gangs = []
    n = scenario.notebooks
    for i in range(n):
        user, team, topic = NOTEBOOK_USERS[i % len(NOTEBOOK_USERS)]
        name = f"{user}-{topic}" if i < len(NOTEBOOK_USERS) else f"{user}-{topic}-{i}"
        namespace = f"kubeflow-user-{user}"
        revision = f"{name}-{namer.suffix(10)}"
        labels = {
            "app": name,
            "controller-revision-hash": revision,
            "notebook-name": name,
            "statefulset": name,
            "statefulset.kubernetes.io/pod-name": f"{name}-0",
            "team": team,
        }
        pod = PodPlan(
            name=f"{name}-0",
            namespace=namespace,
            team=team,
            gpus=1,
            owner=Owner("apps/v1", "StatefulSet", name, namer.uid()),
            labels=labels,
            image="kubeflownotebookswg/jupyter-pytorch-cuda-full:v1.9.0",
            container=name,
            queued_s=_secs(rng, 1, 5),
            pull_s=_secs(rng, 40, 150),
            grace_s=_secs(rng, 2, 10),
        )
        kind = i % 3
        absence = _secs(rng, 40 * MINUTE, 50 * MINUTE) if kind == 0 else 0
        if kind == 0:  # culled by the idle culler after more than an hour idle
            pod.ending, pod.teardown_s = Ending.DELETE, _secs(rng, 70 * MINUTE, 100 * MINUTE)
        elif kind == 1:  # the user stops the server a few minutes after the last cell
            pod.ending, pod.teardown_s = Ending.DELETE, _secs(rng, 3 * MINUTE, 8 * MINUTE)
        else:
            pod.ending = Ending.OPEN
        startup = pod.pull_s + absence + _secs(rng, 20, 60)
        active_s: int | None = None
        if kind != 2:  # closed within the window: sessions fill what the rest leaves
            room = int(scenario.hours * 0.8 * HOUR) - startup - pod.teardown_s
            active_s = max(20 * MINUTE, min(room, int(scenario.hours * 0.4 * HOUR)))
        activity = Activity(
            level=60.0,
            stalls_per_hour=6.0,
            first_absence_s=absence,
            # Leading and trailing runs of 15 s-15 min count as gang-wide gaps when a series
            # is sought; with the pauses they stay fewer than three, so never a series.
            pauses=(2, 0, 1)[kind],
            mem_mib=_secs(rng, 6000, 30000),
        )
        start_frac = 0.02 + 0.5 * i / max(n, 1)
        gangs.append(
            GangPlan(
                key=f"{namespace}/Notebook/{name}",
                profile=Profile.NOTEBOOK,
                team=team,
                pods=[pod],
                activity=activity,
                startup_s=startup,
                active_s=active_s,
                earliest_ms=scenario.start_ms + int(scenario.hours * start_frac * HOUR) * 1000,
                max_wait_s=int(scenario.hours * 0.4 * HOUR),
            )
        )
    return gangs


def build_special(scenario: Scenario, rng: np.random.Generator, namer: Namer) -> list[GangPlan]:
    """A pod that never touches its GPU, a startup past the cap, a sidecar that lingers."""
    if not scenario.special_pods:
        return []
    hours = scenario.hours

    def at(frac: float) -> int:
        return scenario.start_ms + int(hours * frac * HOUR) * 1000

    unused = job_pod(
        namer,
        team="research",
        namespace="research",
        job="dataset-dedup",
        gpus=1,
        image="registry.internal/research/dedup:0.4.1",
    )
    slow = job_pod(
        namer,
        team="nlp",
        namespace="nlp",
        job="llm-eval-70b",
        gpus=min(2, scenario.gpus_per_node),
        image=TRAINER_IMAGES["nlp"],
    )
    slow.pull_s, slow.teardown_s = 27 * MINUTE + _secs(rng, 0, 60), _secs(rng, 60, 120)
    trial = job_pod(
        namer,
        team="research",
        namespace="research",
        job="hpo-trial-042",
        gpus=1,
        image=TRAINER_IMAGES["research"],
    )
    trial.pull_s, trial.teardown_s = _secs(rng, 60, 150), 25 * MINUTE
    trial.ending, trial.sidecar = Ending.SIDECAR, "istio-proxy"
    trial.labels["security.istio.io/tlsMode"] = "istio"
    trial.annotations["sidecar.istio.io/status"] = '{"containers":["istio-proxy"]}'
    return [
        GangPlan(
            key="research/Job/dataset-dedup",
            profile=Profile.UNUSED,
            team="research",
            pods=[unused],
            activity=Activity(),
            startup_s=0,
            active_s=max(45 * MINUTE, int(hours * 0.25 * HOUR)),
            earliest_ms=at(0.08),
            max_wait_s=int(hours * 0.4 * HOUR),
        ),
        GangPlan(
            key="nlp/Job/llm-eval-70b",
            profile=Profile.TRAINING,
            team="nlp",
            pods=[slow],
            activity=Activity(level=80.0, stalls_per_hour=10.0, mem_mib=77000),
            startup_s=45 * MINUTE,
            active_s=max(40 * MINUTE, int(hours * 0.15 * HOUR)),
            earliest_ms=at(0.25),
            max_wait_s=int(hours * 0.4 * HOUR),
        ),
        GangPlan(
            key="research/Job/hpo-trial-042",
            profile=Profile.TRAINING,
            team="research",
            pods=[trial],
            activity=Activity(level=88.0, stalls_per_hour=15.0, mem_mib=18000),
            startup_s=trial.pull_s + _secs(rng, 30, 90),
            active_s=max(40 * MINUTE, int(hours * 0.18 * HOUR)),
            earliest_ms=at(0.45),
            max_wait_s=int(hours * 0.4 * HOUR),
        ),
    ]


def build_pending(scenario: Scenario, namer: Namer) -> list[PodPlan]:
    """A pod the scheduler could not place: it holds nothing and must count for nothing."""
    pod = job_pod(
        namer,
        team="nlp",
        namespace="nlp",
        job="mixtral-sft",
        gpus=scenario.gpus_per_node,
        image=TRAINER_IMAGES["nlp"],
    )
    pod.created_ms = scenario.end_ms - 40 * MINUTE * 1000
    return [pod]


def build_fillers(
    scenario: Scenario, rng: np.random.Generator, namer: Namer, *, target_gpu_s: float
) -> list[GangPlan]:
    """Batch training Jobs arriving through the day, enough to aim at `target_gpu_s`."""
    gangs: list[GangPlan] = []
    first = scenario.data_start_ms - 90 * MINUTE * 1000
    last = scenario.end_ms - HOUR * 1000
    sizes = FILLER_GPU_CHOICES
    choices = sizes[sizes <= max(1, scenario.gpus_per_node // 2)]
    planned = 0.0
    while planned < target_gpu_s:
        team = TEAMS[int(rng.choice(len(TEAMS), p=FILLER_TEAM_WEIGHTS))]
        base, low, high = FILLERS[team][int(rng.integers(len(FILLERS[team])))]
        gpus = int(rng.choice(choices))
        job = f"{base}-{namer.suffix(4)}"
        pod = job_pod(
            namer, team=team, namespace=team, job=job, gpus=gpus, image=TRAINER_IMAGES[team]
        )
        pod.pull_s, pod.teardown_s = _secs(rng, 30, 240), _secs(rng, 20, 150)
        pod.queued_s = _secs(rng, 1, 10)
        if rng.random() < 0.15:
            pod.ending = Ending.FAILED
        if rng.random() < 0.3:
            pod.ttl_s = HOUR
        active = int(np.clip(rng.lognormal(np.log(70 * MINUTE), 0.7), 20 * MINUTE, 5 * HOUR))
        ckpt = active >= 100 * MINUTE and rng.random() < 0.35
        activity = Activity(
            level=float(rng.uniform(low, high)),
            stalls_per_hour=float(rng.uniform(4, 30)),
            ckpt_interval_s=float(rng.uniform(900, 1500)) if ckpt else 0.0,
            ckpt_len_s=float(rng.uniform(30, 90)) if ckpt else 0.0,
            mem_mib=_secs(rng, 18000, 79000),
        )
        startup = apart_from_checkpoints(pod.pull_s + _secs(rng, 30, 200), activity)
        pod.teardown_s = apart_from_checkpoints(pod.teardown_s, activity)
        arrival = first + int(rng.integers(0, (last - first) // 1000)) * 1000
        gangs.append(
            GangPlan(
                key=f"{team}/Job/{job}",
                profile=Profile.TRAINING,
                team=team,
                pods=[pod],
                activity=activity,
                startup_s=startup,
                active_s=active,
                earliest_ms=arrival,
                required=False,
                outage_safe=not ckpt,
            )
        )
        planned += gpus * (startup + active + pod.teardown_s)
    return sorted(gangs, key=lambda g: (g.earliest_ms, g.key))
