"""One pod, as the Kubernetes API writes it in JSON, into a `PodRecord` (SPEC §2.2).

Pure functions on plain dicts in the API's JSON shape (camelCase keys, RFC 3339 times), so
the kubectl-file reader and the live watcher share them. This module owns the rules that
say how many GPUs a pod holds, when it held them, and which team, job, rank and gang it
belongs to.

GPUs: the effective request of each GPU resource (`nvidia.com/gpu`, every
`nvidia.com/mig-*`, and the shared-GPU names of `auditor.collect.shares`), as the scheduler
counts it: the larger of the app containers' sum (plus sidecars) and the peak of the init
containers. A container's count is its limit, else its request. `shares` turns these and
the pod's annotations into the units held and the share of a card asked for (SPEC §7).

Times: `created` is `metadata.creationTimestamp`; `bound` the `PodScheduled=True`
condition (for a pod placed on a node without the scheduler, the earliest condition);
`started` the earliest container start (current or previous run); `finished` the last
container's `finishedAt`, once every container has terminated for good (the pod is
Succeeded/Failed, cannot restart, or is being deleted); `deleted` is
`metadata.deletionTimestamp`, the time the kubelet is told to have stopped the pod by.
A watch `DELETED` event without one (the API server removes a pod that never ran or had
already finished at once) is dated by the caller's `event_ms`, else by `finished`, else
left unknown: a kubectl file carries no event times, and such a pod held no GPU after it
finished anyway.

Jobs: see `workload_of`. Rules are tried in order, most specific first, because several
controllers build on others (a JobSet's pods are owned by a batch Job, a LeaderWorkerSet's
by a StatefulSet, an MPIJob launcher by a batch Job).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from auditor import limits
from auditor.collect import shares
from auditor.errors import PodFieldError, shown
from auditor.model import PodRecord, WorkloadKind, kubeflow_replica, pod_meta
from auditor.settings import Sharing, TeamRules

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
"""Annotations not kept on a record: a copy of the whole manifest, large and of no use here."""

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


# ---------------------------------------------------------------------------------------------
# the record


def pod_record(
    pod: Mapping[str, Any],
    *,
    teams: TeamRules,
    event_ms: int | None = None,
    deleted: bool = False,
    adjusted: list[str] | None = None,
    sharing: Sharing | None = None,
) -> PodRecord | None:
    """The record of one observation of `pod`, or None when the pod holds no GPU (a Run:ai
    reservation pod is kept, holding none: SPEC §7). `sharing`: the config's extra names.

    `deleted` says the observation is a watch `DELETED` event; `event_ms` is when the caller
    saw that event, used as the deletion time when the pod carries no `deletionTimestamp`.
    Raises `PodFieldError` (an `InputError`) naming the field that cannot be read or stored
    (a UID, name or namespace too long or holding a NUL, a phase that is not a string, a GPU
    count out of range). Derived text that can be fitted is (`auditor.limits.fit_text`): a
    team taken from a 300-character annotation is cut, with a digest, rather than losing the
    pod's GPU-hours; the names of fields so fitted are appended to `adjusted` when given.
    """
    if not isinstance(pod, Mapping):
        raise PodFieldError("a pod must be a JSON object", field="(pod)")
    meta = _obj(pod, "metadata", "metadata")
    spec = _obj(pod, "spec", "spec")
    status = _obj(pod, "status", "status", required=False)

    uid = _required_str(meta, "uid", "metadata.uid", limit=limits.UID_MAX)
    name = _required_str(meta, "name", "metadata.name", limit=limits.NAME_MAX)
    namespace = _required_str(meta, "namespace", "metadata.namespace", limit=limits.NAME_MAX)

    annotations = _str_map(meta, "annotations", "metadata.annotations")
    ask = pod_gpu_ask(spec, namespace=namespace, annotations=annotations, sharing=sharing)
    if ask.count == 0 and ask.share_kind != shares.KIND_RESERVATION:
        return None
    shares.hami_devices(annotations)  # the cards it names must be readable
    gpu_count, gpu_resource = ask.count, ask.resource

    labels = _str_map(meta, "labels", "metadata.labels")
    phase = status.get("phase")
    if phase is not None and not isinstance(phase, str):
        raise PodFieldError(f"must be a string, got {type(phase).__name__}", field="status.phase")
    node = spec.get("nodeName")
    if node is not None and not isinstance(node, str):
        raise PodFieldError(f"must be a string, got {type(node).__name__}", field="spec.nodeName")
    if node and (len(node) > limits.NAME_MAX or not limits.is_clean(node)):
        raise PodFieldError("not a node name", field="spec.nodeName", value=node)
    times = pod_times(meta=meta, spec=spec, status=status, deleted=deleted, event_ms=event_ms)
    view = PodView(
        uid=uid,
        name=name,
        namespace=namespace,
        labels=labels,
        annotations=annotations,
        owner=_controller_owner(meta),
        env_rank=_env_rank(spec),
    )
    work = workload_of(view)
    team = team_of(view, teams)
    fitted = {
        "team": limits.fit_text(team, limits.NAME_MAX),
        "job": limits.fit_text(work.job, limits.JOB_MAX),
        "job_kind": limits.fit_text(work.job_kind, limits.KIND_MAX),
        "gang": limits.fit_text(work.gang, limits.GANG_MAX),
        "gpu_resource": limits.fit_text(gpu_resource, limits.RESOURCE_MAX),
    }
    if adjusted is not None:
        raw = {"team": team, "job": work.job, "job_kind": work.job_kind, "gang": work.gang}
        raw["gpu_resource"] = gpu_resource
        adjusted.extend(k for k, v in fitted.items() if v != raw[k])
    version = _optional_str(meta, "resourceVersion")
    return PodRecord(
        uid=uid,
        namespace=namespace,
        name=name,
        node=node or None,
        team=fitted["team"],
        job=fitted["job"],
        job_kind=fitted["job_kind"],
        workload=work.workload,
        gang=fitted["gang"],
        gpu_count=gpu_count,
        gpu_resource=fitted["gpu_resource"],
        rank=work.rank,
        created_ms=times.created_ms,
        bound_ms=times.bound_ms,
        started_ms=times.started_ms,
        finished_ms=times.finished_ms,
        deleted_ms=times.deleted_ms,
        phase=limits.fit_text(phase, limits.PHASE_MAX) if phase else None,
        resource_version=(
            version
            if version and len(version) <= limits.VERSION_MAX and limits.is_clean(version)
            else None
        ),
        labels={limits.clean_text(k): limits.clean_text(v) for k, v in labels.items()},
        annotations={
            limits.clean_text(k): limits.clean_text(v)
            for k, v in annotations.items()
            if k not in DROPPED_ANNOTATIONS
        },
        share_kind=ask.share_kind,
        gpu_share=ask.share,
        gpu_mem_mib=ask.mem_mib,
        gpu_mem_share=ask.mem_share,
    )


# ---------------------------------------------------------------------------------------------
# GPUs


def gpu_request(spec: Mapping[str, Any], sharing: Sharing | None = None) -> tuple[int, str]:
    """(GPU units the pod's resources hold, resource name); (0, "nvidia.com/gpu") for none.

    Per resource, the effective request is the scheduler's: max(peak of init containers,
    sum of app containers), where sidecars (init containers with `restartPolicy: Always`)
    count alongside everything started after them. A pod asking for several GPU resources
    (two MIG profiles) reports their total and the names joined by commas.
    """
    ask = pod_gpu_ask(spec, namespace="", annotations={}, sharing=sharing)
    return ask.count, ask.resource


def pod_gpu_ask(
    spec: Mapping[str, Any],
    *,
    namespace: str,
    annotations: Mapping[str, str],
    sharing: Sharing | None = None,
) -> shares.GpuAsk:
    """What the pod holds of GPUs and what share of a card it asks for (`shares.gpu_ask`)."""
    app = _container_requests(spec, "containers", sharing)
    init = _container_requests(spec, "initContainers", sharing)
    counts = [(c, always) for c, _, always in app]
    init_counts = [(c, always) for c, _, always in init]
    per_device: dict[str, float] = {}
    for _, values, _ in (*app, *init):
        for name, value in values.items():
            per_device[name] = max(per_device.get(name, 0.0), value)
    totals = shares.container_totals(counts, init_counts)
    return shares.gpu_ask(
        totals, per_device, namespace=namespace, annotations=annotations, sharing=sharing
    )


def _container_requests(
    spec: Mapping[str, Any], key: str, sharing: Sharing | None
) -> list[tuple[dict[str, float], dict[str, float], bool]]:
    """Each container's GPU counts by resource, its HAMi per-vGPU values, and whether it is
    a sidecar."""
    containers = spec.get(key)
    if containers is None:
        return []
    if not isinstance(containers, list):
        raise PodFieldError("must be a list of containers", field=f"spec.{key}")
    out: list[tuple[dict[str, float], dict[str, float], bool]] = []
    for i, c in enumerate(containers):
        where = f"spec.{key}[{i}]"
        if not isinstance(c, Mapping):
            raise PodFieldError("a container must be a JSON object", field=where)
        resources = _obj(c, "resources", f"{where}.resources", required=False)
        counts: dict[str, float] = {}
        per_device: dict[str, float] = {}
        for section in ("requests", "limits"):  # limits win: read them last
            values = _obj(resources, section, f"{where}.resources.{section}", required=False)
            for res, qty in values.items():
                field = f"{where}.resources.{section}.{res}"
                if res in shares.PER_DEVICE_RESOURCES:
                    per_device[res] = shares.per_device_value(res, qty, field)
                elif res == shares.ALIYUN_MEM:
                    counts[res] = shares.quantity(qty, field)
                elif shares.is_count_resource(res, sharing):
                    counts[res] = _gpu_quantity(qty, field)
        out.append(
            (counts, per_device, key == "initContainers" and c.get("restartPolicy") == "Always")
        )
    return out


_INT_QUANTITY = re.compile(r"\+?[0-9]+")


def _gpu_quantity(qty: object, field: str) -> int:
    """A GPU count: a whole number (the API writes quantities as strings, "2"), at most
    `limits.MAX_GPUS_PER_POD`."""
    count: int | None = None
    if isinstance(qty, int) and not isinstance(qty, bool) and qty >= 0:
        count = qty
    elif isinstance(qty, str) and len(qty) <= 32 and _INT_QUANTITY.fullmatch(qty.strip()):
        count = int(qty.strip())
    if count is None:
        raise PodFieldError(
            f"GPU quantity must be a whole number, got {shown(qty)}", field=field, value=qty
        )
    if count > limits.MAX_GPUS_PER_POD:
        raise PodFieldError(
            f"GPU quantity {count:.3g} is more than any node has", field=field, value=qty
        )
    return count


# ---------------------------------------------------------------------------------------------
# times


@dataclass(frozen=True, slots=True)
class PodTimes:
    created_ms: int | None = None
    bound_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    deleted_ms: int | None = None


def pod_times(
    *,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    deleted: bool = False,
    event_ms: int | None = None,
) -> PodTimes:
    """The tenure times of one observation of a pod (see the module docstring)."""
    created = parse_time(meta.get("creationTimestamp"), field="metadata.creationTimestamp")
    deletion = parse_time(meta.get("deletionTimestamp"), field="metadata.deletionTimestamp")

    conditions = _list(status, "conditions", "status.conditions")
    cond_times: list[int] = []
    bound: int | None = None
    for i, cond in enumerate(conditions):
        if not isinstance(cond, Mapping):
            raise PodFieldError(
                "a condition must be a JSON object", field=f"status.conditions[{i}]"
            )
        ctype = cond.get("type")
        label = ctype if isinstance(ctype, str) and ctype else str(i)
        t = parse_time(
            cond.get("lastTransitionTime"), field=f"status.conditions[{label}].lastTransitionTime"
        )
        if t is None:
            continue
        cond_times.append(t)
        if ctype == "PodScheduled" and cond.get("status") == "True":
            bound = t
    if bound is None and spec.get("nodeName") and cond_times:
        bound = min(cond_times)

    statuses = _list(status, "containerStatuses", "status.containerStatuses")
    starts: list[int] = []
    ends: list[int] = []
    all_terminated = bool(statuses)
    for i, cs in enumerate(statuses):
        if not isinstance(cs, Mapping):
            raise PodFieldError(
                "a container status must be a JSON object", field=f"status.containerStatuses[{i}]"
            )
        cname = cs.get("name")
        where = f"status.containerStatuses[{cname if isinstance(cname, str) else i}]"
        state = _obj(cs, "state", f"{where}.state", required=False)
        last = _obj(cs, "lastState", f"{where}.lastState", required=False)
        running = _obj(state, "running", f"{where}.state.running", required=False)
        terminated = _obj(state, "terminated", f"{where}.state.terminated", required=False)
        previous = _obj(last, "terminated", f"{where}.lastState.terminated", required=False)
        for section, prefix in (
            (running, "state.running"),
            (terminated, "state.terminated"),
            (previous, "lastState.terminated"),
        ):
            t = parse_time(section.get("startedAt"), field=f"{where}.{prefix}.startedAt")
            if t is not None:
                starts.append(t)
        if state.get("terminated") is not None:
            end = parse_time(
                terminated.get("finishedAt"), field=f"{where}.state.terminated.finishedAt"
            )
            if end is None:
                all_terminated = False
            else:
                ends.append(end)
        else:
            all_terminated = False

    phase = status.get("phase")
    if not isinstance(phase, str):
        phase = None
    final = (
        phase in TERMINAL_PHASES
        or spec.get("restartPolicy") == "Never"
        or deletion is not None
        or deleted
    )
    finished: int | None = None
    if all_terminated and final:
        finished = max(ends)
    elif phase in TERMINAL_PHASES:
        # Failed before or without container records (evicted, admission refused): the
        # latest thing the kubelet wrote is the best end there is.
        finished = max([*ends, *cond_times], default=None)

    deleted_ms = deletion
    if deleted_ms is None and deleted:
        deleted_ms = event_ms if event_ms is not None else finished
    return PodTimes(
        created_ms=created,
        bound_ms=bound,
        started_ms=min(starts) if starts else None,
        finished_ms=finished,
        deleted_ms=deleted_ms,
    )


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def parse_time(value: object, *, field: str) -> int | None:
    """RFC 3339 (`Z` or an offset, optional fraction) to epoch ms UTC; None stays None.

    Fractions below a millisecond are truncated, as Kubernetes' own MicroTime is.
    """
    if value is None:
        return None
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise PodFieldError(f"not an RFC 3339 time: {shown(value)}", field=field, value=value)
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zulu, sign, off_h, off_m = m.groups()[6:]
    try:
        tz = (
            UTC
            if zulu
            else timezone(
                (1 if sign == "+" else -1) * timedelta(hours=int(off_h), minutes=int(off_m))
            )
        )
        dt = datetime(year, month, day, hour, minute, second, tzinfo=tz)
    except ValueError as e:
        raise PodFieldError(
            f"not an RFC 3339 time: {shown(value)} ({e})", field=field, value=value
        ) from e
    ms = int((frac or "0")[:3].ljust(3, "0"))
    return int(dt.timestamp()) * 1000 + ms


# ---------------------------------------------------------------------------------------------
# team, job, rank, gang


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
        return _as_int(self.meta(key))


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
    settles it (`pytorch_worker_ranks`). The others' rank is the replica index (an MPIJob
    launcher has none).
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
        rank = _as_int(_strip_prefix(pod.name, f"{name}-{task}-"))
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
        rank = _as_int(_strip_prefix(pod.name, f"{owner.name}-"))
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
# reading plain dicts


def _controller_owner(meta: Mapping[str, Any]) -> Owner | None:
    """The owner reference marked `controller: true`, else the first one."""
    refs = _list(meta, "ownerReferences", "metadata.ownerReferences")
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


def _env_rank(spec: Mapping[str, Any]) -> int | None:
    """A literal integer `RANK` environment value of the first container that has one."""
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else []:
        env = c.get("env") if isinstance(c, Mapping) else None
        for var in env if isinstance(env, list) else []:
            if isinstance(var, Mapping) and var.get("name") == "RANK":
                rank = _as_int(var.get("value"))
                if rank is not None:
                    return rank
    return None


def _as_int(value: object) -> int | None:
    """A non-negative integer label value that fits a 32-bit column, else None (labels are
    the user's to garble: `job-completion-index: "99999999999999999999"` is a valid label)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        number = int(value)
        return number if limits.in_int32(number) else None
    return None


def _strip_prefix(text: str, prefix: str) -> str | None:
    return text[len(prefix) :] if text.startswith(prefix) and len(text) > len(prefix) else None


def _strip_suffix(text: str, suffix: str) -> str | None:
    return text[: -len(suffix)] if text.endswith(suffix) and len(text) > len(suffix) else None


def _obj(
    parent: Mapping[str, Any], key: str, field: str, *, required: bool = True
) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        if required:
            raise PodFieldError("missing", field=field)
        return {}
    if not isinstance(value, Mapping):
        raise PodFieldError(f"must be a JSON object, got {type(value).__name__}", field=field)
    return value


def _list(parent: Mapping[str, Any], key: str, field: str) -> Sequence[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodFieldError(f"must be a list, got {type(value).__name__}", field=field)
    return value


def _required_str(parent: Mapping[str, Any], key: str, field: str, *, limit: int) -> str:
    value = parent.get(key)
    if value is None or value == "":
        raise PodFieldError("missing", field=field)
    if not isinstance(value, str):
        raise PodFieldError(
            f"must be a string, got {type(value).__name__}", field=field, value=value
        )
    if len(value) > limit:
        raise PodFieldError(f"longer than {limit} characters", field=field, value=value)
    if not limits.is_clean(value):
        raise PodFieldError("holds a NUL or an unpaired surrogate", field=field, value=value)
    return value


def _optional_str(parent: Mapping[str, Any], key: str) -> str | None:
    value = parent.get(key)
    return value if isinstance(value, str) and value else None


def _str_map(parent: Mapping[str, Any], key: str, field: str) -> dict[str, str]:
    value = _obj(parent, key, field, required=False)
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(v, str):
            raise PodFieldError(
                f"values must be strings, got {shown(v)}", field=f"{field}.{k}", value=v
            )
        out[k] = v
    return out
