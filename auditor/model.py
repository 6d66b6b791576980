"""Domain records shared by every layer: GPUs, samples, pods, and the waste categories;
and the rule that ranks a PyTorchJob's workers, which the readers and the store both apply.

Times are integer milliseconds since the Unix epoch, UTC, everywhere inside the auditor:
exact as natural keys, cheap to store, and the same on SQLite and PostgreSQL.
Utilisation is a percentage 0-100 as nvidia-smi and NVML report it; `None` means the
source could not read it (never 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import NamedTuple

from auditor.errors import GpuConflictError
from auditor.limits import in_int32


class Window(NamedTuple):
    """A time window `[start_ms, end_ms)`, epoch milliseconds UTC.

    A tuple, so `start_ms, end_ms = window` and `window[0]` work, and a plain pair compares
    equal to it."""

    start_ms: int
    end_ms: int


class RunSlice(NamedTuple):
    """The stored hours of one audit run that lie in `[start_ms, end_ms)` (SPEC §11): its
    buckets whose start is inside, so a slice from the run's start to its end is the whole
    run."""

    run_id: int
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class Selection:
    """One side of `compare` (SPEC §8): the pods a selector picks, over a window of its own.

    `kind` is "job" (`value` namespace/Kind/name), "team" or "label" (`value` KEY=VALUE);
    `text` is the side as written, `KIND=VALUE@START..END`, which the comparison shows."""

    kind: str
    value: str
    window: Window
    text: str

    @classmethod
    def of(cls, kind: str, value: str, window: Window) -> Selection:
        """The selection with its text written out, ISO 8601 UTC to the second."""
        start, end = (_iso_utc(ms) for ms in window)
        return cls(kind, value, window, f"{kind}={value}@{start}..{end}")


def _iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class WasteCategory(StrEnum):
    """Where one GPU-second went (SPEC §3). Every capacity second gets exactly one."""

    BUSY = "busy"
    UNALLOCATED = "unallocated"
    RESERVED_IDLE = "reserved_idle"
    STARTUP = "startup"
    TEARDOWN = "teardown"
    CHECKPOINT = "checkpoint"
    STRAGGLER_WAIT = "straggler_wait"
    COMPUTE_IDLE = "compute_idle"
    UNOBSERVED = "unobserved"


CATEGORIES: tuple[WasteCategory, ...] = tuple(WasteCategory)

SCHEDULING_WASTE: tuple[WasteCategory, ...] = (
    WasteCategory.RESERVED_IDLE,
    WasteCategory.STARTUP,
    WasteCategory.TEARDOWN,
    WasteCategory.CHECKPOINT,
    WasteCategory.STRAGGLER_WAIT,
)

PLATFORM_TEAM = "(platform)"
"""Team name of the row that carries unallocated time and unobserved time of unheld cards."""


DEFAULT_CLUSTER = "default"
"""The cluster of every card, pod and node that names none (SPEC §11): a store of one
cluster never needs to say which, and a store from before clusters holds this one."""


class GroupBy(StrEnum):
    """What the rows of a report are grouped by (`auditor report --by`)."""

    CLUSTER = "cluster"
    TEAM = "team"
    NAMESPACE = "namespace"
    JOB = "job"
    POD = "pod"
    NODE = "node"
    GPU = "gpu"


class WorkloadKind(StrEnum):
    """What a pod is for, which decides the advice a report gives."""

    TRAINING = "training"
    INFERENCE = "inference"
    NOTEBOOK = "notebook"
    BATCH = "batch"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One GPU (or MIG instance, which is a GPU of its own) as a source saw it."""

    uuid: str
    node: str
    index: int | None = None
    model: str | None = None
    memory_total_mib: float | None = None
    parent_uuid: str | None = None
    util_source: str | None = None
    """Where its utilisation came from: `DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_PROF_GR_ENGINE_ACTIVE`
    (MIG instances have only that), `nvml`, `nvidia-smi`; None where not said."""
    mig_profile: str | None = None
    """A MIG instance's profile (`1g.10gb`, `3g.40gb`, `1c.3g.40gb`); None for a whole card."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU at one instant. Unread fields are `None`, never 0."""

    gpu_uuid: str
    ts_ms: int
    util: float | None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: str | None = None
    temperature_c: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None


SAMPLE_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(GpuSample) if f.name not in ("gpu_uuid", "ts_ms")
)
"""What a `GpuSample` measures, in its order: the columns of the store's `gpu_samples` after
its key, in the order bulk rows carry them (`auditor.store.schema`, `auditor.store.bulk`)."""
SAMPLE_TEXT_FIELDS = frozenset({"throttle_reasons"})
"""The measured field that is text (a hexadecimal bit mask); the others are numbers."""


@dataclass(frozen=True, slots=True)
class TenantSample:
    """One pod's utilisation of one physical card at one instant: percent of the WHOLE card,
    summed over the pod's processes (NVML process utilisation, dcgm per-process fields)."""

    gpu_uuid: str
    pod_uid: str
    ts_ms: int
    util: float | None


@dataclass(frozen=True, slots=True)
class PodSignal:
    """A GPU pod's CPU signals (SPEC §10) from its cgroup, over the time from `ts_ms` to the
    next reading: share of its CPU limit used, share of CFS periods throttled, share of the
    time some task waited for CPU or I/O (PSI `some`). None: not recorded."""

    pod_uid: str
    ts_ms: int
    cpu_limit_ratio: float | None = None
    throttled_ratio: float | None = None
    cpu_pressure: float | None = None
    io_pressure: float | None = None


@dataclass(frozen=True, slots=True)
class CardSignal:
    """A whole card's traffic (SPEC §10) from `ts_ms` on: PCIe bytes/s (rx + tx), its PCIe
    link's bandwidth (bytes/s), NVLink bytes/s (rx + tx). None: not recorded."""

    gpu_uuid: str
    ts_ms: int
    pcie_bytes_s: float | None = None
    pcie_link_bytes_s: float | None = None
    nvlink_bytes_s: float | None = None


@dataclass(frozen=True, slots=True)
class ExactAssignment:
    """A card a source names for a pod without reading the card itself (HAMi's
    `hami.io/vgpu-devices-allocated`): the pod's node, the time it held the card, and the
    exact share (cores / 100) or, without one, the memory it holds there (MiB)."""

    pod_uid: str
    node: str
    gpu_uuid: str
    first_ms: int
    last_ms: int
    share: float | None
    mem_mib: float | None = None


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod that requests GPUs, with what is known of its tenure.

    `job` is `Kind/name` of the workload the pod belongs to; `gang` is the key of the set of
    cards the straggler and job-wide-gap rules compare (SPEC §2.2): the job for distributed
    training, the pod itself otherwise.

    Shares (SPEC §7): `gpu_count` is the cards or units held (whole cards, time-slicing
    replicas, MIG instances, HAMi vGPUs; 1 for a Run:ai fraction, ceil(milli/1000) for
    gpu-milli, 0 for a Run:ai reservation pod). `share_kind` says how the pod asks for a
    share ("mig", "hami", "runai", "milli", "runai-reservation", "dra": its ResourceClaims
    say its cards, exactly; None for whole cards and
    time-slicing, which the node's labels tell); `gpu_share` the share of one card asked
    for, `gpu_mem_mib` the GPU memory asked per card, `gpu_mem_share` HAMi's memory
    percentage / 100, where the request says them.
    """

    uid: str
    namespace: str
    name: str
    node: str | None
    team: str
    job: str
    job_kind: str
    workload: WorkloadKind
    gang: str
    gpu_count: int
    gpu_resource: str = "nvidia.com/gpu"
    rank: int | None = None
    created_ms: int | None = None
    bound_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    deleted_ms: int | None = None
    phase: str | None = None
    resource_version: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    share_kind: str | None = None
    gpu_share: float | None = None
    gpu_mem_mib: float | None = None
    gpu_mem_share: float | None = None
    wait_reason: str | None = None
    """Why the pod waited to be scheduled, as last seen (`Unschedulable`, `SchedulingGated`,
    `PodGroup`: `auditor.collect.pod_waits`); None where it was never seen waiting."""
    wait_message: str | None = None
    """The scheduler's (or the queue's) last word on it, bounded."""
    wanted_model: str | None = None
    """The GPU model its node selector or affinity asks for; None: any card."""
    wait_seen_ms: int | None = None
    """The latest time it was seen still waiting: where a wait that no later observation
    ended (bound, finished, deleted) is taken to end."""

    @property
    def released_ms(self) -> int | None:
        """When the pod stopped holding its GPUs: containers terminated or deleted, first."""
        ends = [t for t in (self.finished_ms, self.deleted_ms) if t is not None]
        return min(ends) if ends else None


OUTAGE_REASONS = ("cordoned", "not_ready", "short")
"""Why a node's free cards could not be given (SPEC §10 `unavailable`): cordoned
(`spec.unschedulable`), its `Ready` condition not True, fewer cards allocatable than it has."""


@dataclass(frozen=True, slots=True)
class NodeState:
    """One observation of a node, as the outages it shows: `outages` maps each reason of
    `OUTAGE_REASONS` that holds at `seen_ms` to when it began; `ready_since_ms` is when its
    `Ready` condition last turned True, while it is Ready (the end of a not-Ready stretch)."""

    node: str
    seen_ms: int
    outages: Mapping[str, int] = field(default_factory=dict)
    ready_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Holding:
    """A pod seen holding a GPU from `first_ms` to `last_ms` (pod-resources, by name);
    `replicas`: how many time-slicing device IDs (`GPU-…::j`) of the card it holds, None for
    a card not handed out in replicas."""

    namespace: str
    pod: str
    gpu_uuid: str
    first_ms: int
    last_ms: int
    replicas: int | None = None


def merge_holdings(holdings: Iterable[Holding]) -> list[Holding]:
    """One span per (namespace, pod, GPU), widened over every observation; the replicas the
    most of any observation (a pod's share of a card does not shrink while it runs)."""
    spans: dict[tuple[str, str, str], Holding] = {}
    for h in holdings:
        key = (h.namespace, h.pod, h.gpu_uuid)
        old = spans.get(key)
        if old is None:
            spans[key] = h
            continue
        counts = [r for r in (old.replicas, h.replicas) if r is not None]
        spans[key] = Holding(
            *key,
            min(old.first_ms, h.first_ms),
            max(old.last_ms, h.last_ms),
            max(counts) if counts else None,
        )
    return list(spans.values())


@dataclass(frozen=True, slots=True)
class Batch:
    """One sampler pass: the GPUs, their samples, who held them, and each pod's own
    utilisation of the cards (per-process utilisation, when on)."""

    gpus: tuple[GpuRecord, ...]
    samples: tuple[GpuSample, ...]
    holdings: tuple[Holding, ...]
    tenants: tuple[TenantSample, ...] = ()
    pod_signals: tuple[PodSignal, ...] = ()
    card_signals: tuple[CardSignal, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuConflict:
    """A GPU record that contradicts the stored card (or an earlier record of the same
    write): another node, or another known model, for the same UUID."""

    uuid: str
    field: str
    """Which differs: "node", "cluster" or "model"."""
    stored: str
    new: str

    def error(self, *, file: str | None = None, line: int | None = None) -> GpuConflictError:
        return GpuConflictError(
            uuid=self.uuid, field=self.field, stored=self.stored, new=self.new, file=file, line=line
        )


@dataclass(frozen=True)
class Written:
    """What a write of sampler batches left over: holdings not joined to a pod yet (kept
    for the next flush), and the GPUs refused as conflicting with the store, with the
    samples skipped for them."""

    unresolved: list[Holding]
    conflicts: tuple[GpuConflict, ...] = ()
    skipped_samples: int = 0


# ---------------------------------------------------------------------------------------------
# Kubeflow replicas and PyTorchJob ranks (SPEC §2.2): read from a pod by the readers, and
# settled across a job's stored pods by the store, so both find them here.


def pod_meta(labels: Mapping[str, str], annotations: Mapping[str, str], key: str) -> str | None:
    """A label, else the annotation of the same key (controllers set both, or either)."""
    value = labels.get(key) or annotations.get(key)
    return value or None


def label_int(value: object) -> int | None:
    """A non-negative integer label value that fits a 32-bit column, else None (labels are
    the user's to garble: `job-completion-index: "99999999999999999999"` is a valid label)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        number = int(value)
        return number if in_int32(number) else None
    return None


def kubeflow_replica(
    labels: Mapping[str, str], annotations: Mapping[str, str]
) -> tuple[str, int | None]:
    """A Kubeflow pod's replica type (lower case, "" when unknown) and replica index."""

    def meta(key: str) -> str | None:
        return pod_meta(labels, annotations, key)

    role = (
        meta("training.kubeflow.org/replica-type")
        or meta("training.kubeflow.org/job-role")
        or meta("pytorch-replica-type")
        or meta("replica-type")
        or ""
    ).lower()
    index = (
        label_int(meta("training.kubeflow.org/replica-index"))
        if meta("training.kubeflow.org/replica-index") is not None
        else label_int(meta("pytorch-replica-index") or meta("replica-index"))
    )
    return role, index


def pytorch_worker_ranks(
    pods: Sequence[tuple[str, int | None, Mapping[str, str], Mapping[str, str]]],
) -> dict[str, int]:
    """The ranks to store for the workers of one PyTorchJob, given all its stored pods as
    (uid, rank, labels, annotations): SPEC §2.2, master 0 and workers 1..N, or workers
    0..N-1 when the job has no master pod. Only ranks that no `RANK` value decided change:
    unranked workers, and, once a master is seen, workers ranked as if there were none
    (a worker's `RANK` is its index + 1 whenever the job has a master)."""
    replicas = [(uid, rank, *kubeflow_replica(labels, ann)) for uid, rank, labels, ann in pods]
    has_master = any(role == "master" for _, _, role, _ in replicas)
    out: dict[str, int] = {}
    for uid, rank, role, index in replicas:
        if role != "worker" or index is None:
            continue
        if has_master and rank in (None, index):
            out[uid] = index + 1
        elif not has_master and rank is None:
            out[uid] = index
    return out
