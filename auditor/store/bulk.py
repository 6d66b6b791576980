"""Bulk sample writes, the ingest hot path: straight to the driver, idempotent, one transaction.

PostgreSQL: when none of the batch's (GPU, timestamp) keys can already be stored (no stored
sample of those GPUs inside the batch's time span, and no key twice in the batch) the rows
go by binary `COPY` straight into `gpu_samples`, inside a savepoint; should a concurrent
writer have stored one of them meanwhile, the savepoint is rolled back and the batch takes
the general path: `COPY` into a session-temporary staging table and one
`INSERT ... ON CONFLICT DO NOTHING` from it. Appending new data, the common case of every
feed, so costs one `COPY` into the indexed table; a replay costs the merge.

SQLite: `INSERT OR IGNORE` in the caller's transaction; the table is `WITHOUT ROWID`,
clustered on its key, so the insert maintains one B-tree, not two. A batch held column by
column binds only the columns some row of it has a value in (the others are NULL by
default): each parameter bound costs about as much as the row's insert itself, and an
exporter or a log rarely has every column. It goes in key order, about a hundred rows per
statement (`SQLITE_PARAMETERS`), not one: the statement's step and reset, and the driver's
work per execution, are paid per hundred rows (bench/bench_nvidia_smi.py's `baseline`).

An import passes its ledger id (`import_id`, `auditor.store.ledger`): every row it stores
carries it, as a constant of the statement on SQLite and one fixed field of each binary
record on PostgreSQL, so tagging costs no work per row; a key stored already keeps the id
of the import that wrote it. The sampler passes none (NULL).

A batch comes as tuples (`write_rows`) or column by column (`write_columns`, the importers'
hot path): numpy arrays become the binary `COPY` stream in a few vectorised steps per
pattern of NULLs, and SQLite's parameters by one assignment per column into an object
array; no object per row is made on PostgreSQL, and only the parameters on SQLite.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from auditor.model import SAMPLE_FIELDS, SAMPLE_TEXT_FIELDS

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Connection

SAMPLE_COLUMNS = SAMPLE_FIELDS
"""The measured columns of `gpu_samples`, in the order rows carry them (the model's)."""
ROW_COLUMNS = ("gpu_id", "ts_ms", *SAMPLE_COLUMNS)
_PG_TYPES = [
    "int4",
    "int8",
    *("varchar" if c in SAMPLE_TEXT_FIELDS else "float8" for c in SAMPLE_COLUMNS),
]
_COLS = ", ".join(ROW_COLUMNS)
_TAG = "import_id"
_SAVEPOINT = "auditor_bulk_samples"

_PG_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
"""The binary COPY header: signature, flags, header extension length."""
_PG_TRAILER = b"\xff\xff"
_PG_VALUE = {"int4": ">i4", "int8": ">i8", "float8": ">f8"}

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


@dataclass(frozen=True, slots=True)
class Columns:
    """A batch of samples column by column: row `i` is `gpu_id[i]`, `ts_ms[i]` and the
    `values[name][i]` of each `SAMPLE_COLUMNS` name present (absent names are NULL):
    float64 with NaN for NULL, or (`throttle_reasons`) an object array of str or None."""

    gpu_id: npt.NDArray[np.int64]
    ts_ms: npt.NDArray[np.int64]
    values: Mapping[str, npt.NDArray[Any]]

    def __len__(self) -> int:
        return len(self.ts_ms)

    def spans(self) -> tuple[dict[int, tuple[int, int]], bool]:
        """Per-GPU spans, and whether a key repeats."""
        if not len(self):
            return {}, False
        order = np.lexsort((self.ts_ms, self.gpu_id))
        g = self.gpu_id[order]
        ts = self.ts_ms[order]
        same_gpu = g[1:] == g[:-1]
        repeats = bool((same_gpu & (ts[1:] == ts[:-1])).any())
        firsts = np.flatnonzero(np.concatenate(([True], ~same_gpu)))
        lasts = np.concatenate((firsts[1:] - 1, [len(g) - 1]))
        spans = {
            gpu: (lo, hi)
            for gpu, lo, hi in zip(
                g[firsts].tolist(), ts[firsts].tolist(), ts[lasts].tolist(), strict=True
            )
        }
        return spans, repeats

    def in_key_order(self) -> Columns:
        """The batch sorted by (gpu_id, ts_ms): each GPU's rows go into one place of the
        index after another, rather than to every GPU's place in turn."""
        order = np.lexsort((self.ts_ms, self.gpu_id))
        return Columns(
            self.gpu_id[order], self.ts_ms[order], {k: v[order] for k, v in self.values.items()}
        )

    def present(self) -> tuple[str, ...]:
        """The `SAMPLE_COLUMNS` with a value in some row of the batch, in their order."""
        out = []
        for name in SAMPLE_COLUMNS:
            value = self.values.get(name)
            if value is None:
                continue
            if value.dtype.kind == "f":
                if not np.isnan(value).all():
                    out.append(name)
            elif any(v is not None for v in value.tolist()):
                out.append(name)
        return tuple(out)

    def rows(self, names: Sequence[str] = SAMPLE_COLUMNS) -> Iterable[Row]:
        """The rows as tuples of gpu_id, ts_ms and the columns `names` (default all of
        `SAMPLE_COLUMNS`, the `ROW_COLUMNS` order), NULL as None (SQLite's parameters)."""
        n = len(self)
        columns: list[Iterable[Any]] = [self.gpu_id.tolist(), self.ts_ms.tolist()]
        for name in names:
            value = self.values.get(name)
            if value is None:
                columns.append(itertools.repeat(None, n))
            elif value.dtype.kind == "f":
                missing = np.isnan(value)
                if not missing.any():
                    columns.append(value.tolist())
                elif missing.all():
                    columns.append(itertools.repeat(None, n))
                else:
                    held = value.astype(object)
                    held[missing] = None
                    columns.append(held.tolist())
            else:
                columns.append(value.tolist())
        return zip(*columns, strict=True)

    def pg_binary(self, import_id: int | None = None) -> bytes:
        """The rows as one binary COPY stream (`ROW_COLUMNS`, `_PG_TYPES`, then `import_id`
        as int4 when given), header and trailer included. Rows are grouped by which of their
        values are NULL (and the length of their text), each group one fixed record layout
        filled column-wise."""
        n = len(self)
        present: list[npt.NDArray[np.bool_] | None] = []
        pattern = np.zeros(n, np.int64)
        text: list[bytes | None] | None = None
        for bit, name in enumerate(SAMPLE_COLUMNS):
            value = self.values.get(name)
            if value is None:
                present.append(None)
                continue
            if value.dtype.kind == "f":
                mask = ~np.isnan(value)
            else:
                text = [None if v is None else str(v).encode() for v in value.tolist()]
                lengths = np.fromiter((-1 if t is None else len(t) for t in text), np.int64, n)
                mask = lengths >= 0
                pattern += (lengths + 1) << len(SAMPLE_COLUMNS)
            present.append(mask)
            pattern += mask.astype(np.int64) << bit
        kinds, inverse = np.unique(pattern, return_inverse=True)
        parts = [_PG_SIGNATURE]
        for k, kind in enumerate(kinds.tolist()):
            rows = np.flatnonzero(inverse == k) if len(kinds) > 1 else None
            count = n if rows is None else len(rows)
            fields: list[tuple[str, str]] = [("n", ">i2")]
            fill: list[tuple[str, Any]] = [("n", len(ROW_COLUMNS) + (import_id is not None))]
            for i, (name, pg_type) in enumerate(zip(ROW_COLUMNS, _PG_TYPES, strict=True)):
                fields.append((f"l{i}", ">i4"))
                if i >= 2 and not (kind >> (i - 2)) & 1:
                    fill.append((f"l{i}", -1))
                    continue
                if i == 0:
                    column: Any = self.gpu_id
                elif i == 1:
                    column = self.ts_ms
                elif pg_type == "varchar":
                    assert text is not None
                    width = (kind >> len(SAMPLE_COLUMNS)) - 1
                    picked = text if rows is None else [text[r] for r in rows.tolist()]
                    fill.append((f"l{i}", width))
                    if width:
                        fields.append((f"v{i}", f"S{width}"))
                        fill.append((f"v{i}", np.array(picked, f"S{width}")))
                    continue
                else:
                    column = self.values[name]
                fields.append((f"v{i}", _PG_VALUE[pg_type]))
                fill.append((f"l{i}", 4 if pg_type == "int4" else 8))
                fill.append((f"v{i}", column if rows is None else column[rows]))
            if import_id is not None:
                fields += [("lt", ">i4"), ("vt", ">i4")]
                fill += [("lt", 4), ("vt", import_id)]
            record = np.empty(count, np.dtype(fields))
            for field, value in fill:
                record[field] = value
            parts.append(record.tobytes())
        parts.append(_PG_TRAILER)
        return b"".join(parts)


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


def write_rows(
    conn: Connection,
    rows: Sequence[Row],
    *,
    spans: Spans,
    repeats: bool,
    import_id: int | None = None,
) -> int:
    """Insert sample rows, skipping keys already stored, in the caller's transaction.

    `spans` and `repeats` describe the batch (`frame_rows`, `object_spans`); they only choose
    the path, never the outcome. `import_id`: the ledger id every stored row carries (None:
    NULL). Returns the rows newly stored (keys already stored, and repeats within the batch,
    are not counted).
    """
    if not rows:
        return 0
    if conn.dialect.name == "postgresql":
        return _pg_write(conn, rows, len(rows), spans=spans, repeats=repeats, import_id=import_id)
    return _sqlite_write(conn, rows, import_id)


def write_columns(conn: Connection, batch: Columns, *, import_id: int | None = None) -> int:
    """`write_rows` of a batch held column by column: the same outcome, no tuple per row on
    PostgreSQL. Returns the rows newly stored."""
    if not len(batch):
        return 0
    if conn.dialect.name == "postgresql":
        spans, repeats = batch.spans()
        payload = batch.in_key_order().pg_binary(import_id)
        return _pg_write(
            conn, payload, len(batch), spans=spans, repeats=repeats, import_id=import_id
        )
    return _sqlite_write_columns(conn, batch, import_id)


_Payload = Sequence[Row] | bytes
"""Rows as tuples, or a whole binary COPY stream (`Columns.pg_binary`)."""


def _pg_write(
    conn: Connection,
    payload: _Payload,
    count: int,
    *,
    spans: Spans,
    repeats: bool,
    import_id: int | None,
) -> int:
    """`payload`: tuples, or a binary stream that already carries `import_id`."""
    raw = conn.connection.driver_connection
    with raw.cursor() as cur:  # type: ignore[union-attr]
        if (
            repeats
            or _any_stored(cur, spans)
            or not _copy_direct(cur, payload, import_id=import_id)
        ):
            return _copy_merge(cur, payload, import_id=import_id)
    return count


def _columns(import_id: int | None) -> str:
    return _COLS if import_id is None else f"{_COLS}, {_TAG}"


def _sqlite_write(
    conn: Connection,
    rows: Iterable[Row],
    import_id: int | None,
    names: Sequence[str] = SAMPLE_COLUMNS,
) -> int:
    """`rows`: gpu_id, ts_ms and the columns `names`; the others are NULL."""
    raw = conn.connection.driver_connection
    columns = ["gpu_id", "ts_ms", *names]
    marks = ", ".join("?" * len(columns))
    if import_id is not None:  # a constant of the statement: nothing added per row
        columns.append(_TAG)
        marks += f", {int(import_id)}"
    cursor = raw.cursor()  # type: ignore[union-attr]
    try:
        cursor.executemany(
            f"INSERT OR IGNORE INTO gpu_samples ({', '.join(columns)}) VALUES ({marks})", rows
        )
        stored = int(cursor.rowcount)  # executemany: the sum over the rows
    finally:
        cursor.close()
    return stored


SQLITE_PARAMETERS = 999
"""Parameters bound per statement at most: the smallest limit of any SQLite build (those
before 3.32 allow 999)."""


def _sqlite_write_columns(conn: Connection, batch: Columns, import_id: int | None) -> int:
    """`write_columns` on SQLite: the batch in key order (each GPU's rows one after another
    into its place of the B-tree, a key twice in the batch still first come first stored),
    as many rows per `INSERT` as `SQLITE_PARAMETERS` allows: a statement's step, reset and
    the driver's per-execution work are paid per statement, not per row, and SQLite inserts
    a statement's rows with the interpreter's lock released. Only the columns some row has
    a value in are bound; the others are NULL by default."""
    names = batch.present()
    if not _in_key_order(batch):
        batch = batch.in_key_order()
    n = len(batch)
    width = 2 + len(names)
    grid = np.empty((n, width), object)  # Python ints, floats, str and None: the parameters
    grid[:, 0] = batch.gpu_id
    grid[:, 1] = batch.ts_ms
    for j, name in enumerate(names, start=2):
        value = batch.values[name]
        grid[:, j] = value
        if value.dtype.kind == "f":
            grid[np.isnan(value), j] = None
    columns = ["gpu_id", "ts_ms", *names]
    one = ", ".join("?" * width)
    if import_id is not None:  # a constant of the statement: nothing bound per row
        columns.append(_TAG)
        one += f", {int(import_id)}"
    insert = f"INSERT OR IGNORE INTO gpu_samples ({', '.join(columns)}) VALUES "
    per = max(1, SQLITE_PARAMETERS // width)
    full = n - n % per
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        stored = 0
        if full:
            cursor.executemany(
                insert + ", ".join([f"({one})"] * per),
                grid[:full].reshape(-1, per * width).tolist(),
            )
            stored += int(cursor.rowcount)  # executemany: the sum over the statements
        if full < n:
            cursor.executemany(insert + f"({one})", grid[full:].tolist())
            stored += int(cursor.rowcount)
    finally:
        cursor.close()
    return stored


def _in_key_order(batch: Columns) -> bool:
    """Whether the batch's rows are sorted by (gpu_id, ts_ms) already."""
    g, ts = batch.gpu_id, batch.ts_ms
    later = (g[1:] > g[:-1]) | ((g[1:] == g[:-1]) & (ts[1:] >= ts[:-1]))
    return bool(later.all())


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


def _copy(cur: Any, table: str, payload: _Payload, *, import_id: int | None) -> None:
    with cur.copy(f"COPY {table} ({_columns(import_id)}) FROM STDIN (FORMAT BINARY)") as copy:
        if isinstance(payload, bytes):
            copy.write(payload)
            return
        if import_id is None:
            copy.set_types(_PG_TYPES)
            for row in payload:
                copy.write_row(row)
            return
        copy.set_types([*_PG_TYPES, "int4"])
        for row in payload:
            copy.write_row((*row, import_id))


def _copy_direct(cur: Any, payload: _Payload, *, import_id: int | None) -> bool:
    """COPY into the table itself; False (and nothing written) where a key was taken."""
    from psycopg import errors

    cur.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        _copy(cur, "gpu_samples", payload, import_id=import_id)
    except errors.UniqueViolation:
        cur.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        return False
    cur.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
    return True


def _copy_merge(cur: Any, payload: _Payload, *, import_id: int | None) -> int:
    cur.execute(
        "CREATE TEMP TABLE IF NOT EXISTS auditor_stage_samples "
        "(LIKE gpu_samples INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
    )
    _copy(cur, "auditor_stage_samples", payload, import_id=import_id)
    cols = _columns(import_id)
    cur.execute(
        f"INSERT INTO gpu_samples ({cols}) SELECT {cols} FROM auditor_stage_samples "
        "ON CONFLICT (gpu_id, ts_ms) DO NOTHING"
    )
    stored = int(cur.rowcount)
    cur.execute("TRUNCATE auditor_stage_samples")
    return stored
