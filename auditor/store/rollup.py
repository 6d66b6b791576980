"""Retention: roll raw samples older than a cut up into 1-minute rows, prune them, read back.

`rollup` moves every raw sample stamped before the cut into `gpu_samples_1m` (the minute
aggregates of `auditor.classify.rollup`, coverage computed exactly as the classifier does)
and deletes it, in the caller's transaction. It works through the GPUs in batches and
through time a day at a time, so memory follows one batch-day, never the table. Each
batch-day's rows are taken with DELETE ... RETURNING, so a sample inserted meanwhile is
either rolled up with them or left for the next run, never deleted unrolled. The samples of
the next `READ_MARGIN_MS` are read (not deleted) so the last sample before a boundary
covers up to its successor; coverage that runs past the cut lands in the minute it reaches.

Every write merges into the stored minute (counts and times add, min/max combine, the mean
is re-weighted by readable time), so a re-run finds nothing to do, and raw samples imported
late for a minute already rolled up join it on the next run. (Re-importing a file whose
samples were already rolled up therefore counts them twice: the raw rows that would have
made the import idempotent are gone.) A caller may leave sparse cards raw
(`min_per_minute`): rolling up samples a minute apart would grow the store.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Table, and_, case, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from auditor.classify.rollup import (
    MINUTE_MS,
    ROLLUP_COLUMNS,
    minute_aggregates,
    pseudo_samples,
    with_rolled,
)
from auditor.model import RunSlice, Window
from auditor.settings import Thresholds
from auditor.store.hours import run_ids as hour_runs
from auditor.store.reads import records
from auditor.store.schema import audit_runs, gpu_samples, gpu_samples_1m, gpu_tenant_util, gpus

READ_MARGIN_MS = 15 * 60_000
"""Raw samples read past a boundary so the last one before it meets its successor."""
BATCH_GPUS = 32
"""GPUs rolled up together."""
CHUNK_MS = 24 * 3600_000
"""Time rolled up per step of a batch (a whole number of minutes)."""

_RAW = ("gpu_id", "ts_ms", "util", "memory_used_mib", "power_w")


@dataclass(frozen=True)
class RollupStats:
    before_ms: int
    """The cut actually used: `before_ms` rounded down to a minute."""
    gpus: int
    """GPUs that had raw samples rolled up."""
    raw_deleted: int
    minutes_written: int
    """Minute rows written or merged into."""


def floor_minute(ms: int) -> int:
    return (ms // MINUTE_MS) * MINUTE_MS


def gpu_ids(conn: Connection) -> list[int]:
    """Every stored GPU's id, in order: what a rollup goes through in batches."""
    return [int(i) for i in conn.execute(select(gpus.c.id).order_by(gpus.c.id)).scalars()]


def rollup(
    conn: Connection,
    *,
    before_ms: int,
    thresholds: Thresholds,
    gpu_ids: Sequence[int] | None = None,
    batch_gpus: int = BATCH_GPUS,
    chunk_ms: int = CHUNK_MS,
    min_per_minute: float = 0.0,
) -> RollupStats:
    """Roll up and delete every raw sample stamped before `before_ms` (cut at a minute).

    `min_per_minute`: a GPU whose raw samples before the cut are fewer than this per minute
    that has any is left raw, as it is: a minute row costs more than two raw rows, so
    rolling up data already a minute apart would grow the store.
    Per-pod utilisation of shared cards (`gpu_tenant_util`) before the cut is deleted with
    them, not rolled up: an audit of rolled-up time splits a shared card's activity by
    share (SPEC §7, estimated), as it would without per-process data.
    `gpu_ids` limits it to those GPUs (default: all). Runs in the caller's transaction.
    """
    cut = floor_minute(before_ms)
    chunk = max(MINUTE_MS, floor_minute(chunk_ms))
    ids = (
        sorted(int(i) for i in gpu_ids)
        if gpu_ids is not None
        else [int(i) for i in conn.execute(select(gpus.c.id).order_by(gpus.c.id)).scalars()]
    )
    touched: set[int] = set()
    deleted = written = 0
    for start in range(0, len(ids), max(1, batch_gpus)):
        batch = ids[start : start + max(1, batch_gpus)]
        if min_per_minute > 0:
            sparse = _sparse(conn, batch, cut=cut, min_per_minute=min_per_minute)
            batch = [g for g in batch if g not in sparse]
            if not batch:
                continue
        uuid_of = _uuids(conn, batch)
        for a, b in _chunks(conn, batch, cut=cut, chunk_ms=chunk):
            taken = conn.execute(
                delete(gpu_samples)
                .where(_in_range(batch, a, b))
                .returning(*(gpu_samples.c[c] for c in _RAW))
            ).all()
            if not taken:
                continue
            after = conn.execute(
                select(*(gpu_samples.c[c] for c in _RAW)).where(
                    _in_range(batch, b, b + READ_MARGIN_MS)
                )
            ).all()
            frame = _raw_frame([*taken, *after], uuid_of)
            minutes = minute_aggregates(frame, before_ms=b, thresholds=thresholds)
            id_of = {u: i for i, u in uuid_of.items()}
            written += merge_minutes(conn, minutes, id_of)
            deleted += len(taken)
            touched |= {int(r[0]) for r in taken}
        conn.execute(
            delete(gpu_tenant_util).where(
                gpu_tenant_util.c.gpu_id.in_(batch), gpu_tenant_util.c.ts_ms < cut
            )
        )
    return RollupStats(
        before_ms=cut, gpus=len(touched), raw_deleted=deleted, minutes_written=written
    )


def _sparse(conn: Connection, batch: list[int], *, cut: int, min_per_minute: float) -> set[int]:
    """The GPUs of `batch` whose raw samples before `cut` number fewer than `min_per_minute`
    per minute that has one."""
    minute = gpu_samples.c.ts_ms // MINUTE_MS
    counts = conn.execute(
        select(gpu_samples.c.gpu_id, func.count(), func.count(func.distinct(minute)))
        .where(gpu_samples.c.gpu_id.in_(batch), gpu_samples.c.ts_ms < cut)
        .group_by(gpu_samples.c.gpu_id)
    ).all()
    return {int(g) for g, n, minutes in counts if n < min_per_minute * minutes}


def _raw_frame(rows: Sequence[Any], uuid_of: dict[int, str]) -> pd.DataFrame:
    """Raw rows as columns (no per-row pandas work: a day of a batch is millions of rows)."""
    gpu_id, ts, util, memory, power = zip(*rows, strict=True)
    ids = np.asarray(gpu_id, dtype=np.int64)
    known = np.unique(ids)
    names = np.array([uuid_of[int(i)] for i in known], dtype=object)
    return pd.DataFrame(
        {
            "gpu": names[np.searchsorted(known, ids)],
            "ts_ms": np.asarray(ts, dtype=np.int64),
            "util": np.asarray(util, dtype=np.float64),
            "memory_used_mib": np.asarray(memory, dtype=np.float64),
            "power_w": np.asarray(power, dtype=np.float64),
        }
    )


def _uuids(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    rows = conn.execute(select(gpus.c.id, gpus.c.uuid).where(gpus.c.id.in_(list(ids))))
    return {int(i): str(u) for i, u in rows}


def _in_range(ids: Sequence[int], a: int, b: int) -> ColumnElement[bool]:
    return and_(
        gpu_samples.c.gpu_id.in_(list(ids)), gpu_samples.c.ts_ms >= a, gpu_samples.c.ts_ms < b
    )


def _chunks(conn: Connection, ids: Sequence[int], *, cut: int, chunk_ms: int) -> Iterator[Window]:
    """Minute-aligned [a, b) steps before `cut` that hold raw samples, skipping empty time."""
    a = -(2**62)
    while True:
        first = conn.execute(
            select(func.min(gpu_samples.c.ts_ms)).where(_in_range(ids, a, cut))
        ).scalar_one_or_none()
        if first is None:
            return
        a = floor_minute(int(first))
        b = min(a + chunk_ms, cut)
        yield Window(a, b)
        a = b


def _upsert(conn: Connection, table: Table) -> Any:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def _least(conn: Connection, a: Any, b: Any) -> Any:
    """The smaller of two nullable values (NULL only when both are)."""
    x, y = func.coalesce(a, b), func.coalesce(b, a)
    return func.min(x, y) if conn.dialect.name == "sqlite" else func.least(x, y)


def _greatest(conn: Connection, a: Any, b: Any) -> Any:
    x, y = func.coalesce(a, b), func.coalesce(b, a)
    return func.max(x, y) if conn.dialect.name == "sqlite" else func.greatest(x, y)


def _weighted(old: Any, old_w: Any, new: Any, new_w: Any) -> Any:
    """The mean of two weighted means, NULL-safe (a NULL mean has no weight)."""
    w_old = case((old.is_(None), 0), else_=old_w)
    w_new = case((new.is_(None), 0), else_=new_w)
    total = w_old + w_new
    return case(
        (total > 0, (func.coalesce(old, 0.0) * w_old + func.coalesce(new, 0.0) * w_new) / total),
        else_=func.coalesce(old, new),
    )


def merge_minutes(conn: Connection, minutes: pd.DataFrame, gpu_ids: dict[str, int]) -> int:
    """Write minute aggregates (`ROLLUP_COLUMNS`), merging into stored minutes. Returns rows."""
    if minutes.empty:
        return 0
    rows = _rows(minutes, gpu_ids)
    t = gpu_samples_1m
    stmt = _upsert(conn, t)
    ex = stmt.excluded
    stmt = stmt.on_conflict_do_update(
        index_elements=[t.c.gpu_id, t.c.minute_ms],
        set_={
            "samples": t.c.samples + ex.samples,
            "covered_ms": t.c.covered_ms + ex.covered_ms,
            "readable_ms": t.c.readable_ms + ex.readable_ms,
            "util_min": _least(conn, t.c.util_min, ex.util_min),
            "util_mean": _weighted(t.c.util_mean, t.c.readable_ms, ex.util_mean, ex.readable_ms),
            "util_max": _greatest(conn, t.c.util_max, ex.util_max),
            "covered_from_ms": _least(conn, t.c.covered_from_ms, ex.covered_from_ms),
            "covered_to_ms": _greatest(conn, t.c.covered_to_ms, ex.covered_to_ms),
            "memory_used_max_mib": _greatest(conn, t.c.memory_used_max_mib, ex.memory_used_max_mib),
            # weighted by covered time: exact unless power was read for only part of it
            "power_mean_w": _weighted(
                t.c.power_mean_w, t.c.covered_ms, ex.power_mean_w, ex.covered_ms
            ),
        },
    )
    for start in range(0, len(rows), 5000):
        conn.execute(stmt, rows[start : start + 5000])
    return len(rows)


def _rows(minutes: pd.DataFrame, gpu_ids: dict[str, int]) -> list[dict[str, Any]]:
    cols: dict[str, list[Any]] = {}
    for c in ROLLUP_COLUMNS:
        if c == "gpu":
            cols["gpu_id"] = [int(gpu_ids[str(u)]) for u in minutes["gpu"].tolist()]
            continue
        values = minutes[c].to_numpy()
        if values.dtype.kind == "f":
            cols[c] = [None if np.isnan(v) else float(v) for v in values.tolist()]
        else:
            cols[c] = [int(v) for v in values.tolist()]
    names = list(cols)
    return [dict(zip(names, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


def read_minutes(
    conn: Connection, *, start_ms: int, end_ms: int, gpu_ids: Sequence[int] | None = None
) -> pd.DataFrame:
    """Stored minute rows with `start_ms <= minute_ms < end_ms`: `ROLLUP_COLUMNS`."""
    t = gpu_samples_1m
    cond = and_(t.c.minute_ms >= start_ms, t.c.minute_ms < end_ms)
    if gpu_ids is not None:
        cond = and_(cond, t.c.gpu_id.in_(list(gpu_ids)))
    cols = [c for c in ROLLUP_COLUMNS if c != "gpu"]
    stmt = (
        select(gpus.c.uuid, *(t.c[c] for c in cols))
        .join(gpus, gpus.c.id == t.c.gpu_id)
        .where(cond)
        .order_by(gpus.c.uuid, t.c.minute_ms)
    )
    frame = records(conn.execute(stmt).all(), ROLLUP_COLUMNS)
    for c in ("minute_ms", "samples", "covered_ms", "readable_ms"):
        frame[c] = frame[c].astype("int64")
    for c in ("covered_from_ms", "covered_to_ms"):
        frame[c] = frame[c].astype("int64")
    for c in ("util_min", "util_mean", "util_max", "memory_used_max_mib", "power_mean_w"):
        frame[c] = pd.to_numeric(frame[c], errors="coerce").astype("float64")
    return frame


def read_rolled_samples(
    conn: Connection, *, start_ms: int, end_ms: int, gpu_ids: Sequence[int] | None = None
) -> pd.DataFrame:
    """Rolled-up minutes in [start, end) as pseudo-samples the classifier takes.

    Columns gpu, ts_ms, util (NaN unreadable), throttle_reasons (None), cover_ms; sorted by
    gpu and ts_ms (see `auditor.classify.rollup.pseudo_samples`).
    """
    return pseudo_samples(read_minutes(conn, start_ms=start_ms, end_ms=end_ms, gpu_ids=gpu_ids))


def read_rolled_card_samples(
    conn: Connection, ranges: Sequence[tuple[int, int, int]]
) -> pd.DataFrame:
    """Rolled-up minutes of each card inside its own range `(gpu_id, lo, hi)`, as
    `read_rolled_samples` returns them (the rollup companion of `reads.read_card_samples`)."""
    if not ranges:
        return pseudo_samples(read_minutes(conn, start_ms=0, end_ms=0, gpu_ids=[]))
    lo = min(r[1] for r in ranges)
    hi = max(r[2] for r in ranges)
    ids = sorted({int(r[0]) for r in ranges})
    minutes = read_minutes(conn, start_ms=lo, end_ms=hi, gpu_ids=ids)
    if minutes.empty:
        return pseudo_samples(minutes)
    uuid_of = _uuids(conn, ids)
    bounds = pd.DataFrame(
        [(uuid_of[int(g)], int(a), int(b)) for g, a, b in ranges], columns=["gpu", "lo", "hi"]
    )
    both = minutes.merge(bounds, on="gpu", how="inner")
    inside = (both["minute_ms"] >= both["lo"]) & (both["minute_ms"] < both["hi"])
    return pseudo_samples(both[inside])


def read_audit_samples(
    conn: Connection, *, start_ms: int, end_ms: int, gpu_ids: Sequence[int] | None = None
) -> pd.DataFrame:
    """Raw samples and rolled-up minutes in [start, end), as one frame for `classify`.

    Exactly `reads.read_samples` where nothing was rolled up; else its rows with a NaN
    `cover_ms`, and the pseudo-samples, sorted by gpu and ts_ms.
    """
    from auditor.store.reads import read_samples

    raw = read_samples(conn, start_ms=start_ms, end_ms=end_ms, gpu_ids=gpu_ids)
    rolled = read_rolled_samples(conn, start_ms=start_ms, end_ms=end_ms, gpu_ids=gpu_ids)
    return with_rolled(raw, rolled)


def rollup_span(conn: Connection, *, cluster: str | None = None) -> Window | None:
    """The first and last instant the stored minutes (of `cluster`'s cards) cover, or None
    where there are none."""
    t = gpu_samples_1m
    stmt = select(func.min(t.c.covered_from_ms), func.max(t.c.covered_to_ms))
    if cluster is not None:
        stmt = stmt.join(gpus, gpus.c.id == t.c.gpu_id).where(gpus.c.cluster == cluster)
    lo, hi = conn.execute(stmt).one()
    if lo is None:
        return None
    return Window(int(lo), int(hi))


def runs_rolled_up_seconds(conn: Connection, run_ids: Sequence[int | RunSlice]) -> float:
    """GPU-seconds the audit runs `run_ids` audited from rollups, together. A run is
    stored with one such figure: a slice of it (some of its hours) counts it in proportion
    to the time it takes of the run's window."""
    if not run_ids:
        return 0.0
    rows = conn.execute(
        select(
            audit_runs.c.id,
            audit_runs.c.window_start_ms,
            audit_runs.c.window_end_ms,
            audit_runs.c.rolled_up_seconds,
        ).where(audit_runs.c.id.in_(hour_runs(run_ids)))
    ).all()
    runs = {int(i): (int(a), int(b), float(r or 0.0)) for i, a, b, r in rows}
    total = 0.0
    for part in run_ids:
        if not isinstance(part, RunSlice):
            total += runs.get(int(part), (0, 1, 0.0))[2]
            continue
        a, b, rolled = runs.get(part.run_id, (0, 1, 0.0))
        taken = max(0, min(b, part.end_ms) - max(a, part.start_ms))
        total += rolled * taken / max(b - a, 1)
    return total
