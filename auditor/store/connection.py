"""Engines for a database URL: SQLite (WAL, busy timeout, foreign keys) or PostgreSQL; the
lock writers of one thing take turns on (`write_lock`).

A SQLite file this process cannot write (the file, or its directory, where the -wal and
-shm files live) is opened read-only (`mode=ro`; `immutable=1` where no -wal or -shm file
exists and none can be made: a store whose writer has finished, copied or mounted
read-only), so that reading it works and writing it fails at once, with SQLite's
"attempt to write a readonly database". `read_only=True` opens any store read-only.

No message from here holds the URL's password: it is remembered by `auditor.redact` (so
any later driver message that quotes it is masked too) and every error text is redacted."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from auditor.errors import InputError, StoreError, shown
from auditor.redact import redact, remember

SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE_LOCK_WAIT_MS = 30 * 60_000
"""How long a writer waits for another writer of the same thing (an audit of the window)
to commit: longer than any one audit's write."""
PG_WRITE_LOCK_SPACE = 0x61756474
"""The first key of the two-key PostgreSQL advisory locks of `write_lock` (two-key locks
never meet the one-key lock of migrations)."""


def _normalise(url: str) -> str:
    """Accept `postgresql://` and `postgres://` and use the psycopg 3 driver for them."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str, *, read_only: bool = False) -> Engine:
    """An engine for `url`; a URL that cannot be parsed or used is a StoreError.

    `read_only`: every transaction is read-only (PostgreSQL's default_transaction_read_only;
    SQLite's `mode=ro` on a file that exists)."""
    _remember_password(url)
    try:
        parsed = make_url(_normalise(url))
    except ArgumentError as e:
        raise StoreError(f"not a database URL: {redact(url)!r}") from e
    except ValueError as e:  # make_url's int() of the port is the one that raises it
        raise StoreError(f"not a database URL: {redact(url)!r} (the port is not a number)") from e
    remember(parsed.password if isinstance(parsed.password, str) else None)
    if parsed.host and "@" in parsed.host:
        raise StoreError(
            f"not a database URL: {redact(url)!r} (write an '@' in the password as %40)"
        )
    try:
        return _engine(parsed, read_only=read_only)
    except Exception as e:  # an unknown dialect or driver, a bad query option...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise StoreError(f"cannot use {redact(url)}: {redact(first)}") from e


def _remember_password(url: str) -> None:
    """The password as a user meant it: between the first `:` of the userinfo and the last
    `@` (SQLAlchemy would split a password holding `@` at its first one)."""
    _, sep, rest = url.partition("//")
    info = rest.rpartition("@")[0] if sep else ""
    if ":" in info:
        remember(info.split(":", 1)[1])


def _engine(parsed: URL, *, read_only: bool) -> Engine:
    if parsed.get_backend_name() == "sqlite":
        uri = _read_only_uri(parsed.database, wanted=read_only)
        timeout = SQLITE_BUSY_TIMEOUT_MS / 1000
        if uri is None:
            engine = create_engine(parsed, connect_args={"timeout": timeout})
        else:
            import sqlite3

            def connect() -> sqlite3.Connection:
                return sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)

            engine = create_engine(parsed, creator=connect)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            if uri is None:  # a read-only connection changes nothing, the journal mode neither
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if read_only:
        return create_engine(
            parsed,
            pool_pre_ping=True,
            connect_args={"options": "-c default_transaction_read_only=on"},
        )
    return create_engine(parsed, pool_pre_ping=True)


def _read_only_uri(database: str | None, *, wanted: bool) -> str | None:
    """The `file:` URI to open the SQLite file `database` read-only with, or None to open it
    as usual: a file that does not exist yet (it is created), an in-memory database, a URI
    the user wrote, or a file this process may write and was not asked to only read."""
    import os
    from pathlib import Path
    from urllib.parse import quote

    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    path = Path(database).absolute()
    if not path.is_file():
        return None
    folder_writable = os.access(path.parent, os.W_OK | os.X_OK)
    if not wanted and folder_writable and os.access(path, os.W_OK):
        return None
    uri = f"file:{quote(str(path))}?mode=ro"
    journal = [Path(f"{path}-wal"), Path(f"{path}-shm")]
    if not folder_writable and not any(p.exists() for p in journal):
        # no writer is part-way (its -wal would be here) and no reader can make the -shm
        # file WAL reading needs: read the file as it is
        uri += "&immutable=1"
    return uri


def write_lock(conn: Connection, name: str) -> None:
    """Make `conn`'s transaction the only writer of `name` until it ends.

    On PostgreSQL a transaction-scoped advisory lock named by a hash of `name`; a second
    writer waits for the first to commit and then sees what it wrote. On SQLite the
    database's write lock (`BEGIN IMMEDIATE`), taken before the transaction reads anything,
    so it never decides on rows another writer is about to change; a transaction that has
    written already holds it. Either waits up to `WRITE_LOCK_WAIT_MS`."""
    if conn.dialect.name == "postgresql":
        import hashlib

        digest = hashlib.sha256(name.encode("utf-8")).digest()
        key = int.from_bytes(digest[:4], "big", signed=True)
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:space, :key)"),
            {"space": PG_WRITE_LOCK_SPACE, "key": key},
        )
    elif conn.dialect.name == "sqlite":
        if getattr(conn.connection.dbapi_connection, "in_transaction", False):
            return
        conn.exec_driver_sql(f"PRAGMA busy_timeout={WRITE_LOCK_WAIT_MS}")
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        finally:
            conn.exec_driver_sql(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction on `engine`; any failure to write leaves as a one-line `StoreError`
    (redacted, its cause kept), which a long-running service backs off from."""
    try:
        with engine.begin() as conn:
            yield conn
    except SQLAlchemyError as e:
        cause = getattr(e, "orig", None) or e
        raise StoreError(f"cannot write to the database: {_first_line(cause)}") from e
    except (InputError, OverflowError, UnicodeError, ValueError) as e:
        raise StoreError(f"cannot write to the database: {_first_line(e)}") from e


def _first_line(error: object) -> str:
    text = redact(str(error)).strip()
    return shown(text.splitlines()[0], 200) if text else type(error).__name__
