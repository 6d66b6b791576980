"""The overlays under manifests/ rendered offline with `kubectl kustomize`, for the manifest
and NetworkPolicy tests: the tool lookup (skipped where missing, failed under CI), the
rendered objects, and the pod template of each workload.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ["postgres", "external-db", "sharded"]
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")


def tool(name: str, *extra: Path) -> str:
    for candidate in (Path(sys.executable).parent / name, *extra):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{name} is required under CI (see .ci/run)")
    pytest.skip(f"{name} is not installed (pip install '.[test]'; checkov: .ci/run)")


def render(kustomization: Path) -> str:
    """`kubectl kustomize` of a directory."""
    out = subprocess.run(
        [tool("kubectl"), "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


@cache
def rendered(overlay: str) -> str:
    return render(ROOT / "manifests" / "overlays" / overlay)


def objects(overlay: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered(overlay)) if d]


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


def workloads(overlay: str) -> list[dict[str, Any]]:
    return [o for o in objects(overlay) if o["kind"] in WORKLOADS]
