"""One node, as the Kubernetes API writes it in JSON, into a `nodes` row. Pure functions.

The GPU model comes from the first label that names it: NVIDIA's GPU feature discovery
(`nvidia.com/gpu.product`), else the cloud providers' accelerator labels. The GPU count, in
capacity and in allocatable, is of physical cards wherever the node says how many it has:
Alibaba's `alibabacloud.com/gpu-count`; on a shared node (time-slicing replicas, HAMi's
`nvidia.com/vgpu`, gpu-milli) and on a MIG node GPU feature discovery's `nvidia.com/gpu.count`
label, else
the cards HAMi registers in the node annotation `hami.io/node-nvidia-register`, else
the shared units turned back into cards (`nvidia.com/gpu` or `nvidia.com/gpu.shared` over
`nvidia.com/gpu.replicas`, `alibabacloud.com/gpu-milli` over 1000). Otherwise it is the sum of
`nvidia.com/gpu` and every `nvidia.com/mig-*` resource, as before. A node is unschedulable
when cordoned (`spec.unschedulable`) or tainted `node.kubernetes.io/unschedulable`.

Each observation also says which outages of SPEC §10 it shows (`node_state`): cordoned,
not Ready, or short of allocatable cards, each with when it began; the store turns the
observations into stretches (`auditor.store.outages`).

The node's labels are kept whole (string values only), so the sharing labels of SPEC §7
(`nvidia.com/gpu.replicas`, `nvidia.com/gpu.sharing-strategy`, `nvidia.com/mig.config`)
are stored with it; `SHARING_LABELS` names them. Text is fitted to the `nodes` columns
(`auditor.limits`): a GPU model longer than the column is cut with a digest, a name that
no column can hold is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from auditor import limits
from auditor.collect.pod_times import parse_time
from auditor.collect.shares import HAMI_VGPU, MIG_PREFIX, MILLI, WHOLE_RESOURCES
from auditor.errors import PodFieldError
from auditor.model import NodeState

GPU_MODEL_LABELS = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "k8s.amazonaws.com/accelerator",
    "alibabacloud.com/gpu-card-model",
    "accelerator",
)
"""Labels that name a node's GPU model, most specific first."""

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
SHARING_LABELS = (
    "nvidia.com/gpu.replicas",
    "nvidia.com/gpu.sharing-strategy",
    "nvidia.com/mig.config",
)
"""The NVIDIA device plugin's and MIG manager's labels saying how a node's cards are shared."""


def node_row(node: Mapping[str, Any], *, at_ms: int, exact: bool = True) -> dict[str, Any]:
    """The `nodes` row of one observation of `node`, seen at `at_ms`, with the outages it
    shows under `state` (a `NodeState`, `node_state`; not a column). `exact`: `at_ms` is when
    the object was seen (the watcher); else it is only a bound (a kubectl file's time)."""
    meta = _obj(node, "metadata")
    spec = _obj(node, "spec")
    status = _obj(node, "status")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise PodFieldError("a node needs a name", field="metadata.name", value=name)
    if len(name) > limits.NAME_MAX or not limits.is_clean(name):
        raise PodFieldError("not a node name", field="metadata.name", value=name)
    labels = {k: v for k, v in _obj(meta, "labels").items() if isinstance(v, str)}
    annotations = {k: v for k, v in _obj(meta, "annotations").items() if isinstance(v, str)}
    rv = meta.get("resourceVersion")
    model = gpu_model(labels)
    capacity = gpu_count(_obj(status, "capacity"), labels, annotations)
    allocatable = gpu_count(_obj(status, "allocatable"), labels, annotations)
    return {
        "name": name,
        "gpu_model": None if model is None else limits.fit_text(model, limits.GPU_MODEL_MAX),
        "gpu_capacity": capacity,
        "gpu_allocatable": allocatable,
        "unschedulable": is_unschedulable(spec),
        "labels": labels,
        "resource_version": rv if isinstance(rv, str) and len(rv) <= limits.VERSION_MAX else None,
        "updated_ms": at_ms,
        "state": node_state(
            name,
            spec=spec,
            status=status,
            short=allocatable < capacity,
            seen_ms=at_ms if exact else carried_time(status, not_after=at_ms),
            not_after=at_ms,
        ),
    }


def node_state(
    name: str,
    *,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    short: bool,
    seen_ms: int,
    not_after: int | None = None,
) -> NodeState:
    """The outages one observation shows (SPEC §10 `unavailable`), each with its start:

    - `cordoned` (`spec.unschedulable`, or the `node.kubernetes.io/unschedulable` taint): from
      the taint's `timeAdded`, else from `seen_ms`;
    - `not_ready` (the `Ready` condition False or Unknown): from its `lastTransitionTime`,
      else `seen_ms` (a node without a `Ready` condition says nothing, and is not counted);
    - `short` (fewer GPUs allocatable than in capacity: the device plugin lost cards): from
      `seen_ms`, the object carries no time for it.

    `not_after` is the latest the observation can have been made (default `seen_ms`; a
    kubectl file's time, where `seen_ms` is only what the object carries): no time the
    object states is taken to be later. Times that cannot be read count as absent."""
    latest = seen_ms if not_after is None else max(not_after, seen_ms)
    outages: dict[str, int] = {}
    if is_unschedulable(spec):
        added = next(
            (
                _time(t.get("timeAdded"))
                for t in _list(spec.get("taints"))
                if isinstance(t, Mapping) and t.get("key") == UNSCHEDULABLE_TAINT
            ),
            None,
        )
        outages["cordoned"] = seen_ms if added is None else min(added, latest)
    ready = next(
        (
            c
            for c in _list(status.get("conditions"))
            if isinstance(c, Mapping) and c.get("type") == "Ready"
        ),
        None,
    )
    since = _time(ready.get("lastTransitionTime")) if ready is not None else None
    ready_since: int | None = None
    if ready is not None and ready.get("status") != "True":
        outages["not_ready"] = seen_ms if since is None else min(since, latest)
    elif ready is not None and since is not None:
        ready_since = min(since, latest)
    if short:
        outages["short"] = seen_ms
    return NodeState(name, seen_ms, outages, ready_since)


def carried_time(status: Mapping[str, Any], *, not_after: int) -> int:
    """When an observation in a kubectl file was made, as near as the object says: its
    conditions' latest `lastHeartbeatTime` (the kubelet posts one at least every five
    minutes, so a node in a watch stream is dated by it), not after the file's time
    `not_after`; the file's time where no condition carries one."""
    beats = [
        t
        for c in _list(status.get("conditions"))
        if isinstance(c, Mapping)
        for t in (_time(c.get("lastHeartbeatTime")),)
        if t is not None
    ]
    return min(max(beats), not_after) if beats else not_after


def _time(value: object) -> int | None:
    try:
        return parse_time(value, field="time")
    except PodFieldError:
        return None


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def gpu_model(labels: Mapping[str, str]) -> str | None:
    for key in GPU_MODEL_LABELS:
        value = labels.get(key)
        if value:
            return value
    return None


GPU_COUNT_RESOURCE = "alibabacloud.com/gpu-count"
GFD_COUNT_LABEL = "nvidia.com/gpu.count"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"


HAMI_REGISTER = "hami.io/node-nvidia-register"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"


def gpu_count(
    resources: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> int:
    """Physical GPUs in a capacity/allocatable map (the module says how); a quantity that is
    not a whole number counts 0."""
    labels = labels or {}
    registered = (annotations or {}).get(HAMI_REGISTER, "")
    units = {name: _whole(qty) for name, qty in resources.items()}
    if units.get(GPU_COUNT_RESOURCE):
        return units[GPU_COUNT_RESOURCE]
    replicas = _whole(labels.get(REPLICAS_LABEL, "1")) or 1
    shared = replicas > 1 or any(units.get(n) for n in (HAMI_VGPU, MILLI, "nvidia.com/gpu.shared"))
    # MIG: the mixed strategy lists instances as `nvidia.com/mig-*`, the single strategy as
    # `nvidia.com/gpu`; either way GPU feature discovery's count is of physical cards
    mig = labels.get(MIG_STRATEGY_LABEL) == "single" or any(
        n for name, n in units.items() if name.startswith(MIG_PREFIX)
    )
    if (shared or mig) and _whole(labels.get(GFD_COUNT_LABEL, "")):
        return _whole(labels[GFD_COUNT_LABEL])
    cards = [d for d in registered.split(":") if d.strip().startswith("GPU-")]
    if cards and (shared or units.get("nvidia.com/gpu")):
        return len(cards)
    total = 0
    for name, n in units.items():
        if name in WHOLE_RESOURCES:
            total += n // replicas
        elif name.startswith(MIG_PREFIX):
            total += n
        elif name == MILLI:
            total += n // 1000
    return total


def _whole(qty: object) -> int:
    text = str(qty).strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else 0


def is_unschedulable(spec: Mapping[str, Any]) -> bool:
    if spec.get("unschedulable") is True:
        return True
    taints = spec.get("taints")
    if not isinstance(taints, list):
        return False
    return any(isinstance(t, Mapping) and t.get("key") == UNSCHEDULABLE_TAINT for t in taints)


def _obj(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}
