"""The CLI's frame: the typer apps, the shared state, the error wrapper and the output helper.

Every command module registers on these apps (the package face lists them in `--help`
order); every command runs its work inside `user_errors()`, which turns an `AuditorError`
into one line on stderr and its exit code, and writes what it produces through `emit`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from auditor import __version__
from auditor.errors import AuditorError
from auditor.redact import redact
from auditor.report.text import terminal_safe
from auditor.settings import (
    CONFIG_ENV,
    DB_URL_ENV,
    DB_URL_FILE_ENV,
    Config,
    cluster_name,
    default_db_url,
    load_config,
)

app = typer.Typer(
    name="auditor",
    help="Split every GPU-second of a Kubernetes GPU cluster into causes, per team and job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
import_app = typer.Typer(
    help="Import GPU samples and pod records from files; list imports, take one back.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="Manage the database schema (Alembic migrations).", no_args_is_help=True)
export_app = typer.Typer(help="Export audit results for other systems.", no_args_is_help=True)
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")
app.add_typer(db_app, name="db")


class State:
    """What the root options set for every command: the database and the config file."""

    db_url: str = ""
    config_path: Path | None = None

    def config(self) -> Config:
        return load_config(self.config_path)

    def cluster(self, flag: str | None) -> str:
        """The cluster a writer records: `--cluster`, else the config's (SPEC §11)."""
        return cluster_name(flag) if flag is not None else self.config().cluster

    @staticmethod
    def cluster_filter(flag: str | None) -> str | None:
        """The cluster a reader keeps to: `--cluster`, else None (every one)."""
        return None if flag is None else cluster_name(flag)


state = State()


def say_error(e: AuditorError) -> None:
    """The one error line on stderr: secrets masked, names from the cluster escaped."""
    typer.echo(f"auditor: error: {terminal_safe(redact(str(e)))}", err=True)


@contextmanager
def user_errors() -> Iterator[None]:
    """Foreseeable errors become one line on stderr and their exit code; no traceback."""
    try:
        yield
    except AuditorError as e:
        say_error(e)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("auditor: interrupted", err=True)
        raise typer.Exit(130) from None
    except Exception as e:
        from auditor.jobs.common import environment_failure

        failure = environment_failure(state.db_url, e)
        if failure is None:
            raise
        say_error(failure)
        raise typer.Exit(failure.exit_code) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"auditor {__version__}")
        raise typer.Exit()


SERVICES = frozenset({"sample", "watch"})
"""The commands that run until stopped (a DaemonSet, a Deployment); every other one ends."""


@app.callback()
def root(
    ctx: typer.Context,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar=DB_URL_ENV,
            show_envvar=True,
            help="Database URL (sqlite:///FILE or postgresql://...). Default: the URL in the "
            f"file {DB_URL_FILE_ENV} names, else auditor.db in the working directory.",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar=CONFIG_ENV,
            show_envvar=True,
            help="TOML config file (thresholds, team rules).",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """GPU scheduling-waste auditor."""
    if ctx.invoked_subcommand not in SERVICES:
        from auditor.allocator import keep_freed_memory

        keep_freed_memory()
    try:
        state.db_url = db or default_db_url()
    except AuditorError as e:
        say_error(e)
        raise typer.Exit(e.exit_code) from None
    state.config_path = config


# ---------------------------------------------------------------- output


@contextmanager
def file_progress(path: Path, label: str) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar over a file's bytes on a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    try:
        total = path.stat().st_size
    except OSError:
        total = None
    with Progress(
        f"[bold]{label}", BarColumn(), DownloadColumn(), TimeRemainingColumn(), transient=True
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.update(task, completed=n)


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so readers (node-exporter's textfile
    collector, a mail job) never see half a file."""
    from auditor.jobs.destinations import write_local

    write_local(path, text.encode("utf-8"))


def terminal_width() -> int | None:
    """The terminal's columns (`COLUMNS` first) when standard output is a terminal; None
    for a file or a pipe, which gets tables as wide as their content."""
    import shutil
    import sys

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def emit(text: str, out: Path | None) -> None:
    """A command's output: into `out` (atomically) where given, else to standard output."""
    if out is not None:
        write_atomically(out, text)
    else:
        typer.echo(text, nl=False)


def echo_err(message: str) -> None:
    """A service's log line on stderr (the `log` the long-running jobs take)."""
    typer.echo(message, err=True)
