"""Whether a GPU pod is waiting to be scheduled, and why (SPEC §10 `blocked`, queue waste).

One observation of a pod is **waiting** when it is not bound to a node yet (no
`spec.nodeName`, no `PodScheduled=True`), has not ended (not Succeeded/Failed) and
something holds it back, the first that holds:

1. `SchedulingGated`: `spec.schedulingGates` is not empty (Kueue's
   `kueue.x-k8s.io/admission`, or any gate), or `PodScheduled=False` says `SchedulingGated`;
   the message names the gates.
2. `Unschedulable`: `PodScheduled=False` with reason `Unschedulable`; the message is the
   scheduler's (`0/12 nodes are available: 3 Insufficient nvidia.com/gpu`).
3. `PodGroup`: the pod is in a gang scheduler's pod group (Volcano's annotation
   `scheduling.k8s.io/group-name`, KAI's `pod-group-name`, the coscheduling plugin's
   `scheduling.x-k8s.io/pod-group` or `pod-group.scheduling.sigs.k8s.io`, as annotation or
   label), or names `volcano` or `kai-scheduler` as its `schedulerName`; the message is the
   condition's, else the group's name.

Gates come first: a gated pod is outside the scheduler's queue whatever an older condition
says. Anything else is not waiting: a pod the scheduler has not judged yet (Pending, no
condition), one refused for another reason (`SchedulerError`), one already bound.

A pod asks for a kind of card through its `nodeSelector` or its required node affinity on a
label that names a node's GPU model (`auditor.collect.nodes.GPU_MODEL_LABELS`, NVIDIA's
`nvidia.com/gpu.product` first): one value is the model it waits for; none, several, or a
negative operator is any card (None).

Messages are stored bounded (`limits.MESSAGE_MAX`), cut on a whole word with an ellipsis,
with anything that looks like a credential masked (`auditor.redact`). Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from auditor import limits
from auditor.collect.nodes import GPU_MODEL_LABELS
from auditor.redact import redact

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
UNSCHEDULABLE = "Unschedulable"
GATED = "SchedulingGated"
POD_GROUP = "PodGroup"
WAIT_REASONS = (UNSCHEDULABLE, GATED, POD_GROUP)

POD_GROUP_KEYS = (
    "scheduling.k8s.io/group-name",  # Volcano
    "pod-group-name",  # KAI scheduler (and Run:ai)
    "scheduling.x-k8s.io/pod-group",  # scheduler-plugins coscheduling
    "pod-group.scheduling.sigs.k8s.io",  # its older name
)
"""Annotations (or labels) that put a pod in a gang scheduler's pod group."""
GANG_SCHEDULERS = frozenset({"volcano", "kai-scheduler"})
"""`schedulerName`s that hold a pod until its whole pod group fits."""
ELLIPSIS = "…"


@dataclass(frozen=True, slots=True)
class PodWait:
    """Why one observation of a pod waits (`reason` None: it does not), and for what card."""

    reason: str | None = None
    message: str | None = None
    wanted_model: str | None = None


def pod_wait(
    *,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
) -> PodWait:
    """The wait of one observation (module docstring). Never raises on odd shapes: a field
    that is not what the API writes counts as absent (the pod's other readers refuse it)."""
    wanted = wanted_model(spec)
    if spec.get("nodeName") or status.get("phase") in TERMINAL_PHASES:
        return PodWait(wanted_model=wanted)
    scheduled = _scheduled_condition(status)
    if scheduled is not None and scheduled.get("status") == "True":
        return PodWait(wanted_model=wanted)
    gates = [
        g["name"]
        for g in _list(spec.get("schedulingGates"))
        if isinstance(g, Mapping) and isinstance(g.get("name"), str) and g["name"]
    ]
    reason = _text(scheduled.get("reason")) if scheduled is not None else None
    message = _text(scheduled.get("message")) if scheduled is not None else None
    if gates or reason == GATED:
        text = f"held by scheduling gates: {', '.join(gates)}" if gates else message
        return PodWait(GATED, bounded_message(text), wanted)
    if reason == UNSCHEDULABLE:
        return PodWait(UNSCHEDULABLE, bounded_message(message), wanted)
    group = next(
        (v for k in POD_GROUP_KEYS for v in (annotations.get(k), labels.get(k)) if v), None
    )
    if group is not None or spec.get("schedulerName") in GANG_SCHEDULERS:
        text = message or (f"waiting for pod group {group}" if group else None)
        return PodWait(POD_GROUP, bounded_message(text), wanted)
    return PodWait(wanted_model=wanted)


def wanted_model(spec: Mapping[str, Any]) -> str | None:
    """The one GPU model the pod's nodeSelector or required node affinity asks for, or None."""
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        for key in GPU_MODEL_LABELS:
            value = selector.get(key)
            if isinstance(value, str) and value:
                return limits.fit_text(value, limits.GPU_MODEL_MAX)
    terms = _list(
        _get(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution")
        .get("nodeSelectorTerms")
    )  # fmt: skip
    found: set[str] = set()
    for term in terms:
        if not isinstance(term, Mapping):
            continue
        models = _term_models(term)
        if models is None:  # a term that admits any card: the pod can take any
            return None
        found |= models
    if len(found) == 1:
        return limits.fit_text(found.pop(), limits.GPU_MODEL_MAX)
    return None


def _term_models(term: Mapping[str, Any]) -> set[str] | None:
    """The models one node selector term admits (terms are ORed, expressions ANDed), None
    for any model."""
    admitted: set[str] | None = None
    for expr in _list(term.get("matchExpressions")):
        if not isinstance(expr, Mapping) or expr.get("key") not in GPU_MODEL_LABELS:
            continue
        if expr.get("operator") != "In":
            continue  # NotIn, Exists, DoesNotExist: no one model
        values = {v for v in _list(expr.get("values")) if isinstance(v, str) and v}
        admitted = values if admitted is None else admitted & values
    return admitted


def bounded_message(text: str | None, limit: int = limits.MESSAGE_MAX) -> str | None:
    """`text` as stored: credentials masked, whitespace runs made one space, and when longer
    than `limit`, cut at the last whole word that fits with an ellipsis after it."""
    if not text:
        return None
    clean = " ".join(limits.clean_text(redact(text)).split())
    if len(clean) <= limit:
        return clean or None
    head = clean[: limit - len(ELLIPSIS)]
    cut = head.rfind(" ")
    if cut > limit // 2:
        head = head[:cut]
    return head.rstrip(" ,;:.") + ELLIPSIS


def _scheduled_condition(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in _list(status.get("conditions")):
        if isinstance(cond, Mapping) and cond.get("type") == "PodScheduled":
            return cond
    return None


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _get(parent: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
    for key in keys:
        value = parent.get(key)
        parent = value if isinstance(value, Mapping) else {}
    return parent


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
