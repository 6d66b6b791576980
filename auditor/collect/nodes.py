"""One node, as the Kubernetes API writes it in JSON, into a `nodes` row. Pure functions.

The GPU model comes from the first label that names it: NVIDIA's GPU feature discovery
(`nvidia.com/gpu.product`), else the cloud providers' accelerator labels. The GPU count is
the sum of `nvidia.com/gpu` and every `nvidia.com/mig-*` resource, in capacity and in
allocatable. A node is unschedulable when cordoned (`spec.unschedulable`) or tainted
`node.kubernetes.io/unschedulable`.

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
from auditor.collect.workloads import PodFieldError, is_gpu_resource

GPU_MODEL_LABELS = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "k8s.amazonaws.com/accelerator",
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


def node_row(node: Mapping[str, Any], *, at_ms: int) -> dict[str, Any]:
    """The `nodes` row of one observation of `node`, seen at `at_ms`."""
    meta = _obj(node, "metadata")
    spec = _obj(node, "spec")
    status = _obj(node, "status")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise PodFieldError("a node needs a name", field="metadata.name", value=name)
    if len(name) > limits.NAME_MAX or not limits.is_clean(name):
        raise PodFieldError("not a node name", field="metadata.name", value=name)
    labels = {k: v for k, v in _obj(meta, "labels").items() if isinstance(v, str)}
    rv = meta.get("resourceVersion")
    model = gpu_model(labels)
    return {
        "name": name,
        "gpu_model": None if model is None else limits.fit_text(model, limits.GPU_MODEL_MAX),
        "gpu_capacity": gpu_count(_obj(status, "capacity")),
        "gpu_allocatable": gpu_count(_obj(status, "allocatable")),
        "unschedulable": is_unschedulable(spec),
        "labels": labels,
        "resource_version": rv if isinstance(rv, str) and len(rv) <= limits.VERSION_MAX else None,
        "updated_ms": at_ms,
    }


def gpu_model(labels: Mapping[str, str]) -> str | None:
    for key in GPU_MODEL_LABELS:
        value = labels.get(key)
        if value:
            return value
    return None


def gpu_count(resources: Mapping[str, Any]) -> int:
    """GPUs in a capacity/allocatable map; a quantity that is not a whole number counts 0."""
    total = 0
    for name, qty in resources.items():
        if is_gpu_resource(name):
            text = str(qty).strip()
            total += int(text) if text.isdigit() else 0
    return total


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
