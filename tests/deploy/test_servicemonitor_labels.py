"""The sampler's series as the Prometheus Operator scrapes them, and the alerts on them.

The sampler exports one idle-streak series per held card, labelled with the *tenant's*
`namespace` and `pod`. The Prometheus Operator gives every target it scrapes through a
ServiceMonitor the labels of the scraped pod itself (`namespace`, `pod`, `service`,
`container`, `endpoint`, `job`); unless the endpoint sets `honorLabels`, a scraped label that
collides with one of them is renamed `exported_<name>`, and the alert would name the
auditor's own sampler pod instead of the tenant.

A real Prometheus scrapes a real sampler registry on loopback here, with the scrape job the
Operator generates from the shipped ServiceMonitor: the target labels it adds (from the
Kubernetes service-discovery meta labels, given as the target's static labels), then the
endpoint's own relabelings and its `honorLabels`. The alert expressions of the shipped
PrometheusRule then run against what was stored. The watcher's series, the audit's labelled
with its cluster, are scraped the same way through the watcher's ServiceMonitor.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import yaml
from chart import CHART, objects
from prometheus_client import CollectorRegistry, make_wsgi_app
from promserver import PromServer, binaries, start_prometheus

from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.streaks import IdleStreaks
from auditor.agents.watch.metrics import WatchMetrics
from auditor.jobs.metrics import AuditCollector
from auditor.model import GpuSample, Holding

SAMPLER_POD = {
    "__meta_kubernetes_namespace": "gpu-auditor-node",
    "__meta_kubernetes_pod_name": "auditor-sampler-x7k2p",
    "__meta_kubernetes_pod_container_name": "sampler",
    "__meta_kubernetes_service_name": "auditor-sampler",
    "__meta_kubernetes_pod_node_name": "gpu-node-1",
}


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def endpoint_of(name: str, *sets: str) -> dict[str, Any]:
    (monitor,) = [
        o
        for o in objects("observability", *sets)
        if o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == name
    ]
    (endpoint,) = monitor["spec"]["endpoints"]
    return dict(endpoint)


def sampler_endpoint() -> dict[str, Any]:
    return endpoint_of("auditor-sampler")


def rule_expr(alert: str) -> str:
    rule = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    (found,) = [r for g in rule["groups"] for r in g["rules"] if r.get("alert") == alert]
    return str(found["expr"])


def operator_scrape_job(endpoint: dict[str, Any], target: str) -> dict[str, Any]:
    """The scrape job the Prometheus Operator writes for one ServiceMonitor endpoint, with
    Kubernetes service discovery replaced by one static target carrying its meta labels."""
    generated = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    own = [
        {
            "source_labels": r.get("sourceLabels", []),
            "target_label": r["targetLabel"],
            "action": r.get("action", "replace"),
        }
        | ({"replacement": r["replacement"]} if "replacement" in r else {})
        for r in endpoint.get("relabelings", [])
    ]
    return {
        "job_name": "serviceMonitor/gpu-auditor-node/auditor-sampler/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": "1s",
        "static_configs": [{"targets": [target], "labels": SAMPLER_POD}],
        "relabel_configs": generated + own,
    }


@contextmanager
def serving(registry: CollectorRegistry) -> Iterator[str]:
    server: WSGIServer = make_server("127.0.0.1", 0, make_wsgi_app(registry), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def sampler_target() -> Iterator[str]:
    """A sampler's registry (one pass over one card held idle by ml/nb-0) on loopback."""
    registry = CollectorRegistry()
    SamplerMetrics(registry).passed(
        gpus=1, problems=0, dropped=0, buffered=0, at=time.time(), seconds=0.01
    )
    streaks = IdleStreaks(registry, node="gpu-node-1", idle_threshold_pct=5.0)
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - 3 * 3600_000
    holding = Holding(
        namespace="ml", pod="nb-0", gpu_uuid="GPU-a", first_ms=start_ms, last_ms=now_ms
    )
    for ts in (start_ms, now_ms):
        sample = GpuSample(gpu_uuid="GPU-a", ts_ms=ts, util=0.0)
        streaks.update(taken_ms=ts, samples=[sample], held=[holding])
    with serving(registry) as target:
        yield target


def scraped(endpoint: dict[str, Any], target: str, root: Path) -> PromServer:
    found = binaries()
    if isinstance(found, str):
        pytest.skip(found)
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": []}
    config["scrape_configs"] = [operator_scrape_job(endpoint, target)]
    return start_prometheus(root / "tsdb", root, config_text=yaml.safe_dump(config))


def query(server: PromServer, expr: str) -> list[dict[str, Any]]:
    """The instant vector `expr` gives, once the first scrape is in (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        url = f"{server.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as r:
            result: list[dict[str, Any]] = json.load(r)["data"]["result"]
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.3)


def test_the_shipped_servicemonitor_keeps_the_tenants_labels(
    sampler_target: str, tmp_path: Path
) -> None:
    server = scraped(sampler_endpoint(), sampler_target, tmp_path)
    try:
        held_idle = query(server, rule_expr("GpuHeldIdle"))
        silent = query(
            server, "max by (cluster, node) (auditor_sampler_last_pass_timestamp_seconds)"
        )
    finally:
        server.stop()
    assert [r["metric"] for r in held_idle] == [
        {
            "cluster": "default",
            "node": "gpu-node-1",
            "gpu": "GPU-a",
            "namespace": "ml",
            "pod": "nb-0",
        }
    ]
    # the node and cluster labels of series the sampler does not label itself come from the
    # relabelings (the cluster: the chart's `cluster` value)
    assert [r["metric"] for r in silent] == [{"cluster": "default", "node": "gpu-node-1"}]


def test_without_honor_labels_the_alert_would_name_the_sampler_pod(
    sampler_target: str, tmp_path: Path
) -> None:
    """The case the shipped ServiceMonitor guards against, so the test above can fail."""
    endpoint = sampler_endpoint() | {"honorLabels": False}
    server = scraped(endpoint, sampler_target, tmp_path)
    try:
        held_idle = query(server, rule_expr("GpuHeldIdle"))
    finally:
        server.stop()
    assert [(r["metric"]["namespace"], r["metric"]["pod"]) for r in held_idle] == [
        ("gpu-auditor-node", "auditor-sampler-x7k2p")
    ]


def test_the_watchers_series_all_carry_its_cluster_under_that_name(tmp_path: Path) -> None:
    """The audit series name their cluster themselves and the watcher's health series get
    it from the relabeling: both as `cluster`, none renamed `exported_cluster`."""
    metrics = WatchMetrics(("pods",))
    metrics.relist("pods")
    metrics.registry.register(AuditCollector(lambda: None, cluster="east"))
    with serving(metrics.registry) as target:
        server = scraped(endpoint_of("auditor-watcher", "cluster=east"), target, tmp_path)
        try:
            read = query(server, "auditor_audit_read_errors_total")
            relists = query(server, "auditor_watch_relists_total")
            alert = query(server, rule_expr("GpuAuditorNoAudit"))
        finally:
            server.stop()
    for series in (read, relists):
        (got,) = series
        assert got["metric"]["cluster"] == "east"
        assert "exported_cluster" not in got["metric"]
    assert [r["metric"] for r in alert] == [{"cluster": "east"}]  # before its `for`
