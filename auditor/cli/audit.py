"""`auditor audit`, `auditor whatif` and `auditor rollup`: classify, replay policies, fold.

`--threshold KEY=VALUE` overrides a classifier threshold for one run of `audit` or `whatif`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from auditor.cli.app import echo_err, emit, state, user_errors
from auditor.cli.options import (
    BasicAuthPasswordFileOption,
    BasicAuthUserOption,
    BearerTokenFileOption,
    ClusterLabelOption,
    EndOption,
    OutOption,
    QueryTimeoutOption,
    SinceOption,
    StartOption,
    ThresholdOption,
)
from auditor.errors import InputError
from auditor.model import DEFAULT_CLUSTER
from auditor.settings import Config
from auditor.timespec import parse_day, parse_window

if TYPE_CHECKING:
    from auditor.jobs import AuditStats


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
    samples_from: Annotated[
        str | None,
        typer.Option(
            "--samples-from",
            metavar="URL",
            help="Read GPU samples straight from this Prometheus-compatible store "
            "(Prometheus, Thanos Query, Mimir, VictoriaMetrics) instead of the database; "
            "only cards, holdings and results are stored. Needs a window.",
        ),
    ] = None,
    step: Annotated[
        str,
        typer.Option(
            "--step", help="With --samples-from: dcgm-exporter's scrape interval (15s, 30s)."
        ),
    ] = "15s",
    store_points: Annotated[
        int | None,
        typer.Option(
            "--store-points",
            min=1,
            help="With --samples-from: raw points one query may ask for (default 200000); "
            "keep it under the store's per-query sample limit.",
        ),
    ] = None,
    store_chunk: Annotated[
        str | None,
        typer.Option(
            "--store-chunk",
            help="With --samples-from: the time one query covers (e.g. 1h); default from "
            "--store-points. A query refused as too large is asked again over half the time.",
        ),
    ] = None,
    bearer_token_file: BearerTokenFileOption = None,
    basic_auth_user: BasicAuthUserOption = None,
    basic_auth_password_file: BasicAuthPasswordFileOption = None,
    timeout: QueryTimeoutOption = "60s",
    node_label: Annotated[
        list[str] | None,
        typer.Option(
            "--node-label",
            metavar="<str>",
            help="With --samples-from: the label naming the node, as import prometheus "
            "takes it; repeatable.",
        ),
    ] = None,
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            metavar="KEY=NODE",
            help="With --samples-from: the node of a GPU UUID or a Hostname; repeatable.",
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            help="Audit this cluster only (default: each cluster the database holds, one run "
            "each; with --samples-from, the config's `cluster`, else 'default').",
        ),
    ] = None,
    cluster_label: ClusterLabelOption = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Processes that read and classify parts of the fleet side by side (default on Linux: one per CPU this process may use, for an audit of 400,000 samples or more; elsewhere 1; 1: none). The stored results are the same.",
        ),
    ] = None,
) -> None:
    """Classify every GPU-second of a window and store the run (re-running replaces it).

    Without a window, audits all stored samples. With --samples-from, reads the samples
    from the cluster's metrics store instead, node by node, and stores none of them."""
    from auditor import jobs

    with user_errors():
        config = _thresholds(state.config(), threshold)
        if day is not None:
            if start is not None or end is not None or since is not None:
                raise InputError("give --day alone, without --start/--end/--since", field="--day")
            window: tuple[int, int] | None = parse_day(day, now=datetime.now(UTC))
        else:
            window = parse_window(start, end, since)
        if cluster_label is not None and samples_from is None:
            raise InputError("--cluster-label goes with --samples-from", field="--cluster-label")
        if samples_from is not None:
            _from_store(
                samples_from,
                window=window,
                thresholds=config,
                shard=parse_shard(shard),
                step=step,
                points=store_points,
                chunk=store_chunk,
                auth_files=(basic_auth_user, basic_auth_password_file, bearer_token_file),
                timeout=timeout,
                node_labels=node_label or None,
                nodes=node or [],
                cluster=state.cluster(cluster),
                cluster_label=cluster_label,
            )
            return
        if cluster is not None:
            done = [
                jobs.audit(
                    state.db_url,
                    window=window,
                    thresholds=config.thresholds,
                    shard=parse_shard(shard),
                    cluster=state.cluster(cluster),
                    workers=workers,
                )
            ]
        else:
            done = jobs.audit_clusters(
                state.db_url,
                window=window,
                thresholds=config.thresholds,
                shard=parse_shard(shard),
                workers=workers,
            )
    for stats in done:
        _said(stats)


def _from_store(
    url: str,
    *,
    window: tuple[int, int] | None,
    thresholds: Config,
    shard: tuple[int, int] | None,
    step: str,
    points: int | None,
    chunk: str | None,
    auth_files: tuple[str | None, Path | None, Path | None],
    timeout: str,
    node_labels: list[str] | None,
    nodes: list[str],
    cluster: str,
    cluster_label: str | None,
) -> None:
    """`audit --samples-from URL`: the audit read straight from the metrics store."""
    from auditor import jobs
    from auditor.collect.prometheus import credentials
    from auditor.redact import redact
    from auditor.timespec import parse_duration

    if window is None:
        raise InputError(
            "--samples-from needs a window: --start/--end, --since or --day", field="--start"
        )
    user, password_file, token_file = auth_files
    clean, auth = credentials(url, user=user, password_file=password_file, token_file=token_file)
    stats = jobs.audit_from_store(
        state.db_url,
        samples_from=clean,
        window=window,
        thresholds=thresholds.thresholds,
        shard=shard,
        auth=auth,
        timeout_s=parse_duration(timeout, option="--timeout").total_seconds(),
        step_s=parse_duration(step, option="--step").total_seconds(),
        points=points,
        chunk_s=None
        if chunk is None
        else parse_duration(chunk, option="--store-chunk").total_seconds(),
        node_labels=node_labels,
        nodes=jobs.parse_node_options(nodes),
        cluster=cluster,
        cluster_label=cluster_label,
    )
    typer.echo(
        f"read {stats.points} samples of {stats.cards} GPUs from {redact(clean)} in "
        f"{stats.queries} queries"
        + (f" ({stats.shrunk} refused as too large, asked again smaller)" if stats.shrunk else "")
    )
    if stats.unresolved:
        echo_err(
            f"auditor: warning: {stats.unresolved} GPU -> pod spans name pods not in the "
            "database: import the pods (or run the watcher), then audit again"
        )
    _said(stats.audit)


def _said(stats: AuditStats) -> None:
    of = "" if stats.cluster == DEFAULT_CLUSTER else f" of cluster {stats.cluster}"
    typer.echo(
        f"audit run {stats.run_id}{of}: {stats.gpus} GPUs, {stats.samples} samples, "
        f"{stats.tenures} tenures in {stats.seconds:.1f}s"
        + (f" ({stats.workers} worker processes)" if stats.workers > 1 else "")
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
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="The cluster replayed, where the database holds several."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Processes that read and replay parts of the fleet side by side, as the audit takes them (default on Linux: one per CPU this process may use, for 400,000 samples or more; elsewhere 1; 1: none). The output is the same.",
        ),
    ] = None,
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
            cluster=state.cluster_filter(cluster),
            policies=policies,
            window=parse_window(start, end, since),
            thresholds=config.thresholds,
            workers=workers,
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
