"""The schema commands: `db upgrade` and `db current`, through the store's migrations."""

from __future__ import annotations

from dataclasses import dataclass

from auditor.errors import AuditorError
from auditor.jobs.common import store_error


@dataclass(frozen=True)
class Revisions:
    """The database's schema revision (None: an empty database) and the one this auditor
    needs."""

    current: str | None
    head: str


def db_upgrade(url: str, *, revision: str = "head") -> str | None:
    """Apply migrations up to `revision`; returns the revision the database is at after."""
    from auditor.store import migrate
    from auditor.store.connection import make_engine

    engine = make_engine(url)
    try:
        migrate.upgrade(engine, revision=revision)
        return migrate.current(engine)
    except AuditorError:
        raise
    except Exception as e:
        raise store_error(url, e) from e
    finally:
        engine.dispose()


def db_current(url: str) -> Revisions:
    """The database's revision and the auditor's head revision."""
    from auditor.store import migrate
    from auditor.store.connection import make_engine

    engine = make_engine(url)
    try:
        now = migrate.current(engine)
    except Exception as e:
        raise store_error(url, e) from e
    finally:
        engine.dispose()
    return Revisions(now, migrate.head())
