"""Fresh, migrated stores for the benchmarks: a SQLite file per label, and a database per
label in one throwaway PostgreSQL server (the tests' `pgserver`), stopped afterwards.

`stores(tmp, databases)` yields {"sqlite": make, "postgresql": make}, where `make(label)`
returns the URL of a new migrated store; PostgreSQL is left out (and `databases` told so)
when no server binaries are installed.

With `keep=True`, `tmp` is a directory kept between runs: the SQLite files and the
server's data (`tmp/pg`) stay, the server is stopped cleanly and started again on them by
the next run, and `kept[name](label)` gives the URL of a store an earlier run made (None
where there is none); `make` still replaces a store of that label with a new one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

Make = dict[str, Callable[[str], str]]
Kept = dict[str, Callable[[str], str | None]]


@contextmanager
def stores(tmp: Path, databases: list[str]) -> Iterator[Make]:
    with kept_stores(tmp, databases, keep=False) as (make, _):
        yield make


@contextmanager
def kept_stores(tmp: Path, databases: list[str], *, keep: bool) -> Iterator[tuple[Make, Kept]]:
    from auditor.store import migrate

    def sqlite_url(label: str) -> str:
        return f"sqlite:///{tmp / f'{label}.db'}"

    def fresh_sqlite(label: str) -> str:
        for stale in tmp.glob(f"{label}.db*"):
            stale.unlink()
        url = sqlite_url(label)
        migrate.upgrade(url)
        return url

    def kept_sqlite(label: str) -> str | None:
        if not (tmp / f"{label}.db").exists():
            return None
        migrate.upgrade(sqlite_url(label))  # a store kept by an earlier release
        return sqlite_url(label)

    make: Make = {"sqlite": fresh_sqlite}
    kept: Kept = {"sqlite": kept_sqlite}
    server = None
    try:
        if "postgresql" in databases:
            from pgserver import find_bindir, start_server

            if find_bindir() is None:
                print("postgresql: skipped (no server binaries found)")
                databases.remove("postgresql")
            else:
                server = start_server(tmp / "pg" if keep else None)

                def fresh_pg(label: str) -> str:
                    assert server is not None
                    server.admin(f"DROP DATABASE IF EXISTS {label}")
                    server.admin(f"CREATE DATABASE {label}")
                    url = server.url(label)
                    migrate.upgrade(url)
                    return url

                def kept_pg(label: str) -> str | None:
                    import psycopg

                    assert server is not None
                    with psycopg.connect(
                        host="127.0.0.1", port=server.port, user="postgres", dbname="postgres"
                    ) as conn:
                        found = conn.execute(
                            "SELECT 1 FROM pg_database WHERE datname = %s", (label,)
                        ).fetchone()
                    if not found:
                        return None
                    migrate.upgrade(server.url(label))  # a store kept by an earlier release
                    return server.url(label)

                make["postgresql"] = fresh_pg
                kept["postgresql"] = kept_pg
        yield make, kept
    finally:
        if server is not None:
            server.stop(keep=keep)
