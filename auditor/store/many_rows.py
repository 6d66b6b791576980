"""Many plain rows into one table, through the driver: an audit run's results, causes and
findings (a 1,000-GPU day is about 120,000 rows).

SQLAlchemy's `insert` of a list of dicts processes every value of every row in Python
before the driver sees it: 3 s for those rows on PostgreSQL, longer than the rest of the
run's write. Here PostgreSQL takes them as one `COPY ... FROM STDIN` (psycopg writes each
row in C) and SQLite as one `executemany` of a prepared statement, each row a tuple in the
order of the columns named, its values already what the columns hold (int, float, str,
bool, None): no dict per row, no column default filled in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Table


def insert_many(
    conn: Connection, table: Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """Insert `rows` (a value per column of `columns`, in that order) into `table` inside
    `conn`'s transaction; the number inserted."""
    unknown = [c for c in columns if c not in table.c]
    if unknown:
        raise ValueError(f"{table.name} has no column {unknown[0]!r}")
    names = ", ".join(columns)
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    count = 0
    try:
        if conn.dialect.name == "postgresql":
            with cur.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    count += 1
        else:
            listed = rows if isinstance(rows, list) else list(rows)
            if listed:
                marks = ", ".join("?" * len(columns))
                cur.executemany(f"INSERT INTO {table.name} ({names}) VALUES ({marks})", listed)
            count = len(listed)
    finally:
        cur.close()
    return count
