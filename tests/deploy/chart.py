"""The chart charts/auditor rendered offline with `helm template`, for the deploy tests, and
the plain manifests under manifests/ generated from it.

The chart is the one source of the Kubernetes objects. Each documented setup is a values file
`charts/auditor/ci/<case>-values.yaml` (chart-testing's convention); the tests render every
case. manifests/ holds the output of some of them for `kubectl apply` without helm; a test
regenerates them and fails on any difference. After changing the chart, regenerate with

    .venv/bin/python tests/deploy/chart.py

Tools: helm 4 (`helm`) and helm 3 (`helm3`) under .tools/helm/bin (.ci/run installs both,
.ci/helm.py), kubernetes-validate and kubectl from the test extras, checkov in `.tools/`.
Where one is missing the test is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "auditor"
MANIFESTS = ROOT / "manifests"
HELM_BIN = ROOT / ".tools" / "helm" / "bin"
RELEASE = "auditor"
CASES = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")
# the optional objects: observability and the finance export to an object store
OBSERVABLE = ("observability.enabled=true", "finance.objectStore.enabled=true")
CRD_KINDS = {"ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}
# manifests/<name>.yaml: the case it is rendered from, and extra `--set`s
GENERATED: dict[str, tuple[str, tuple[str, ...]]] = {
    "postgres": ("postgres", ()),
    "external-db": ("external-db", ()),
    "sharded": ("sharded", ()),
}
# manifests/observability.yaml: what observability.enabled adds to external-db, alone
ADDON = ("observability", "external-db", ("observability.enabled=true",))
HEADER = (
    "# Generated from charts/auditor by tests/deploy/chart.py (helm template {release} "
    "charts/auditor -f charts/auditor/ci/{case}-values.yaml{sets}): do not edit; change the "
    "chart and regenerate.\n"
)


class ToolMissing(Exception):
    pass


def find_tool(name: str, *extra: Path) -> str:
    for candidate in (Path(sys.executable).parent / name, *extra):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise ToolMissing(f"{name} is not installed (pip install '.[test]'; helm, checkov: .ci/run)")


def tool(name: str, *extra: Path) -> str:
    """A tool's path; skips the test where it is missing, fails it under CI."""
    import pytest

    try:
        return find_tool(name, *extra)
    except ToolMissing as e:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is required under CI (see .ci/run)")
        pytest.skip(str(e))


def helm(major: int = 4) -> str:
    name = "helm" if major == 4 else f"helm{major}"
    return tool(name, HELM_BIN / name)


def values_file(case: str) -> Path:
    return CHART / "ci" / f"{case}-values.yaml"


def template(binary: str, case: str, *sets: str, check: bool = True) -> str:
    args = [binary, "template", RELEASE, str(CHART), "-f", str(values_file(case))]
    for s in sets:  # "json:key=JSON" for --set-json
        args += ["--set-json", s[5:]] if s.startswith("json:") else ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise AssertionError(out.stderr)
    return out.stdout


@cache
def rendered(case: str, *sets: str) -> str:
    return template(helm(), case, *sets)


def parse(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def objects(case: str, *sets: str) -> list[dict[str, Any]]:
    """The objects of a case, a fresh copy each call (tests may change them)."""
    return copy.deepcopy(_objects(case, *sets))


@cache
def _objects(case: str, *sets: str) -> list[dict[str, Any]]:
    return parse(rendered(case, *sets))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@cache
def _values(case: str) -> dict[str, Any]:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return _merge(defaults, yaml.safe_load(values_file(case).read_text()) or {})


def values(case: str) -> dict[str, Any]:
    """The values a case renders with (the chart's defaults, then the case's file)."""
    return copy.deepcopy(_values(case))


def pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod template (metadata and spec) of a workload."""
    if obj["kind"] == "CronJob":
        template: dict[str, Any] = obj["spec"]["jobTemplate"]["spec"]["template"]
        return template
    template = obj["spec"]["template"]
    return template


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = pod_template(obj)["spec"]
    return spec


def workloads(case: str) -> list[dict[str, Any]]:
    return [o for o in objects(case) if o["kind"] in WORKLOADS]


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def documents(text: str) -> list[str]:
    """The YAML documents of helm's output as text (comments kept), empty ones left out."""
    chunks = "\n".join(line if line != "---" else "\0" for line in text.splitlines()).split("\0")
    return [c for c in chunks if parse(c)]


def generated(binary: str) -> dict[str, str]:
    """manifests/<name>.yaml as the chart renders them now."""
    out = {}
    for name, (case, sets) in GENERATED.items():
        header = HEADER.format(
            release=RELEASE, case=case, sets="".join(f" --set {s}" for s in sets)
        )
        out[name] = header + template(binary, case, *sets)
    name, case, sets = ADDON
    base = {key(o) for o in parse(template(binary, case))}
    added = [d for d in documents(template(binary, case, *sets)) if key(parse(d)[0]) not in base]
    header = HEADER.format(release=RELEASE, case=case, sets="".join(f" --set {s}" for s in sets))
    out[name] = (
        header
        + f"# Only what this adds to manifests/{case}.yaml (or to either of the others):"
        + " apply it beside one.\n"
        + "".join(f"---\n{d.strip()}\n" for d in added)
    )
    return out


def write_manifests() -> None:
    binary = find_tool("helm", HELM_BIN / "helm")
    MANIFESTS.mkdir(exist_ok=True)
    for name, text in generated(binary).items():
        (MANIFESTS / f"{name}.yaml").write_text(text)
        print(f"wrote manifests/{name}.yaml", file=sys.stderr)


if __name__ == "__main__":
    write_manifests()
