"""Pods and nodes in the API's JSON shape, for the stand-in API server and the watcher tests.

`pod()` builds a pod at one point of its life from the times given so far: pending
(created), scheduled (bound), running (started), terminated (finished), being deleted
(deleted: `deletionTimestamp` set). Times are epoch milliseconds on whole seconds, as the
API writes them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
T0 = 1_796_000_000_000
"""A fixed start for scenario times (late 2026), on a whole second."""


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str,
    *,
    uid: str,
    namespace: str = "ml",
    gpus: int = 1,
    node: str | None = None,
    created: int = T0,
    bound: int | None = None,
    started: int | None = None,
    finished: int | None = None,
    deleted: int | None = None,
    labels: dict[str, str] | None = None,
) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "creationTimestamp": rfc3339(created),
        "labels": labels if labels is not None else {"team": "vision"},
    }
    if deleted is not None:
        meta["deletionTimestamp"] = rfc3339(deleted)
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: Obj = {"containers": [{"name": "main", "image": "trainer", "resources": resources}]}
    status: Obj = {"phase": "Pending"}
    if bound is not None:
        spec["nodeName"] = node or "gpu-node-1"
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(bound)}
        ]
    if started is not None:
        state: Obj = {"running": {"startedAt": rfc3339(started)}}
        if finished is not None:
            state = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": rfc3339(started),
                    "finishedAt": rfc3339(finished),
                }
            }
        status["containerStatuses"] = [{"name": "main", "ready": finished is None, "state": state}]
        status["phase"] = "Running" if finished is None else "Succeeded"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def node(
    name: str,
    *,
    gpus: int = 8,
    model: str | None = "NVIDIA-H100-80GB-HBM3",
    cordoned: bool = False,
) -> Obj:
    labels = {"kubernetes.io/hostname": name}
    if model:
        labels["nvidia.com/gpu.product"] = model
    spec: Obj = {"unschedulable": True} if cordoned else {}
    resources = {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"node-{name}", "labels": labels},
        "spec": spec,
        "status": {"capacity": resources, "allocatable": resources},
    }
