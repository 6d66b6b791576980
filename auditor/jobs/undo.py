"""The imports ledger as jobs: list the imports, take one back (`auditor.store.ledger`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from auditor.jobs.common import open_store

if TYPE_CHECKING:
    from auditor.store.ledger import Entry, Undone


def list_imports(url: str) -> list[Entry]:
    """Every import recorded in the store, oldest first."""
    from auditor.store import ledger

    engine = open_store(url, read_only=True)
    with engine.connect() as conn:
        return ledger.entries(conn)


def undo_import(url: str, import_id: int, *, dry_run: bool = False) -> Undone:
    """Take import `import_id` back in one transaction (`ledger.undo`); with `dry_run`, say
    what it would remove and roll back."""
    from auditor.store import ledger

    engine = open_store(url)
    with engine.connect() as conn, conn.begin() as tx:
        done = ledger.undo(conn, import_id, now_ms=int(time.time() * 1000))
        if dry_run:
            tx.rollback()
    return done
