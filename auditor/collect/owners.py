"""Which team, job, rank and gang a pod belongs to: the owner rules of the operators
(SPEC §2.2).

A pod is read into a `PodView` (labels, annotations, controller owner, `RANK` value), and
`workload_of` tries the rules of `RULES` on it: JobSet and TrainJob, LeaderWorkerSet, the
Kubeflow training operators and MPIJob, Volcano, KubeRay, Kubeflow Notebooks, batch Jobs,
Deployments and StatefulSets; then any other owner, else the pod itself. Rules are tried
in order, most specific first, because several controllers build on others (a JobSet's
pods are owned by a batch Job, a LeaderWorkerSet's by a StatefulSet, an MPIJob launcher by
a batch Job). `team_of` says whose the pod is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from auditor.collect.pod_fields import list_at
from auditor.errors import PodFieldError
from auditor.model import WorkloadKind, kubeflow_replica, label_int, pod_meta
from auditor.settings import TeamRules


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str
    name: str
    api_version: str = ""


@dataclass(frozen=True, slots=True)
class PodView:
    """What the job rules read of a pod."""

    uid: str
    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner: Owner | None = None
    env_rank: int | None = None
    """A literal `RANK` environment value, as the PyTorch and Volcano operators set it."""

    def meta(self, key: str) -> str | None:
        """A label, else the annotation of the same key (controllers set both, or either)."""
        return pod_meta(self.labels, self.annotations, key)

    def meta_int(self, key: str) -> int | None:
        return label_int(self.meta(key))


@dataclass(frozen=True, slots=True)
class Workload:
    job: str
    job_kind: str
    workload: WorkloadKind
    gang: str
    rank: int | None = None


def team_of(pod: PodView, teams: TeamRules) -> str:
    """The team label, else the team annotation, else the namespace's mapped team, else it."""
    return (
        pod.labels.get(teams.label)
        or pod.annotations.get(teams.annotation)
        or teams.namespace_teams.get(pod.namespace)
        or pod.namespace
    )


def workload_of(pod: PodView) -> Workload:
    """Which job the pod belongs to, what it is for, its rank and its gang: the first rule
    in `RULES` that recognises the pod, else the owner (any kind), else the pod itself."""
    for rule in RULES:
        found = rule(pod)
        if found is not None:
            return found
    return _by_owner(pod)


def _own_gang(pod: PodView) -> str:
    return f"pod/{pod.uid}"


def _job_gang(pod: PodView, job: str) -> str:
    return f"{pod.namespace}/{job}"


def _jobset(pod: PodView) -> Workload | None:
    """JobSet, and Kubeflow Trainer v2 TrainJobs (a JobSet named after the TrainJob).

    Rank: the pod's completion index within its Job (exact for the usual one-Job JobSet, and
    for a TrainJob, whose nodes are the completions of one Job); a JobSet of several Jobs
    repeats it per Job, because the pods-per-Job that a global rank needs is on the Job, not
    on the pod. Without a completion index, the Job's global index (one pod per Job).
    """
    name = pod.meta("jobset.sigs.k8s.io/jobset-name")
    if name is None:
        return None
    kind = "JobSet"
    if any(k.startswith("trainer.kubeflow.org/") for k in pod.labels):
        kind = "TrainJob"
        name = pod.meta("trainer.kubeflow.org/trainjob-name") or name
    rank = pod.meta_int("batch.kubernetes.io/job-completion-index")
    if rank is None:
        rank = pod.meta_int("jobset.sigs.k8s.io/job-global-index")
    if rank is None:
        rank = pod.meta_int("jobset.sigs.k8s.io/job-index")
    job = f"{kind}/{name}"
    return Workload(job, kind, WorkloadKind.TRAINING, _job_gang(pod, job), rank)


def _leader_worker_set(pod: PodView) -> Workload | None:
    """LeaderWorkerSet: one group (a leader and its workers) serves one model replica."""
    name = pod.meta("leaderworkerset.sigs.k8s.io/name")
    if name is None:
        return None
    job = f"LeaderWorkerSet/{name}"
    group = pod.meta("leaderworkerset.sigs.k8s.io/group-index") or "0"
    return Workload(
        job,
        "LeaderWorkerSet",
        WorkloadKind.INFERENCE,
        f"{_job_gang(pod, job)}/{group}",
        pod.meta_int("leaderworkerset.sigs.k8s.io/worker-index"),
    )


KUBEFLOW_KINDS = frozenset(
    {"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob"}
)
_OPERATOR_KINDS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "mpi-operator": "MPIJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
    "mxjob-controller": "MXJob",
}
_LEGACY_NAME_LABELS = {
    "pytorch-job-name": "PyTorchJob",
    "tf-job-name": "TFJob",
    "mpi-job-name": "MPIJob",
}


def _kubeflow_training(pod: PodView) -> Workload | None:
    """Kubeflow training-operator v1 jobs and MPIJob (current and pre-1.0 label sets).

    Rank: a PyTorchJob's is its `RANK` environment value where the operator wrote one (it
    knows whether the job has a master), else 0 for the master; a worker without one is
    left unranked here, as only the job's other pods tell whether a master exists: the store
    settles it (`auditor.model.pytorch_worker_ranks`). The others' rank is the replica index
    (an MPIJob launcher has none).
    """
    name = pod.meta("training.kubeflow.org/job-name")
    kind: str | None = None
    if name is None:
        for label, legacy_kind in _LEGACY_NAME_LABELS.items():
            if pod.meta(label):
                name, kind = pod.meta(label), legacy_kind
                break
    if name is None and pod.owner is not None and pod.owner.kind in KUBEFLOW_KINDS:
        name = pod.owner.name
    if name is None:
        return None
    if pod.owner is not None and pod.owner.kind in KUBEFLOW_KINDS:
        kind = pod.owner.kind
    if kind is None:
        operator = pod.meta("training.kubeflow.org/operator-name") or ""
        kind = _OPERATOR_KINDS.get(operator)
    role, index = kubeflow_replica(pod.labels, pod.annotations)
    if kind is None:
        kind = "MPIJob" if role == "launcher" else "KubeflowJob"
    rank = index
    if kind == "PyTorchJob":
        if pod.env_rank is not None:
            rank = pod.env_rank
        elif role == "master":
            rank = 0
        elif role == "worker":
            rank = None
    job = f"{kind}/{name}"
    return Workload(job, kind, WorkloadKind.TRAINING, _job_gang(pod, job), rank)


def _volcano(pod: PodView) -> Workload | None:
    """Volcano Job (`batch.volcano.sh`), named `VolcanoJob` to keep it apart from batch Jobs.

    Rank: the `RANK` environment value where Volcano's pytorch plugin wrote one, else the
    task index (label/annotation, else the `<job>-<task>-<index>` pod name).
    """
    name = pod.meta("volcano.sh/job-name")
    owner = pod.owner
    if name is None and owner is not None and owner.api_version.startswith("batch.volcano.sh/"):
        name = owner.name
    if name is None:
        return None
    rank = pod.env_rank
    if rank is None:
        rank = pod.meta_int("volcano.sh/task-index")
    task = pod.meta("volcano.sh/task-spec")
    if rank is None and task is not None:
        rank = label_int(_strip_prefix(pod.name, f"{name}-{task}-"))
    job = f"VolcanoJob/{name}"
    return Workload(job, "VolcanoJob", WorkloadKind.TRAINING, _job_gang(pod, job), rank)


def _kuberay(pod: PodView) -> Workload | None:
    """KubeRay: a Ray cluster's head and workers, possibly made for a RayJob or RayService.

    The gang is the Ray cluster. A RayService's pods are serving replicas: independent,
    each its own gang, like a Deployment's. Ray has no stable per-pod rank: none is given.
    """
    cluster = pod.meta("ray.io/cluster")
    if cluster is None:
        return None
    origin = pod.meta("ray.io/originated-from-crd")
    origin_name = pod.meta("ray.io/originated-from-cr-name")
    cluster_gang = _job_gang(pod, f"RayCluster/{cluster}")
    if origin == "RayService" and origin_name:
        return Workload(
            f"RayService/{origin_name}", "RayService", WorkloadKind.INFERENCE, _own_gang(pod)
        )
    if origin == "RayJob" and origin_name:
        return Workload(f"RayJob/{origin_name}", "RayJob", WorkloadKind.TRAINING, cluster_gang)
    return Workload(f"RayCluster/{cluster}", "RayCluster", WorkloadKind.TRAINING, cluster_gang)


def _notebook(pod: PodView) -> Workload | None:
    """Kubeflow Notebook: a one-pod StatefulSet labelled `notebook-name`."""
    name = pod.meta("notebook-name")
    if name is None or (pod.owner is not None and pod.owner.kind != "StatefulSet"):
        return None
    return Workload(f"Notebook/{name}", "Notebook", WorkloadKind.NOTEBOOK, _own_gang(pod))


def _batch_job(pod: PodView) -> Workload | None:
    """Kubernetes Job: each pod is independent; rank is the Indexed Job completion index."""
    owner = pod.owner
    if owner is not None and owner.kind == "Job":
        name: str | None = owner.name
    elif owner is None:  # orphaned by `kubectl delete job --cascade=orphan`
        name = pod.meta("batch.kubernetes.io/job-name") or pod.meta("job-name")
    else:
        name = None
    if name is None:
        return None
    return Workload(
        f"Job/{name}",
        "Job",
        WorkloadKind.BATCH,
        _own_gang(pod),
        pod.meta_int("batch.kubernetes.io/job-completion-index"),
    )


def _deployment(pod: PodView) -> Workload | None:
    """A Deployment's ReplicaSet is `<deployment>-<pod-template-hash>`."""
    owner = pod.owner
    if owner is None or owner.kind != "ReplicaSet":
        return None
    template_hash = pod.labels.get("pod-template-hash")
    deployment = _strip_suffix(owner.name, f"-{template_hash}") if template_hash else None
    job = f"Deployment/{deployment}" if deployment else f"ReplicaSet/{owner.name}"
    return Workload(job, job.split("/", 1)[0], WorkloadKind.INFERENCE, _own_gang(pod))


def _stateful_set(pod: PodView) -> Workload | None:
    """StatefulSet replicas: rank from `apps.kubernetes.io/pod-index`, else the name's ordinal."""
    owner = pod.owner
    if owner is None or owner.kind != "StatefulSet":
        return None
    rank = pod.meta_int("apps.kubernetes.io/pod-index")
    if rank is None:
        rank = label_int(_strip_prefix(pod.name, f"{owner.name}-"))
    return Workload(
        f"StatefulSet/{owner.name}", "StatefulSet", WorkloadKind.INFERENCE, _own_gang(pod), rank
    )


def _by_owner(pod: PodView) -> Workload:
    """Any other owner (forward compatible): its Kind/name, independent; else the pod."""
    if pod.owner is None:
        return Workload(f"Pod/{pod.name}", "Pod", WorkloadKind.OTHER, _own_gang(pod))
    return Workload(
        f"{pod.owner.kind}/{pod.owner.name}", pod.owner.kind, WorkloadKind.OTHER, _own_gang(pod)
    )


RULES: tuple[Callable[[PodView], Workload | None], ...] = (
    _jobset,
    _leader_worker_set,
    _kubeflow_training,
    _volcano,
    _kuberay,
    _notebook,
    _batch_job,
    _deployment,
    _stateful_set,
)
"""Tried in order; the first that recognises a pod decides its job."""


# ---------------------------------------------------------------------------------------------
# what the rules read of a pod's JSON


def controller_owner(meta: Mapping[str, Any]) -> Owner | None:
    """The owner reference marked `controller: true`, else the first one."""
    refs = list_at(meta, "ownerReferences", "metadata.ownerReferences")
    owners: list[tuple[bool, Owner]] = []
    for i, ref in enumerate(refs):
        if not isinstance(ref, Mapping):
            raise PodFieldError(
                "an owner reference must be a JSON object", field=f"metadata.ownerReferences[{i}]"
            )
        kind, name = ref.get("kind"), ref.get("name")
        if not (isinstance(kind, str) and kind and isinstance(name, str) and name):
            raise PodFieldError(
                "an owner reference needs a kind and a name", field=f"metadata.ownerReferences[{i}]"
            )
        api = ref.get("apiVersion")
        owners.append(
            (ref.get("controller") is True, Owner(kind, name, api if isinstance(api, str) else ""))
        )
    for is_controller, owner in owners:
        if is_controller:
            return owner
    return owners[0][1] if owners else None


def env_rank(spec: Mapping[str, Any]) -> int | None:
    """A literal integer `RANK` environment value of the first container that has one."""
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else []:
        env = c.get("env") if isinstance(c, Mapping) else None
        for var in env if isinstance(env, list) else []:
            if isinstance(var, Mapping) and var.get("name") == "RANK":
                rank = label_int(var.get("value"))
                if rank is not None:
                    return rank
    return None


def _strip_prefix(text: str, prefix: str) -> str | None:
    return text[len(prefix) :] if text.startswith(prefix) and len(text) > len(prefix) else None


def _strip_suffix(text: str, suffix: str) -> str | None:
    return text[: -len(suffix)] if text.endswith(suffix) and len(text) > len(suffix) else None
