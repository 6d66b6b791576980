"""What share of a card a pod asks for (SPEC §7), from its resources and annotations. Pure.

A pod is a GPU pod when it asks for any of:

- whole cards or time-slicing/MPS replicas: `nvidia.com/gpu`, `nvidia.com/gpu.shared`
  (a plain request does not know it is time-sliced: the node's labels say so);
- MIG instances: `nvidia.com/mig-<P>` resources, or Run:ai's `nvidia.com/mig-<P>: "1"`
  annotation (with `runai-allocated-mig-gpus`);
- HAMi vGPUs: `nvidia.com/vgpu`, or `nvidia.com/gpu` beside HAMi's `nvidia.com/gpucores`,
  `nvidia.com/gpumem` (MiB) or `nvidia.com/gpumem-percentage` (those alone: one vGPU, HAMi's
  default);
- Run:ai fractions: the `gpu-fraction` annotation (with `gpu-fraction-num-devices`), else
  `runai-allocated-gpus`; pods of the `runai-reservation` namespace are Run:ai's
  placeholders, kept as `runai-reservation` with no card of their own;
- Alibaba gpu-milli: `alibabacloud.com/gpu-milli` (thousandths of a card), as a resource or
  as the annotation Alibaba's OpenB trace and scheduler use, with `alibabacloud.com/gpu-count`
  (then the milli are per card: OpenB's 8 x 1000 is eight whole cards) and
  `aliyun.com/gpu-mem` (GiB); `aliyun.com/gpu-mem` alone is Alibaba's memory-shared GPU;
- the extra resource names and fraction annotations of the config's `[sharing]` table.

Counts (cards, replicas, instances, vGPUs, milli) are whole numbers, as the API writes them.
HAMi's per-vGPU values are Kubernetes quantities: "3000", "3k" and "2.5k" are numbers of
MiB (HAMi's unit); a binary suffix ("2Gi") is taken as bytes, which is what its writer
meant. A value no real system writes (a fraction above 1 or not above 0, cores above 100,
text that is no number) is a `PodFieldError` naming the field.

`hami_devices` reads HAMi's `hami.io/vgpu-devices-allocated` annotation, which names the
exact cards a pod's vGPUs sit on: containers end with `;`, devices with `:`, each device
`UUID,Type,MemoryMiB,Cores`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from auditor import limits
from auditor.errors import PodFieldError, shown
from auditor.model import ExactAssignment, PodRecord
from auditor.settings import Sharing

WHOLE_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_PREFIX = "nvidia.com/mig-"
HAMI_VGPU = "nvidia.com/vgpu"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_MEM_PCT = "nvidia.com/gpumem-percentage"
MILLI = "alibabacloud.com/gpu-milli"
MILLI_COUNT = "alibabacloud.com/gpu-count"
ALIYUN_MEM = "aliyun.com/gpu-mem"
COUNT_RESOURCES = (*WHOLE_RESOURCES, HAMI_VGPU, MILLI, MILLI_COUNT, ALIYUN_MEM)
"""Resources that count something held (and add up over a pod's containers)."""
PER_DEVICE_RESOURCES = (HAMI_CORES, HAMI_MEM, HAMI_MEM_PCT)
"""HAMi's per-vGPU values: each container's, not summed."""

RUNAI_FRACTION = "gpu-fraction"
RUNAI_FRACTION_DEVICES = "gpu-fraction-num-devices"
RUNAI_ALLOCATED = "runai-allocated-gpus"
RUNAI_ALLOCATED_MIG = "runai-allocated-mig-gpus"
RUNAI_RESERVATION_NAMESPACE = "runai-reservation"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"

KIND_MIG = "mig"
KIND_HAMI = "hami"
KIND_RUNAI = "runai"
KIND_MILLI = "milli"
KIND_RESERVATION = "runai-reservation"
KIND_DRA = "dra"
DRA_RESOURCE = "resource.k8s.io/claims"
"""`gpu_resource` of a pod whose GPUs come from its ResourceClaims (`auditor.collect.dra`)."""
MIB = 1 << 20
GIB_MIB = 1024


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """What a pod holds of GPUs: see `PodRecord` for each field."""

    count: int
    resource: str
    share_kind: str | None = None
    share: float | None = None
    mem_mib: float | None = None
    mem_share: float | None = None


NO_GPU = GpuAsk(0, "nvidia.com/gpu")


def is_share_resource(name: str, sharing: Sharing | None = None) -> bool:
    """Does a container resource of this name say anything about GPUs?"""
    return (
        name in COUNT_RESOURCES
        or name in PER_DEVICE_RESOURCES
        or name.startswith(MIG_PREFIX)
        or (sharing is not None and name in sharing.resources)
    )


def is_count_resource(name: str, sharing: Sharing | None = None) -> bool:
    return is_share_resource(name, sharing) and name not in PER_DEVICE_RESOURCES


def gpu_ask(
    totals: Mapping[str, float],
    per_device: Mapping[str, float],
    *,
    namespace: str,
    annotations: Mapping[str, str],
    sharing: Sharing | None = None,
) -> GpuAsk:
    """The ask of a pod, from the effective totals of its count resources (`totals`), the
    largest per-vGPU values of its containers (`per_device`, HAMi's), its namespace and
    annotations. Raises `PodFieldError` (field relative to the pod) for a value no real
    system writes."""
    rules = sharing or Sharing()
    ask = _from_resources(totals, per_device, rules)
    if ask.count == 0:
        ask = _from_annotations(annotations, rules)
    if namespace == RUNAI_RESERVATION_NAMESPACE and (ask.count or _runai(annotations)):
        return GpuAsk(0, ask.resource, KIND_RESERVATION)
    return ask


def _runai(annotations: Mapping[str, str]) -> bool:
    return any(k in annotations for k in (RUNAI_FRACTION, RUNAI_ALLOCATED, RUNAI_ALLOCATED_MIG))


def _names(found: Mapping[str, float]) -> str:
    return ",".join(sorted(found))


def _from_resources(
    totals: Mapping[str, float], per_device: Mapping[str, float], rules: Sharing
) -> GpuAsk:
    held = {k: v for k, v in totals.items() if v}
    if not held and per_device:  # HAMi's default: one vGPU when only its values are set
        return _hami(1, _names(per_device), per_device)
    extra = {k: rules.resources[k] for k in held if k in rules.resources}
    mig = {k: v for k, v in held.items() if k.startswith(MIG_PREFIX) or extra.get(k) == KIND_MIG}
    if mig:
        return GpuAsk(_whole(sum(mig.values())), _names(mig), KIND_MIG)
    milli = {k: v for k, v in held.items() if k == MILLI or extra.get(k) == KIND_MILLI}
    mem_gib = held.get(ALIYUN_MEM)
    mem_mib = None if mem_gib is None else mem_gib * GIB_MIB
    if milli:
        cards = held.get(MILLI_COUNT)
        return _milli(
            sum(milli.values()), None if cards is None else int(cards), _names(milli), mem_mib
        )
    if held.get(MILLI_COUNT):  # Alibaba's count of whole cards, alone
        return GpuAsk(_whole(held[MILLI_COUNT]), MILLI_COUNT)
    hami = {k: v for k, v in held.items() if k == HAMI_VGPU or extra.get(k) == KIND_HAMI}
    whole = {k: v for k, v in held.items() if k in WHOLE_RESOURCES or extra.get(k) == "whole"}
    if hami or (whole and per_device):
        units_of = hami or whole
        return _hami(_whole(sum(units_of.values())), _names(units_of), per_device)
    if whole:
        return GpuAsk(_whole(sum(whole.values())), _names(whole))
    if mem_mib is not None:  # Alibaba's memory-shared GPU: one card's memory slice
        return GpuAsk(1, ALIYUN_MEM, KIND_MILLI, mem_mib=mem_mib)
    return NO_GPU


def _milli(units: float, cards: int | None, resource: str, mem_mib: float | None) -> GpuAsk:
    """gpu-milli: with a card count the milli are per card (OpenB), else all the pod's."""
    return GpuAsk(
        cards if cards else max(1, math.ceil(units / 1000)),
        resource,
        KIND_MILLI,
        share=units / 1000 if units <= 1000 else None,
        mem_mib=mem_mib,
    )


def _hami(count: int, resource: str, per_device: Mapping[str, float]) -> GpuAsk:
    cores = per_device.get(HAMI_CORES)
    pct = per_device.get(HAMI_MEM_PCT)
    return GpuAsk(
        count,
        resource,
        KIND_HAMI,
        share=cores / 100 if cores else None,
        mem_mib=per_device.get(HAMI_MEM),
        mem_share=None if pct is None else pct / 100,
    )


def _whole(value: float) -> int:
    return int(value)


_FRACTION = re.compile(r"[+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")
"""A decimal number as Go's `strconv.ParseFloat` (Run:ai's reader) takes it: `0.5`, `.5`,
`5e-1`; no sign but `+`, no hex, no `inf`/`nan`."""


def _fraction(annotations: Mapping[str, str], key: str, *, upto: float | None) -> float:
    raw = annotations[key]
    text = raw.strip()
    value = float(text) if len(text) <= 32 and _FRACTION.fullmatch(text) else math.nan
    if not math.isfinite(value) or value <= 0 or (upto is not None and value > upto):
        bound = f" in (0, {upto:g}]" if upto is not None else " above 0"
        raise PodFieldError(
            f"must be a fraction of a GPU{bound}, got {shown(raw)}",
            field=f"metadata.annotations.{key}",
            value=raw,
        )
    return value


def _count_annotation(annotations: Mapping[str, str], key: str, *, zero: bool = False) -> int:
    raw = annotations[key]
    text = raw.strip()
    least = 0 if zero else 1
    if not (len(text) <= 12 and text.isascii() and text.isdigit()) or not (
        least <= int(text) <= limits.MAX_GPUS_PER_POD
    ):
        raise PodFieldError(
            f"must be a whole number of at least {least}, got {shown(raw)}",
            field=f"metadata.annotations.{key}",
            value=raw,
        )
    return int(text)


def _from_annotations(annotations: Mapping[str, str], rules: Sharing) -> GpuAsk:
    for key in (RUNAI_FRACTION, *rules.fraction_annotations):
        if key in annotations:
            share = _fraction(annotations, key, upto=1.0)
            devices = (
                _count_annotation(annotations, RUNAI_FRACTION_DEVICES)
                if RUNAI_FRACTION_DEVICES in annotations
                else 1
            )
            return GpuAsk(devices, key, KIND_RUNAI, share=share)
    migs = sorted(k for k in annotations if k.startswith(MIG_PREFIX))
    if migs:
        count = sum(_count_annotation(annotations, k) for k in migs)
        return GpuAsk(count, ",".join(migs), KIND_MIG)
    if RUNAI_ALLOCATED_MIG in annotations:
        count = _count_annotation(annotations, RUNAI_ALLOCATED_MIG)
        return GpuAsk(count, RUNAI_ALLOCATED_MIG, KIND_MIG)
    if MILLI in annotations:
        milli = _count_annotation(annotations, MILLI, zero=True)
        cards = (
            _count_annotation(annotations, MILLI_COUNT, zero=True)
            if MILLI_COUNT in annotations
            else None
        )
        if milli == 0 or cards == 0:  # OpenB writes 0 for a pod of no GPU
            return NO_GPU
        return _milli(float(milli), cards, MILLI, None)
    if RUNAI_ALLOCATED in annotations:
        value = _fraction(annotations, RUNAI_ALLOCATED, upto=float(limits.MAX_GPUS_PER_POD))
        if value < 1:
            return GpuAsk(1, RUNAI_ALLOCATED, KIND_RUNAI, share=value)
        cards = math.ceil(value)
        split = None if value == cards else value / cards
        return GpuAsk(cards, RUNAI_ALLOCATED, KIND_RUNAI if split else None, share=split)
    return NO_GPU


# ---------------------------------------------------------------------------------------------
# quantities


_DECIMAL = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "m": 1e-3}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_QUANTITY = re.compile(r"([+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|E|m)?")


def quantity(qty: object, field: str, *, mib: bool = False) -> float:
    """A Kubernetes quantity as a number ("3000", "3k", "2.5k", 3000). With `mib`, a binary
    suffix is bytes and comes back in MiB ("2Gi" -> 2048), others are MiB already."""
    value: float | None = None
    if isinstance(qty, int | float) and not isinstance(qty, bool) and math.isfinite(qty):
        value = float(qty) if qty >= 0 else None
    elif isinstance(qty, str) and len(qty) <= 32:
        m = _QUANTITY.fullmatch(qty.strip())
        if m is not None:
            number, suffix = float(m.group(1)), m.group(2) or ""
            if suffix in _BINARY:
                value = number * _BINARY[suffix] / (MIB if mib else 1)
            else:
                value = number * _DECIMAL[suffix]
    if value is None or not math.isfinite(value):
        raise PodFieldError(f"not a quantity: {shown(qty)}", field=field, value=qty)
    return value


def per_device_value(name: str, qty: object, field: str) -> float:
    """HAMi's per-vGPU cores (percent), memory (MiB) or memory percentage."""
    value = quantity(qty, field, mib=name == HAMI_MEM)
    if name in (HAMI_CORES, HAMI_MEM_PCT) and value > 100:
        raise PodFieldError(
            f"is a percentage of one GPU (0-100), got {shown(qty)}", field=field, value=qty
        )
    return value


# ---------------------------------------------------------------------------------------------
# HAMi's allocation annotation


@dataclass(frozen=True, slots=True)
class HamiDevice:
    """One card a HAMi pod's vGPUs sit on, summed over its containers: cores (percent of the
    card, 0 for no limit) and memory (MiB)."""

    uuid: str
    cores: float
    mem_mib: float

    @property
    def share(self) -> float | None:
        """The exact share of the card the cores give; None without a cores limit."""
        return min(1.0, self.cores / 100) if self.cores > 0 else None


def hami_devices(annotations: Mapping[str, str]) -> tuple[HamiDevice, ...]:
    """The cards of `hami.io/vgpu-devices-allocated`, in order of first mention; () without
    it. Raises `PodFieldError` for a device entry that is not `UUID,Type,Mem,Cores`."""
    raw = annotations.get(HAMI_ALLOCATED)
    if not raw:
        return ()
    field = f"metadata.annotations.{HAMI_ALLOCATED}"
    found: dict[str, tuple[float, float]] = {}
    for container in raw.split(";"):
        for device in container.split(":"):
            if not device.strip():
                continue
            parts = [p.strip() for p in device.split(",")]
            if len(parts) < 4 or not parts[0] or len(parts[0]) > limits.GPU_UUID_MAX:
                raise PodFieldError(
                    f"a device must be UUID,Type,Memory,Cores, got {shown(device)}",
                    field=field,
                    value=raw,
                )
            mem = _number(parts[2], field, raw)
            cores = _number(parts[3], field, raw)
            old_mem, old_cores = found.get(parts[0], (0.0, 0.0))
            found[parts[0]] = (old_mem + mem, old_cores + cores)
    return tuple(HamiDevice(u, cores, mem) for u, (mem, cores) in found.items())


def hami_assignments(records: Iterable[PodRecord]) -> list[ExactAssignment]:
    """The cards HAMi's annotation names for each pod placed on a node, held from its bind
    (else creation) to its release (else its bind): exact assignments for the store."""
    found: list[ExactAssignment] = []
    for rec in records:
        start = next(
            (t for t in (rec.bound_ms, rec.created_ms, rec.started_ms) if t is not None), None
        )
        if rec.node is None or start is None or HAMI_ALLOCATED not in rec.annotations:
            continue
        end = rec.released_ms
        for dev in hami_devices(rec.annotations):
            found.append(
                ExactAssignment(
                    rec.uid,
                    rec.node,
                    dev.uuid,
                    start,
                    max(start, end if end is not None else start),
                    dev.share,
                    dev.mem_mib or None,
                )
            )
    return found


def _number(text: str, field: str, raw: str) -> float:
    if not (len(text) <= 20 and _FRACTION.fullmatch(text)):
        raise PodFieldError(
            f"device memory and cores must be numbers, got {shown(text)}", field=field, value=raw
        )
    return float(text)


def container_totals(
    requests: Sequence[tuple[Mapping[str, float], bool]],
    init: Sequence[tuple[Mapping[str, float], bool]],
) -> dict[str, float]:
    """Per resource, the scheduler's effective request: max(peak of init containers, sum of
    app containers), sidecars (init containers with `restartPolicy: Always`) counting
    alongside everything started after them."""
    totals: dict[str, float] = {}
    names = sorted({n for reqs, _ in (*requests, *init) for n in reqs})
    for res in names:
        sidecars = 0.0
        init_peak = 0.0
        for reqs, always in init:
            count = reqs.get(res, 0)
            if always:
                sidecars += count
                init_peak = max(init_peak, sidecars)
            else:
                init_peak = max(init_peak, sidecars + count)
        total = max(init_peak, sum(reqs.get(res, 0) for reqs, _ in requests) + sidecars)
        if total:
            totals[res] = total
    return totals
