"""Dynamic Resource Allocation (SPEC §12, §7): which cards a pod's ResourceClaims hold. Pure.

A pod whose GPUs come from `spec.resourceClaims` asks for none in its containers: the
ResourceClaim says what it was given. Two kinds of object tell it, as the API writes them
(`resource.k8s.io/v1`; `v1beta1` and `v1beta2` read the same where their shapes differ):

- a **ResourceSlice** publishes a driver's devices on a node: `spec.driver`,
  `spec.pool.name`, `spec.nodeName`, and `spec.devices[]`, each a `name` with `attributes`
  (`v1beta1`: under `devices[].basic`). NVIDIA's DRA driver (`gpu.nvidia.com`) writes
  `type` (`gpu` or `mig`), `uuid` (the card's `GPU-…`, a MIG instance's `MIG-…`),
  `productName`, and for a MIG instance `parentUUID` and `profile` (`1g.10gb`); some
  versions also `index`. An attribute may be qualified by the driver's domain
  (`gpu.nvidia.com/uuid`). A device with a `uuid` that names a GPU or a MIG instance is a
  card; any other (an IMEX channel, a NIC) is not.
- a **ResourceClaim** (one a pod names by `resourceClaimName`, or the one the control
  plane made for it from a `resourceClaimTemplateName`) says, once allocated, which devices
  it was given, `status.allocation.devices.results[]` (`driver`, `pool`, `device`,
  `request`), and which consumers it is reserved for, `status.reservedFor[]`
  (`resource: pods`, `name`, `uid`). The allocation, not the request, is what is read, so
  the request shapes of the versions (`exactly.deviceClassName` in `v1`, a flat
  `deviceClassName` in `v1beta1`) do not matter.

The join, claim result → the slice device of the same driver, pool and name → its `uuid`,
is an **exact** card mapping (`DraHold`). A claim reserved for several pods makes them
share its cards equally (SPEC §7): each holds 1/n of each, n the most pods seen reserving
it at once. A MIG instance is a card of its own held whole (its part of the physical card
is the classifier's, from its profile). A claim allocated but reserved for no pod holds
nothing. When a pod holds its cards is the pod's own tenure (bound to released), which
lies inside the claim's reservation: the scheduler reserves a claim before it binds the
pod and the reservation ends after the pod's containers have.

`DraState` gathers the objects of a file or a watch and gives the holds it can resolve.
A field that cannot be read is a `PodFieldError` naming the field relative to the object.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from auditor import limits
from auditor.collect.pod_fields import list_at, mapping_at, optional_str, required_str
from auditor.errors import PodFieldError, shown
from auditor.model import GpuRecord

GROUP = "resource.k8s.io"
CLAIM_KINDS = frozenset({"ResourceClaim"})
SLICE_KINDS = frozenset({"ResourceSlice"})
LIST_KINDS = frozenset({"ResourceClaimList", "ResourceSliceList"})
CARD_TYPES = frozenset({"gpu", "mig", "vfio"})
"""`type` attributes of NVIDIA's driver that are cards (a VFIO device is a card passed
through whole)."""
CARD_PREFIXES = ("GPU-", "MIG-")
MIB = 1 << 20

DeviceKey = tuple[str, str, str]
"""(driver, pool, device name): how a claim's result names a slice's device."""


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One card (or MIG instance) a ResourceSlice publishes."""

    driver: str
    pool: str
    name: str
    node: str | None
    uuid: str | None
    """None for a device that is not a card (an IMEX channel, a NIC)."""
    index: int | None = None
    model: str | None = None
    memory_mib: float | None = None
    parent_uuid: str | None = None
    profile: str | None = None

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    def records(self) -> list[GpuRecord]:
        """The `gpus` rows this device says: the card, or a MIG instance and its card."""
        if self.node is None or self.uuid is None:
            return []
        if self.parent_uuid is None:
            return [GpuRecord(self.uuid, self.node, self.index, self.model, self.memory_mib)]
        return [
            GpuRecord(self.parent_uuid, self.node, None, self.model),
            GpuRecord(self.uuid, self.node, parent_uuid=self.parent_uuid, mig_profile=self.profile),
        ]


@dataclass(frozen=True, slots=True)
class DraClaim:
    """What one ResourceClaim was given, and whom it is reserved for."""

    uid: str
    namespace: str
    name: str
    results: tuple[DeviceKey, ...]
    pods: tuple[str, ...]
    """UIDs of the pods in `status.reservedFor`."""
    owner: str | None = None
    """UID of the pod the control plane made this claim for (from its template: the
    claim's controlling `ownerReferences` entry of kind Pod); None for a claim made alone."""
    asked: int = 0
    """GPUs (cards or MIG instances) its requests ask for: what a pod still waiting for it
    is waiting for."""


@dataclass(frozen=True, slots=True)
class DraSlice:
    """One ResourceSlice's devices, as a kubectl file gives it."""

    devices: tuple[DraDevice, ...]


@dataclass(frozen=True, slots=True)
class DraHold:
    """A card a claim gives a pod: exact, with the pod's share of it."""

    claim_uid: str
    pod_uid: str
    gpu_uuid: str
    node: str | None
    share: float


def _str_in(parent: Mapping[str, Any], key: str, field: str, *, limit: int) -> str:
    return required_str(parent, key, field, limit=limit)


def read_slice(obj: Mapping[str, Any]) -> list[DraDevice]:
    """The devices a ResourceSlice publishes: its cards, and the others with no UUID."""
    spec = mapping_at(obj, "spec", "spec")
    driver = _str_in(spec, "driver", "spec.driver", limit=limits.NAME_MAX)
    pool = _str_in(
        mapping_at(spec, "pool", "spec.pool"), "name", "spec.pool.name", limit=limits.NAME_MAX
    )
    node = spec.get("nodeName")
    if node is not None and not (
        isinstance(node, str) and len(node) <= limits.NAME_MAX and limits.is_clean(node)
    ):
        raise PodFieldError(f"not a node name: {shown(node)}", field="spec.nodeName", value=node)
    found: list[DraDevice] = []
    for i, dev in enumerate(list_at(spec, "devices", "spec.devices")):
        where = f"spec.devices[{i}]"
        if not isinstance(dev, Mapping):
            raise PodFieldError("a device must be a JSON object", field=where)
        name = _str_in(dev, "name", f"{where}.name", limit=limits.NAME_MAX)
        body = mapping_at(dev, "basic", f"{where}.basic") if "basic" in dev else dev  # v1beta1
        base = f"{where}.basic" if "basic" in dev else where
        attrs = _attributes(body, f"{base}.attributes", driver)
        uuid = attrs.get("uuid")
        kind = attrs.get("type")
        if not isinstance(uuid, str) or not (
            uuid.startswith(CARD_PREFIXES) or (isinstance(kind, str) and kind in CARD_TYPES)
        ):
            found.append(DraDevice(driver, pool, name, node or None, None))  # not a card
            continue
        if len(uuid) > limits.GPU_UUID_MAX or not limits.is_clean(uuid):
            raise PodFieldError("not a GPU UUID", field=f"{base}.attributes.uuid", value=uuid)
        parent = attrs.get("parentUUID")
        if parent is not None and not (
            isinstance(parent, str)
            and 0 < len(parent) <= limits.GPU_UUID_MAX
            and limits.is_clean(parent)
        ):
            raise PodFieldError(
                "not a GPU UUID", field=f"{base}.attributes.parentUUID", value=parent
            )
        index = attrs.get("index", attrs.get("minor"))
        found.append(
            DraDevice(
                driver,
                pool,
                name,
                node or None,
                uuid,
                index if isinstance(index, int) and not isinstance(index, bool) else None,
                _text(attrs.get("productName"), limits.GPU_MODEL_MAX),
                _memory(body, f"{base}.capacity") if parent is None else None,
                parent,
                _text(attrs.get("profile"), limits.SHARE_TEXT_MAX) if parent is not None else None,
            )
        )
    return found


def _text(value: object, limit: int) -> str | None:
    if isinstance(value, str) and value and limits.is_clean(value):
        return value if len(value) <= limit else None
    return None


def _attributes(device: Mapping[str, Any], field: str, driver: str) -> dict[str, object]:
    """A device's attributes by their name in the driver's domain, each as its one value
    (`{"string": ...}`, `{"int": ...}`, `{"bool": ...}`, `{"version": ...}`)."""
    out: dict[str, object] = {}
    for key, value in mapping_at(device, "attributes", field, required=False).items():
        if not isinstance(value, Mapping):
            raise PodFieldError("an attribute must be a JSON object", field=f"{field}.{key}")
        name = key[len(driver) + 1 :] if key.startswith(f"{driver}/") else key
        if "/" in name:
            continue  # another domain's attribute
        for kind in ("string", "int", "bool", "version"):
            if kind in value:
                out[name] = value[kind]
                break
    return out


def _memory(device: Mapping[str, Any], field: str) -> float | None:
    """The `memory` capacity in MiB, where the slice says it (`{"value": "40Gi"}`)."""
    from auditor.collect.shares import quantity

    capacity = mapping_at(device, "capacity", field, required=False)
    memory = capacity.get("memory")
    value = memory.get("value") if isinstance(memory, Mapping) else memory
    if value is None:
        return None
    return quantity(value, f"{field}.memory") / MIB or None  # bytes, with or without suffix


def read_claim(obj: Mapping[str, Any]) -> DraClaim:
    """The devices a ResourceClaim was allocated and the pods it is reserved for."""
    meta = mapping_at(obj, "metadata", "metadata")
    uid = required_str(meta, "uid", "metadata.uid", limit=limits.UID_MAX)
    name = required_str(meta, "name", "metadata.name", limit=limits.NAME_MAX)
    namespace = required_str(meta, "namespace", "metadata.namespace", limit=limits.NAME_MAX)
    status = mapping_at(obj, "status", "status", required=False)
    allocation = mapping_at(status, "allocation", "status.allocation", required=False)
    devices = mapping_at(allocation, "devices", "status.allocation.devices", required=False)
    results: list[DeviceKey] = []
    for i, res in enumerate(list_at(devices, "results", "status.allocation.devices.results")):
        where = f"status.allocation.devices.results[{i}]"
        if not isinstance(res, Mapping):
            raise PodFieldError("a result must be a JSON object", field=where)
        results.append(
            (
                _str_in(res, "driver", f"{where}.driver", limit=limits.NAME_MAX),
                _str_in(res, "pool", f"{where}.pool", limit=limits.NAME_MAX),
                _str_in(res, "device", f"{where}.device", limit=limits.NAME_MAX),
            )
        )
    pods: list[str] = []
    for i, ref in enumerate(list_at(status, "reservedFor", "status.reservedFor")):
        where = f"status.reservedFor[{i}]"
        if not isinstance(ref, Mapping):
            raise PodFieldError("a consumer must be a JSON object", field=where)
        if optional_str(ref, "resource") != "pods" or ref.get("apiGroup") not in (None, ""):
            continue  # another kind of consumer
        pods.append(_str_in(ref, "uid", f"{where}.uid", limit=limits.UID_MAX))
    return DraClaim(
        uid,
        namespace,
        name,
        tuple(results),
        tuple(dict.fromkeys(pods)),
        owner=_owner_pod(meta),
        asked=_gpus_asked(mapping_at(obj, "spec", "spec", required=False), len(results)),
    )


GPU_CLASS = re.compile(r"(?:^|[.-])(?:gpu|mig)(?:[.-]|$)")
"""A DeviceClass of GPUs or MIG instances by its name: NVIDIA's `gpu.nvidia.com` and
`mig.nvidia.com`, `gpu.amd.com`, `gpu.intel.com`; not `compute-domain-…channel.nvidia.com`."""


def _owner_pod(meta: Mapping[str, Any]) -> str | None:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("controller"):
            uid = ref.get("uid")
            if isinstance(uid, str) and 0 < len(uid) <= limits.UID_MAX and limits.is_clean(uid):
                return uid
    return None


def _gpus_asked(spec: Mapping[str, Any], allocated: int) -> int:
    """GPUs the claim's requests ask for: each request of a GPU class counts its `count`
    (`allocationMode: ExactCount`, the default, 1 unless given); `All` counts what was
    allocated, at least 1; of `firstAvailable` alternatives, the first. `v1` nests a
    request's class and count under `exactly`, `v1beta1` and `v1beta2` do not."""
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    if not isinstance(requests, list):
        return 0
    total = 0
    for req in requests:
        if not isinstance(req, Mapping):
            continue
        body = req.get("exactly", req)
        options = req.get("firstAvailable")
        if isinstance(options, list) and options and isinstance(options[0], Mapping):
            body = options[0]
        if not isinstance(body, Mapping):
            continue
        cls = body.get("deviceClassName")
        if not isinstance(cls, str) or not GPU_CLASS.search(cls):
            continue
        if body.get("allocationMode") == "All":
            total += max(allocated, 1)
            continue
        count = body.get("count", 1)
        if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= 1024:
            total += count
    return total


@dataclass
class DraState:
    """The slices' cards and the claims seen so far (a file, or a watch since its list),
    and what they resolve to."""

    devices: dict[DeviceKey, DraDevice] = field(default_factory=dict)
    claims: dict[str, DraClaim] = field(default_factory=dict)
    consumers: dict[str, int] = field(default_factory=dict)
    """Per claim UID, the most pods seen reserving it at once."""
    unknown: set[DeviceKey] = field(default_factory=set)
    """Results naming a device no slice seen has: a slice not read, or not a card."""

    def add_slice(self, devices: Iterable[DraDevice]) -> list[DraDevice]:
        """Remember a slice's cards (a deleted slice's too: claims made while it stood
        still name them); returns them."""
        given = list(devices)
        for dev in given:
            self.devices[dev.key] = dev
        return given

    def add_claim(self, claim: DraClaim) -> None:
        self.claims[claim.uid] = claim
        self.consumers[claim.uid] = max(self.consumers.get(claim.uid, 0), len(claim.pods))

    def forget(self, claim_uid: str) -> None:
        self.claims.pop(claim_uid, None)
        self.consumers.pop(claim_uid, None)

    def holds(self, claim_uids: Iterable[str] | None = None) -> list[DraHold]:
        """The cards each claim (all, or those of `claim_uids`) gives each pod it is
        reserved for. A result naming no known card is left out (and kept in `unknown`)."""
        uids = self.claims.keys() if claim_uids is None else claim_uids
        out: list[DraHold] = []
        for uid in list(uids):
            claim = self.claims.get(uid)
            if claim is None or not claim.pods:
                continue
            share = 1.0 / max(self.consumers.get(uid, 1), len(claim.pods), 1)
            for key in dict.fromkeys(claim.results):
                dev = self.devices.get(key)
                if dev is None:
                    self.unknown.add(key)
                    continue
                self.unknown.discard(key)
                if dev.uuid is None:
                    continue  # not a card
                out.extend(DraHold(uid, p, dev.uuid, dev.node, share) for p in claim.pods)
        return out

    def asks(self) -> dict[str, int]:
        """Per pod, the GPUs the claims made for it ask for (what it waits for while it
        waits; a claim shared by name is not counted: no one pod owns it)."""
        out: dict[str, int] = {}
        for claim in self.claims.values():
            if claim.owner is not None and claim.asked:
                out[claim.owner] = out.get(claim.owner, 0) + claim.asked
        return out

    def resolved(self, claim_uid: str) -> bool:
        """Whether every device a claim was given is a known one (a claim not allocated or
        not reserved has nothing left to resolve)."""
        claim = self.claims.get(claim_uid)
        return claim is None or all(k in self.devices for k in claim.results)
