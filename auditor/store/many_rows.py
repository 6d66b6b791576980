"""Many plain rows into one table, through the driver: an audit run's results, causes and
findings (a 1,000-GPU day is about 120,000 rows).

SQLAlchemy's `insert` of a list of dicts processes every value of every row in Python
before the driver sees it: 3 s for those rows on PostgreSQL, longer than the rest of the
run's write. Here PostgreSQL takes them as one `COPY ... FROM STDIN` (psycopg writes each
row in C) and SQLite as one `executemany` of a prepared statement. Only for rows whose
values are already what the columns hold (int, float, str, bool, None) and whose table
has no column default the rows rely on: every row names the same columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table


def insert_many(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> int:
    """Insert `rows` (each with the first row's keys, the table's column names) into
    `table` inside `conn`'s transaction; the number inserted."""
    if not rows:
        return 0
    columns = list(rows[0])
    unknown = [c for c in columns if c not in table.c]
    if unknown:
        raise ValueError(f"{table.name} has no column {unknown[0]!r}")
    names = ", ".join(columns)
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        if conn.dialect.name == "postgresql":
            with cur.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row([row[c] for c in columns])
        else:
            marks = ", ".join("?" * len(columns))
            cur.executemany(
                f"INSERT INTO {table.name} ({names}) VALUES ({marks})",
                ([row[c] for c in columns] for row in rows),
            )
    finally:
        cur.close()
    return len(rows)
