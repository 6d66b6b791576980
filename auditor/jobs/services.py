"""The long-running in-cluster services: the node sampler and the pod watcher."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from auditor.errors import AuditorError, InputError
from auditor.jobs.common import open_store
from auditor.model import DEFAULT_CLUSTER
from auditor.settings import Config, SampleOptions, WatchOptions

__all__ = ["SampleOptions", "WatchOptions", "restored_streaks", "sample", "watch"]
"""The options are declared in `auditor.settings`, with their defaults; here they run."""


def restored_streaks(
    url: str, *, node: str, idle_threshold_pct: float, cluster: str = DEFAULT_CLUSTER
) -> dict[Any, int]:
    """Where each held card of the node began its idle stretch, by the store; nothing (and a
    warning) where the store cannot be read: the streaks then start afresh."""
    import logging

    from auditor.store.streaks import idle_streak_starts

    try:
        engine = open_store(url)
        try:
            with engine.connect() as conn:
                return dict(
                    idle_streak_starts(
                        conn, node=node, idle_threshold_pct=idle_threshold_pct, cluster=cluster
                    )
                )
        finally:
            engine.dispose()
    except Exception as e:  # the store may be down at start: the sampler goes on
        logging.getLogger(__name__).warning("idle streaks start afresh: %s", e)
        return {}


def sample(url: str, options: SampleOptions, *, log: Callable[[str], None]) -> None:
    """Run the node sampler until stopped: NVML every period, pod-resources, buffered writes.

    NVML that cannot be initialised is a `DriverError` at once (the DaemonSet restarts the
    sampler); the database may be down at start: passes wait in the on-disk buffer."""
    import signal
    import threading

    from prometheus_client import CollectorRegistry

    from auditor.agents.sample.buffer import DiskBuffer
    from auditor.agents.sample.cgroup_signals import CgroupSignals
    from auditor.agents.sample.metrics import SamplerMetrics, serve
    from auditor.agents.sample.nvml import NvmlReader
    from auditor.agents.sample.podresources import PodResourcesClient
    from auditor.agents.sample.sampler import Sampler, SamplerSettings
    from auditor.agents.sample.streaks import IdleStreaks
    from auditor.agents.serve import setup_logging
    from auditor.store.sample_sink import StoreSink

    setup_logging(json_format=options.json_logs)  # a store error names the URL: redacted
    reader = NvmlReader(node=options.node, period_s=options.period_s, proc_root=options.proc_root)
    reader.open()
    holders = (
        None
        if options.pod_resources_socket is None
        else PodResourcesClient(options.pod_resources_socket)
    )
    buffer = DiskBuffer(
        options.buffer_dir / "sampler-buffer.db",
        max_bytes=max(1, int(options.buffer_max_mib * 2**20)),
    )
    metrics = SamplerMetrics(CollectorRegistry())
    streaks = IdleStreaks(
        metrics.registry,
        node=options.node,
        idle_threshold_pct=options.idle_threshold_pct,
        restored=restored_streaks(
            url,
            node=options.node,
            idle_threshold_pct=options.idle_threshold_pct,
            cluster=options.cluster,
        )
        if holders is not None
        else None,
    )
    sampler = Sampler(
        reader=reader,
        holders=holders,
        sink=StoreSink(lambda: open_store(url), cluster=options.cluster),
        buffer=buffer,
        metrics=metrics,
        settings=SamplerSettings(period_s=options.period_s, flush_every_s=options.flush_every_s),
        streaks=streaks,
        cgroups=None if options.cgroup_root is None else CgroupSignals(options.cgroup_root),
    )
    server = None
    if options.metrics_port is not None:
        server = serve(
            metrics,
            address=options.metrics_host,
            port=options.metrics_port,
            max_age_s=3 * options.period_s + options.flush_every_s,
        )
        log(f"metrics on http://{options.metrics_host}:{server.server_address[1]}/metrics")
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: sampler.stop.set())
    log(f"sampling node {options.node} every {options.period_s:g}s, buffer in {buffer.path}")
    try:
        sampler.run(max_passes=options.max_passes)
    finally:
        if server is not None:
            server.shutdown()
        if holders is not None:
            holders.close()
        reader.close()
        buffer.close()


def _skips(metrics: Any, kind: str) -> Callable[[str], None]:
    """Count a skipped object of `kind`."""
    return lambda reason: metrics.skipped(str(kind), reason)


def watch(
    url: str,
    options: WatchOptions,
    *,
    config: Config,
    log: Callable[[str], None],
    stop: threading.Event | None = None,
) -> None:
    """Record GPU pods (and nodes) from the Kubernetes API until stopped (SIGTERM).

    Each kind runs its own list/watch loop in a thread; a loop that fails unexpectedly stops
    the watcher with an error, so that Kubernetes restarts it (it resumes from the store)."""
    import signal

    from auditor.agents.serve import setup_logging
    from auditor.agents.watch import kube
    from auditor.agents.watch.metrics import WatchMetrics, serve
    from auditor.agents.watch.watcher import LoopOptions, Reflector
    from auditor.jobs.watch_sinks import NodeSink, PodSink, requests_gpus, scope_filter

    setup_logging(json_format=options.json_logs)
    in_scope = scope_filter(options.namespace, options.selector)  # a bad selector fails here
    engine = open_store(url)
    api = kube.connect(kubeconfig=options.kubeconfig, context=options.context)
    timeouts = kube.Timeouts(options.connect_timeout_s, options.read_timeout_s)
    stop = stop or threading.Event()
    pod_source = kube.KubeSource(
        api,
        kind=kube.Kind.PODS,
        namespace=options.namespace,
        selector=options.selector,
        timeouts=timeouts,
    )
    kinds: tuple[kube.Kind, ...] = (
        (kube.Kind.PODS, kube.Kind.NODES) if options.nodes else (kube.Kind.PODS,)
    )
    dra_version = kube.dra_version(api, timeouts=timeouts) if options.dra else None
    if options.dra and dra_version is None:
        log("the cluster serves no resource.k8s.io API: ResourceClaims not watched")
    if dra_version is not None:
        kinds = (*kinds, kube.Kind.CLAIMS, kube.Kind.SLICES)
    metrics = WatchMetrics(tuple(str(k) for k in kinds))
    from auditor.jobs.metrics import AuditCollector, latest_audit_figures

    metrics.registry.register(
        AuditCollector(
            lambda: latest_audit_figures(engine, cluster=options.cluster),
            cluster=options.cluster,
            top_jobs=options.audit_top_jobs,
        )
    )
    from auditor.jobs.watch_dra import DraSink, WatchedDra

    dra = WatchedDra(engine, cluster=options.cluster) if dra_version is not None else None
    pod_sink = PodSink(
        engine,
        scope=pod_source.scope,
        teams=config.teams,
        in_scope=in_scope,
        on_skip=lambda reason: metrics.skipped("pods", reason),
        sharing=config.sharing,
        after=dra.retry if dra is not None else None,
        cluster=options.cluster,
    )
    pairs: list[tuple[kube.KubeSource, Any]] = [(pod_source, pod_sink)]
    if dra is not None and dra_version is not None:
        for kind in (kube.Kind.SLICES, kube.Kind.CLAIMS):
            source = kube.KubeSource(api, kind=kind, timeouts=timeouts, version=dra_version)
            sink = DraSink(dra, kind=str(kind), scope=source.scope, on_skip=_skips(metrics, kind))
            pairs.append((source, sink))
    if options.nodes:
        node_source = kube.KubeSource(api, kind=kube.Kind.NODES, timeouts=timeouts)
        node_sink = NodeSink(
            engine,
            scope=node_source.scope,
            on_skip=lambda reason: metrics.skipped("nodes", reason),
            cluster=options.cluster,
        )
        pairs.append((node_source, node_sink))
    loop = LoopOptions(watch_timeout_s=options.watch_timeout_s)
    failures: list[BaseException] = []

    def run(reflector: Reflector) -> None:
        try:
            reflector.run()
        except BaseException as e:
            failures.append(e)
            stop.set()

    threads = [
        threading.Thread(
            target=run,
            args=(
                Reflector(
                    source,
                    sink,
                    metrics=metrics,
                    stop=stop,
                    options=loop,
                    keep=(
                        (lambda pod: requests_gpus(pod, config.sharing))
                        if source.kind is kube.Kind.PODS
                        else None
                    ),
                ),
            ),
            name=f"watch-{source.kind}",
            daemon=True,
        )
        for source, sink in pairs
    ]
    server = None
    if options.metrics_port is not None:
        try:
            server = serve(
                metrics,
                address=options.metrics_host,
                port=options.metrics_port,
                max_age_s=options.health_max_age_s,
            )
        except OSError as e:
            raise InputError(f"cannot listen: {e.strerror}", field="--metrics-port") from e
        log(f"metrics on http://{options.metrics_host}:{server.server_address[1]}/metrics")
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    log(f"watching {', '.join(metrics.kinds)} ({pod_source.scope})")
    for thread in threads:
        thread.start()
    try:
        stop.wait()
    finally:
        stop.set()
        for source, _ in pairs:
            source.interrupt()
        for thread in threads:
            thread.join(timeout=10)  # no daemon thread may be writing a log line at exit
        if server is not None:
            server.shutdown()
    if failures:
        raise AuditorError(f"watch loop failed: {failures[0]!r}") from failures[0]
