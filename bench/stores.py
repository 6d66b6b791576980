"""Fresh, migrated stores for the benchmarks: a SQLite file per label, and a database per
label in one throwaway PostgreSQL server (the tests' `pgserver`), stopped afterwards.

`stores(tmp, databases)` yields {"sqlite": make, "postgresql": make}, where `make(label)`
returns the URL of a new migrated store; PostgreSQL is left out (and `databases` told so)
when no server binaries are installed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def stores(tmp: Path, databases: list[str]) -> Iterator[dict[str, Callable[[str], str]]]:
    from auditor.store import migrate

    def fresh_sqlite(label: str) -> str:
        url = f"sqlite:///{tmp / f'{label}.db'}"
        migrate.upgrade(url)
        return url

    make: dict[str, Callable[[str], str]] = {"sqlite": fresh_sqlite}
    server = None
    try:
        if "postgresql" in databases:
            from pgserver import find_bindir, start_server

            if find_bindir() is None:
                print("postgresql: skipped (no server binaries found)")
                databases.remove("postgresql")
            else:
                server = start_server()

                def fresh_pg(label: str) -> str:
                    assert server is not None
                    server.admin(f"CREATE DATABASE {label}")
                    url = server.url(label)
                    migrate.upgrade(url)
                    return url

                make["postgresql"] = fresh_pg
        yield make
    finally:
        if server is not None:
            server.stop()
