"""Alembic environment: runs the revisions in `versions/` against one database.

The URL never lives here. `auditor.store.migrate` hands over an open connection in
`config.attributes["connection"]`; the plain `alembic` command line may instead give
`sqlalchemy.url` in its ini file, `-x url=...`, or the `AUDITOR_DB_URL` environment variable.
SQLite alters tables in batch mode (copy and move), since it lacks most of ALTER TABLE.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from auditor.settings import DB_URL_ENV
from auditor.store.connection import make_engine
from auditor.store.schema import metadata

config = context.config
if config.config_file_name is not None:  # the `alembic` command line, with an ini file
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    """The database URL for a run that was not handed a connection."""
    url = (
        config.get_main_option("sqlalchemy.url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get(DB_URL_ENV)
    )
    if not url:
        raise RuntimeError(
            f"no database URL: give -x url=..., set {DB_URL_ENV}, or run `auditor db upgrade`"
        )
    return url


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Write the SQL to standard output instead of running it (`alembic upgrade --sql`)."""
    context.configure(
        url=_url(),
        target_metadata=metadata,
        render_as_batch=True,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Run against the connection handed over, else against a fresh engine for the URL."""
    handed: Connection | None = config.attributes.get("connection")
    if handed is not None:
        _run(handed)
        return
    engine = make_engine(_url())
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
