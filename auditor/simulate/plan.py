"""The plan of a simulated cluster: pods, the gangs they form, and how each gang behaves.

A `GangPlan` is the unit the scheduler places and the workload generator fills: the cards of
one pod, or of all pods of one distributed job (SPEC §2.2). Its timing is relative until
placement fixes it; after placement every time is an integer millisecond on a whole second,
because Kubernetes records second-precision timestamps.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

import numpy as np

NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet Kubernetes uses for generated name suffixes and pod-template hashes."""


class Profile(StrEnum):
    """How a gang uses its cards while it holds them."""

    TRAINING = "training"
    DISTRIBUTED = "distributed"
    INFERENCE = "inference"
    NOTEBOOK = "notebook"
    UNUSED = "unused"


class Ending(StrEnum):
    """How a pod stops holding its GPUs."""

    COMPLETE = "complete"
    """Containers exit 0; the pod is Succeeded."""
    FAILED = "failed"
    """Containers exit non-zero; the pod is Failed."""
    DELETE = "delete"
    """The pod is deleted (scale-down, rollout, notebook stopped or culled)."""
    SIDECAR = "sidecar"
    """The main container exits; a sidecar keeps the pod until a deadline kills it."""
    OPEN = "open"
    """Still running when the snapshot is taken."""


class Label(IntEnum):
    """What a sample of a card is, by construction, under SPEC §3's rules."""

    UNHELD = 0
    ACTIVE = 1
    LEAD = 2
    """Idle, in the tenure's leading run: startup up to the cap, reserved_idle after."""
    TRAIL = 3
    """Idle, in the tenure's trailing run: teardown up to the cap, reserved_idle after."""
    RESERVED = 4
    """Idle for the whole tenure, or in a mid-tenure run longer than `reserved_after`."""
    WAIT = 5
    """Idle while other cards of the gang compute: straggler_wait."""
    CHECKPOINT = 6
    """Idle in a gang-wide gap of a regular series: checkpoint."""
    STALL = 7
    """Idle in a short or irregular gang-wide gap: compute_idle."""


@dataclass(frozen=True, slots=True)
class Owner:
    """The controller of a pod, as its ownerReference names it."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Activity:
    """The knobs of a gang's utilisation pattern; each profile reads the ones it needs."""

    level: float = 85.0
    """Mean utilisation (percent) while computing."""
    stalls_per_hour: float = 10.0
    """Short gang-wide stalls (data loader, host sync), one or two samples each."""
    ckpt_interval_s: float = 0.0
    """Start-to-start interval of checkpoints; 0 for none."""
    ckpt_len_s: float = 0.0
    straggler: str = ""
    """'throttled': one card is thermally throttled and the others wait for it;
    'lagging': one card runs 20-40 points below its siblings and one rank now and then
    goes idle while the others compute."""
    floor: float = 10.0
    """Inference: utilisation at the quietest hour."""
    peak: float = 70.0
    """Inference: utilisation at the busiest hour."""
    peak_hour: float = 15.0
    """Inference: UTC hour of the daily peak."""
    first_absence_s: int = 0
    """Notebook: the user is away this long after the server started."""
    pauses: int = 2
    """Notebook: at most this many pauses of 2-8 minutes within sessions."""
    mem_mib: int = 60000
    """Memory the workload keeps on each card once loaded."""


@dataclass(slots=True)
class PodPlan:
    """One pod; the fields after `uid` are filled by placement."""

    name: str
    namespace: str
    team: str
    gpus: int
    owner: Owner
    labels: dict[str, str]
    image: str
    container: str = "main"
    rank: int | None = None
    bind_offset_s: int = 0
    """Bound this long after its gang was placed (the other replicas of a job lag)."""
    queued_s: int = 3
    """Created this long before it was bound."""
    pull_s: int = 60
    """Its main container runs this long after binding (image pull, init)."""
    teardown_s: int = 60
    """Idle from the gang's last activity until the pod releases its GPUs."""
    ending: Ending = Ending.COMPLETE
    init_container: str = ""
    sidecar: str = ""
    restarts: int = 0
    grace_s: int = 10
    """After a deletion, the containers take this long to terminate."""
    ttl_s: int = 0
    """A finished pod is deleted this long after it finished (Job TTL); 0 for never."""
    annotations: dict[str, str] = field(default_factory=dict)
    gpu_limits: dict[str, str] = field(default_factory=dict)
    """The GPU resources the main container asks for, where not `nvidia.com/gpu: gpus`
    (a MIG profile, HAMi's gpucores/gpumem, gpu-milli)."""
    uid: str = ""
    node: int = -1
    gpu_indices: tuple[int, ...] = ()
    created_ms: int = 0
    bound_ms: int = 0
    started_ms: int = 0
    main_finished_ms: int | None = None
    finished_ms: int | None = None
    deleted_ms: int | None = None

    @property
    def released_ms(self) -> int | None:
        """SPEC §2.2: the hold ends when all containers terminated or at deletion, first."""
        ends = [t for t in (self.finished_ms, self.deleted_ms) if t is not None]
        return min(ends) if ends else None


@dataclass(slots=True)
class GangPlan:
    """The cards that SPEC §2.2 compares with each other, with their shared behaviour."""

    key: str
    profile: Profile
    team: str
    pods: list[PodPlan]
    activity: Activity
    startup_s: int
    """From placement to the gang's first active sample."""
    active_s: int | None
    """From first to last active sample; None: active until the snapshot. For an UNUSED
    gang, how long it holds its cards."""
    earliest_ms: int
    max_wait_s: int = 3 * 3600
    required: bool = True
    pack: bool = True
    """Prefer the fullest node that fits (batch); else the emptiest (serving replicas)."""
    outage_safe: bool = False
    """Only steady, single-node gangs may sit on a node whose sampler goes down."""
    placed_ms: int | None = None
    active_start_ms: int | None = None
    active_end_ms: int | None = None
    """Last activity ends here; None while active until the snapshot or never active."""

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pods)


class Namer:
    """Deterministic uids and Kubernetes-style generated names from one random generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def uid(self) -> str:
        raw = bytes(self._rng.integers(0, 256, size=16, dtype=np.uint8).tolist())
        return str(uuid.UUID(bytes=raw, version=4))

    def suffix(self, length: int = 5) -> str:
        picks = self._rng.integers(0, len(NAME_ALPHABET), size=length)
        return "".join(NAME_ALPHABET[int(i)] for i in picks)

    def digest(self) -> str:
        """64 hex digits, as a container ID or an image digest has."""
        return bytes(self._rng.integers(0, 256, size=32, dtype=np.uint8).tolist()).hex()

    def gpu_uuid(self) -> str:
        return "GPU-" + self.uid()
