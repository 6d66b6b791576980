"""The command line: parse, call one function of `auditor.jobs`, render; errors become one line.

Heavy libraries (pandas, sqlalchemy, kubernetes, pynvml) are imported inside the commands,
so `auditor --help` stays fast.
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from auditor import __version__
from auditor.errors import AuditorError, InputError
from auditor.redact import redact
from auditor.report.text import terminal_safe
from auditor.settings import (
    BUFFER_DIR_ENV,
    BUFFER_MAX_MIB,
    BUFFER_MAX_MIB_ENV,
    CONFIG_ENV,
    DB_URL_ENV,
    DB_URL_FILE_ENV,
    LOG_FORMAT_ENV,
    METRICS_HOST,
    METRICS_PORT_ENV,
    NODE_NAME_ENV,
    PROMETHEUS_PASSWORD_ENV,
    PROMETHEUS_TOKEN_ENV,
    READ_TIMEOUT_S,
    SAMPLE_FLUSH_EVERY_S,
    SAMPLE_METRICS_PORT,
    SAMPLE_PERIOD_S,
    WATCH_HEALTH_MAX_AGE_S,
    WATCH_METRICS_PORT,
    WATCH_NAMESPACE_ENV,
    WATCH_SELECTOR_ENV,
    WATCH_TIMEOUT_S,
    Config,
    default_db_url,
    load_config,
)

if TYPE_CHECKING:
    from auditor.collect.prometheus import Auth

app = typer.Typer(
    name="auditor",
    help="Split every GPU-second of a Kubernetes GPU cluster into causes, per team and job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
import_app = typer.Typer(
    help="Import GPU samples and pod records from files.", no_args_is_help=True
)
db_app = typer.Typer(help="Manage the database schema (Alembic migrations).", no_args_is_help=True)
export_app = typer.Typer(help="Export audit results for other systems.", no_args_is_help=True)
app.add_typer(import_app, name="import")
app.add_typer(export_app, name="export")
app.add_typer(db_app, name="db")


class State:
    db_url: str = ""
    config_path: Path | None = None

    def config(self) -> Config:
        return load_config(self.config_path)


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


@app.callback()
def root(
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
    try:
        state.db_url = db or default_db_url()
    except AuditorError as e:
        say_error(e)
        raise typer.Exit(e.exit_code) from None
    state.config_path = config


# ---------------------------------------------------------------- parsing helpers

StartOption = Annotated[str | None, typer.Option("--start", help="Window start (ISO 8601, UTC).")]
EndOption = Annotated[str | None, typer.Option("--end", help="Window end (ISO 8601, UTC).")]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Window of this length ending now (or at --end): 7d, 12h."),
]


def parse_time(text: str, *, option: str) -> int:
    """ISO 8601 date or date-time; without a zone it is UTC. Returns epoch milliseconds."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(f"not an ISO 8601 time: {text!r}", field=option) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, *, option: str) -> timedelta:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise InputError(f"not a duration like 30m, 12h, 7d: {text!r}", field=option)
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


def parse_window(start: str | None, end: str | None, since: str | None) -> tuple[int, int] | None:
    if since is not None:
        if start is not None:
            raise InputError("give --since or --start, not both", field="--since")
        end_ms = (
            parse_time(end, option="--end") if end else int(datetime.now(UTC).timestamp() * 1000)
        )
        return end_ms - int(parse_duration(since, option="--since").total_seconds() * 1000), end_ms
    if start is None and end is None:
        return None
    if start is None or end is None:
        raise InputError(
            "give both --start and --end (or --since)",
            field="--start" if start is None else "--end",
        )
    return parse_time(start, option="--start"), parse_time(end, option="--end")


def parse_tz(name: str | None) -> tzinfo | None:
    if name is None:
        return None
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(f"unknown time zone {name!r}", field="--tz") from None


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


def emit(text: str, out: Path | None) -> None:
    """A command's output: into `out` (atomically) where given, else to standard output."""
    if out is not None:
        write_atomically(out, text)
    else:
        typer.echo(text, nl=False)


# ---------------------------------------------------------------- import


@import_app.command("nvidia-smi")
def import_nvidia_smi(
    files: Annotated[
        list[Path],
        typer.Argument(help="nvidia-smi --query-gpu=... --format=csv logs, one per node."),
    ],
    node: Annotated[
        str | None,
        typer.Option("--node", help="Node the files were captured on. Default: each file's name."),
    ] = None,
    tz: Annotated[
        str | None,
        typer.Option(
            "--tz", help="The node's time zone (nvidia-smi prints local time). Default UTC."
        ),
    ] = None,
    columns: Annotated[
        str | None,
        typer.Option(
            "--columns",
            help="Fields of a file without a header, as given to --query-gpu "
            "(timestamp,uuid,utilization.gpu,memory.used).",
        ),
    ] = None,
    ignore_unknown_columns: Annotated[
        bool,
        typer.Option("--ignore-unknown-columns", help="Skip columns this version does not know."),
    ] = False,
) -> None:
    """Import GPU samples from nvidia-smi CSVs (any field order, with or without units).

    Each file is one transaction: a bad file is refused with its error and the others are
    imported; the exit status is 2 if any was refused."""
    from auditor import jobs

    fields = None if columns is None else [c.strip() for c in columns.split(",")]
    with user_errors():
        zone = parse_tz(tz)

    def one(file: Path) -> None:
        with file_progress(file, file.name) as progress:
            stats = jobs.import_nvidia_smi(
                state.db_url,
                file,
                node=node if node is not None else file.stem,
                tz=zone,
                ignore_unknown_columns=ignore_unknown_columns,
                progress=progress,
                columns=fields,
            )
        already = f" ({stats.already} already stored)" if stats.already else ""
        typer.echo(
            f"imported {stats.rows} samples of {stats.gpus} GPUs from {file} in "
            f"{stats.seconds:.1f}s{already}"
        )

    each_file(files, one)


def each_file(files: list[Path], one: Callable[[Path], None]) -> None:
    """Import each file in its own transaction. A file refused for its content is named with
    its one-line error and the next goes on; a store that cannot be used, or Ctrl-C, stops
    the command. With several files a summary ends it; exit 2 if any was refused."""
    refused: list[str] = []
    for file in files:
        try:
            with user_errors():
                one(file)
        except typer.Exit as e:
            if e.exit_code != InputError.exit_code:
                raise
            refused.append(file.name)
    if refused:
        if len(files) > 1:
            names = terminal_safe(", ".join(refused))
            names = names if len(names) <= 160 else f"{names[:160]}…"
            typer.echo(
                f"auditor: error: {len(refused)} of {len(files)} files refused "
                f"(nothing of them written): {names}",
                err=True,
            )
        raise typer.Exit(InputError.exit_code)
    if len(files) > 1:
        typer.echo(f"{len(files)} files imported")


@import_app.command("pods")
def import_pods(
    files: Annotated[
        list[Path],
        typer.Argument(
            metavar="FILE",
            help="kubectl get pods,nodes -A -o json|yaml [--watch --output-watch-events]; "
            "several files: one transaction each.",
        ),
    ],
) -> None:
    """Import GPU pods and nodes from kubectl JSON or YAML lists, manifests or watch streams.

    A refused file is rolled back and the others are imported; the exit status is then
    non-zero."""
    from auditor import jobs

    def one(file: Path) -> None:
        with file_progress(file, file.name) as progress:
            stats = jobs.import_pods(state.db_url, file, config=state.config(), progress=progress)
        typer.echo(
            f"imported {stats.rows} GPU pod records and {stats.nodes} nodes from {file} in "
            f"{stats.seconds:.1f}s"
        )

    each_file(files, one)


def _prometheus_source(
    url: str,
    *,
    start: str | None,
    end: str | None,
    since: str | None,
    user: str | None,
    password_file: Path | None,
    token_file: Path | None,
) -> tuple[tuple[int, int], str, Auth | None]:
    """The window and the Prometheus URL (credentials taken out) with its auth, as the
    Prometheus imports take them."""
    from auditor.collect.prometheus import credentials

    window = parse_window(start, end, since)
    if window is None:
        raise InputError("give --start and --end, or --since", field="--start")
    clean, auth = credentials(url, user=user, password_file=password_file, token_file=token_file)
    return window, clean, auth


@import_app.command("prometheus")
def import_prometheus(
    url: Annotated[
        str, typer.Option("--url", help="Prometheus base URL, e.g. http://prometheus:9090.")
    ],
    start: StartOption = None,
    end: EndOption = None,
    since: SinceOption = None,
    step: Annotated[
        str,
        typer.Option("--step", help="Resolution: dcgm-exporter's scrape interval (5s, 15s, 30s)."),
    ] = "15s",
    bearer_token_file: Annotated[
        Path | None,
        typer.Option(
            "--bearer-token-file",
            help=f"File holding a bearer token (else env {PROMETHEUS_TOKEN_ENV}).",
        ),
    ] = None,
    basic_auth_user: Annotated[
        str | None,
        typer.Option("--basic-auth-user", help="Basic auth user (else the URL's user@)."),
    ] = None,
    basic_auth_password_file: Annotated[
        Path | None,
        typer.Option(
            "--basic-auth-password-file",
            help=f"File holding the basic auth password (else env {PROMETHEUS_PASSWORD_ENV}).",
        ),
    ] = None,
    timeout: Annotated[
        str, typer.Option("--timeout", help="Longest one query may take, to its last byte.")
    ] = "60s",
    node_label: Annotated[
        list[str] | None,
        typer.Option(
            "--node-label",
            metavar="<str>",
            help="Label naming the node, first present wins; repeatable "
            "(default kubernetes_node, node, nodename; else kube_pod_info, else Hostname).",
        ),
    ] = None,
) -> None:
    """Import dcgm-exporter GPU samples, and the pod holding each GPU, from Prometheus."""
    from auditor import jobs
    from auditor.collect.prometheus import describe_sources

    with user_errors():
        window, url, auth = _prometheus_source(
            url,
            start=start,
            end=end,
            since=since,
            user=basic_auth_user,
            password_file=basic_auth_password_file,
            token_file=bearer_token_file,
        )
        step_s = parse_duration(step, option="--step").total_seconds()
        timeout_s = parse_duration(timeout, option="--timeout").total_seconds()
        stats = jobs.import_prometheus(
            state.db_url,
            prometheus_url=url,
            window=window,
            step_s=step_s,
            auth=auth,
            timeout_s=timeout_s,
            node_labels=node_label or None,
        )
    sources = describe_sources(stats.node_sources, stats.util_sources)
    typer.echo(
        f"imported {stats.samples} samples of {stats.gpus} GPUs and {stats.holdings} GPU -> pod "
        f"assignments from {redact(url)} in {stats.seconds:.1f}s"
        + (f" ({stats.already} samples already stored)" if stats.already else "")
        + (f"; {terminal_safe(sources)}" if sources else "")
    )
    if stats.unresolved:
        typer.echo(
            f"{stats.unresolved} GPU -> pod spans name pods not in the database: "
            "import the pods, then run this import again",
            err=True,
        )


@import_app.command("outputs")
def import_outputs(
    file: Annotated[
        Path | None,
        typer.Argument(
            metavar="[FILE.csv]",
            help="Outputs CSV: job|pod,start,end,outputs,unit[,quality,quality_better].",
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", help="Prometheus base URL to read serving counters from."),
    ] = None,
    start: StartOption = None,
    end: EndOption = None,
    since: SinceOption = None,
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric",
            metavar="NAME[:unit]",
            help="Output counter, repeatable (default: vLLM, Triton and TGI counters).",
        ),
    ] = None,
    latency: Annotated[
        str,
        typer.Option("--latency", help="Latency histogram ('' for none)."),
    ] = "vllm:e2e_request_latency_seconds",
    step: Annotated[str, typer.Option("--step", help="Resolution of the counters read.")] = "15s",
    interval: Annotated[
        str, typer.Option("--interval", help="Length of each stored interval per pod.")
    ] = "5m",
    bearer_token_file: Annotated[
        Path | None,
        typer.Option("--bearer-token-file", help="File holding a bearer token."),
    ] = None,
    basic_auth_user: Annotated[
        str | None, typer.Option("--basic-auth-user", help="Basic auth user.")
    ] = None,
    basic_auth_password_file: Annotated[
        Path | None,
        typer.Option("--basic-auth-password-file", help="File holding the basic auth password."),
    ] = None,
    timeout: Annotated[
        str, typer.Option("--timeout", help="Longest one query may take, to its last byte.")
    ] = "60s",
) -> None:
    """Import useful output per pod: serving counters and latency from Prometheus (--url), or
    an outputs CSV for training (samples, steps, tokens) with an optional quality column."""
    from auditor import jobs
    from auditor.collect.outputs import parse_metric

    with user_errors():
        if (file is None) == (url is None):
            raise InputError("give an outputs CSV or --url, one of them", field="FILE")
        if file is not None:
            stats = jobs.import_outputs_csv(state.db_url, file)
            source = str(file)
        else:
            assert url is not None
            window, clean, auth = _prometheus_source(
                url,
                start=start,
                end=end,
                since=since,
                user=basic_auth_user,
                password_file=basic_auth_password_file,
                token_file=bearer_token_file,
            )
            stats = jobs.import_outputs_prometheus(
                state.db_url,
                prometheus_url=clean,
                window=window,
                step_s=parse_duration(step, option="--step").total_seconds(),
                metrics=[parse_metric(m) for m in metric] if metric else None,
                latency=latency,
                auth=auth,
                timeout_s=parse_duration(timeout, option="--timeout").total_seconds(),
                interval_s=max(
                    1, int(parse_duration(interval, option="--interval").total_seconds())
                ),
            )
            source = redact(clean)
    typer.echo(
        f"imported {stats.rows} output rows and {stats.latency_rows} latency bucket rows of "
        f"{stats.pods} pods from {terminal_safe(source)} in {stats.seconds:.1f}s"
        + (f" ({stats.resets} counter resets)" if stats.resets else "")
    )
    if stats.unresolved:
        typer.echo(
            f"{stats.unresolved} series intervals name pods not in the database: "
            "import the pods, then run this import again",
            err=True,
        )


# ---------------------------------------------------------------- db


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Option("--revision", help="Target revision.")] = "head",
) -> None:
    """Apply migrations up to REVISION (default head)."""
    from auditor import jobs

    with user_errors():
        now = jobs.db_upgrade(state.db_url, revision=revision)
    typer.echo(f"database at revision {now}")


@db_app.command("current")
def db_current() -> None:
    """Print the database's schema revision and the one this auditor needs."""
    from auditor import jobs

    with user_errors():
        revisions = jobs.db_current(state.db_url)
    typer.echo(f"current: {revisions.current or '(empty)'}")
    typer.echo(f"head:    {revisions.head}")


# ---------------------------------------------------------------- audit and report


def _thresholds(config: Config, overrides: list[str]) -> Config:
    from dataclasses import replace

    values: dict[str, float] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise InputError(f"expected KEY=VALUE, got {item!r}", field="--threshold")
        try:
            values[key.strip()] = float(raw)
        except ValueError:
            raise InputError(f"not a number: {raw!r}", field=f"--threshold {key}") from None
    return replace(config, thresholds=config.thresholds.updated(values, source="--threshold"))


def parse_day(text: str, *, now: datetime) -> tuple[int, int]:
    """`YYYY-MM-DD` or `yesterday`/`today` → that UTC day, so daily runs chain exactly."""
    from datetime import date

    if text in ("yesterday", "today"):
        day = now.date() - timedelta(days=1 if text == "yesterday" else 0)
    else:
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise InputError(
                f"not a day like 2026-11-23 or 'yesterday': {text!r}", field="--day"
            ) from None
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return int(start.timestamp() * 1000), int((start + timedelta(days=1)).timestamp() * 1000)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`i/N` with 0 <= i < N."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise InputError(f"expected i/N with 0 <= i < N, got {text!r}", field="--shard")
    return int(m.group(1)), int(m.group(2))


@app.command()
def audit(
    start: StartOption = None,
    end: EndOption = None,
    since: SinceOption = None,
    day: Annotated[
        str | None,
        typer.Option(
            "--day", help="One UTC day: YYYY-MM-DD, 'yesterday' or 'today' (for daily CronJobs)."
        ),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            help="Audit only the nodes of shard i of N (i/N), e.g. $(JOB_COMPLETION_INDEX)/4.",
        ),
    ] = None,
    threshold: Annotated[
        list[str],
        typer.Option(
            "--threshold", help="Override a classifier threshold: KEY=VALUE (repeatable)."
        ),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """Classify every GPU-second of a window and store the run (re-running replaces it).

    Without a window, audits all stored samples."""
    from auditor import jobs

    with user_errors():
        config = _thresholds(state.config(), threshold)
        if day is not None:
            if start is not None or end is not None or since is not None:
                raise InputError("give --day alone, without --start/--end/--since", field="--day")
            window: tuple[int, int] | None = parse_day(day, now=datetime.now(UTC))
        else:
            window = parse_window(start, end, since)
        stats = jobs.audit(
            state.db_url, window=window, thresholds=config.thresholds, shard=parse_shard(shard)
        )
    typer.echo(
        f"audit run {stats.run_id}: {stats.gpus} GPUs, {stats.samples} samples, "
        f"{stats.tenures} tenures in {stats.seconds:.1f}s"
    )


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"
    PROMETHEUS = "prometheus"
    HTML = "html"


class By(StrEnum):
    TEAM = "team"
    NAMESPACE = "namespace"
    JOB = "job"
    POD = "pod"
    NODE = "node"
    GPU = "gpu"


@app.command()
def report(
    by: Annotated[By, typer.Option("--by", help="Grouping of the rows.")] = By.TEAM,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's rows.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.TABLE,
    start: Annotated[
        str | None, typer.Option("--start", help="Window start (default: latest audit).")
    ] = None,
    end: Annotated[str | None, typer.Option("--end", help="Window end.")] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write to this file instead of stdout.")
    ] = None,
    policy: Annotated[
        list[str],
        typer.Option(
            "--policy",
            help="With --format html: also replay this idle policy over the window "
            "(repeatable; as `auditor whatif --policy`).",
        ),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """GPU-hours per category and group, shares, utilisation spread, top offenders."""
    from auditor import jobs
    from auditor.report.prometheus import render_prometheus
    from auditor.report.render import render_csv, render_json, render_table
    from auditor.report.summary import GroupBy

    with user_errors():
        window = parse_window(start, end, None)
        if policy and fmt is not Format.HTML:
            raise InputError("--policy goes with --format html", field="--policy")
        if fmt is Format.HTML:
            from auditor.classify.whatif import parse_policy

            text = jobs.build_report_html(
                state.db_url,
                start_ms=window[0] if window else None,
                end_ms=window[1] if window else None,
                by=GroupBy(by.value),
                team=team,
                thresholds=state.config().thresholds,
                policies=[parse_policy(p) for p in policy],
            )
            emit(text, out)
            return
        rep = jobs.build_report(
            state.db_url,
            start_ms=window[0] if window else None,
            end_ms=window[1] if window else None,
            by=GroupBy(by.value),
            team=team,
        )
        renderers = {
            Format.TABLE: render_table,
            Format.JSON: render_json,
            Format.CSV: render_csv,
            Format.PROMETHEUS: render_prometheus,
        }
        text = renderers[fmt](rep)
        emit(text, out)


@app.command()
def explain(
    target: Annotated[
        str,
        typer.Argument(
            metavar="JOB_OR_POD",
            help="namespace/Kind/name, Kind/name, namespace/pod or a pod name.",
        ),
    ],
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write the timeline chart as HTML here.")
    ] = None,
    width: Annotated[
        int, typer.Option("--width", min=20, help="Characters per timeline strip.")
    ] = 72,
) -> None:
    """Each card of a job or pod over time: categories, findings, what it waited on, next steps."""
    from auditor import jobs
    from auditor.report.explain import render_explain_text
    from auditor.report.html import render_explain_html

    with user_errors():
        ex = jobs.explain(state.db_url, target, thresholds=state.config().thresholds)
        if html is not None:
            write_atomically(html, render_explain_html(ex))
    typer.echo(render_explain_text(ex, width=width), nl=False)


class WhatIfFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


@app.command()
def whatif(
    policy: Annotated[
        list[str],
        typer.Option(
            "--policy",
            help="An idle policy (repeatable, shown side by side): idle>=DURATION, then "
            "optionally kind=KIND, team=TEAM, grace=DURATION, util<PERCENT; e.g. "
            "'idle>=4h,team=research,grace=1h'.",
        ),
    ],
    start: StartOption = None,
    end: EndOption = None,
    since: SinceOption = None,
    fmt: Annotated[
        WhatIfFormat, typer.Option("--format", help="Output format.")
    ] = WhatIfFormat.TABLE,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write to this file instead of stdout.")
    ] = None,
    threshold: Annotated[
        list[str],
        typer.Option(
            "--threshold", help="Override a classifier threshold: KEY=VALUE (repeatable)."
        ),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """Replay idle-culling policies over stored history: GPU-hours released, false stops.

    Each policy stops a job (all its pods) the moment one of its cards has been idle that
    long; without a window, replays all stored samples."""
    from auditor import jobs
    from auditor.classify.whatif import parse_policy
    from auditor.report.whatif import render_whatif_csv, render_whatif_json, render_whatif_table

    with user_errors():
        config = _thresholds(state.config(), threshold)
        policies = [parse_policy(p) for p in policy]
        result = jobs.whatif(
            state.db_url,
            policies=policies,
            window=parse_window(start, end, since),
            thresholds=config.thresholds,
        )
        renderers = {
            WhatIfFormat.TABLE: render_whatif_table,
            WhatIfFormat.JSON: render_whatif_json,
            WhatIfFormat.CSV: render_whatif_csv,
        }
        text = renderers[fmt](result)
        emit(text, out)


def last_week(now: datetime) -> str:
    """The ISO week before the one `now` is in."""
    year, week, _ = (now - timedelta(days=7)).isocalendar()
    return f"{year}-W{week:02d}"


@export_app.command("finance")
def export_finance(
    week: Annotated[
        str,
        typer.Option("--week", help="ISO week, e.g. 2026-W48, or 'last' for the previous week."),
    ],
    out: Annotated[
        str | None,
        typer.Option(
            "--out",
            metavar="PATH|URL",
            envvar="AUDITOR_FINANCE_OUT",
            show_envvar=True,
            help="Write here instead of stdout: a path, or s3://, gs://, az:// (credentials "
            "from the environment as each SDK reads them); {week} in it becomes the week.",
        ),
    ] = None,
) -> None:
    """The weekly finance CSV: one row per team × GPU model, plus the platform rows.

    Written whole or not at all: a local file through a temporary file and a rename, an
    object in one upload (never a partial object)."""
    from auditor import jobs
    from auditor.jobs.destinations import check_target, write_output

    with user_errors():
        if out is not None:
            check_target(out)
        chosen = last_week(datetime.now(UTC)) if week == "last" else week
        text = jobs.export_finance(state.db_url, week=chosen, config=state.config())
        if out is not None:
            write_output(out.replace("{week}", chosen), text.encode("utf-8"))
            return
    typer.echo(text, nl=False)


@app.command()
def rollup(
    older_than: Annotated[
        float | None,
        typer.Option(
            "--older-than",
            min=0.0,
            metavar="DAYS",
            help="Roll up raw samples older than this many days (default: the config's "
            "retention.raw_days, 14).",
        ),
    ] = None,
) -> None:
    """Fold raw samples older than the retention age into 1-minute rows and delete them.

    Audits of those days read the rollups (minute resolution; reports say so). Safe to
    re-run; raw samples that arrive late for a rolled-up minute join it on the next run."""
    from auditor import jobs

    with user_errors():
        config = state.config()
        days = config.retention.raw_days if older_than is None else older_than
        stats = jobs.rollup(state.db_url, older_than_days=days, thresholds=config.thresholds)
    before = datetime.fromtimestamp(stats.before_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    typer.echo(
        f"rolled up raw samples before {before}: {stats.raw_deleted} raw rows of "
        f"{stats.gpus} GPUs into {stats.minutes_written} minute rows in {stats.seconds:.1f}s"
    )


# ---------------------------------------------------------------- node sampler


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


LogFormatOption = Annotated[
    LogFormat,
    typer.Option(
        "--log-format",
        envvar=LOG_FORMAT_ENV,
        show_envvar=True,
        help="Log lines as text or JSON.",
    ),
]
"""One `--log-format` for both services: the same logging setup (`auditor.agents.serve`)."""


@app.command()
def sample(
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            envvar=NODE_NAME_ENV,
            show_envvar=True,
            help="This node's name (default: the host name).",
        ),
    ] = None,
    buffer_dir: Annotated[
        Path,
        typer.Option(
            "--buffer-dir",
            envvar=BUFFER_DIR_ENV,
            show_envvar=True,
            help="Directory of the on-disk buffer that keeps passes while the database is down.",
        ),
    ] = Path("/var/lib/auditor"),
    period: Annotated[
        float, typer.Option("--period", min=0.1, help="Seconds between passes over the GPUs.")
    ] = SAMPLE_PERIOD_S,
    flush_every: Annotated[
        float,
        typer.Option("--flush-every", min=1.0, help="Seconds between writes to the database."),
    ] = SAMPLE_FLUSH_EVERY_S,
    buffer_max_mib: Annotated[
        float,
        typer.Option(
            "--buffer-max-mib",
            envvar=BUFFER_MAX_MIB_ENV,
            show_envvar=True,
            min=0.01,
            help="MiB of passes kept while the database is down; beyond it, or on a full disk, "
            "the oldest are dropped and counted.",
        ),
    ] = BUFFER_MAX_MIB,
    pod_resources: Annotated[
        Path | None,
        typer.Option(
            "--pod-resources", help="The kubelet's pod-resources socket (GPU -> pod mapping)."
        ),
    ] = Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    no_pod_resources: Annotated[
        bool, typer.Option("--no-pod-resources", help="Record no GPU -> pod mapping.")
    ] = False,
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port", help="Port of /metrics and /healthz (0: any free port, -1: none)."
        ),
    ] = SAMPLE_METRICS_PORT,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address /metrics and /healthz listen on.")
    ] = METRICS_HOST,
    passes: Annotated[
        int | None,
        typer.Option(
            "--passes", min=1, help="Stop after this many passes (default: run until stopped)."
        ),
    ] = None,
    process_util: Annotated[
        bool,
        typer.Option(
            "--process-util",
            envvar="AUDITOR_PROCESS_UTIL",
            show_envvar=True,
            help="Record each pod's own utilisation of shared cards from NVML's per-process "
            "utilisation (needs hostPID: true and the host's /proc).",
        ),
    ] = False,
    proc_root: Annotated[
        Path,
        typer.Option(
            "--proc-root",
            envvar="AUDITOR_PROC_ROOT",
            show_envvar=True,
            help="The host's /proc, where --process-util finds each process's pod.",
        ),
    ] = Path("/proc"),
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Sample this node's GPUs through NVML and record which pod holds each (the DaemonSet)."""
    import socket

    from auditor import jobs

    with user_errors():
        options = jobs.SampleOptions(
            node=node or socket.gethostname(),
            buffer_dir=buffer_dir,
            period_s=period,
            flush_every_s=flush_every,
            buffer_max_mib=buffer_max_mib,
            pod_resources_socket=None if no_pod_resources else pod_resources,
            metrics_host=metrics_host,
            metrics_port=None if metrics_port < 0 else metrics_port,
            max_passes=passes,
            proc_root=proc_root if process_util else None,
            json_logs=log_format is LogFormat.JSON,
        )
        jobs.sample(state.db_url, options, log=lambda m: typer.echo(m, err=True))


# ---------------------------------------------------------------- pod watcher


@app.command()
def watch(
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            help="Kubeconfig file (default: in-cluster, else KUBECONFIG or ~/.kube/config).",
        ),
    ] = None,
    context: Annotated[
        str | None, typer.Option("--context", help="Kubeconfig context to use.")
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            envvar=WATCH_NAMESPACE_ENV,
            show_envvar=True,
            help="Only pods of this namespace (default: all).",
        ),
    ] = None,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            "-l",
            envvar=WATCH_SELECTOR_ENV,
            show_envvar=True,
            help="Only pods matching this label selector.",
        ),
    ] = None,
    no_nodes: Annotated[bool, typer.Option("--no-nodes", help="Do not watch nodes.")] = False,
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port",
            envvar=METRICS_PORT_ENV,
            show_envvar=True,
            help="Port of /metrics and /healthz (0: any free port, -1: none).",
        ),
    ] = WATCH_METRICS_PORT,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address /metrics and /healthz listen on.")
    ] = METRICS_HOST,
    health_max_age: Annotated[
        float,
        typer.Option(
            "--health-max-age",
            min=1.0,
            help="Seconds without a successful sync after which /healthz fails.",
        ),
    ] = WATCH_HEALTH_MAX_AGE_S,
    metrics_top_jobs: Annotated[
        int,
        typer.Option(
            "--metrics-top-jobs",
            min=0,
            help="/metrics also serves the latest complete audit (read at most once a minute): "
            "the figures of this many jobs that wasted most (0: none; teams always).",
        ),
    ] = 10,
    watch_timeout: Annotated[
        int,
        typer.Option(
            "--watch-timeout",
            min=1,
            help="Seconds after which the server ends each watch (it is resumed).",
        ),
    ] = WATCH_TIMEOUT_S,
    read_timeout: Annotated[
        float,
        typer.Option(
            "--read-timeout",
            min=0.1,
            help="Seconds of silence after which a stream counts as dead.",
        ),
    ] = READ_TIMEOUT_S,
    log_format: LogFormatOption = LogFormat.TEXT,
) -> None:
    """Record who held which GPU when: list/watch GPU pods and nodes (the Deployment).

    Restart-safe: resumes from the resourceVersion stored with the last write, and relists
    (closing pods that vanished meanwhile) when the API has expired it."""
    from auditor import jobs

    with user_errors():
        options = jobs.WatchOptions(
            kubeconfig=kubeconfig,
            context=context,
            namespace=namespace,
            selector=selector,
            nodes=not no_nodes,
            metrics_host=metrics_host,
            metrics_port=None if metrics_port < 0 else metrics_port,
            health_max_age_s=health_max_age,
            watch_timeout_s=watch_timeout,
            read_timeout_s=read_timeout,
            json_logs=log_format is LogFormat.JSON,
            audit_top_jobs=metrics_top_jobs,
        )
        jobs.watch(
            state.db_url, options, config=state.config(), log=lambda m: typer.echo(m, err=True)
        )


# ---------------------------------------------------------------- simulate and demo


@app.command()
def simulate(
    out: Annotated[Path, typer.Argument(help="Directory to write the scenario's files into.")],
    scenario: Annotated[
        str,
        typer.Option(
            "--scenario",
            help="Preset: demo, small, large, or shared (MIG, time-slicing, HAMi and whole "
            "cards; also writes nodes.json and dcgm-exporter OpenMetrics for MIG).",
        ),
    ] = "demo",
    seed: Annotated[int | None, typer.Option("--seed", help="Override the preset's seed.")] = None,
) -> None:
    """Write a simulated cluster as real input files, with its ground truth.

    One nvidia-smi CSV per node, a kubectl pod list, and truth.csv per team and category."""
    from auditor import jobs

    with user_errors():
        result = jobs.simulate(out, scenario=scenario, seed=seed)
    typer.echo(f"wrote scenario {scenario!r} to {out} ({result.summary})")


@app.command()
def demo(
    keep: Annotated[
        Path | None, typer.Option("--keep", help="Keep the files and database here.")
    ] = None,
    scenario: Annotated[str, typer.Option("--scenario", help="Simulator preset.")] = "demo",
) -> None:
    """Simulate a cluster, import it, audit it and report, on a throwaway SQLite database."""
    from auditor import jobs

    with user_errors():
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            text = jobs.demo(keep, scenario=scenario, log=lambda m: typer.echo(m, err=True))
            typer.echo(
                f"files and database kept in {keep} "
                f"(auditor --db sqlite:///{keep / 'auditor.db'} report ...)",
                err=True,
            )
        else:
            with tempfile.TemporaryDirectory(prefix="auditor-demo-") as tmp:
                text = jobs.demo(
                    Path(tmp), scenario=scenario, log=lambda m: typer.echo(m, err=True)
                )
    typer.echo(text, nl=False)


def main() -> None:
    app()


class CompareFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    HTML = "html"


@app.command()
def compare(
    a: Annotated[
        str,
        typer.Argument(
            metavar="A",
            help="Before: SELECTOR@START..END, SELECTOR job=NS/Kind/name, team=T or label=K=V.",
        ),
    ],
    b: Annotated[str, typer.Argument(metavar="B", help="After, in the same form.")],
    fmt: Annotated[
        CompareFormat, typer.Option("--format", help="Output format.")
    ] = CompareFormat.TABLE,
    tolerance: Annotated[
        float,
        typer.Option("--tolerance", min=0.0, max=1.0, help="Latency/quality tolerance (0.05)."),
    ] = 0.05,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """Did a change make the work cheaper? GPU-hours, outputs, latency and quality of A and B
    side by side, the confounders, and the verdict."""
    from auditor import jobs
    from auditor.report.compare import (
        render_compare_html,
        render_compare_json,
        render_compare_table,
    )

    with user_errors():
        result = jobs.compare(
            state.db_url,
            jobs.parse_side(a, option="A"),
            jobs.parse_side(b, option="B"),
            tolerance=tolerance,
        )
        renderers = {
            CompareFormat.TABLE: render_compare_table,
            CompareFormat.JSON: render_compare_json,
            CompareFormat.HTML: render_compare_html,
        }
        text = renderers[fmt](result)
        emit(text, out)
