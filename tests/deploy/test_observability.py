"""The chart's observability objects (observability.enabled) and the finance object store
(finance.objectStore), rendered offline and checked.

What an operator relies on: every case renders with them; the core objects validate
strictly and the Prometheus Operator objects validate against the operator's published CRD
schemas (vendored under tests/fixtures/crds/, made strict: an unknown or misspelt field
fails); the ServiceMonitors find the watcher's and the sampler's metrics ports and carry the
labels a Prometheus selects them by; the alerting rules pass `promtool check rules` and
their unit tests (`promtool test rules`, tests/fixtures/promtool/); the Grafana dashboard is
a ConfigMap the sidecar picks up, every panel's PromQL parses (`promtool check rules` on the
panels as recording rules), and rules and dashboard name only metrics the auditor exports.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart import CASES, CHART, CRD_KINDS, OBSERVABLE, objects, pod_template, values
from prometheus_client import CollectorRegistry
from test_network_policies import (
    ELSEWHERE,
    Endpoint,
    cluster_of,
    connects,
    needs_of,
    problems,
    workloads_of,
)

from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.streaks import IdleStreaks
from auditor.agents.watch.metrics import WatchMetrics
from auditor.jobs.metrics import READ_METRIC_NAMES
from auditor.report.audit_metrics import AUDIT_METRIC_NAMES

FILES = CHART / "files"
FIXTURES = Path(__file__).parents[1] / "fixtures"


@cache
def strict_schema(kind: str) -> dict[str, Any]:
    """The CRD's openAPIV3Schema, with unknown fields refused wherever the CRD lists its
    fields (as `kubectl apply --validate=strict` does against an installed CRD)."""
    schema = json.loads((FIXTURES / "crds" / f"{CRD_KINDS[kind]}.v1.json").read_text())

    def close(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    strict = copy.deepcopy(schema)
    close(strict)
    strict["properties"]["metadata"] = {"type": "object"}
    return strict


def crd_errors(obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(strict_schema(obj["kind"]))
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


def the(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]


def test_every_case_renders_with_observability_and_validates_against_the_crds() -> None:
    """The Operator's objects against its CRDs; the others are validated strictly with the
    rest in test_manifests.py."""
    for case in CASES:
        objs = objects(case, *OBSERVABLE)
        assert len(the(objs, "ServiceMonitor")) == 2, case
        assert len(the(objs, "PrometheusRule")) == 1, case
        for obj in objs:
            if obj["kind"] in CRD_KINDS:
                assert crd_errors(obj) == [], (case, obj["metadata"]["name"])


def test_the_strict_crd_schema_catches_a_misspelt_field() -> None:
    objs = objects("observability")
    (monitor,) = the(objs, "ServiceMonitor", "auditor-watcher")
    (rule,) = the(objs, "PrometheusRule")

    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    rule["spec"]["groups"][0]["rules"][0]["for"] = 15  # a duration is a string

    assert any("intervall" in e for e in crd_errors(monitor))
    assert crd_errors(rule) != []


def test_prometheus_finds_the_monitors_and_rule_by_its_label() -> None:
    objs = objects("observability")
    selected = values("observability")["observability"]["labels"]
    assert selected == {"release": "kube-prometheus-stack"}
    for obj in the(objs, "ServiceMonitor") + the(objs, "PrometheusRule"):
        assert selected.items() <= obj["metadata"]["labels"].items()


def test_the_rule_and_the_dashboard_can_be_left_out() -> None:
    objs = objects("observability", "observability.prometheusRule.enabled=false",
                   "observability.dashboard.enabled=false")  # fmt: skip
    assert the(objs, "PrometheusRule") == []
    assert the(objs, "ConfigMap", "auditor-grafana-dashboard") == []
    assert len(the(objs, "ServiceMonitor")) == 2


def test_the_service_monitors_reach_the_metrics_ports() -> None:
    objs = objects("observability")
    pods = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in objs
        if o["kind"] in ("Deployment", "DaemonSet")
    }

    for component in ("watcher", "sampler"):
        (monitor,) = the(objs, "ServiceMonitor", f"auditor-{component}")
        services = [
            s
            for s in the(objs, "Service")
            if s["metadata"]["namespace"] == monitor["metadata"]["namespace"]
            and monitor["spec"]["selector"]["matchLabels"].items()
            <= s["metadata"]["labels"].items()
        ]
        assert len(services) == 1, component
        service = services[0]
        template = pod_template(pods[component])
        assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["endpoints"]
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        container_ports = {
            p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]
        }
        assert container_ports[port["targetPort"]] == port["port"]
        assert endpoint["path"] == "/metrics"


def test_the_service_monitors_label_each_series_with_the_releases_cluster() -> None:
    """The sampler's series carry no cluster of their own: node names repeat between
    clusters, so the ServiceMonitors add the release's `cluster`; the watcher's audit
    series carry theirs, which the endpoint honours (not renamed `exported_cluster`)."""
    for sets, want in (((), "default"), (("cluster=east",), "east")):
        objs = objects("observability", *sets)
        for component in ("watcher", "sampler"):
            (monitor,) = the(objs, "ServiceMonitor", f"auditor-{component}")
            (endpoint,) = monitor["spec"]["endpoints"]
            assert endpoint["honorLabels"] is True
            assert {
                "targetLabel": "cluster",
                "replacement": want,
                "action": "replace",
            } in endpoint["relabelings"]


def test_the_dashboard_is_a_configmap_for_grafanas_sidecar() -> None:
    objs = objects("observability")

    (cm,) = the(objs, "ConfigMap", "auditor-grafana-dashboard")

    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "GPU"
    (body,) = cm["data"].values()
    dashboard = json.loads(body)
    assert dashboard == json.loads((FILES / "dashboard.json").read_text())
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for wanted in ("Fleet capacity", "by category", "wasted most", "Inferred mapping"):
        assert wanted in titles


def test_the_rule_is_the_alerts_file() -> None:
    (rule,) = the(objects("observability"), "PrometheusRule")
    assert rule["spec"] == rule_groups()


# --------------------------------------------------------------------- PromQL


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("promtool is required under CI (Debian package prometheus, see .ci/run)")
    pytest.skip("promtool is not installed (apt-get install prometheus)")


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec, as charts/auditor/files/alerts.yaml holds it."""
    spec: dict[str, Any] = yaml.safe_load((FILES / "alerts.yaml").read_text())
    return spec


def panel_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable of the dashboard."""
    dashboard = json.loads((FILES / "dashboard.json").read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['id']} {target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["definition"])
            assert inner is not None, var["definition"]
            out.append((f"variable {var['name']}", inner.group(1)))
    return out


def grafana_free(expr: str) -> str:
    """PromQL as Grafana sends it: multi-value variables become regexes."""
    return expr.replace("$team", ".*").replace("$cluster", ".*")


def run_promtool(*args: str, cwd: Path) -> str:
    out = subprocess.run([promtool(), *args], capture_output=True, text=True, check=False, cwd=cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_rules_pass_promtool_check_and_their_unit_tests(tmp_path: Path) -> None:
    (tmp_path / "auditor-rules.yaml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    shutil.copy(FIXTURES / "promtool" / "auditor-rules.test.yaml", tmp_path)

    checked = run_promtool("check", "rules", "auditor-rules.yaml", cwd=tmp_path)
    tested = run_promtool("test", "rules", "auditor-rules.test.yaml", cwd=tmp_path)

    assert "SUCCESS: 6 rules found" in checked
    assert "SUCCESS" in tested
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    unit = yaml.safe_load((FIXTURES / "promtool" / "auditor-rules.test.yaml").read_text())
    tested_alerts = {a["alertname"] for t in unit["tests"] for a in t["alert_rule_test"]}
    assert alerts == tested_alerts  # every alert has a unit test


def test_every_panel_query_parses(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": grafana_free(expr)}
        for i, (_, expr) in enumerate(panel_queries())
    ]
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))

    checked = run_promtool("check", "rules", path.name, cwd=tmp_path)

    assert f"SUCCESS: {len(rules)} rules found" in checked


def test_a_query_that_does_not_parse_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    rules = [{"record": "dashboard:bad", "expr": "sum by (team (auditor_audit_gpu_hours)"}]
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": rules}]}))

    out = subprocess.run(
        [promtool(), "check", "rules", path.name],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )

    assert out.returncode != 0


KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, ranges, grouping clauses,
    strings and function names left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", text)
    return {n for n in names if n not in KEYWORDS}


def exported() -> set[str]:
    """What the auditor's /metrics endpoints can serve, as Prometheus stores the names."""
    names = set(AUDIT_METRIC_NAMES) | set(READ_METRIC_NAMES)
    sampler = SamplerMetrics(CollectorRegistry()).registry
    IdleStreaks(sampler, node="n", idle_threshold_pct=5.0)  # the sampler's live idle streaks
    for registry in (WatchMetrics(("pods", "nodes")).registry, sampler):
        for family in registry.collect():
            names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (category) (auditor_audit_gpu_hours{team=~"a|b"})', {"auditor_audit_gpu_hours"}),
        ("time() - max by (node) (max_over_time(x_seconds[1h])) > 600", {"x_seconds"}),
        ("count(a_total) unless count(b)", {"a_total", "b"}),
        ("increase(c_total[15m]) > 0 and on () d > 30 * 3600", {"c_total", "d"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


SELECTOR = re.compile(r"\b(auditor_\w+)(\{[^}]*\})?")
"""An auditor metric and its label matchers in a PromQL expression."""


def test_the_cluster_variable_comes_first_and_filters_every_panel() -> None:
    """Several clusters scraped into one Prometheus: the Cluster variable (every value, or
    several) comes before Team, whose values it narrows, and every query of an auditor
    metric keeps to it; the sampler's and watcher's series too (the ServiceMonitors label
    them)."""
    dashboard = json.loads((FILES / "dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    names = list(variables)
    assert names.index("cluster") < names.index("team")
    cluster = variables["cluster"]
    assert cluster["definition"] == "label_values(auditor_audit_gpu_hours, cluster)"
    assert cluster["multi"] is True
    assert cluster["includeAll"] is True
    assert 'cluster=~"$cluster"' in variables["team"]["definition"]
    selectors = [
        (where, m.group(1), m.group(2) or "")
        for where, expr in panel_queries()
        if where != "variable cluster"
        for m in SELECTOR.finditer(expr)
    ]
    assert selectors
    unfiltered = [(w, n) for w, n, labels in selectors if 'cluster=~"$cluster"' not in labels]
    assert unfiltered == []


AGGREGATION = re.compile(r"\b(?:sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\)\s*)?\((.*)")
"""An aggregation, its `by` labels (None: all merged) and what follows it."""


def test_no_panel_nor_alert_merges_two_clusters_shares_or_ages() -> None:
    """A ratio or a timestamp of two clusters does not add up: wherever one is aggregated,
    the cluster is kept (one series per cluster); GPU-hours may be added over clusters."""
    queries = [*panel_queries()] + [
        (f"alert {r['alert']}", str(r["expr"])) for g in rule_groups()["groups"] for r in g["rules"]
    ]
    merged = []
    for where, expr in queries:
        for m in AGGREGATION.finditer(expr):
            by = {label.strip() for label in (m.group(1) or "").split(",")}
            inner = SELECTOR.search(m.group(2))
            assert inner is not None, (where, expr)
            name = inner.group(1)
            if name.endswith(("_ratio", "_seconds")) and "cluster" not in by:
                merged.append((where, name))
    assert merged == []


def test_rules_and_dashboard_name_only_metrics_the_auditor_exports() -> None:
    served = exported()
    used = {
        f"alert {r['alert']}": metric_names(r["expr"])
        for g in rule_groups()["groups"]
        for r in g["rules"]
    } | {where: metric_names(grafana_free(expr)) for where, expr in panel_queries()}

    unknown = {where: names - served for where, names in used.items() if names - served}

    assert unknown == {}
    assert all(used.values())  # each query reads some metric
    assert "auditor_sampler_last_pass_timestamp_seconds" in served
    assert "auditor_audit_gpu_hours" in served


# ------------------------------------------------------------ finance to an object store


@pytest.mark.parametrize("case", CASES)
def test_the_finance_job_reaches_the_object_store_and_takes_its_url_from_config(
    case: str,
) -> None:
    objs = objects(case, "finance.objectStore.enabled=true")
    cluster = cluster_of(objs)
    found = workloads_of(objs)
    (finance,) = [w for w in found if w.component == "finance"]
    store = values(case)["finance"]["objectStore"]

    if store["cidrs"]:
        inside = store["cidrs"][0].split("/")[0]
        assert connects(cluster, finance.pod, Endpoint.outside(inside), port=443)
        assert not connects(cluster, finance.pod, ELSEWHERE, port=443)
    else:
        assert connects(cluster, finance.pod, ELSEWHERE, port=443)
    # the documented trade-off: 443 to any address includes the API server's Service
    # port (the finance pod mounts no token); narrow it with finance.objectStore.cidrs
    needs = needs_of(case, found)
    for w in found:
        if w.component == "postgres":
            continue
        got = problems(cluster, w, needs)
        wide = w is finance and not store["cidrs"]
        assert got == (["API server allowed (TCP 443)"] if wide else []), w.name
    (cron,) = the(objs, "CronJob", "auditor-finance")
    container = pod_template(cron)["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    ref = env["AUDITOR_FINANCE_OUT"]["valueFrom"]["configMapKeyRef"]
    (config,) = [c for c in the(objs, "ConfigMap") if c["metadata"]["name"] == ref["name"]]
    assert config["data"][ref["key"]] == values(case)["finance"]["out"]
    assert container["envFrom"] == [{"secretRef": {"name": store["secretName"], "optional": True}}]


def test_without_the_object_store_the_finance_job_has_no_credentials_nor_egress() -> None:
    objs = objects("external-db")
    (cron,) = the(objs, "CronJob", "auditor-finance")
    assert "envFrom" not in pod_template(cron)["spec"]["containers"][0]
    assert the(objs, "NetworkPolicy", "finance-object-store") == []
