"""Schema migrations as functions code calls; `auditor db ...` is one caller.

The revisions ship inside the package (`auditor/migrations`), so an installed auditor
(the CronJob's image) migrates its database without a source checkout. Each function
takes an Engine or a URL; a URL gets an engine of its own that is disposed afterwards.
Alembic keeps its running context in module globals, so within one process these calls
take turns (a lock); across processes they take turns on the database's own lock (an
advisory lock on PostgreSQL, the write lock on SQLite).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, text

from auditor.errors import StoreError
from auditor.store.connection import make_engine

if TYPE_CHECKING:
    from alembic.config import Config

SCRIPT_LOCATION = "auditor:migrations"
"""Where env.py and versions/ live: the `migrations` directory of the installed package."""

PG_LOCK_KEY = 0x61756469746F72
"""PostgreSQL advisory lock held while migrating, so the pods of a sharded audit that all
run `auditor db upgrade` at once take turns (the later ones then find nothing to do)."""

_alembic_lock = threading.RLock()


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@contextmanager
def _migrating(target: Engine | str) -> Iterator[Connection]:
    """One transaction to migrate in, and the only one migrating that database.

    On SQLite, foreign keys are off while it runs (and checked before it commits): a batch
    alteration copies a table and drops the old one, and with them on, that drop would
    cascade to every row referencing it (dropping a column of `gpus` would delete every
    stored result)."""
    with _alembic_lock, _engine(target) as engine, engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:  # takes effect only outside a transaction
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY}
                    )
                elif sqlite:
                    # Take the write lock now, before alembic reads the version: the driver
                    # would otherwise run the DDL outside any transaction.
                    connection.exec_driver_sql("BEGIN IMMEDIATE")
                yield connection
                if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first():
                    raise RuntimeError("a migration left rows referencing rows that are gone")
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()


@contextmanager
def _engine(target: Engine | str) -> Iterator[Engine]:
    if isinstance(target, Engine):
        yield target
        return
    engine = make_engine(target)
    try:
        yield engine
    finally:
        engine.dispose()


def upgrade(target: Engine | str, revision: str = "head") -> None:
    """Bring the database up to `revision` (all of it in one transaction where DDL allows)."""
    from alembic import command

    with _migrating(target) as connection:
        command.upgrade(_config(connection), revision)


def create_fresh(target: Engine | str) -> None:
    """Bring an EMPTY database to head at once: the schema's tables created as they are, and
    the head revision stamped, as `upgrade` would leave it (a test compares the two) in a
    fiftieth of the time — the first import into a new SQLite file is mostly this. A
    database that has any table (another process got there first) is migrated instead."""
    from sqlalchemy import inspect

    from auditor.store.schema import metadata

    head_revision = _cheap_head()
    with _migrating(target) as connection:
        if head_revision is None or inspect(connection).get_table_names():
            from alembic import command

            command.upgrade(_config(connection), "head")
            return
        metadata.create_all(connection)
        connection.exec_driver_sql(
            "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL, "
            "CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))"
        )
        connection.execute(
            text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": head_revision}
        )


def downgrade(target: Engine | str, revision: str) -> None:
    """Take the database down to `revision`; "base" drops every table the migrations made."""
    from alembic import command

    with _migrating(target) as connection:
        command.downgrade(_config(connection), revision)


def current(target: Engine | str) -> str | None:
    """The revision the database is at, or None for a database never migrated."""
    from alembic.runtime.migration import MigrationContext

    with _engine(target) as engine, engine.connect() as connection:
        rev: str | None = MigrationContext.configure(connection).get_current_revision()
        return rev


def head() -> str:
    """The newest revision this auditor knows."""
    from alembic.script import ScriptDirectory

    with _alembic_lock:
        rev: str | None = ScriptDirectory.from_config(_config()).get_current_head()
    if rev is None:  # only a broken installation lacks the versions/ directory
        raise StoreError("the auditor ships no migrations")
    return rev


def check_drift(target: Engine | str) -> list[str]:
    """What differs between the migrated database and `schema.metadata`; empty means none."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from auditor.store.schema import metadata

    with _engine(target) as engine, engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return [repr(diff) for diff in compare_metadata(context, metadata)]


def ensure_current(target: Engine | str) -> None:
    """Raise StoreError unless the database is at this auditor's head revision.

    The common case, a database at the head, is told without loading alembic (a second of
    every command's start): the stored revision is read with one query and compared with
    the head read from the revision files' `revision`/`down_revision` lines."""
    if _cheap_head() is not None and _stored_revision(target) == _cheap_head():
        return
    from alembic.script import ScriptDirectory

    at = current(target)
    need = head()
    if at == need:
        return
    with _alembic_lock:
        scripts = ScriptDirectory.from_config(_config())
        known = {script.revision for script in scripts.walk_revisions()}
    if at is not None and at not in known:
        raise StoreError(
            f"database schema is at {at}, newer than this auditor knows ({need}): "
            "upgrade the auditor"
        )
    raise StoreError(
        f"database schema is at {at or 'no revision (never migrated)'}, this auditor needs {need}: "
        "run `auditor db upgrade`"
    )


_REVISION_LINE = re.compile(r"^(revision|down_revision)\b[^=]*=\s*(.+?)\s*$", re.M)


@cache
def _cheap_head() -> str | None:
    """The head revision from the revision files' text; None when they are not the plain
    linear history this reads (alembic then decides)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    versions = resources.files("auditor").joinpath("migrations/versions")
    for entry in versions.iterdir():
        if not entry.name.endswith(".py") or entry.name.startswith("_"):
            continue
        found = dict(_REVISION_LINE.findall(entry.read_text("utf-8")))
        revision, parent = found.get("revision"), found.get("down_revision")
        if revision is None or parent is None:
            return None
        revisions.add(revision.strip("\"'"))
        if parent != "None":
            if not re.fullmatch(r"[\"'][\w-]+[\"']", parent):
                return None  # a merge: a tuple of parents
            parents.add(parent.strip("\"'"))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def _stored_revision(target: Engine | str) -> str | None:
    """The revision in alembic's version table, or None where there is none (or several)."""
    with _engine(target) as engine, engine.connect() as connection:
        try:
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
        except Exception:  # no such table: never migrated; alembic says the rest
            connection.rollback()
            return None
    return str(rows[0][0]) if len(rows) == 1 else None
