"""`auditor import nvidia-smi|pods|prometheus|outputs|list|undo`: read files or Prometheus
into the store; list the imports, take one back.

Each file is its own transaction (`each_file`): a refused one is named and the others go in.
Each import is recorded in the ledger with an id (`auditor.store.ledger`), which its line
names and `import undo` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from auditor.cli.app import echo_err, file_progress, state, user_errors
from auditor.cli.options import (
    BasicAuthPasswordFileOption,
    BasicAuthUserOption,
    BearerTokenFileOption,
    ClusterLabelOption,
    ClusterOption,
    EndOption,
    QueryTimeoutOption,
    SinceOption,
    StartOption,
)
from auditor.errors import InputError
from auditor.redact import redact
from auditor.report.text import terminal_safe
from auditor.timespec import parse_duration, parse_tz, parse_window

if TYPE_CHECKING:
    from auditor.collect.prometheus import Auth


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
            "--tz",
            help="The node's time zone (nvidia-smi prints local time): a name such as "
            "Europe/Berlin, or an offset such as +02:00. Default UTC.",
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
    cluster: ClusterOption = None,
) -> None:
    """Import GPU samples from nvidia-smi CSVs (any field order, with or without units).

    Each file is one transaction: a bad file is refused with its error and the others are
    imported; the exit status is 2 if any was refused."""
    from auditor import jobs

    fields = None if columns is None else [c.strip() for c in columns.split(",")]
    with user_errors():
        zone = parse_tz(tz)
        of = state.cluster(cluster)

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
                cluster=of,
            )
        already = f" ({stats.already} already stored)" if stats.already else ""
        typer.echo(
            f"imported {stats.rows} samples of {stats.gpus} GPUs from {file} in "
            f"{stats.seconds:.1f}s{already}, import {stats.import_id}"
        )
        if stats.shifted_ms is not None and stats.rows:  # said once, when the copy is made
            hours = abs(stats.shifted_ms) / 3_600_000
            way = "earlier" if stats.shifted_ms < 0 else "later"
            echo_err(
                f"auditor: warning: {terminal_safe(str(file))}: its first readings are stored "
                f"already, {hours:g} h {way}: the same log imported before with another --tz? "
                f"Both copies are now stored; `auditor import undo {stats.import_id}` takes "
                "this one back."
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


def import_pods(
    files: Annotated[
        list[Path],
        typer.Argument(
            metavar="FILE",
            help="kubectl get pods,nodes -A -o json|yaml [--watch --output-watch-events]; "
            "with DRA, add resourceclaims,resourceslices to the same file; "
            "several files: one transaction each.",
        ),
    ],
    cluster: ClusterOption = None,
) -> None:
    """Import GPU pods and nodes from kubectl JSON or YAML lists, manifests or watch streams.

    A refused file is rolled back and the others are imported; the exit status is then
    non-zero."""
    from auditor import jobs

    with user_errors():
        of = state.cluster(cluster)

    def one(file: Path) -> None:
        with file_progress(file, file.name) as progress:
            stats = jobs.import_pods(
                state.db_url, file, config=state.config(), progress=progress, cluster=of
            )
        typer.echo(
            f"imported {stats.rows} GPU pod records and {stats.nodes} nodes from {file} in "
            f"{stats.seconds:.1f}s, import {stats.import_id}"
        )
        if stats.claims:
            typer.echo(
                f"  {stats.claims} ResourceClaims: {stats.dra_assignments} pod-card pairs "
                "mapped exactly"
                + (
                    f", {stats.dra_pending} claims gave nothing (pod not imported, or device "
                    "in no ResourceSlice of the file)"
                    if stats.dra_pending
                    else ""
                )
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
    bearer_token_file: BearerTokenFileOption = None,
    basic_auth_user: BasicAuthUserOption = None,
    basic_auth_password_file: BasicAuthPasswordFileOption = None,
    timeout: QueryTimeoutOption = "60s",
    node_label: Annotated[
        list[str] | None,
        typer.Option(
            "--node-label",
            metavar="<str>",
            help="Label naming the node, first present wins; repeatable "
            "(default kubernetes_node, node, nodename; else kube_pod_info, else Hostname).",
        ),
    ] = None,
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            metavar="KEY=NODE",
            help="The node of a GPU UUID or a Hostname (an exporter pod), where no node label "
            "says; repeatable.",
        ),
    ] = None,
    cluster: ClusterOption = None,
    cluster_label: ClusterLabelOption = None,
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
            nodes=jobs.parse_node_options(node or []),
            cluster=state.cluster(cluster),
            cluster_label=cluster_label,
        )
    sources = describe_sources(stats.node_sources, stats.util_sources)
    typer.echo(
        f"imported {stats.samples} samples of {stats.gpus} GPUs and {stats.holdings} GPU -> pod "
        f"assignments from {redact(url)} in {stats.seconds:.1f}s"
        + (f" ({stats.already} samples already stored)" if stats.already else "")
        + f", import {stats.import_id}"
        + (f"; {terminal_safe(sources)}" if sources else "")
    )
    if stats.pod_signals or stats.card_signals:
        typer.echo(
            f"stored {stats.pod_signals} cAdvisor pod signal rows and {stats.card_signals} "
            "PCIe/NVLink card rows"
            + (
                f" ({stats.signals_unmatched} rows of pods or cards not in the database skipped)"
                if stats.signals_unmatched
                else ""
            )
        )
    if stats.signals_bad:
        bad = ", ".join(f"{terminal_safe(k)} {v}" for k, v in stats.signals_bad.items())
        typer.echo(f"skipped bad signal points: {bad}", err=True)
    if stats.unresolved:
        typer.echo(
            f"{stats.unresolved} GPU -> pod spans name pods not in the database: "
            "import the pods, then run this import again",
            err=True,
        )


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
    bearer_token_file: BearerTokenFileOption = None,
    basic_auth_user: BasicAuthUserOption = None,
    basic_auth_password_file: BasicAuthPasswordFileOption = None,
    timeout: QueryTimeoutOption = "60s",
) -> None:
    """Import useful output per pod: serving counters and latency from Prometheus (--url), or
    an outputs CSV for training (samples, steps, tokens) with an optional quality column."""
    from auditor import jobs
    from auditor.collect.useful_output import parse_metric

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
        + (f"; {stats.queue_rows} serving queue rows" if stats.queue_rows else "")
    )
    if stats.queue_unresolved:
        typer.echo(
            f"{stats.queue_unresolved} serving queue readings name pods not in the database",
            err=True,
        )
    if stats.queue_bad:
        bad = ", ".join(f"{terminal_safe(k)} {v}" for k, v in stats.queue_bad.items())
        typer.echo(f"skipped bad serving queue readings: {bad}", err=True)
    if stats.unresolved:
        typer.echo(
            f"{stats.unresolved} series intervals name pods not in the database: "
            "import the pods, then run this import again",
            err=True,
        )


def _utc(ms: int | None) -> str:
    from datetime import UTC, datetime

    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _options(options: Mapping[str, object]) -> str:
    """An import's options as the user gave them: `node=node-a tz=Europe/Berlin`."""
    out = []
    for key, value in options.items():
        if key in ("start_ms", "end_ms") and isinstance(value, int):
            out.append(f"{key.removesuffix('_ms')}={_utc(value)}")
        elif isinstance(value, dict):
            out += [f"{key}={k}={v}" for k, v in value.items()]
        elif isinstance(value, list):
            out += [f"{key}={v}" for v in value]
        else:
            out.append(f"{key}={value}")
    return " ".join(out)


def import_list() -> None:
    """List the imports recorded in the database, oldest first: id, when, kind, rows written,
    cards, the first and last sample time, the options that change meaning, the source."""
    from auditor import jobs

    with user_errors():
        entries = jobs.list_imports(state.db_url)
    if not entries:
        typer.echo("no imports recorded")
        return
    typer.echo("id\timported\tkind\trows\tcards\tsamples from..to\toptions\tsource")
    for e in entries:
        samples = "-" if e.first_ms is None else f"{_utc(e.first_ms)}..{_utc(e.last_ms)}"
        fields = [
            str(e.id),
            _utc(e.created_ms),
            e.kind,
            str(e.rows_written),
            str(e.cards),
            samples,
            _options(e.options) or "-",
            redact(e.source),
        ]
        if e.undone_ms is not None:
            fields.append(f"(taken back {_utc(e.undone_ms)})")
        typer.echo("\t".join(terminal_safe(f) for f in fields))


def import_undo(
    import_id: Annotated[
        int, typer.Argument(metavar="ID", help="The import's id, as `auditor import list` shows.")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would be removed; change nothing.")
    ] = False,
) -> None:
    """Take one nvidia-smi or Prometheus import back: delete exactly the samples it wrote,
    the cards it added that nothing else refers to, and the audit runs that counted them
    (their windows are named: audit them again). Pods and outputs imports are refused."""
    from auditor import jobs

    with user_errors():
        done = jobs.undo_import(state.db_url, import_id, dry_run=dry_run)
    e = done.entry
    what = terminal_safe(
        f"{e.kind} {redact(e.source)}" + (f" ({_options(e.options)})" if e.options else "")
    )
    cards = f", and {len(done.gpus)} cards it had added" if done.gpus else ""
    verb = "would take" if dry_run else "took"
    typer.echo(f"{verb} back import {e.id}, {what}: {done.samples} samples{cards}")
    if done.runs:
        ids = ", ".join(str(r.id) for r in done.runs)
        removed = "would be deleted" if dry_run else "were deleted"
        echo_err(
            f"auditor: warning: audit runs {ids} counted these samples and {removed}; "
            "audit their windows again:"
        )
        for window in dict.fromkeys((r.start_ms, r.end_ms) for r in done.runs):
            echo_err(f"  auditor audit --start {_utc(window[0])} --end {_utc(window[1])}")
    if dry_run:
        typer.echo("nothing was changed (--dry-run)")
