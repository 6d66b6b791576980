"""Domain records the store and collector tests build, in one place."""

from __future__ import annotations

from auditor.model import PodRecord, WorkloadKind


def bare_pod(
    name: str, uid: str, *, bound_ms: int, finished_ms: int | None = None, gpu_count: int = 1
) -> PodRecord:
    """A bare training pod of namespace and team `ml` on node-a, its own gang."""
    return PodRecord(
        uid=uid,
        namespace="ml",
        name=name,
        node="node-a",
        team="ml",
        job=f"Pod/{name}",
        job_kind="Pod",
        workload=WorkloadKind.TRAINING,
        gang=uid,
        gpu_count=gpu_count,
        bound_ms=bound_ms,
        finished_ms=finished_ms,
    )
