"""Idempotent writes of pods: observations merged by UID (later state wins, times are filled
in and never erased), and what the pod watcher does to the pods a relist no longer shows or
that still wait. Every function takes an open connection inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import BigInteger, Connection, case, func, literal, select, update

from auditor.collect.shares import DRA_RESOURCE
from auditor.model import DEFAULT_CLUSTER, PodRecord
from auditor.store.bounds import check_row
from auditor.store.ranks import PYTORCH_JOB, settle_pytorch_ranks
from auditor.store.schema import pods
from auditor.store.writes import greatest, least, upsert_statement


def _merge_pod(old: PodRecord | None, new: PodRecord) -> PodRecord:
    """Later observations win for state; times are filled in, never erased.

    Created, bound and started keep the earliest value seen: a container status remembers
    only its previous run, so after restarts a later observation reports a later start.
    """
    if old is None:
        return new

    def pick(name: str) -> Any:
        value = getattr(new, name)
        return value if value is not None else getattr(old, name)

    def earliest(name: str) -> Any:
        values = [v for v in (getattr(old, name), getattr(new, name)) if v is not None]
        return min(values) if values else None

    return replace(
        new,
        node=pick("node"),
        created_ms=earliest("created_ms"),
        bound_ms=earliest("bound_ms"),
        started_ms=earliest("started_ms"),
        finished_ms=pick("finished_ms"),
        deleted_ms=pick("deleted_ms"),
        rank=pick("rank"),
        wait_reason=pick("wait_reason"),
        wait_message=pick("wait_message") if new.wait_reason is not None else old.wait_message,
        wanted_model=pick("wanted_model"),
        wait_seen_ms=max(
            (t for t in (old.wait_seen_ms, new.wait_seen_ms) if t is not None), default=None
        ),
    )


_EARLIEST_COLUMNS = ("created_ms", "bound_ms", "started_ms")
_LATEST_FILLED_COLUMNS = ("finished_ms", "deleted_ms", "node", "rank", "wanted_model")
_WAIT_COLUMNS = ("wait_reason", "wait_message")
"""Why a pod waited, as last seen: an observation that shows no wait (it is bound) keeps
what an earlier one said; one that shows a wait replaces reason and message together."""


def upsert_pods(
    conn: Connection, records: Iterable[PodRecord], *, cluster: str = DEFAULT_CLUSTER
) -> int:
    """Merge pod observations of `cluster` into the store by UID (a UID is unique across
    clusters; the latest cluster a pod was seen in wins). Returns the number of distinct
    pods."""
    merged: dict[str, PodRecord] = {}
    for rec in records:
        merged[rec.uid] = _merge_pod(merged.get(rec.uid), rec)
    if not merged:
        return 0
    stmt = upsert_statement(conn, pods)
    keep_old = {c: least(conn, stmt.excluded[c], pods.c[c]) for c in _EARLIEST_COLUMNS}
    keep_old |= {c: func.coalesce(stmt.excluded[c], pods.c[c]) for c in _LATEST_FILLED_COLUMNS}
    waiting = stmt.excluded.wait_reason.is_not(None)
    keep_old |= {c: case((waiting, stmt.excluded[c]), else_=pods.c[c]) for c in _WAIT_COLUMNS}
    keep_old["wait_seen_ms"] = greatest(conn, stmt.excluded.wait_seen_ms, pods.c.wait_seen_ms)
    replace_cols = (
        "cluster",
        "namespace",
        "name",
        "team",
        "job",
        "job_kind",
        "workload",
        "gang",
        "gpu_count",
        "gpu_resource",
        "phase",
        "resource_version",
        "labels",
        "annotations",
        "share_kind",
        "gpu_share",
        "gpu_mem_mib",
        "gpu_mem_share",
    )
    replaced = {c: stmt.excluded[c] for c in replace_cols}
    # a DRA pod's count is its claims' (`jobs.dra.write_asks`): its own record says 0
    replaced["gpu_count"] = case(
        (
            (stmt.excluded.gpu_resource == DRA_RESOURCE) & (stmt.excluded.gpu_count == 0),
            pods.c.gpu_count,
        ),
        else_=stmt.excluded.gpu_count,
    )
    stmt = stmt.on_conflict_do_update(index_elements=[pods.c.uid], set_={**keep_old, **replaced})
    rows = [{**pod_row(r), "cluster": cluster} for r in merged.values()]
    for row in rows:
        check_row(pods, row, what=f"pod {row['namespace']}/{row['name']}")
    conn.execute(stmt, rows)
    settle_pytorch_ranks(conn, {r.job for r in merged.values() if r.job_kind == PYTORCH_JOB})
    return len(merged)


def pod_row(rec: PodRecord) -> dict[str, Any]:
    return {
        "uid": rec.uid,
        "namespace": rec.namespace,
        "name": rec.name,
        "node": rec.node,
        "team": rec.team,
        "job": rec.job,
        "job_kind": rec.job_kind,
        "workload": str(rec.workload),
        "gang": rec.gang,
        "rank": rec.rank,
        "gpu_count": rec.gpu_count,
        "gpu_resource": rec.gpu_resource,
        "created_ms": rec.created_ms,
        "bound_ms": rec.bound_ms,
        "started_ms": rec.started_ms,
        "finished_ms": rec.finished_ms,
        "deleted_ms": rec.deleted_ms,
        "phase": rec.phase,
        "resource_version": rec.resource_version,
        "labels": dict(rec.labels),
        "annotations": dict(rec.annotations),
        "share_kind": rec.share_kind,
        "gpu_share": rec.gpu_share,
        "gpu_mem_mib": rec.gpu_mem_mib,
        "gpu_mem_share": rec.gpu_mem_share,
        "wait_reason": rec.wait_reason,
        "wait_message": rec.wait_message,
        "wanted_model": rec.wanted_model,
        "wait_seen_ms": rec.wait_seen_ms,
    }


def close_missing_pods(
    conn: Connection,
    *,
    listed_uids: Collection[str],
    at_ms: int,
    in_scope: Callable[[str, Mapping[str, str]], bool] = lambda _ns, _labels: True,
    cluster: str = DEFAULT_CLUSTER,
) -> list[str]:
    """Close the tenure of open pods a relist no longer shows: deleted at `at_ms`, estimated.

    Open = no deletion time yet. `in_scope(namespace, labels)` says whether the relist could
    have shown the pod at all (a watcher of one namespace or selector must not close others);
    a watcher of one cluster closes no pod of another. Returns the UIDs closed.
    """
    listed = set(listed_uids)
    rows = conn.execute(
        select(pods.c.uid, pods.c.namespace, pods.c.labels).where(
            pods.c.deleted_ms.is_(None), pods.c.cluster == cluster
        )
    )
    gone = [
        uid
        for uid, namespace, labels in rows
        if uid not in listed and in_scope(namespace, labels or {})
    ]
    for start in range(0, len(gone), 500):
        conn.execute(
            update(pods)
            .where(pods.c.uid.in_(gone[start : start + 500]), pods.c.deleted_ms.is_(None))
            .values(deleted_ms=at_ms, deleted_estimated=True)
        )
    return gone


def touch_waiting_pods(
    conn: Connection,
    *,
    at_ms: int,
    in_scope: Callable[[str, Mapping[str, str]], bool] = lambda _ns, _labels: True,
    cluster: str = DEFAULT_CLUSTER,
) -> int:
    """Mark the pods of `cluster` still waiting to be scheduled (a wait reason, not bound,
    not ended) as seen waiting at `at_ms`, where the watcher could see them (`in_scope`).
    Returns how many."""
    rows = conn.execute(
        select(pods.c.uid, pods.c.namespace, pods.c.labels).where(
            pods.c.cluster == cluster,
            pods.c.wait_reason.is_not(None),
            pods.c.bound_ms.is_(None),
            pods.c.finished_ms.is_(None),
            pods.c.deleted_ms.is_(None),
        )
    )
    uids = [uid for uid, namespace, labels in rows if in_scope(namespace, labels or {})]
    for start in range(0, len(uids), 500):
        conn.execute(
            update(pods)
            .where(pods.c.uid.in_(uids[start : start + 500]))
            .values(wait_seen_ms=greatest(conn, literal(at_ms, BigInteger), pods.c.wait_seen_ms))
        )
    return len(uids)


def known_deletions(conn: Connection, uids: Collection[str]) -> dict[str, int]:
    """The deletion times stored for those of `uids` that have one."""
    if not uids:
        return {}
    rows = conn.execute(
        select(pods.c.uid, pods.c.deleted_ms).where(
            pods.c.uid.in_(uids), pods.c.deleted_ms.is_not(None)
        )
    )
    return {uid: int(ms) for uid, ms in rows}
