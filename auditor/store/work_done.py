"""Reads and writes of SPEC §8's tables: SM activity per audit run, outputs, latency buckets.

Writes are idempotent on their natural keys (re-importing an interval replaces it); reads
return DataFrames with the pod's attributes joined, for the report and `compare`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection, and_, delete, func, insert, or_, select, tuple_

from auditor.model import RunSlice, Selection, Window
from auditor.store.hours import parts_condition
from auditor.store.many_rows import insert_many
from auditor.store.reads import records
from auditor.store.schema import audit_sm, gpus, latency_buckets, outputs, pods
from auditor.store.signals import run_start

_DELETE_CHUNK = 500


def write_sm_rows(conn: Connection, *, run_id: int, rows: Sequence[Mapping[str, Any]]) -> None:
    """Store one audit run's SM activity rows (gpu_id, pod_uid, sm_*_seconds, and hour_ms:
    their bucket; the run's start where not given)."""
    if rows:
        start = run_start(conn, run_id)
        insert_many(
            conn,
            audit_sm,
            ("run_id", "gpu_id", "pod_uid", "sm_active_seconds", "sm_busy_seconds", "hour_ms"),
            [
                (run_id, r["gpu_id"], r.get("pod_uid"), r["sm_active_seconds"],
                 r["sm_busy_seconds"], r.get("hour_ms", start))
                for r in rows
            ],
        )  # fmt: skip


def read_sm(conn: Connection, run_ids: Sequence[int | RunSlice]) -> pd.DataFrame:
    """SM activity of runs (or of their hours in a window, SPEC §11), the hours of a run
    summed, with the card and the pod's attributes joined."""
    m = audit_sm
    keys = [m.c.run_id, m.c.gpu_id, m.c.pod_uid]
    summed = (
        select(
            *keys,
            func.sum(m.c.sm_active_seconds).label("sm_active_seconds"),
            func.sum(m.c.sm_busy_seconds).label("sm_busy_seconds"),
        )
        .where(parts_condition(m, run_ids))
        .group_by(*keys)
        .subquery("hours")
    )
    stmt = (
        select(
            gpus.c.cluster,
            gpus.c.uuid.label("gpu"),
            gpus.c.node,
            summed.c.pod_uid,
            pods.c.team,
            pods.c.namespace,
            pods.c.job,
            pods.c.name.label("pod"),
            summed.c.sm_active_seconds,
            summed.c.sm_busy_seconds,
        )
        .select_from(summed)
        .join(gpus, gpus.c.id == summed.c.gpu_id)
        .outerjoin(pods, pods.c.uid == summed.c.pod_uid)
    )
    cols = [
        "cluster",
        "gpu",
        "node",
        "pod_uid",
        "team",
        "namespace",
        "job",
        "pod",
        "sm_active_seconds",
        "sm_busy_seconds",
    ]
    df = records(conn.execute(stmt).all(), cols)
    for c in ("sm_active_seconds", "sm_busy_seconds"):
        df[c] = df[c].astype("float64")
    return df


def _replace(conn: Connection, table: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    keys = sorted({(r["pod_uid"], r["metric"], r["start_ms"]) for r in rows})
    for i in range(0, len(keys), _DELETE_CHUNK):
        part = keys[i : i + _DELETE_CHUNK]
        conn.execute(
            delete(table).where(
                or_(
                    *(
                        and_(table.c.pod_uid == p, table.c.metric == m, table.c.start_ms == s)
                        for p, m, s in part
                    )
                )
            )
        )
    for i in range(0, len(rows), 5000):
        conn.execute(insert(table), list(rows[i : i + 5000]))


def write_outputs(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> int:
    """Store output rows (pod_uid, metric, start_ms, end_ms, outputs, unit, source, quality,
    quality_better), replacing the stored rows of the same pod, metric and start."""
    if rows:
        _replace(conn, outputs, rows)
    return len(rows)


def write_latency(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> int:
    """Store latency bucket rows (pod_uid, metric, start_ms, end_ms, le, count), replacing
    every stored bucket of the same pod, metric and start."""
    if rows:
        _replace(conn, latency_buckets, rows)
    return len(rows)


_POD_COLS = ("team", "namespace", "job", "name", "gpu_count")


def read_outputs(conn: Connection, *, window: Window) -> pd.DataFrame:
    """Output rows overlapping `[start, end)`, with the pod's team, namespace, job, name."""
    stmt = (
        select(
            outputs.c.pod_uid,
            outputs.c.metric,
            outputs.c.start_ms,
            outputs.c.end_ms,
            outputs.c.outputs,
            outputs.c.unit,
            outputs.c.source,
            outputs.c.quality,
            outputs.c.quality_better,
            *(pods.c[c] for c in _POD_COLS),
        )
        .join(pods, pods.c.uid == outputs.c.pod_uid)
        .where(outputs.c.start_ms < window[1], outputs.c.end_ms > window[0])
    )
    cols = [
        "pod_uid",
        "metric",
        "start_ms",
        "end_ms",
        "outputs",
        "unit",
        "source",
        "quality",
        "quality_better",
        "team",
        "namespace",
        "job",
        "pod",
        "gpu_count",
    ]
    df = records(conn.execute(stmt).all(), cols)
    df["outputs"] = df["outputs"].astype("float64")
    df["quality"] = pd.to_numeric(df["quality"], errors="coerce").astype("float64")
    return df


def read_latency(conn: Connection, *, window: Window, pod_uids: Sequence[str]) -> pd.DataFrame:
    """Latency bucket rows of these pods overlapping `[start, end)`."""
    cols = ["pod_uid", "metric", "start_ms", "end_ms", "le", "count"]
    if not pod_uids:
        return pd.DataFrame(columns=cols)
    rows: list[Any] = []
    uids = sorted(set(pod_uids))
    for i in range(0, len(uids), _DELETE_CHUNK):
        stmt = select(*(latency_buckets.c[c] for c in cols)).where(
            latency_buckets.c.pod_uid.in_(uids[i : i + _DELETE_CHUNK]),
            latency_buckets.c.start_ms < window[1],
            latency_buckets.c.end_ms > window[0],
        )
        rows += conn.execute(stmt).all()
    df = records(rows, cols)
    df["le"] = df["le"].astype("float64")
    df["count"] = df["count"].astype("float64")
    return df


def pods_by_name(
    conn: Connection, names: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], list[tuple[str, int | None, int | None]]]:
    """(namespace, pod name) -> [(uid, bound_ms, end_ms)] of the pods stored under it (a
    name is reused by a StatefulSet's next pod, so several)."""
    from auditor.store.schema import pods as p

    out: dict[tuple[str, str], list[tuple[str, int | None, int | None]]] = {}
    wanted = sorted(set(names))
    for i in range(0, len(wanted), _DELETE_CHUNK):
        stmt = select(
            p.c.namespace, p.c.name, p.c.uid, p.c.bound_ms, p.c.finished_ms, p.c.deleted_ms
        ).where(tuple_(p.c.namespace, p.c.name).in_(wanted[i : i + _DELETE_CHUNK]))
        for ns, name, uid, bound, finished, deleted in conn.execute(stmt):
            ends = [t for t in (finished, deleted) if t is not None]
            out.setdefault((ns, name), []).append((uid, bound, min(ends) if ends else None))
    return out


def pods_of_jobs(
    conn: Connection, jobs: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], list[tuple[str, int | None, int | None]]]:
    """(namespace, job `Kind/name`) -> [(uid, bound_ms, end_ms)] of its pods."""
    out: dict[tuple[str, str], list[tuple[str, int | None, int | None]]] = {}
    wanted = sorted(set(jobs))
    for i in range(0, len(wanted), _DELETE_CHUNK):
        stmt = select(
            pods.c.namespace,
            pods.c.job,
            pods.c.uid,
            pods.c.bound_ms,
            pods.c.finished_ms,
            pods.c.deleted_ms,
        ).where(tuple_(pods.c.namespace, pods.c.job).in_(wanted[i : i + _DELETE_CHUNK]))
        for ns, job, uid, bound, finished, deleted in conn.execute(stmt):
            ends = [t for t in (finished, deleted) if t is not None]
            out.setdefault((ns, job), []).append((uid, bound, min(ends) if ends else None))
    return out


def overlap_share(rows: pd.DataFrame, *, window: Window) -> np.ndarray:
    """The part of each row's interval `[start_ms, end_ms)` inside the window (0-1)."""
    start = rows["start_ms"].to_numpy(dtype=np.float64)
    end = rows["end_ms"].to_numpy(dtype=np.float64)
    inside = np.clip(np.minimum(end, window[1]) - np.maximum(start, window[0]), 0, None)
    span = np.maximum(end - start, 1.0)
    return np.asarray(inside / span, dtype=np.float64)


def selected_pods(conn: Connection, sel: Selection) -> set[str]:
    """The uids of the pods a `compare` side selects: a job's, a team's or a label's."""
    if sel.kind == "job":
        ns, kind, name = sel.value.split("/")
        stmt = select(pods.c.uid).where(pods.c.namespace == ns, pods.c.job == f"{kind}/{name}")
        return {str(u) for (u,) in conn.execute(stmt)}
    if sel.kind == "team":
        return {str(u) for (u,) in conn.execute(select(pods.c.uid).where(pods.c.team == sel.value))}
    key, _, value = sel.value.partition("=")
    return {
        str(uid)
        for uid, labels in conn.execute(select(pods.c.uid, pods.c.labels))
        if isinstance(labels, dict) and labels.get(key) == value
    }
