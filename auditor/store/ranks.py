"""Ranks that one pod cannot tell alone, settled across the stored pods of its job.

A PyTorchJob worker's rank is its replica index + 1 when the job has a master, else its
index (SPEC §2.2). The operator writes it into the pod as `RANK` where it can; a worker
without one is stored unranked and settled here from the job's pods in the store, after
every write of pods, by `auditor.model.pytorch_worker_ranks`. A master seen
later (another file, a later watch event) shifts its job's settled workers up again.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, select, update

from auditor.model import pytorch_worker_ranks
from auditor.store.schema import pods

PYTORCH_JOB = "PyTorchJob"
_JOBS_PER_QUERY = 500


def settle_pytorch_ranks(conn: Connection, jobs: Iterable[str]) -> int:
    """Settle the worker ranks of the PyTorchJobs named `jobs`; returns the pods changed."""
    names = sorted(set(jobs))
    changed = 0
    for i in range(0, len(names), _JOBS_PER_QUERY):
        part = names[i : i + _JOBS_PER_QUERY]
        rows = conn.execute(
            select(pods.c.job, pods.c.uid, pods.c.rank, pods.c.labels, pods.c.annotations).where(
                pods.c.job_kind == PYTORCH_JOB, pods.c.job.in_(part)
            )
        )
        by_job: dict[str, list[tuple[str, int | None, dict[str, str], dict[str, str]]]] = {}
        for job, uid, rank, labels, notes in rows:
            by_job.setdefault(job, []).append((uid, rank, labels or {}, notes or {}))
        for members in by_job.values():
            for uid, rank in pytorch_worker_ranks(members).items():
                conn.execute(update(pods).where(pods.c.uid == uid).values(rank=rank))
                changed += 1
    return changed
