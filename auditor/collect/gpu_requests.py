"""The GPUs a pod asks for, read from its containers' resources (SPEC §2.2, §7).

The effective request of each GPU resource (`nvidia.com/gpu`, every `nvidia.com/mig-*`, and
the shared-GPU names of `auditor.collect.shares`), as the scheduler counts it: the larger of
the app containers' sum (plus sidecars) and the peak of the init containers. A container's
count is its limit, else its request. `shares` turns these and the pod's annotations into
the units held and the share of a card asked for (SPEC §7). A pod that asks for none but
names `spec.resourceClaims` (Dynamic Resource Allocation) is kept as a `dra` pod of no card
of its own: its claims say which cards it holds (`auditor.collect.dra`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from auditor import limits
from auditor.collect import shares
from auditor.collect.pod_fields import mapping_at
from auditor.errors import PodFieldError, shown
from auditor.settings import Sharing

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


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
    ask = shares.gpu_ask(
        totals, per_device, namespace=namespace, annotations=annotations, sharing=sharing
    )
    if ask.count == 0 and ask.share_kind is None and _claims(spec):
        return shares.GpuAsk(0, shares.DRA_RESOURCE, shares.KIND_DRA)
    return ask


def _claims(spec: Mapping[str, Any]) -> bool:
    """Whether the pod names ResourceClaims (SPEC §12): its cards are what they were given
    (`auditor.collect.dra`), none until then."""
    claims = spec.get("resourceClaims")
    if claims is None:
        return False
    if not isinstance(claims, list):
        raise PodFieldError("must be a list of claims", field="spec.resourceClaims")
    return len(claims) > 0


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
        resources = mapping_at(c, "resources", f"{where}.resources", required=False)
        counts: dict[str, float] = {}
        per_device: dict[str, float] = {}
        for section in ("requests", "limits"):  # limits win: read them last
            values = mapping_at(resources, section, f"{where}.resources.{section}", required=False)
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
