"""Options more than one command takes, declared once as `Annotated` aliases.

A command names its parameter and takes the alias (`start: StartOption = None`), so that
two commands cannot drift apart in a flag's name, environment variable or help text.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from auditor.settings import (
    CLUSTER_ENV,
    LOG_FORMAT_ENV,
    PROMETHEUS_PASSWORD_ENV,
    PROMETHEUS_TOKEN_ENV,
)

# ---------------------------------------------------------------- windows

StartOption = Annotated[str | None, typer.Option("--start", help="Window start (ISO 8601, UTC).")]
EndOption = Annotated[str | None, typer.Option("--end", help="Window end (ISO 8601, UTC).")]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Window of this length ending now (or at --end): 7d, 12h."),
]

# ---------------------------------------------------------------- audit and output

ThresholdOption = Annotated[
    list[str],
    typer.Option("--threshold", help="Override a classifier threshold: KEY=VALUE (repeatable)."),
]
OutOption = Annotated[
    Path | None, typer.Option("--out", help="Write to this file instead of stdout.")
]

# ---------------------------------------------------------------- Prometheus

BearerTokenFileOption = Annotated[
    Path | None,
    typer.Option(
        "--bearer-token-file",
        help=f"File holding a bearer token (else env {PROMETHEUS_TOKEN_ENV}).",
    ),
]
BasicAuthUserOption = Annotated[
    str | None,
    typer.Option("--basic-auth-user", help="Basic auth user (else the URL's user@)."),
]
BasicAuthPasswordFileOption = Annotated[
    Path | None,
    typer.Option(
        "--basic-auth-password-file",
        help=f"File holding the basic auth password (else env {PROMETHEUS_PASSWORD_ENV}).",
    ),
]
QueryTimeoutOption = Annotated[
    str, typer.Option("--timeout", help="Longest one query may take, to its last byte.")
]

ClusterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="The cluster these records are of (default: the config's `cluster`, else "
        "'default'); one database holds several.",
    ),
]
"""`--cluster` of the writers (imports, services): the cluster what they store is of."""
ClusterFilterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="Only this cluster's results (default: every cluster the database holds).",
    ),
]
"""`--cluster` of the readers (reports, exports): one cluster, else all of them."""
ClusterLabelOption = Annotated[
    str | None,
    typer.Option(
        "--cluster-label",
        metavar="LABEL",
        help="The series label naming clusters in a store holding several (e.g. cluster): "
        "read only the series whose LABEL is --cluster's name.",
    ),
]
"""`--cluster-label` of the readers of a Prometheus-compatible store."""
ServiceClusterOption = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        envvar=CLUSTER_ENV,
        show_envvar=True,
        help="The cluster this service runs in (default: the config's `cluster`, else "
        "'default'); one database holds several.",
    ),
]
"""`--cluster` of the services, also from the environment (the chart sets it)."""


# ---------------------------------------------------------------- services


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
MetricsHostOption = Annotated[
    str, typer.Option("--metrics-host", help="Address /metrics and /healthz listen on.")
]


def metrics_port_option(envvar: str | None = None) -> Any:
    """`--metrics-port`, optionally read from `envvar`: a port, 0 for any free one, -1 for
    no server (`port_flag` and `port_or_none` translate)."""
    return typer.Option(
        "--metrics-port",
        envvar=envvar,
        show_envvar=envvar is not None,
        help="Port of /metrics and /healthz (0: any free port, -1: none).",
    )


def port_flag(port: int | None) -> int:
    """An options port as `--metrics-port` shows it: -1 for no server."""
    return -1 if port is None else port


def port_or_none(port: int) -> int | None:
    """`--metrics-port` as the options take it: None for no server."""
    return None if port < 0 else port
