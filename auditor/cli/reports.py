"""`auditor report`, `explain`, `compare` and `export finance`: what the audit runs found.

Each reads the stored runs, calls one function of `auditor.jobs` and renders; `emit` writes
the text to `--out` or standard output.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from auditor.cli.app import (
    echo_err,
    emit,
    state,
    terminal_width,
    user_errors,
    write_atomically,
)
from auditor.cli.options import ClusterFilterOption, OutOption
from auditor.errors import InputError
from auditor.model import GroupBy
from auditor.settings import FINANCE_OUT_ENV
from auditor.timespec import last_week, parse_window


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"
    PROMETHEUS = "prometheus"
    HTML = "html"


def report(
    by: Annotated[GroupBy, typer.Option("--by", help="Grouping of the rows.")] = GroupBy.TEAM,
    team: Annotated[str | None, typer.Option("--team", help="Only this team's rows.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.TABLE,
    start: Annotated[
        str | None,
        typer.Option(
            "--start",
            help="Window start (default: latest audit): a whole UTC hour inside audited runs, "
            "or where a run starts.",
        ),
    ] = None,
    end: Annotated[
        str | None,
        typer.Option("--end", help="Window end: a whole UTC hour, or where a run ends."),
    ] = None,
    out: OutOption = None,
    policy: Annotated[
        list[str],
        typer.Option(
            "--policy",
            help="With --format html: also replay this idle policy over the window "
            "(repeatable; as `auditor whatif --policy`).",
        ),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    cluster: ClusterFilterOption = None,
) -> None:
    """GPU-hours per category and group, shares, utilisation spread, top offenders."""
    from auditor import jobs
    from auditor.report.prometheus import render_prometheus
    from auditor.report.render import render_csv, render_json, render_table

    with user_errors():
        window = parse_window(start, end, None)
        only = state.cluster_filter(cluster)
        if policy and fmt is not Format.HTML:
            raise InputError("--policy goes with --format html", field="--policy")
        if fmt is Format.HTML:
            from auditor.classify.whatif import parse_policy

            text = jobs.build_report_html(
                state.db_url,
                start_ms=window[0] if window else None,
                end_ms=window[1] if window else None,
                by=by,
                team=team,
                thresholds=state.config().thresholds,
                policies=[parse_policy(p) for p in policy],
                cluster=only,
            )
            emit(text, out)
            return
        rep = jobs.build_report(
            state.db_url,
            start_ms=window[0] if window else None,
            end_ms=window[1] if window else None,
            by=by,
            team=team,
            cluster=only,
        )
        if fmt is Format.TABLE:
            text = render_table(rep, width=terminal_width() if out is None else None)
        else:
            renderers = {
                Format.JSON: render_json,
                Format.CSV: render_csv,
                Format.PROMETHEUS: render_prometheus,
            }
            text = renderers[fmt](rep)
        emit(text, out)


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
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="The cluster it runs in, where its name is in several."),
    ] = None,
) -> None:
    """Each card of a job or pod over time: categories, findings, what it waited on, next steps."""
    from auditor import jobs
    from auditor.report.explain import render_explain_text
    from auditor.report.html import render_explain_html

    with user_errors():
        ex = jobs.explain(
            state.db_url,
            target,
            thresholds=state.config().thresholds,
            cluster=state.cluster_filter(cluster),
        )
        if html is not None:
            write_atomically(html, render_explain_html(ex))
    typer.echo(render_explain_text(ex, width=width), nl=False)


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
            envvar=FINANCE_OUT_ENV,
            show_envvar=True,
            help="Write here instead of stdout: a path, or s3://, gs://, az:// (credentials "
            "from the environment as each SDK reads them); {week} in it becomes the week.",
        ),
    ] = None,
    cluster: ClusterFilterOption = None,
) -> None:
    """The weekly finance CSV: one row per team × cluster × GPU model, plus the platform
    rows.

    Written whole or not at all: a local file through a temporary file and a rename, an
    object in one upload (never a partial object)."""
    from auditor import jobs
    from auditor.jobs.destinations import check_target, write_output

    with user_errors():
        if out is not None:
            check_target(out)
        chosen = last_week(datetime.now(UTC)) if week == "last" else week
        warnings: list[str] = []
        text = jobs.export_finance(
            state.db_url,
            week=chosen,
            config=state.config(),
            warn=warnings.append,
            cluster=state.cluster_filter(cluster),
        )
        if out is not None:
            write_output(out.replace("{week}", chosen), text.encode("utf-8"))
        else:
            typer.echo(text, nl=False)
    for warning in warnings:  # once the CSV is out: a failure stays one line
        echo_err(f"auditor: {warning}")


class CompareFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    HTML = "html"


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
    out: OutOption = None,
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
