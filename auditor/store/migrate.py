"""Schema migrations as functions code calls; `auditor db ...` is one caller.

The revisions ship inside the package (`auditor/migrations`), so an installed auditor
(the CronJob's image) migrates its database without a source checkout. Each function
takes an Engine or a URL; a URL gets an engine of its own that is disposed afterwards.
Alembic keeps its running context in module globals, so within one process these calls
take turns (a lock); across processes they take turns on the database's own lock (an
advisory lock on PostgreSQL, the write lock on SQLite).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from auditor.errors import StoreError
from auditor.store.engine import make_engine
from auditor.store.schema import metadata

SCRIPT_LOCATION = "auditor:migrations"
"""Where env.py and versions/ live: the `migrations` directory of the installed package."""

PG_LOCK_KEY = 0x61756469746F72
"""PostgreSQL advisory lock held while migrating, so the pods of a sharded audit that all
run `auditor db upgrade` at once take turns (the later ones then find nothing to do)."""

_alembic_lock = threading.RLock()


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@contextmanager
def _migrating(target: Engine | str) -> Iterator[Connection]:
    """One transaction to migrate in, and the only one migrating that database."""
    with _alembic_lock, _engine(target) as engine, engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK_KEY})
        elif connection.dialect.name == "sqlite":
            # Take the write lock now, before alembic reads the version: the driver
            # would otherwise run the DDL outside any transaction.
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        yield connection


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
    with _migrating(target) as connection:
        command.upgrade(_config(connection), revision)


def downgrade(target: Engine | str, revision: str) -> None:
    """Take the database down to `revision`; "base" drops every table the migrations made."""
    with _migrating(target) as connection:
        command.downgrade(_config(connection), revision)


def current(target: Engine | str) -> str | None:
    """The revision the database is at, or None for a database never migrated."""
    with _engine(target) as engine, engine.connect() as connection:
        rev: str | None = MigrationContext.configure(connection).get_current_revision()
        return rev


def head() -> str:
    """The newest revision this auditor knows."""
    with _alembic_lock:
        rev: str | None = ScriptDirectory.from_config(_config()).get_current_head()
    if rev is None:  # only a broken installation lacks the versions/ directory
        raise StoreError("the auditor ships no migrations")
    return rev


def check_drift(target: Engine | str) -> list[str]:
    """What differs between the migrated database and `schema.metadata`; empty means none."""
    with _engine(target) as engine, engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return [repr(diff) for diff in compare_metadata(context, metadata)]


def ensure_current(target: Engine | str) -> None:
    """Raise StoreError unless the database is at this auditor's head revision."""
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
