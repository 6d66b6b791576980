"""Idempotent writes. Natural keys (GPU UUID; GPU + timestamp; pod UID) make a replay harmless.
The pods' own writes (merging observations, closing and touching them) are in
`auditor.store.pod_writes`.

Every function takes an open connection inside the caller's transaction, so one import is
one transaction and a failure leaves the database as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    Connection,
    Table,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite

from auditor.errors import shown
from auditor.model import (
    DEFAULT_CLUSTER,
    ExactAssignment,
    GpuConflict,
    GpuRecord,
    GpuSample,
    TenantSample,
    Window,
)
from auditor.store.bounds import RowError, check_row
from auditor.store.bulk import SAMPLE_COLUMNS, object_spans, write_rows
from auditor.store.connection import write_lock
from auditor.store.many_rows import insert_many
from auditor.store.schema import (
    audit_findings,
    audit_results,
    audit_runs,
    gpu_assignments,
    gpu_tenant_util,
    gpus,
    nodes,
    watch_cursors,
)

NodeRow = Mapping[str, Any]
"""A `nodes` row: name, gpu_model, gpu_capacity, gpu_allocatable, unschedulable, labels,
resource_version, updated_ms (see `auditor.collect.nodes.node_row`)."""


def upsert_statement(conn: Connection, table: Table) -> Any:
    """The dialect's INSERT that knows ON CONFLICT (SQLite and PostgreSQL both do)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def least(conn: Connection, new: Any, old: Any) -> Any:
    """The smaller of two nullable values (NULL only when both are)."""
    a, b = func.coalesce(new, old), func.coalesce(old, new)
    return func.min(a, b) if conn.dialect.name == "sqlite" else func.least(a, b)


def greatest(conn: Connection, new: Any, old: Any) -> Any:
    """The greater of two nullable values (NULL only when both are)."""
    a, b = func.coalesce(new, old), func.coalesce(old, new)
    return func.max(a, b) if conn.dialect.name == "sqlite" else func.greatest(a, b)


def gpu_conflicts(
    conn: Connection, records: Iterable[GpuRecord], *, cluster: str = DEFAULT_CLUSTER
) -> list[GpuConflict]:
    """The records that would move a stored GPU to another node or cluster, or change its
    known model, where they are written as cards of `cluster`.

    A GPU UUID is one physical card: the node a sample was taken on is history, so a record
    naming another node is a conflict (a wrong `--node`, or a card moved: either way its
    past samples must not move). A model is a conflict only where both are known; unknown
    (None) fields may be filled in. Records of one UUID that disagree with each other
    conflict too, the first being taken as `stored`. One conflict per UUID, in record order.
    """
    known: dict[str, GpuRecord] = {}  # per UUID: the first node, the first known model
    found: dict[str, GpuConflict] = {}
    for rec in records:
        seen = known.setdefault(rec.uuid, rec)
        if rec.uuid in found:
            continue
        conflict = _conflict(rec, node=seen.node, model=seen.model)
        if conflict is not None:
            found[rec.uuid] = conflict
        elif seen.model is None and rec.model is not None:
            known[rec.uuid] = replace(seen, model=rec.model)
    if not known:
        return []
    rows = conn.execute(
        select(gpus.c.uuid, gpus.c.node, gpus.c.model, gpus.c.cluster).where(
            gpus.c.uuid.in_(list(known))
        )
    )
    for uuid, node, model, stored_cluster in rows:
        conflict = _conflict(known[uuid], node=node, model=model)
        if conflict is None and stored_cluster != cluster:
            conflict = GpuConflict(uuid, "cluster", stored_cluster, cluster)
        if conflict is not None:
            found[uuid] = conflict  # the store's view wins over the records' own
    return [found[u] for u in known if u in found]


def _conflict(rec: GpuRecord, *, node: str, model: str | None) -> GpuConflict | None:
    if rec.node != node:
        return GpuConflict(rec.uuid, "node", node, rec.node)
    if rec.model is not None and model is not None and rec.model != model:
        return GpuConflict(rec.uuid, "model", model, rec.model)
    return None


def upsert_gpus(
    conn: Connection,
    records: Iterable[GpuRecord],
    *,
    file: str | None = None,
    lines: Mapping[str, int] | None = None,
    util_source: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> dict[str, int]:
    """Insert unknown GPUs as cards of `cluster`, fill in attributes a later source knows;
    return uuid -> id.

    Refuses a record that moves a stored GPU (to another node or cluster) or changes its
    model (`gpu_conflicts`): raises
    `GpuConflictError` for the first, naming `file` and the line `lines` gives its UUID, so
    that the caller's transaction rolls back. A GPU's node is never rewritten.

    `util_source` is the utilisation source of records that name none (an importer's own,
    e.g. `nvidia-smi`). Like the other attributes, the latest source that names one wins: a
    card whose samples came from nvidia-smi logs and now come from the sampler says `nvml`.
    It is never a conflict (two readers of one card may both be right)."""
    given = list(records)
    if not given:
        return {}
    if util_source is not None:
        given = [r if r.util_source else replace(r, util_source=util_source) for r in given]
    for conflict in gpu_conflicts(conn, given, cluster=cluster):
        raise conflict.error(file=file, line=(lines or {}).get(conflict.uuid))
    merged: dict[str, GpuRecord] = {}
    for rec in given:
        old = merged.get(rec.uuid)
        merged[rec.uuid] = rec if old is None else _fill(old, rec)
    stmt = upsert_statement(conn, gpus)
    stmt = stmt.on_conflict_do_update(
        index_elements=[gpus.c.uuid],
        set_={
            "gpu_index": func.coalesce(stmt.excluded.gpu_index, gpus.c.gpu_index),
            "model": func.coalesce(stmt.excluded.model, gpus.c.model),
            "memory_total_mib": func.coalesce(
                stmt.excluded.memory_total_mib, gpus.c.memory_total_mib
            ),
            "parent_uuid": func.coalesce(stmt.excluded.parent_uuid, gpus.c.parent_uuid),
            "util_source": func.coalesce(stmt.excluded.util_source, gpus.c.util_source),
            "mig_profile": func.coalesce(stmt.excluded.mig_profile, gpus.c.mig_profile),
        },
    )
    values = [gpu_row(r, cluster=cluster) for r in merged.values()]
    for rec, row in zip(merged.values(), values, strict=True):
        try:
            check_row(gpus, row, what=f"GPU {shown(rec.uuid)}")
        except RowError as e:
            e.file, e.line = file, (lines or {}).get(rec.uuid)
            raise
    conn.execute(stmt, values)
    rows = conn.execute(select(gpus.c.uuid, gpus.c.id).where(gpus.c.uuid.in_(list(merged))))
    return {uuid: gpu_id for uuid, gpu_id in rows}


def gpu_row(rec: GpuRecord, *, cluster: str = DEFAULT_CLUSTER) -> dict[str, Any]:
    """The `gpus` row of a record of `cluster` (without its id)."""
    return {
        "cluster": cluster,
        "uuid": rec.uuid,
        "node": rec.node,
        "gpu_index": rec.index,
        "model": rec.model,
        "memory_total_mib": rec.memory_total_mib,
        "parent_uuid": rec.parent_uuid,
        "util_source": rec.util_source,
        "mig_profile": rec.mig_profile,
    }


def _fill(old: GpuRecord, new: GpuRecord) -> GpuRecord:
    """Two records of one GPU in one write: the later wins where it knows a value."""
    return replace(
        new,
        index=old.index if new.index is None else new.index,
        model=old.model if new.model is None else new.model,
        memory_total_mib=old.memory_total_mib
        if new.memory_total_mib is None
        else new.memory_total_mib,
        parent_uuid=old.parent_uuid if new.parent_uuid is None else new.parent_uuid,
        util_source=old.util_source if new.util_source is None else new.util_source,
        mig_profile=old.mig_profile if new.mig_profile is None else new.mig_profile,
    )


def insert_samples(
    conn: Connection,
    samples: Sequence[GpuSample],
    gpu_ids: Mapping[str, int],
    *,
    import_id: int | None = None,
) -> int:
    """Insert samples, skipping any (GPU, timestamp) already stored. Returns rows stored.

    The hot path of every import; `auditor.store.bulk` says how each database takes it.
    `import_id`: the ledger id of the import writing them (None for the sampler).
    """
    rows = [
        (gpu_ids[s.gpu_uuid], s.ts_ms, *(getattr(s, c) for c in SAMPLE_COLUMNS)) for s in samples
    ]
    spans, repeats = object_spans(rows)
    return write_rows(conn, rows, spans=spans, repeats=repeats, import_id=import_id)


ShareSeen = tuple[int | None, float | None]
"""(replicas, share) a source saw for a pod on a card; None where it says nothing."""


def upsert_assignments(
    conn: Connection,
    seen: Iterable[tuple[str, int, int]],
    *,
    source: str,
    shares: Mapping[tuple[str, int], ShareSeen] | None = None,
) -> None:
    """Record exact GPU -> pod observations as (pod_uid, gpu_id, ts_ms), widening the span.

    `shares` gives, per (pod_uid, gpu_id), the time-slicing replicas of the card the pod
    holds and an exact share where the source says it; a stored value is replaced by a
    newer one, never erased by None."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for pod_uid, gpu_id, ts in seen:
        lo, hi = spans.get((pod_uid, gpu_id), (ts, ts))
        spans[(pod_uid, gpu_id)] = (min(lo, ts), max(hi, ts))
    given = shares or {}
    if not spans:
        return
    stmt = upsert_statement(conn, gpu_assignments)
    stmt = stmt.on_conflict_do_update(
        index_elements=[gpu_assignments.c.pod_uid, gpu_assignments.c.gpu_id],
        set_={
            "first_seen_ms": least(
                conn, stmt.excluded.first_seen_ms, gpu_assignments.c.first_seen_ms
            ),
            "last_seen_ms": greatest(
                conn, stmt.excluded.last_seen_ms, gpu_assignments.c.last_seen_ms
            ),
            "replicas": func.coalesce(stmt.excluded.replicas, gpu_assignments.c.replicas),
            "share": func.coalesce(stmt.excluded.share, gpu_assignments.c.share),
        },
    )
    conn.execute(
        stmt,
        [
            {
                "pod_uid": p,
                "gpu_id": g,
                "first_seen_ms": lo,
                "last_seen_ms": hi,
                "source": source,
                "replicas": r,
                "share": s_,
            }
            for (p, g), (lo, hi) in spans.items()
            for r, s_ in [given.get((p, g), (None, None))]
        ],
    )


def upsert_exact_assignments(
    conn: Connection,
    found: Iterable[ExactAssignment],
    *,
    source: str,
    cluster: str = DEFAULT_CLUSTER,
) -> int:
    """Record cards named for pods. A card the store does not know yet is added as a bare
    GPU of the pod's node (a later reader fills in the rest); one the store has on another
    node is left out (the name is wrong for that pod, or the card moved). Without a share,
    the memory held over the card's known memory stands in. A card new to the store is of
    `cluster`, the pods'. Returns the assignments written."""
    given = [a for a in found if a.pod_uid and a.gpu_uuid]
    if not given:
        return 0
    uuids = sorted({a.gpu_uuid for a in given})
    stored = {
        uuid: (gpu_id, node, memory)
        for uuid, gpu_id, node, memory in conn.execute(
            select(gpus.c.uuid, gpus.c.id, gpus.c.node, gpus.c.memory_total_mib).where(
                gpus.c.uuid.in_(uuids)
            )
        )
    }
    new: dict[str, GpuRecord] = {}
    for a in given:  # a card new to the store goes on the node that first names it
        if a.gpu_uuid not in stored:
            new.setdefault(a.gpu_uuid, GpuRecord(a.gpu_uuid, a.node))
    for rec in new.values():
        check_row(gpus, gpu_row(rec, cluster=cluster), what=f"GPU {shown(rec.uuid)}")
    ids = {u: i for u, (i, _, _) in stored.items()}
    ids.update(upsert_gpus(conn, new.values(), cluster=cluster))
    nodes_of = {u: n for u, (_, n, _) in stored.items()} | {u: r.node for u, r in new.items()}
    memory = {u: m for u, (_, _, m) in stored.items()}
    seen: list[tuple[str, int, int]] = []
    shares: dict[tuple[str, int], ShareSeen] = {}
    for a in given:
        if nodes_of[a.gpu_uuid] != a.node:
            continue
        gpu_id = ids[a.gpu_uuid]
        share = a.share
        total = memory.get(a.gpu_uuid)
        if share is None and a.mem_mib and total:
            share = min(1.0, a.mem_mib / float(total))
        seen += [(a.pod_uid, gpu_id, a.first_ms), (a.pod_uid, gpu_id, a.last_ms)]
        shares[(a.pod_uid, gpu_id)] = (None, share)
    upsert_assignments(conn, seen, source=source, shares=shares)
    return len(shares)


def insert_tenant_samples(
    conn: Connection, samples: Iterable[TenantSample], gpu_ids: Mapping[str, int]
) -> int:
    """Store per-pod utilisation of cards, skipping any (card, pod, time) already stored
    (a replay is harmless). Returns the rows offered (new or not)."""
    rows = {
        (gpu_ids[s.gpu_uuid], s.pod_uid, s.ts_ms): s.util for s in samples if s.gpu_uuid in gpu_ids
    }
    if not rows:
        return 0
    stmt = upsert_statement(conn, gpu_tenant_util).on_conflict_do_nothing(
        index_elements=[
            gpu_tenant_util.c.gpu_id,
            gpu_tenant_util.c.pod_uid,
            gpu_tenant_util.c.ts_ms,
        ]
    )
    values = [{"gpu_id": g, "pod_uid": p, "ts_ms": t, "util": u} for (g, p, t), u in rows.items()]
    for start in range(0, len(values), 5000):
        conn.execute(stmt, values[start : start + 5000])
    return len(values)


def supersedes(new: str, old: str) -> bool:
    """Whether a run of shard `new` replaces a stored run of shard `old` of the same window.

    An unsharded run ("all") replaces every run of its window and is replaced by any shard;
    a shard "i/N" replaces itself and shards of another N.
    """
    if new == "all" or old in ("all", new):
        return True
    return new.split("/")[1] != old.split("/")[1]


def replace_audit_run(
    conn: Connection,
    *,
    window: Window,
    shard: str,
    created_ms: int,
    thresholds: Mapping[str, Any],
    version: str,
    results: Iterable[Mapping[str, Any]],
    findings: Iterable[Mapping[str, Any]],
    rolled_up_seconds: float = 0.0,
    hourly: bool = False,
    cluster: str = DEFAULT_CLUSTER,
) -> int:
    """Store one audit run of `cluster`, replacing that cluster's runs of the same window it
    supersedes.

    `hourly`: the results carry `hour_ms`, their UTC hour's bucket (SPEC §11); a result
    without one is the whole run's, stored at the run's start.

    `rolled_up_seconds`: GPU-seconds of the window audited from 1-minute rollups (the
    report flags them as coarser). A result that does not say `estimated` was not.

    Audits of one window take turns (`write_lock`): each stores a run of its own, the
    later replacing the earlier, and none meets the other's half-written run. Run ids are
    never given twice, on SQLite too (which would give a replaced run's id to the next)."""
    write_lock(conn, f"audit run {cluster} {window[0]} {window[1]}")
    next_id = None
    if conn.dialect.name == "sqlite":
        next_id = int(conn.execute(select(func.max(audit_runs.c.id))).scalar() or 0) + 1
    old = select(audit_runs.c.id, audit_runs.c.shard).where(
        audit_runs.c.cluster == cluster,
        audit_runs.c.window_start_ms == window[0],
        audit_runs.c.window_end_ms == window[1],
    )
    old_ids = [r for r, other in conn.execute(old) if supersedes(shard, other)]
    if old_ids:
        conn.execute(delete(audit_results).where(audit_results.c.run_id.in_(old_ids)))
        conn.execute(delete(audit_findings).where(audit_findings.c.run_id.in_(old_ids)))
        conn.execute(delete(audit_runs).where(audit_runs.c.id.in_(old_ids)))
    run_id = conn.execute(
        insert(audit_runs).returning(audit_runs.c.id),
        {
            "window_start_ms": window[0],
            "window_end_ms": window[1],
            "shard": shard,
            "created_ms": created_ms,
            "thresholds": json.loads(json.dumps(dict(thresholds))),
            "version": version,
            "rolled_up_seconds": float(rolled_up_seconds),
            "hourly": hourly,
            "cluster": cluster,
            **({} if next_id is None else {"id": next_id}),
        },
    ).scalar_one()
    start = window[0]
    insert_many(
        conn,
        audit_results,
        RESULT_COLUMNS,
        [
            (run_id, r["gpu_id"], r.get("pod_uid"), r["category"], r["seconds"], r["inferred"],
             r.get("estimated", False), r.get("share"), r.get("hour_ms", start))
            for r in results
        ],
    )  # fmt: skip
    insert_many(
        conn,
        audit_findings,
        FINDING_COLUMNS,
        [
            (run_id, f["kind"], f.get("gang"), f.get("gpu_id"), f.get("pod_uid"),
             f.get("start_ms"), f.get("end_ms"), f["seconds"], f.get("detail"))
            for f in findings
        ],
    )  # fmt: skip
    return int(run_id)


RESULT_COLUMNS = (
    "run_id", "gpu_id", "pod_uid", "category", "seconds", "inferred", "estimated", "share",
    "hour_ms",
)  # fmt: skip
FINDING_COLUMNS = (
    "run_id", "kind", "gang", "gpu_id", "pod_uid", "start_ms", "end_ms", "seconds", "detail"
)  # fmt: skip


def upsert_nodes(
    conn: Connection, records: Iterable[NodeRow], *, cluster: str = DEFAULT_CLUSTER
) -> int:
    """Store the latest view of each node of `cluster` by name. Returns the number of
    distinct nodes.
    Keys that are no column (a row's `state`, `auditor.collect.nodes.node_row`) are left
    out: the outages it shows are `auditor.store.outages`' to record."""
    latest = {r["name"]: r for r in records}
    if not latest:
        return 0
    stmt = upsert_statement(conn, nodes)
    columns = [c.name for c in nodes.c if c.name not in ("cluster", "name")]
    stmt = stmt.on_conflict_do_update(
        index_elements=[nodes.c.cluster, nodes.c.name], set_={c: stmt.excluded[c] for c in columns}
    )
    rows = [
        {**{c.name: r[c.name] for c in nodes.c if c.name in r}, "cluster": cluster}
        for r in latest.values()
    ]
    for row in rows:
        check_row(nodes, row, what=f"node {row['name']}")
    conn.execute(stmt, rows)
    return len(latest)


def read_cursor(conn: Connection, scope: str) -> str | None:
    """The resourceVersion a watch of `scope` had reached, or None for none stored."""
    rv: str | None = conn.execute(
        select(watch_cursors.c.resource_version).where(watch_cursors.c.scope == scope)
    ).scalar_one_or_none()
    return rv


def write_cursor(conn: Connection, scope: str, *, resource_version: str, at_ms: int) -> None:
    """Record where the watch of `scope` got to, in the transaction of the events it covers."""
    stmt = upsert_statement(conn, watch_cursors)
    stmt = stmt.on_conflict_do_update(
        index_elements=[watch_cursors.c.scope],
        set_={
            "resource_version": stmt.excluded.resource_version,
            "updated_ms": stmt.excluded.updated_ms,
        },
    )
    conn.execute(stmt, {"scope": scope, "resource_version": resource_version, "updated_ms": at_ms})
