"""Bulk sample writes, the ingest hot path: straight to the driver, idempotent, one transaction.

PostgreSQL: when none of the batch's (GPU, timestamp) keys can already be stored (no stored
sample of those GPUs inside the batch's time span, and no key twice in the batch) the rows
go by binary `COPY` straight into `gpu_samples`, inside a savepoint; should a concurrent
writer have stored one of them meanwhile, the savepoint is rolled back and the batch takes
the general path: `COPY` into a session-temporary staging table and one
`INSERT ... ON CONFLICT DO NOTHING` from it. Appending new data, the common case of every
feed, so costs one `COPY` into the indexed table; a replay costs the merge.

SQLite: one `executemany` of `INSERT OR IGNORE` in the caller's transaction; the table is
`WITHOUT ROWID`, clustered on its key, so the insert maintains one B-tree, not two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection

SAMPLE_COLUMNS = (
    "util",
    "memory_used_mib",
    "memory_total_mib",
    "power_w",
    "sm_clock_mhz",
    "throttle_reasons",
    "temperature_c",
    "sm_active",
    "tensor_active",
    "dram_active",
)
"""The measured columns of `gpu_samples`, in the order rows carry them."""
ROW_COLUMNS = ("gpu_id", "ts_ms", *SAMPLE_COLUMNS)
_PG_TYPES = [
    "int4",
    "int8",
    *("varchar" if c == "throttle_reasons" else "float8" for c in SAMPLE_COLUMNS),
]
_COLS = ", ".join(ROW_COLUMNS)
_SAVEPOINT = "auditor_bulk_samples"

Row = tuple[Any, ...]
Spans = Mapping[int, tuple[int, int]]
"""Per GPU id, the first and last timestamp of a batch."""


def frame_rows(frame: pd.DataFrame) -> tuple[list[Row], dict[int, tuple[int, int]], bool]:
    """Rows (in `ROW_COLUMNS` order), per-GPU spans, and whether a key repeats, of a frame.

    `frame` has gpu_id, ts_ms and any of `SAMPLE_COLUMNS` (absent ones are NULL); NaN
    becomes NULL.
    """
    n = len(frame)
    columns: list[list[Any]] = []
    for name in ROW_COLUMNS:
        if name not in frame.columns:
            columns.append([None] * n)
            continue
        col = frame[name]
        if name in ("gpu_id", "ts_ms"):
            columns.append(col.to_numpy(dtype=np.int64).tolist())
        elif col.dtype.kind == "f":
            missing = col.isna().to_numpy()
            if missing.all():
                columns.append([None] * n)
            elif missing.any():
                columns.append(col.astype(object).where(~missing, None).tolist())
            else:
                columns.append(col.tolist())
        else:
            columns.append(col.astype(object).where(col.notna(), None).tolist())
    rows = list(zip(*columns, strict=True))
    keys = frame[["gpu_id", "ts_ms"]]
    span = keys.groupby("gpu_id")["ts_ms"].agg(["min", "max"])
    spans = {
        int(g): (int(lo), int(hi))
        for g, lo, hi in zip(span.index, span["min"], span["max"], strict=True)
    }
    repeats = bool(keys.duplicated().any())
    return rows, spans, repeats


def object_spans(rows: Iterable[Row]) -> tuple[dict[int, tuple[int, int]], bool]:
    """Per-GPU spans and whether a key repeats, of rows whose first two fields are the key."""
    spans: dict[int, tuple[int, int]] = {}
    seen: set[tuple[int, int]] = set()
    repeats = False
    for row in rows:
        g, ts = row[0], row[1]
        if not repeats:
            key = (g, ts)
            repeats = key in seen
            seen.add(key)
        lo_hi = spans.get(g)
        spans[g] = (ts, ts) if lo_hi is None else (min(lo_hi[0], ts), max(lo_hi[1], ts))
    return spans, repeats


def write_rows(conn: Connection, rows: Sequence[Row], *, spans: Spans, repeats: bool) -> int:
    """Insert sample rows, skipping keys already stored, in the caller's transaction.

    `spans` and `repeats` describe the batch (`frame_rows`, `object_spans`); they only choose
    the path, never the outcome. Returns the rows newly stored (keys already stored, and
    repeats within the batch, are not counted).
    """
    if not rows:
        return 0
    raw = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        with raw.cursor() as cur:  # type: ignore[union-attr]
            if repeats or _any_stored(cur, spans) or not _copy_direct(cur, rows):
                return _copy_merge(cur, rows)
        return len(rows)
    marks = ", ".join("?" * len(ROW_COLUMNS))
    cursor = raw.cursor()  # type: ignore[union-attr]
    try:
        cursor.executemany(f"INSERT OR IGNORE INTO gpu_samples ({_COLS}) VALUES ({marks})", rows)
        stored = int(cursor.rowcount)  # executemany: the sum over the rows
    finally:
        cursor.close()
    return stored


def _any_stored(cur: Any, spans: Spans) -> bool:
    """Whether any sample of the batch's GPUs is stored inside the batch's span of that GPU."""
    ids = list(spans)
    cur.execute(
        "SELECT EXISTS (SELECT 1 FROM unnest(%s::int[], %s::bigint[], %s::bigint[]) AS b(g, lo, hi)"
        " WHERE EXISTS (SELECT 1 FROM gpu_samples s"
        " WHERE s.gpu_id = b.g AND s.ts_ms BETWEEN b.lo AND b.hi))",
        (ids, [spans[g][0] for g in ids], [spans[g][1] for g in ids]),
    )
    return bool(cur.fetchone()[0])


def _copy(cur: Any, table: str, rows: Sequence[Row]) -> None:
    with cur.copy(f"COPY {table} ({_COLS}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(_PG_TYPES)
        for row in rows:
            copy.write_row(row)


def _copy_direct(cur: Any, rows: Sequence[Row]) -> bool:
    """COPY into the table itself; False (and nothing written) where a key was taken."""
    from psycopg import errors

    cur.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        _copy(cur, "gpu_samples", rows)
    except errors.UniqueViolation:
        cur.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return False
    cur.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
    return True


def _copy_merge(cur: Any, rows: Sequence[Row]) -> int:
    cur.execute(
        "CREATE TEMP TABLE IF NOT EXISTS auditor_stage_samples "
        "(LIKE gpu_samples INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
    )
    _copy(cur, "auditor_stage_samples", rows)
    cur.execute(
        f"INSERT INTO gpu_samples ({_COLS}) SELECT {_COLS} FROM auditor_stage_samples "
        "ON CONFLICT (gpu_id, ts_ms) DO NOTHING"
    )
    stored = int(cur.rowcount)
    cur.execute("TRUNCATE auditor_stage_samples")
    return stored
