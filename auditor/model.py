"""Domain records shared by every layer: GPUs, samples, pods, and the waste categories.

Times are integer milliseconds since the Unix epoch, UTC, everywhere inside the auditor:
exact as natural keys, cheap to store, and the same on SQLite and PostgreSQL.
Utilisation is a percentage 0-100 as nvidia-smi and NVML report it; `None` means the
source could not read it (never 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from auditor.errors import GpuConflictError


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


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod that requests GPUs, with what is known of its tenure.

    `job` is `Kind/name` of the workload the pod belongs to; `gang` is the key of the set of
    cards the straggler and job-wide-gap rules compare (SPEC §2.2): the job for distributed
    training, the pod itself otherwise.
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

    @property
    def released_ms(self) -> int | None:
        """When the pod stopped holding its GPUs: containers terminated or deleted, first."""
        ends = [t for t in (self.finished_ms, self.deleted_ms) if t is not None]
        return min(ends) if ends else None


@dataclass(frozen=True, slots=True)
class Holding:
    """A pod seen holding a GPU from `first_ms` to `last_ms` (pod-resources, by name)."""

    namespace: str
    pod: str
    gpu_uuid: str
    first_ms: int
    last_ms: int


def merge_holdings(holdings: Iterable[Holding]) -> list[Holding]:
    """One span per (namespace, pod, GPU), widened over every observation."""
    spans: dict[tuple[str, str, str], Holding] = {}
    for h in holdings:
        key = (h.namespace, h.pod, h.gpu_uuid)
        old = spans.get(key)
        spans[key] = (
            h
            if old is None
            else Holding(*key, min(old.first_ms, h.first_ms), max(old.last_ms, h.last_ms))
        )
    return list(spans.values())


@dataclass(frozen=True, slots=True)
class Batch:
    """One sampler pass: the GPUs, their samples, and who held them."""

    gpus: tuple[GpuRecord, ...]
    samples: tuple[GpuSample, ...]
    holdings: tuple[Holding, ...]


@dataclass(frozen=True, slots=True)
class GpuConflict:
    """A GPU record that contradicts the stored card (or an earlier record of the same
    write): another node, or another known model, for the same UUID."""

    uuid: str
    field: str
    """Which differs: "node" or "model"."""
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
