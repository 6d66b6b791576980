"""`auditor sample` (the node DaemonSet) and `auditor watch` (the pod watcher Deployment).

Each builds its options (`auditor.settings.SampleOptions` / `WatchOptions`, where every
knob and its default is declared) from its flags and runs until stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from auditor.cli.app import echo_err, state, user_errors
from auditor.cli.options import (
    LogFormat,
    LogFormatOption,
    MetricsHostOption,
    ServiceClusterOption,
    metrics_port_option,
    port_flag,
    port_or_none,
)
from auditor.settings import (
    BUFFER_DIR_ENV,
    BUFFER_MAX_MIB_ENV,
    METRICS_PORT_ENV,
    NODE_NAME_ENV,
    PROC_ROOT_ENV,
    PROCESS_UTIL_ENV,
    WATCH_NAMESPACE_ENV,
    WATCH_SELECTOR_ENV,
    SampleOptions,
    WatchOptions,
)


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
    ] = SampleOptions.buffer_dir,
    period: Annotated[
        float, typer.Option("--period", min=0.1, help="Seconds between passes over the GPUs.")
    ] = SampleOptions.period_s,
    flush_every: Annotated[
        float,
        typer.Option("--flush-every", min=1.0, help="Seconds between writes to the database."),
    ] = SampleOptions.flush_every_s,
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
    ] = SampleOptions.buffer_max_mib,
    pod_resources: Annotated[
        Path | None,
        typer.Option(
            "--pod-resources", help="The kubelet's pod-resources socket (GPU -> pod mapping)."
        ),
    ] = Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    no_pod_resources: Annotated[
        bool, typer.Option("--no-pod-resources", help="Record no GPU -> pod mapping.")
    ] = False,
    metrics_port: Annotated[int, metrics_port_option()] = port_flag(SampleOptions.metrics_port),
    metrics_host: MetricsHostOption = SampleOptions.metrics_host,
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
            envvar=PROCESS_UTIL_ENV,
            show_envvar=True,
            help="Record each pod's own utilisation of shared cards from NVML's per-process "
            "utilisation (needs hostPID: true and the host's /proc).",
        ),
    ] = False,
    proc_root: Annotated[
        Path,
        typer.Option(
            "--proc-root",
            envvar=PROC_ROOT_ENV,
            show_envvar=True,
            help="The host's /proc, where --process-util finds each process's pod.",
        ),
    ] = Path("/proc"),
    cgroup_root: Annotated[
        Path | None,
        typer.Option(
            "--cgroup-root",
            help="The host's /sys/fs/cgroup: read the CPU limit use, throttling and pressure "
            "of the pods on the cards each pass (needs --process-util).",
        ),
    ] = None,
    log_format: LogFormatOption = LogFormat.TEXT,
    cluster: ServiceClusterOption = None,
) -> None:
    """Sample this node's GPUs through NVML and record which pod holds each (the DaemonSet)."""
    import socket

    from auditor import jobs

    with user_errors():
        options = SampleOptions(
            node=node or socket.gethostname(),
            buffer_dir=buffer_dir,
            period_s=period,
            flush_every_s=flush_every,
            buffer_max_mib=buffer_max_mib,
            pod_resources_socket=None if no_pod_resources else pod_resources,
            metrics_host=metrics_host,
            metrics_port=port_or_none(metrics_port),
            max_passes=passes,
            proc_root=proc_root if process_util else None,
            cgroup_root=cgroup_root if process_util else None,
            json_logs=log_format is LogFormat.JSON,
            cluster=state.cluster(cluster),
        )
        jobs.sample(state.db_url, options, log=echo_err)


# ---------------------------------------------------------------- pod watcher


def watch(
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            "--kubeconfig",
            help="Kubeconfig file (default: in-cluster, else KUBECONFIG or ~/.kube/config).",
        ),
    ] = WatchOptions.kubeconfig,
    context: Annotated[
        str | None, typer.Option("--context", help="Kubeconfig context to use.")
    ] = WatchOptions.context,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace",
            "-n",
            envvar=WATCH_NAMESPACE_ENV,
            show_envvar=True,
            help="Only pods of this namespace (default: all).",
        ),
    ] = WatchOptions.namespace,
    selector: Annotated[
        str | None,
        typer.Option(
            "--selector",
            "-l",
            envvar=WATCH_SELECTOR_ENV,
            show_envvar=True,
            help="Only pods matching this label selector.",
        ),
    ] = WatchOptions.selector,
    no_nodes: Annotated[bool, typer.Option("--no-nodes", help="Do not watch nodes.")] = False,
    no_dra: Annotated[
        bool,
        typer.Option("--no-dra", help="Do not watch ResourceClaims and ResourceSlices (DRA)."),
    ] = False,
    metrics_port: Annotated[int, metrics_port_option(METRICS_PORT_ENV)] = port_flag(
        WatchOptions.metrics_port
    ),
    metrics_host: MetricsHostOption = WatchOptions.metrics_host,
    health_max_age: Annotated[
        float,
        typer.Option(
            "--health-max-age",
            min=1.0,
            help="Seconds without a successful sync after which /healthz fails.",
        ),
    ] = WatchOptions.health_max_age_s,
    metrics_top_jobs: Annotated[
        int,
        typer.Option(
            "--metrics-top-jobs",
            min=0,
            help="/metrics also serves the latest complete audit (read at most once a minute): "
            "the figures of this many jobs that wasted most (0: none; teams always).",
        ),
    ] = WatchOptions.audit_top_jobs,
    watch_timeout: Annotated[
        int,
        typer.Option(
            "--watch-timeout",
            min=1,
            help="Seconds after which the server ends each watch (it is resumed).",
        ),
    ] = WatchOptions.watch_timeout_s,
    read_timeout: Annotated[
        float,
        typer.Option(
            "--read-timeout",
            min=0.1,
            help="Seconds of silence after which a stream counts as dead.",
        ),
    ] = WatchOptions.read_timeout_s,
    log_format: LogFormatOption = LogFormat.TEXT,
    cluster: ServiceClusterOption = None,
) -> None:
    """Record who held which GPU when: list/watch GPU pods and nodes (the Deployment).

    Restart-safe: resumes from the resourceVersion stored with the last write, and relists
    (closing pods that vanished meanwhile) when the API has expired it."""
    from auditor import jobs

    with user_errors():
        options = WatchOptions(
            kubeconfig=kubeconfig,
            context=context,
            namespace=namespace,
            selector=selector,
            nodes=not no_nodes,
            dra=not no_dra,
            metrics_host=metrics_host,
            metrics_port=port_or_none(metrics_port),
            health_max_age_s=health_max_age,
            watch_timeout_s=watch_timeout,
            read_timeout_s=read_timeout,
            json_logs=log_format is LogFormat.JSON,
            audit_top_jobs=metrics_top_jobs,
            cluster=state.cluster(cluster),
        )
        jobs.watch(state.db_url, options, config=state.config(), log=echo_err)
