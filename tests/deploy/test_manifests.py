"""The chart rendered offline for every documented setup (charts/auditor/ci/) and checked:
`helm lint --strict` under helm 4 and helm 3, the same objects from both, the schema of the
values (a wrong type or an unknown key is refused), strict schema validation of the objects,
checkov, RBAC, Pod Security, what a real cluster needs of the sampler (its RuntimeClass,
PriorityClass and nodes), the configuration file as the auditor reads it, every container's
args as the real CLI parses them, and manifests/ as the chart's output.

helm comes from .tools/helm/bin (.ci/run, .ci/helm.py), kubectl and kubernetes-validate from
the test extras, checkov from its own virtualenv `.tools/`. Where a tool is missing the test
is skipped, except under CI.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from chart import (
    CASES,
    CHART,
    CRD_KINDS,
    MANIFESTS,
    OBSERVABLE,
    ROOT,
    generated,
    helm,
    objects,
    parse,
    pod_spec,
    rendered,
    template,
    tool,
    values,
    values_file,
    workloads,
)

from auditor.cli import app
from auditor.settings import load_config

# the oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas
KUBERNETES = ["1.27.0", None]


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, cwd=cwd)


@pytest.mark.parametrize("major", [4, 3])
def test_helm_lint_strict_is_clean_for_the_defaults_and_every_case(major: int) -> None:
    binary = helm(major)
    for extra in [[], *(["-f", str(values_file(c))] for c in CASES)]:
        out = _run(binary, "lint", "--strict", str(CHART), *extra)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "[WARNING]" not in out.stdout, out.stdout
        assert "[ERROR]" not in out.stdout, out.stdout


def test_helm_3_renders_the_same_objects_as_helm_4() -> None:
    helm3 = helm(3)
    for case in CASES:
        assert parse(template(helm3, case)) == objects(case), case


def test_every_documented_setup_has_a_case() -> None:
    assert {"postgres", "external-db", "sharded", "observability", "device-plugin"} <= set(CASES)
    for case in CASES:
        comment = values_file(case).read_text().splitlines()[0]
        assert comment.startswith("# "), f"{case}: say what setup it is"


@pytest.mark.parametrize(
    ("bad", "refusal"),
    [
        ({"audit": {"shards": "4"}}, "/audit/shards"),
        ({"sampler": {"periodSeconds": "five"}}, "/sampler/periodSeconds"),
        ({"database": {"type": "sqlite"}}, "/database/type"),
        ({"watcher": {"replicas": 2}}, "replicas"),
        ({"config": {"prices": {"default": "2.50"}}}, "/config/prices/default"),
        ({"config": {"thresholds": {"idle_treshold_pct": 3}}}, "idle_treshold_pct"),
        ({"finance": {"out": "finance.csv"}}, "/finance/out"),
        ({"sampler": {"tolerations": [{"key": "a", "operator": "Equals"}]}}, "operator"),
        ({"cluster": "us east"}, "/cluster"),
        ({"cluster": "-east"}, "/cluster"),
    ],
)
def test_the_schema_refuses_a_wrong_value(
    bad: dict[str, Any], refusal: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad-values.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = _run(helm(), "template", "auditor", str(CHART), "-f", str(path))
    assert out.returncode != 0
    assert "schema" in out.stderr, out.stderr
    assert refusal in out.stderr, out.stderr


def test_the_schema_knows_every_threshold_and_share_kind() -> None:
    from dataclasses import fields

    from auditor.settings import SHARE_KINDS, Thresholds

    schema = json.loads((CHART / "values.schema.json").read_text())
    config = schema["properties"]["config"]["properties"]
    assert set(config["thresholds"]["properties"]) == {f.name for f in fields(Thresholds)}
    kinds = config["sharing"]["properties"]["resources"]["additionalProperties"]["enum"]
    assert kinds == list(SHARE_KINDS)


def test_the_manifests_are_the_charts_output() -> None:
    want = generated(helm())
    have = {p.stem: p.read_text() for p in MANIFESTS.glob("*.yaml")}
    stale = sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))
    assert stale == [], f"manifests/ {stale} differ: run .venv/bin/python tests/deploy/chart.py"


def test_the_observability_manifest_only_adds_objects() -> None:
    base = objects("external-db")
    both = objects("external-db", "observability.enabled=true")
    added = parse((MANIFESTS / "observability.yaml").read_text())
    assert sorted(map(json.dumps, both)) == sorted(map(json.dumps, base + added))
    assert {o["kind"] for o in added} == {
        "Service",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
    }


def test_every_case_validates_strictly(tmp_path: Path) -> None:
    """kubernetes-validate over every case, as it is and with the observability objects and
    the object store (each distinct object once), against the oldest supported Kubernetes
    and the newest, both runs at once; the Prometheus Operator's kinds are checked against
    their CRDs in test_observability.py."""
    paths = []
    for case in CASES:
        seen: dict[str, dict[str, Any]] = {}
        for obj in objects(case) + objects(case, *OBSERVABLE):
            if obj["kind"] not in CRD_KINDS:
                seen.setdefault(json.dumps(obj, sort_keys=True), obj)
        path = tmp_path / f"{case}.yaml"
        path.write_text(yaml.safe_dump_all(list(seen.values())))
        paths.append(str(path))
    validate = tool("kubernetes-validate")
    runs = [
        subprocess.Popen(
            [validate, "--strict", "--quiet", *(["-k", v] if v else []), *paths],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for v in KUBERNETES
    ]
    for version, run in zip(KUBERNETES, runs, strict=True):
        output, _ = run.communicate()
        assert run.returncode == 0, f"Kubernetes {version or 'newest'}: {output}"


def test_checkov_passes_every_case_with_every_skip_justified(tmp_path: Path) -> None:
    """One checkov run over every case (a directory of rendered files)."""
    checkov = tool("checkov", ROOT / ".tools" / "bin" / "checkov")
    for case in CASES:
        (tmp_path / f"{case}.yaml").write_text(rendered(case))
    out = _run(checkov, "--framework", "kubernetes", "-d", str(tmp_path), "--skip-download",
               "-o", "json")  # fmt: skip
    report = json.loads(out.stdout)
    failed = [
        (Path(c["file_path"]).stem, c["check_id"], c["resource"])
        for c in report["results"]["failed_checks"]
    ]
    assert failed == []
    assert report["summary"]["parsing_errors"] == 0
    passed_files = {Path(c["file_path"]).stem for c in report["results"]["passed_checks"]}
    assert passed_files == set(CASES)
    assert report["summary"]["passed"] > 100 * len(CASES)
    for check in report["results"]["skipped_checks"]:
        reason = check["check_result"].get("suppress_comment") or ""
        assert len(reason.split()) >= 5, f"{check['check_id']} on {check['resource']} unjustified"


@pytest.mark.parametrize("case", CASES)
def test_rbac_reads_pods_nodes_and_claims_and_nothing_else(case: str) -> None:
    objs = objects(case)
    main = values(case)["namespaces"]["main"]
    roles = [o for o in objs if o["kind"] in ("ClusterRole", "Role")]
    assert [r["metadata"]["name"] for r in roles] == ["gpu-auditor-watcher"]
    assert roles[0]["rules"] == [
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims", "resourceslices"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    bindings = [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert [b["subjects"] for b in bindings] == [
        [{"kind": "ServiceAccount", "name": "auditor-watcher", "namespace": main}]
    ]


@pytest.mark.parametrize("case", CASES)
def test_no_token_where_the_api_is_not_needed(case: str) -> None:
    for obj in workloads(case):
        mounted = pod_spec(obj).get("automountServiceAccountToken")
        name = obj["metadata"]["name"]
        assert mounted is (name == "auditor-watcher"), name
    for account in (o for o in objects(case) if o["kind"] == "ServiceAccount"):
        name = account["metadata"]["name"]
        assert account["automountServiceAccountToken"] is (name == "auditor-watcher"), name


@pytest.mark.parametrize("case", CASES)
def test_restricted_pod_security_everywhere_but_the_sampler(case: str) -> None:
    objs = objects(case)
    names = values(case)["namespaces"]
    levels = {
        o["metadata"]["name"]: o["metadata"]["labels"] for o in objs if o["kind"] == "Namespace"
    }
    assert levels[names["main"]]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert levels[names["node"]]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert levels[names["node"]]["pod-security.kubernetes.io/warn"] == "restricted"
    for obj in workloads(case):
        spec = pod_spec(obj)
        if obj["metadata"]["namespace"] == names["node"]:
            assert obj["metadata"]["name"] == "auditor-sampler"
            (c,) = spec["containers"]
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["privileged"] is False
            assert spec.get("hostPID", False) is values(case)["sampler"]["processUtil"]
            continue
        assert obj["metadata"]["namespace"] == names["main"]
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


@pytest.mark.parametrize("case", CASES)
def test_a_pod_that_writes_to_a_claimed_volume_owns_it_through_its_group(case: str) -> None:
    """A fresh PersistentVolume is owned by root on most provisioners: a non-root pod that
    mounts a claim read-write must set `fsGroup` (its own group), or its first write fails."""
    writers = []
    for obj in workloads(case):
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
    in_cluster = values(case)["database"]["type"] == "postgres"
    assert ("auditor-postgres" in writers) is in_cluster


@pytest.mark.parametrize("case", CASES)
def test_sampler_reads_gpus_without_taking_one(case: str) -> None:
    (sampler,) = [o for o in workloads(case) if o["kind"] == "DaemonSet"]
    spec = pod_spec(sampler)
    (container,) = spec["containers"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] is True
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert ("--process-util" in container["args"]) is values(case)["sampler"]["processUtil"]


# --- several clusters in one database --------------------------------------------------

WRITERS = {("DaemonSet", "auditor-sampler"), ("Deployment", "auditor-watcher")}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize(("sets", "want"), [((), "default"), (("cluster=east",), "east")])
def test_each_release_records_and_audits_its_own_cluster(sets: tuple[str, ...], want: str) -> None:
    """The sampler and the watcher record their data as the `cluster` value's, and the daily
    audit, sharded or not, audits that cluster alone (`auditor audit` without --cluster
    audits every cluster the database holds)."""
    for case in ("postgres", "sharded"):
        kinds = {(o["kind"], o["metadata"]["name"]): o for o in objects(case, *sets)}
        assert kinds.keys() >= WRITERS
        for key, obj in kinds.items():
            if obj["kind"] not in ("DaemonSet", "Deployment", "CronJob"):
                continue
            (container,) = pod_spec(obj)["containers"]
            assert _env(container).get("AUDITOR_CLUSTER") == want, key
        (audit,) = pod_spec(kinds[("CronJob", "auditor-audit")])["containers"]
        i = audit["args"].index("--cluster")
        assert audit["args"][i + 1] == "$(AUDITOR_CLUSTER)"  # Kubernetes substitutes it


def test_the_schema_takes_the_cluster_names_the_auditor_takes() -> None:
    from auditor.settings import CLUSTER_NAME

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["cluster"]["pattern"] == f"^{CLUSTER_NAME.pattern}$"
    assert values("postgres")["cluster"] == "default"


# --- what a real cluster needs of the sampler --------------------------------------------

# What the GPU stacks create (docs/deployment.md): the GPU Operator the RuntimeClass
# `nvidia`; the system priority classes exist in every cluster.
OUTSIDE_RUNTIME_CLASSES = {"nvidia"}
SYSTEM_PRIORITIES = {"system-node-critical", "system-cluster-critical"}


@pytest.mark.parametrize("case", CASES)
def test_every_class_a_pod_names_exists_or_is_documented(case: str) -> None:
    objs = objects(case)
    runtime_classes = {o["metadata"]["name"] for o in objs if o["kind"] == "RuntimeClass"}
    priorities = {o["metadata"]["name"]: o for o in objs if o["kind"] == "PriorityClass"}
    for obj in workloads(case):
        spec = pod_spec(obj)
        if "runtimeClassName" in spec:
            assert spec["runtimeClassName"] in runtime_classes | OUTSIDE_RUNTIME_CLASSES
        name = spec.get("priorityClassName")
        if name is not None:
            assert name in priorities or name in SYSTEM_PRIORITIES, name
        if name in priorities:
            # scheduled ahead of ordinary pods but never evicting one to get a place
            assert priorities[name]["preemptionPolicy"] == "Never"
            assert 0 < priorities[name]["value"] < 1_000_000_000
    for rc in (o for o in objs if o["kind"] == "RuntimeClass"):
        assert rc["handler"] == "nvidia"


@pytest.mark.parametrize("case", CASES)
def test_a_system_priority_outside_kube_system_comes_with_the_quota_that_admits_it(
    case: str,
) -> None:
    """GKE and other managed clusters admit system-node-critical and system-cluster-critical
    pods outside kube-system only in a namespace whose ResourceQuota covers that class."""
    objs = objects(case)
    for obj in workloads(case):
        name = pod_spec(obj).get("priorityClassName")
        namespace = obj["metadata"]["namespace"]
        if name not in SYSTEM_PRIORITIES or namespace == "kube-system":
            continue
        quotas = [
            q
            for q in objs
            if q["kind"] == "ResourceQuota"
            and q["metadata"]["namespace"] == namespace
            and {"scopeName": "PriorityClass", "operator": "In", "values": [name]}
            in q["spec"]["scopeSelector"]["matchExpressions"]
        ]
        assert quotas, f"{obj['metadata']['name']}: {name} in {namespace} without a quota"
        assert int(quotas[0]["spec"]["hard"]["pods"]) >= 1000


def test_the_default_sampler_priority_is_the_charts_own() -> None:
    (sampler,) = [o for o in workloads("postgres") if o["kind"] == "DaemonSet"]
    assert pod_spec(sampler)["priorityClassName"] == "gpu-auditor-sampler"
    (managed,) = [o for o in workloads("managed") if o["kind"] == "DaemonSet"]
    assert pod_spec(managed)["priorityClassName"] == "system-node-critical"
    assert not [o for o in objects("managed") if o["kind"] == "PriorityClass"]


def _term_matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    for expr in term.get("matchExpressions", []):
        key, op, vals = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in vals,
            "NotIn": labels.get(key) not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _schedules_on(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the pod's nodeSelector and required node affinity admit a node."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if not required:
        return True
    return any(_term_matches(t, labels) for t in required["nodeSelectorTerms"])


OPERATOR_NODE = {"nvidia.com/gpu.present": "true", "kubernetes.io/os": "linux"}
NFD_NODE = {"feature.node.kubernetes.io/pci-10de.present": "true"}
CPU_NODE = {"kubernetes.io/os": "linux", "feature.node.kubernetes.io/pci-8086.present": "true"}


@pytest.mark.parametrize(
    ("case", "node", "runs"),
    [
        ("postgres", OPERATOR_NODE, True),  # GPU Operator (its feature discovery)
        ("postgres", NFD_NODE, True),  # Node Feature Discovery with the device plugin
        ("postgres", CPU_NODE, False),
        ("device-plugin", {"example.com/gpu-node": ""}, True),  # labelled by hand
        ("device-plugin", OPERATOR_NODE, False),
        ("operator-runtimeclass", {"gpu": "on"}, True),  # HAMi's node label
    ],
)
def test_the_sampler_runs_on_gpu_nodes_alone(case: str, node: dict[str, str], runs: bool) -> None:
    (sampler,) = [o for o in workloads(case) if o["kind"] == "DaemonSet"]
    assert _schedules_on(pod_spec(sampler), node) is runs


def test_the_sampler_tolerates_the_gpu_taint_everywhere() -> None:
    for case in CASES:
        (sampler,) = [o for o in workloads(case) if o["kind"] == "DaemonSet"]
        taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        assert taint in pod_spec(sampler)["tolerations"], case


def test_the_runtime_class_follows_the_gpu_stack() -> None:
    def runtime(case: str) -> str | None:
        (sampler,) = [o for o in workloads(case) if o["kind"] == "DaemonSet"]
        name: str | None = pod_spec(sampler).get("runtimeClassName")
        return name

    assert runtime("postgres") == "nvidia"  # the GPU Operator's
    assert runtime("device-plugin") is None  # the NVIDIA runtime is containerd's default
    assert runtime("operator-runtimeclass") == "nvidia"
    assert [o["kind"] for o in objects("operator-runtimeclass") if o["kind"] == "RuntimeClass"]


# --- what the chart's values become ------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_the_config_file_loads_with_the_auditors_loader(case: str, tmp_path: Path) -> None:
    maps = [o for o in objects(case) if o["kind"] == "ConfigMap" and o["metadata"]["name"] ==
            "auditor-config"]  # fmt: skip
    names = values(case)["namespaces"]
    assert sorted(m["metadata"]["namespace"] for m in maps) == sorted(
        [names["main"], names["node"]]
    )
    texts = {m["data"]["config.toml"] for m in maps}
    assert len(texts) == 1
    path = tmp_path / "config.toml"
    path.write_text(texts.pop())
    config = load_config(path)
    wanted = values(case)["config"]
    assert tomllib.loads(path.read_text()) == json.loads(json.dumps(wanted))
    assert config.prices.currency == wanted["currency"]
    assert config.prices.default == wanted["prices"]["default"]
    assert config.retention.raw_days == wanted["retention"]["raw_days"]
    assert config.teams.namespace_teams == wanted["teams"].get("namespaces", {})


def test_prices_by_model_reach_the_auditor(tmp_path: Path) -> None:
    (cm, *_) = [o for o in objects("device-plugin") if o["metadata"]["name"] == "auditor-config"]
    path = tmp_path / "config.toml"
    path.write_text(cm["data"]["config.toml"])
    config = load_config(path)
    assert config.prices.for_model("NVIDIA H100 80GB HBM3") == 4.0
    assert config.prices.for_model("Tesla T4") == 2.0
    assert config.cost_centres == {"nlp": "CC-1001"}


@pytest.mark.parametrize("case", CASES)
def test_schedules_shards_images_and_the_database_secret_follow_the_values(case: str) -> None:
    v = values(case)
    cron = {o["metadata"]["name"]: o for o in objects(case) if o["kind"] == "CronJob"}
    for component in ("audit", "rollup", "finance"):
        spec = cron[f"auditor-{component}"]["spec"]
        assert spec["schedule"] == v[component]["schedule"]
        assert spec["timeZone"] == v[component]["timeZone"]
    audit_job = cron["auditor-audit"]["spec"]["jobTemplate"]["spec"]
    (audit,) = audit_job["template"]["spec"]["containers"]
    shards = v["audit"]["shards"]
    if shards > 1:
        assert audit_job["completionMode"] == "Indexed"
        assert audit_job["completions"] == audit_job["parallelism"] == shards
        assert audit["args"][-2:] == ["--shard", f"$(JOB_COMPLETION_INDEX)/{shards}"]
    else:
        assert "completionMode" not in audit_job
        assert "--shard" not in audit["args"]
    external = v["database"]["type"] == "external"
    secret = (
        v["database"]["external"] if external else {"secretName": "auditor-db", "secretKey": "url"}
    )
    image = v["image"]
    for obj in workloads(case):
        spec = pod_spec(obj)
        for c in spec["containers"]:
            if c["name"] == "postgres":
                continue
            if image["digest"]:
                assert c["image"] == f"{image['repository']}@{image['digest']}"
                assert "CKV_K8S_43" not in json.dumps(obj["metadata"].get("annotations", {}))
            else:
                assert c["image"] == f"{image['repository']}:{image['tag'] or '0.1.0'}"
            (db,) = [vol for vol in spec["volumes"] if vol["name"] == "db"]
            assert db["secret"] == {
                "secretName": secret["secretName"],
                "items": [{"key": secret["secretKey"], "path": "url"}],
            }
        assert spec.get("imagePullSecrets", []) == (
            [] if obj["kind"] == "StatefulSet" else v["imagePullSecrets"]
        )


def test_the_in_cluster_database_secret_is_in_both_namespaces_with_one_password() -> None:
    secrets = [o for o in objects("postgres") if o["kind"] == "Secret"]
    urls = {s["metadata"]["namespace"]: s["stringData"]["url"] for s in secrets
            if s["metadata"]["name"] == "auditor-db"}  # fmt: skip
    assert set(urls) == {"gpu-auditor", "gpu-auditor-node"}
    (pg,) = [s for s in secrets if s["metadata"]["name"] == "auditor-postgres"]
    password = pg["stringData"]["POSTGRES_PASSWORD"]
    assert set(urls.values()) == {
        f"postgresql://auditor:{password}@auditor-postgres.gpu-auditor.svc:5432/auditor"
    }


def test_without_a_password_one_is_generated_and_differs_per_render() -> None:
    def password() -> str:
        objs = parse(template(helm(), "postgres", "database.postgres.password="))
        (pg,) = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] ==
                 "auditor-postgres"]  # fmt: skip
        return str(pg["stringData"]["POSTGRES_PASSWORD"])

    first, second = password(), password()
    assert len(first) == 32
    assert first != second


def test_the_migration_runs_after_install_and_before_each_upgrade() -> None:
    (job,) = [o for o in objects("postgres") if o["kind"] == "Job"]
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation"


def test_what_holds_data_is_kept_on_uninstall() -> None:
    for obj in objects("postgres"):
        if obj["kind"] in ("Namespace", "PersistentVolumeClaim"):
            assert obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_the_sampler_can_be_left_out() -> None:
    objs = objects("postgres", "sampler.enabled=false")
    kinds = {o["kind"] for o in objs}
    assert "DaemonSet" not in kinds
    assert "PriorityClass" not in kinds
    assert {o["kind"] for o in objects("postgres")} - kinds == {"DaemonSet", "PriorityClass"}


def test_namespaces_created_elsewhere_are_left_alone() -> None:
    objs = objects("postgres", "namespaces.create=false")
    assert not [o for o in objs if o["kind"] == "Namespace"]
    assert len(objs) == len(objects("postgres")) - 2


# --- every container's args, as the real CLI parses them ----------------------------------


def _env_value(match: re.Match[str]) -> str:
    """What Kubernetes substitutes for $(VAR) in a container's args."""
    return {
        "$(NODE_NAME)": "gpu-node-1",
        "$(JOB_COMPLETION_INDEX)": "0",
        "$(AUDITOR_CLUSTER)": "east",
    }[match.group(0)]


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


@pytest.mark.parametrize("case", CASES)
def test_every_container_args_parse_with_the_real_cli(case: str) -> None:
    seen = 0
    for obj in workloads(case):
        for c in pod_spec(obj)["containers"]:
            if c["name"] == "postgres":
                continue
            args = [re.sub(r"\$\([A-Z_]+\)", _env_value, a) for a in c["args"]]
            _parse(args)
            seen += 1
    assert seen == 6


def test_a_bad_flag_is_caught_by_the_parse_check() -> None:
    with pytest.raises(Exception, match="No such option"):
        _parse(["audit", "--dya", "yesterday"])


def test_kustomize_users_can_build_on_the_manifests(tmp_path: Path) -> None:
    """The documented way to change the plain manifests without helm: a kustomization of
    one's own over manifests/<setup>.yaml (here: one's own image)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "external-db.yaml").write_text((MANIFESTS / "external-db.yaml").read_text())
    (mine / "kustomization.yaml").write_text(
        "resources: [external-db.yaml]\n"
        "images:\n  - name: ghcr.io/gpu-waste-auditor/auditor\n"
        "    newName: registry.example/auditor\n    newTag: '0.1.1'\n"
    )
    out = _run(tool("kubectl"), "kustomize", str(mine))
    assert out.returncode == 0, out.stderr
    images = {c["image"] for o in parse(out.stdout) if o["kind"] in ("Deployment", "DaemonSet",
              "CronJob", "Job") for c in pod_spec(o)["containers"]}  # fmt: skip
    assert images == {"registry.example/auditor:0.1.1"}
