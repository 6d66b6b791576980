"""`auditor audit`, `auditor whatif` and `auditor rollup`: classify, replay policies, fold.

`--threshold KEY=VALUE` overrides a classifier threshold for one run of `audit` or `whatif`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer

from auditor.cli.app import echo_err, emit, state, user_errors
from auditor.cli.options import EndOption, OutOption, SinceOption, StartOption, ThresholdOption
from auditor.errors import InputError
from auditor.settings import Config
from auditor.timespec import parse_day, parse_window


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


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """`i/N` with 0 <= i < N."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise InputError(f"expected i/N with 0 <= i < N, got {text!r}", field="--shard")
    return int(m.group(1)), int(m.group(2))


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
    threshold: ThresholdOption = [],  # noqa: B006 - typer reads the default, never mutates it
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
    if stats.gpus and not stats.tenures:
        echo_err(
            "auditor: warning: no pod held any of these cards in the window: were the pods "
            "imported (auditor import pods, or the watcher)? Every card's time is the "
            "platform's, its kernel time busy of no pod."
        )


class WhatIfFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


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
    out: OutOption = None,
    threshold: ThresholdOption = [],  # noqa: B006 - typer reads the default, never mutates it
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
