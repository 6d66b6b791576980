"""`auditor db upgrade|current`: the database schema, through Alembic's migrations."""

from __future__ import annotations

from typing import Annotated

import typer

from auditor.cli.app import state, user_errors


def db_upgrade(
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
) -> None:
    """Apply migrations up to REVISION (default head)."""
    from auditor import jobs

    with user_errors():
        now = jobs.db_upgrade(state.db_url, revision=revision)
    typer.echo(f"database at revision {now}")


def db_current() -> None:
    """Print the database's schema revision and the one this auditor needs."""
    from auditor import jobs

    with user_errors():
        revisions = jobs.db_current(state.db_url)
    typer.echo(f"current: {revisions.current or '(empty)'}")
    typer.echo(f"head:    {revisions.head}")
