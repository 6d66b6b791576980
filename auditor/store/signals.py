"""Reads and writes of SPEC §10's signals: pods' CPU, pressure, network and serving-queue
readings, cards' PCIe and NVLink traffic, nodes' outages, and each audit run's causes.

Writes are idempotent on their natural keys (a reading imported again replaces itself);
reads return the frames `auditor.classify.causes` takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection, and_, bindparam, delete, func, insert, or_, select

from auditor.classify.causes import CARD_SIGNALS, POD_SIGNALS
from auditor.model import DEFAULT_CLUSTER, RunSlice, Window
from auditor.store.hours import parts_condition
from auditor.store.keyscan import driver_cursor, merged_spans, scan_card_ranges
from auditor.store.many_rows import insert_many
from auditor.store.schema import (
    audit_causes,
    audit_runs,
    card_signals,
    gpus,
    node_outages,
    pod_signals,
    pods,
)

SOURCES = ("cgroup", "cadvisor", "serving")
"""Where a pod's signal row came from: the sampler's cgroup reading, cAdvisor through
Prometheus, a serving pod's queue gauges."""
_CHUNK = 500


def _replace(
    conn: Connection, table: Any, keys: Sequence[str], rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert `rows`, replacing stored rows with the same key columns."""
    if not rows:
        return 0
    unique = sorted({tuple(r[k] for k in keys) for r in rows})
    # one statement, executed per key: building an OR of every key as an expression cost
    # seconds per 100 000 rows
    gone = delete(table).where(and_(*(table.c[k] == bindparam(f"key_{k}") for k in keys)))
    conn.execute(gone, [{f"key_{k}": v for k, v in zip(keys, key, strict=True)} for key in unique])
    for i in range(0, len(rows), 5000):
        conn.execute(insert(table), list(rows[i : i + 5000]))
    return len(rows)


def write_pod_signals(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> int:
    """Store pod signal rows (pod_uid, source, ts_ms and any of `POD_SIGNALS`; a signal the
    source does not give is None)."""
    for r in rows:
        if r["source"] not in SOURCES:
            raise ValueError(f"unknown signal source {r['source']!r}")
    full = [{"pod_uid": r["pod_uid"], "source": r["source"], "ts_ms": int(r["ts_ms"]),
             **{c: r.get(c) for c in POD_SIGNALS}} for r in rows]  # fmt: skip
    return _replace(conn, pod_signals, ("pod_uid", "source", "ts_ms"), full)


def write_card_signals(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> int:
    """Store card signal rows (gpu_id, ts_ms and any of `CARD_SIGNALS`)."""
    full = [{"gpu_id": int(r["gpu_id"]), "ts_ms": int(r["ts_ms"]),
             **{c: r.get(c) for c in CARD_SIGNALS}} for r in rows]  # fmt: skip
    return _replace(conn, card_signals, ("gpu_id", "ts_ms"), full)


PodTenure = tuple[str, int | None, int | None]
"""A stored pod's (uid, bound_ms, end_ms): end is finished or deleted, None while it runs."""


def pods_in_window(
    conn: Connection, *, start_ms: int, end_ms: int, cluster: str = DEFAULT_CLUSTER
) -> dict[tuple[str, str], list[PodTenure]]:
    """(namespace, name) -> the tenures of the stored pods of `cluster` of that name bound
    before `end_ms` and not over before `start_ms` (a name reused over time has several)."""
    stmt = select(
        pods.c.namespace, pods.c.name, pods.c.uid, pods.c.bound_ms, pods.c.finished_ms,
        pods.c.deleted_ms,
    ).where(
        pods.c.cluster == cluster,
        pods.c.bound_ms.is_not(None),
        pods.c.bound_ms < end_ms,
        or_(pods.c.finished_ms.is_(None), pods.c.finished_ms > start_ms),
        or_(pods.c.deleted_ms.is_(None), pods.c.deleted_ms > start_ms),
    )  # fmt: skip
    out: dict[tuple[str, str], list[PodTenure]] = {}
    for ns, name, uid, bound, finished, deleted in conn.execute(stmt):
        ends = [int(t) for t in (finished, deleted) if t is not None]
        out.setdefault((str(ns), str(name)), []).append(
            (str(uid), None if bound is None else int(bound), min(ends) if ends else None)
        )
    return out


def write_node_outages(
    conn: Connection, rows: Sequence[Mapping[str, Any]], *, cluster: str = DEFAULT_CLUSTER
) -> int:
    """Store outage rows of `cluster`'s nodes (node, reason, start_ms, end_ms or None while it
    lasts); a known stretch seen again gets its end."""
    keyed = [{**r, "cluster": cluster} for r in rows]
    return _replace(conn, node_outages, ("cluster", "node", "reason", "start_ms"), keyed)


_POD_SIGNAL_COLUMNS = ("pod_uid", "source", "ts_ms", *POD_SIGNALS)
_POD_SIGNAL_ROW = np.dtype(
    [("pod_uid", object), ("source", object), ("ts_ms", np.int64),
     *((c, np.float64) for c in POD_SIGNALS)]
)  # fmt: skip


def read_pod_signals(
    conn: Connection, pod_uids: Sequence[str], *, window: Window, margin_ms: int
) -> pd.DataFrame:
    """The signal rows of `pod_uids` in `[start - margin, end + margin)`: pod_uid, source,
    ts_ms and `POD_SIGNALS` (NaN where not recorded).

    Through the driver, as many pods a statement as `_CHUNK`, each statement's rows turned
    into an array in one pass (NULL arrives as NaN), as `keyscan` reads cards."""
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    head = f"SELECT {', '.join(_POD_SIGNAL_COLUMNS)} FROM pod_signals"
    uids = sorted(set(pod_uids))
    lo, hi = window.start_ms - margin_ms, window.end_ms + margin_ms
    parts: list[np.ndarray] = []
    cur = driver_cursor(conn)
    try:
        for i in range(0, len(uids), _CHUNK):
            some = uids[i : i + _CHUNK]
            cur.execute(
                f"{head} WHERE pod_uid IN ({', '.join([mark] * len(some))})"
                f" AND ts_ms >= {mark} AND ts_ms < {mark}",
                (*some, lo, hi),
            )
            found = cur.fetchall()
            parts.append(np.fromiter(found, dtype=_POD_SIGNAL_ROW, count=len(found)))
    finally:
        cur.close()
    rows = np.concatenate(parts) if parts else np.zeros(0, dtype=_POD_SIGNAL_ROW)
    return pd.DataFrame({c: rows[c] for c in _POD_SIGNAL_COLUMNS})


_CARD_SIGNAL_ROW = np.dtype([("ts_ms", np.int64), *((c, np.float64) for c in CARD_SIGNALS)])


def read_card_signals(
    conn: Connection,
    *,
    window: Window,
    margin_ms: int,
    cards: Mapping[int, str] | None = None,
    spans: Mapping[int, Sequence[tuple[int, int]]] | None = None,
) -> pd.DataFrame:
    """The card signal rows in `[start - margin, end + margin)` (of `cards` only, GPU id ->
    UUID, when given; else of every card): gpu (the UUID), ts_ms, `CARD_SIGNALS` (NaN where
    not recorded), sorted by card and time.

    With `spans` (GPU id -> time spans `[lo, hi)`), only the rows of a card inside its
    spans, and none of a card without any: the audit reads a card's signals only while a
    pod held it, since only a held card's idle time is judged on them. Read as the audit
    reads samples: one key-range scan per card and (merged) span through the driver; a row
    per card and pass adds up to most of the signals an audit reads."""
    if cards is None:
        uuid_of = {int(i): str(u) for i, u in conn.execute(select(gpus.c.id, gpus.c.uuid))}
    else:
        uuid_of = {int(i): str(u) for i, u in cards.items()}
    lo, hi = window.start_ms - margin_ms, window.end_ms + margin_ms
    ranges: list[tuple[int, int, int]] = []
    for gpu_id in sorted(uuid_of):
        if spans is None:
            ranges.append((gpu_id, lo, hi))
        else:
            ranges += [(gpu_id, a, b) for a, b in merged_spans(spans.get(gpu_id, ()), lo=lo, hi=hi)]
    found = scan_card_ranges(conn, "card_signals", ("ts_ms", *CARD_SIGNALS), _CARD_SIGNAL_ROW,
                             ranges)  # fmt: skip
    parts = [rows for _, rows in found]
    rows = np.concatenate(parts) if parts else np.zeros(0, dtype=_CARD_SIGNAL_ROW)
    names = np.array([uuid_of[gpu_id] for gpu_id, _ in found], dtype=object)
    gpu = np.repeat(names, [p.size for p in parts])
    return pd.DataFrame({"gpu": gpu, "ts_ms": rows["ts_ms"], **{c: rows[c] for c in CARD_SIGNALS}})


def read_node_outages(
    conn: Connection, *, window: Window, cluster: str = DEFAULT_CLUSTER
) -> pd.DataFrame:
    """Outages of `cluster`'s nodes overlapping the window: node, reason, start_ms, end_ms
    (an open one ends at the window's end)."""
    o = node_outages
    stmt = select(o.c.node, o.c.reason, o.c.start_ms, o.c.end_ms).where(
        node_outages.c.cluster == cluster,
        node_outages.c.start_ms < window.end_ms,
        or_(node_outages.c.end_ms.is_(None), node_outages.c.end_ms > window.start_ms),
    )
    frame = pd.DataFrame(
        [tuple(r) for r in conn.execute(stmt)], columns=["node", "reason", "start_ms", "end_ms"]
    )
    frame["end_ms"] = frame["end_ms"].fillna(window.end_ms).astype(np.int64)
    return frame


def run_start(conn: Connection, run_id: int) -> int:
    """The start of an audit run's window: the bucket of a row stored without one."""
    return int(
        conn.execute(
            select(audit_runs.c.window_start_ms).where(audit_runs.c.id == run_id)
        ).scalar_one()
    )


def write_cause_rows(conn: Connection, *, run_id: int, rows: Sequence[Mapping[str, Any]]) -> None:
    """Store one audit run's cause rows (gpu_id, pod_uid, category, cause, seconds,
    signalled_seconds, and hour_ms: their bucket; the run's start where not given)."""
    if rows:
        start = run_start(conn, run_id)
        insert_many(
            conn,
            audit_causes,
            ("run_id", "gpu_id", "pod_uid", "category", "cause", "seconds",
             "signalled_seconds", "hour_ms"),
            [
                (run_id, r["gpu_id"], r.get("pod_uid"), r["category"], r["cause"], r["seconds"],
                 r["signalled_seconds"], r.get("hour_ms", start))
                for r in rows
            ],
        )  # fmt: skip


def read_causes(conn: Connection, run_ids: Sequence[int | RunSlice]) -> pd.DataFrame:
    """Cause rows of runs (or of their hours in a window, SPEC §11), the hours of a run
    summed: gpu (UUID), pod_uid, category, cause, seconds, signalled_seconds."""
    c = audit_causes
    keys = [c.c.run_id, c.c.gpu_id, c.c.pod_uid, c.c.category, c.c.cause]
    summed = (
        select(*keys, func.sum(c.c.seconds).label("seconds"),
               func.sum(c.c.signalled_seconds).label("signalled_seconds"))
        .where(parts_condition(c, run_ids))
        .group_by(*keys)
        .subquery("hours")
    )  # fmt: skip
    stmt = (
        select(gpus.c.uuid, summed.c.pod_uid, summed.c.category, summed.c.cause,
               summed.c.seconds, summed.c.signalled_seconds)
        .select_from(summed)
        .join(gpus, gpus.c.id == summed.c.gpu_id)
    )  # fmt: skip
    cols = ["gpu", "pod_uid", "category", "cause", "seconds", "signalled_seconds"]
    frame = pd.DataFrame([tuple(r) for r in conn.execute(stmt)], columns=cols)
    return frame.astype({"seconds": np.float64, "signalled_seconds": np.float64})
