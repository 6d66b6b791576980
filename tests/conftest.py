"""Fixtures shared by every test module.

PostgreSQL ones (the server itself lives in tests/pgserver.py, imported as `pgserver`:
pytest puts this directory on sys.path, as it holds conftest.py and no __init__.py):
- `pg_server`: one throwaway server for the whole session, started on first use.
- `pg_url`: a database `auditor_test` in it, shared by the session.
- `pg_db_url`: a fresh empty database for one test, dropped afterwards.
- `db_url`: parametrised over "sqlite" (a file in tmp_path) and "postgresql" (`pg_db_url`),
  so one test runs against both stores; the PostgreSQL case carries the `postgres` mark.
- `engine`: an engine on a migrated store at `db_url`.

VictoriaMetrics (tests/vmserver.py): `victoria_metrics`, one empty server for the session on
loopback, started on first use (skipped where the binary is missing, failed under CI).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgserver import PgServer, new_database_name, start_server
from sqlalchemy import Engine
from vmserver import MISSING, VmServer, start_victoria_metrics
from vmserver import binary as vm_binary

from auditor.store import migrate
from auditor.store.connection import make_engine


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = start_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def victoria_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmServer]:
    if vm_binary() is None:
        if os.environ.get("CI"):
            pytest.fail(f"{MISSING}: required under CI", pytrace=False)
        pytest.skip(MISSING)
    server = start_victoria_metrics(tmp_path_factory.mktemp("victoria-metrics"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_url(pg_server: PgServer) -> str:
    pg_server.admin("CREATE DATABASE auditor_test")
    return pg_server.url("auditor_test")


@pytest.fixture
def pg_db_url(pg_server: PgServer) -> Iterator[str]:
    name = new_database_name()
    pg_server.admin(f"CREATE DATABASE {name}")
    yield pg_server.url(name)
    pg_server.admin(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'auditor.db'}"
    url: str = request.getfixturevalue("pg_db_url")
    return url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An engine on a migrated store, SQLite and PostgreSQL (test_migrations has its own,
    unmigrated one)."""
    eng = make_engine(db_url)
    migrate.upgrade(eng)
    yield eng
    eng.dispose()
