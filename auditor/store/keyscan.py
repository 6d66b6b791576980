"""Per-card key-range scans through the driver: the audit's hot reads.

A table keyed by (gpu_id, ts_ms) is read one card and time range at a time, each an index
range scan whose rows come in key order and carry no GPU column to convert; each range's
rows become a structured array in one pass (`np.fromiter`: no Python object per value is
kept but text, and NULL in a float field arrives as NaN). SQLAlchemy's row objects would
cost more than the scan itself at a million rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection

CardRange = tuple[int, int, int]
"""A GPU id and the time range `[lo, hi)` of its rows to read."""


def scan_card_ranges(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    row: np.dtype,
    ranges: Sequence[CardRange],
    *,
    neighbours: int = 0,
    order: str = "",
) -> list[tuple[int, np.ndarray]]:
    """(GPU id, rows) per range of `ranges` that holds any, in the order given: `columns`
    of `table` (the first is `ts_ms`), as arrays of dtype `row`; a range's rows in key order,
    or by `order` (an ORDER BY list) where the key does not lead with time.

    With `neighbours` = k, also the card's last k rows before its range and first k after
    it, however far (two index seeks). Ranges of one card that overlap read their common
    rows twice: give them merged."""
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    head = f"SELECT {', '.join(columns)} FROM {table}"
    query = f"{head} WHERE gpu_id = {mark} AND ts_ms >= {mark} AND ts_ms < {mark}"
    if order:
        query += f" ORDER BY {order}"
    before = f"{head} WHERE gpu_id = {mark} AND ts_ms < {mark} ORDER BY ts_ms DESC LIMIT {mark}"
    after = f"{head} WHERE gpu_id = {mark} AND ts_ms >= {mark} ORDER BY ts_ms LIMIT {mark}"
    parts: list[tuple[int, np.ndarray]] = []
    cur = driver_cursor(conn)
    try:
        for gpu_id, lo, hi in ranges:
            cur.execute(query, (gpu_id, lo, hi))
            found = cur.fetchall()  # one range's rows: a driver's fetchall beats its iterator
            if neighbours:
                cur.execute(before, (gpu_id, lo, neighbours))
                first = cur.fetchall()[::-1]
                cur.execute(after, (gpu_id, hi, neighbours))
                found = [*first, *found, *cur.fetchall()]
            if found:
                parts.append((gpu_id, np.fromiter(found, dtype=row, count=len(found))))
    finally:
        cur.close()
    return parts


def driver_cursor(conn: Connection) -> Any:
    """A cursor of the driver under `conn`, in its transaction. On PostgreSQL it asks for
    results in binary: the server sends a float as its 8 bytes rather than formatting it as
    text for psycopg to parse back, which takes both sides less CPU."""
    driver = conn.connection.driver_connection
    if conn.dialect.name == "postgresql":
        return driver.cursor(binary=True)  # type: ignore[union-attr]
    return driver.cursor()  # type: ignore[union-attr]


def merged_spans(spans: Iterable[tuple[int, int]], *, lo: int, hi: int) -> list[tuple[int, int]]:
    """`spans` clipped to `[lo, hi)`, sorted, overlapping or touching ones merged: the
    ranges to scan for a card."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((max(int(a), lo), min(int(b), hi)) for a, b in spans):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
