"""Writers of the real input formats: `nvidia-smi --query-gpu ... --format=csv -l 5` output
per node, and `kubectl get pods -A -o json`.

The CSV is what nvidia-smi prints: one header, then at each tick a row per GPU with its own
millisecond timestamp in UTC; when the sampler restarts after an outage, nvidia-smi starts
over and prints its header again. The JSON is a `v1 List` of Pods with keys sorted, as kubectl
prints unstructured objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor.simulate.plan import Ending, Namer, PodPlan
from auditor.simulate.telemetry import REASON_CODES, Telemetry
from auditor.simulate.utilisation import Frames

NVIDIA_SMI_FIELDS = (
    "timestamp,index,uuid,name,utilization.gpu,memory.used,memory.total,"
    "power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active"
)
NVIDIA_SMI_HEADER = (
    "timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], "
    "memory.total [MiB], power.draw [W], clocks.sm [MHz], temperature.gpu, "
    "clocks_event_reasons.active"
)
REASON_TEXT = tuple(f"0x{code:016X}" for code in REASON_CODES)


Strings = npt.NDArray[np.object_]


def _smi_times(ms: np.ndarray) -> Strings:
    """'2026/11/23 08:00:05.123' for each epoch millisecond: the second's text looked up
    from the distinct seconds, then the milliseconds from a table."""
    seconds, where = np.unique(ms // 1000, return_inverse=True)
    iso = np.datetime_as_string(seconds.astype("datetime64[s]"), unit="s")
    codes = iso.view(np.uint32).reshape(iso.size, -1).copy()
    codes[:, 4] = codes[:, 7] = ord("/")
    codes[:, 10] = ord(" ")
    text = codes.view(f"<U{codes.shape[1]}").ravel().astype(object)
    millis = np.array([f".{i:03d}, " for i in range(1000)], dtype=object)
    out: Strings = text[where.ravel()] + millis[ms % 1000]
    return out


@cache
def _table(template: str, size: int) -> Strings:
    """`template` formatted for every integer below `size` (cells repeat; look them up)."""
    return np.array([template.format(i) for i in range(size)], dtype=object)


@cache
def _power_table(size: int) -> Strings:
    return np.array([f"{i // 100}.{i % 100:02d} W, " for i in range(size)], dtype=object)


def _cells(values: np.ndarray, table: Strings) -> Strings:
    if values.size and (int(values.min()) < 0 or int(values.max()) >= table.size):
        raise ValueError("a value outside what the CSV writer expects")
    cells: Strings = table[values]
    return cells


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """The cards of one node: their rows in the frames, indices and UUIDs."""

    rows: list[int]
    uuids: list[str]


def write_nvidia_smi(
    path: Path,
    *,
    gpus: NodeGpus,
    ts: np.ndarray,
    present: np.ndarray,
    frames: Frames,
    tele: Telemetry,
    gpu_model: str,
    memory_total_mib: int,
) -> int:
    """Write one node's CSV; returns the number of sample rows.

    Cells are looked up from tables of their possible texts and joined column by column
    (numpy object arrays), which is several times faster than formatting row by row.
    """
    ticks = np.flatnonzero(present)
    rows = np.array(gpus.rows)
    g = rows.size
    sel = (rows[None, :], ticks[:, None])  # tick-major, GPU-minor: nvidia-smi's order
    ident = np.array(
        [f"{i}, {uuid}, {gpu_model}, " for i, uuid in enumerate(gpus.uuids)], dtype=object
    )
    lines: Strings = _smi_times(ts[sel].ravel()) + np.tile(ident, ticks.size)
    lines += _cells(frames.util[sel].ravel(), _table("{} %, ", 101))
    mem_table = _table("{} MiB, " + f"{memory_total_mib} MiB, ", memory_total_mib + 1)
    lines += _cells(frames.mem[sel].ravel(), mem_table)
    lines += _cells(tele.power_cw[sel].ravel(), _power_table(100_001))
    lines += _cells(tele.clock_mhz[sel].ravel(), _table("{} MHz, ", 3001))
    lines += _cells(tele.temp_c[sel].ravel(), _table("{}, ", 128))
    lines += _cells(tele.reason[sel].ravel(), np.array(REASON_TEXT, dtype=object))
    out: list[str] = lines.tolist()
    restarts = np.flatnonzero(np.diff(ticks) > 1) + 1
    for pos in sorted(restarts.tolist(), reverse=True):
        out.insert(pos * g, NVIDIA_SMI_HEADER)
    out.insert(0, NVIDIA_SMI_HEADER)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return int(lines.size)


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class PodContext:
    """What a pod's JSON needs beyond its plan."""

    node_name: str | None
    host_ip: str
    pod_ip: str
    resource_version: int
    now_ms: int
    unschedulable: str = ""


def _container(
    name: str,
    image: str,
    *,
    gpus: int,
    cpu: str,
    memory: str,
    gpu_limits: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits = {"cpu": cpu, "memory": memory}
    if gpu_limits:
        limits.update(gpu_limits)
    elif gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    return {
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "name": name,
        "resources": {"limits": limits, "requests": dict(limits)},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def _terminated(namer: Namer, *, started: int, finished: int, code: int) -> dict[str, Any]:
    """A terminated container state. The kubelet never writes a container that finished
    before it started: a plan whose pod ended during its image pull starts it there."""
    reason = "Completed" if code == 0 else "Error"
    started = min(started, finished)
    return {
        "terminated": {
            "containerID": f"containerd://{namer.digest()}",
            "exitCode": code,
            "finishedAt": rfc3339(finished),
            "reason": reason,
            "startedAt": rfc3339(started),
        }
    }


def _status(pod: PodPlan, ctx: PodContext, namer: Namer) -> dict[str, Any]:
    if ctx.node_name is None:
        return {
            "conditions": [
                {
                    "lastProbeTime": None,
                    "lastTransitionTime": rfc3339(pod.created_ms + 1000),
                    "message": ctx.unschedulable,
                    "reason": "Unschedulable",
                    "status": "False",
                    "type": "PodScheduled",
                }
            ],
            "phase": "Pending",
            "qosClass": "Burstable",
        }
    ready_at = pod.started_ms
    running = pod.ending is Ending.OPEN
    main_code = 1 if pod.ending is Ending.FAILED else 0
    image_id = f"{pod.image.rsplit(':', 1)[0]}@sha256:{namer.digest()}"
    main: dict[str, Any] = {
        "image": pod.image,
        "imageID": image_id,
        "name": pod.container,
        "restartCount": pod.restarts,
        "ready": running,
        "started": running,
    }
    if running:
        if pod.restarts:
            crash = pod.started_ms + 3 * 3600_000
            main["lastState"] = _terminated(namer, started=pod.started_ms, finished=crash, code=137)
            main["lastState"]["terminated"]["reason"] = "OOMKilled"
            ready_at = crash + 10_000
        main["containerID"] = f"containerd://{namer.digest()}"
        main["state"] = {"running": {"startedAt": rfc3339(ready_at)}}
    else:
        assert pod.main_finished_ms is not None
        main["lastState"] = {}
        main["state"] = _terminated(
            namer, started=pod.started_ms, finished=pod.main_finished_ms, code=main_code
        )
    statuses = [main]
    phase = "Running" if running else ("Failed" if main_code else "Succeeded")
    extra: dict[str, Any] = {}
    if pod.sidecar:
        side: dict[str, Any] = {
            "image": "docker.io/istio/proxyv2:1.23.2",
            "name": pod.sidecar,
            "restartCount": 0,
            "ready": running,
            "started": running,
            "imageID": "docker.io/istio/proxyv2@sha256:" + namer.digest(),
        }
        if running or pod.finished_ms is None:
            side["state"] = {"running": {"startedAt": rfc3339(pod.bound_ms + 2000)}}
        else:
            side["state"] = _terminated(
                namer, started=pod.bound_ms + 2000, finished=pod.finished_ms, code=137
            )
            phase = "Failed"
            extra = {
                "message": "Pod was active on the node longer than the specified deadline",
                "reason": "DeadlineExceeded",
            }
        side["lastState"] = {}
        statuses.append(side)
    done_at = pod.finished_ms if pod.finished_ms is not None else ready_at
    conditions = [
        ("PodReadyToStartContainers", pod.bound_ms + 1000, "True", ""),
        ("Initialized", pod.bound_ms + (3000 if pod.init_container else 0), "True", ""),
        (
            "Ready",
            ready_at if running else done_at,
            "True" if running else "False",
            "" if running else "PodCompleted",
        ),
        (
            "ContainersReady",
            ready_at if running else done_at,
            "True" if running else "False",
            "" if running else "PodCompleted",
        ),
        ("PodScheduled", pod.bound_ms, "True", ""),
    ]
    status: dict[str, Any] = {
        "conditions": [
            {
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(at),
                "status": state,
                "type": kind,
                **({"reason": why} if why else {}),
            }
            for kind, at, state, why in conditions
        ],
        "containerStatuses": statuses,
        "hostIP": ctx.host_ip,
        "hostIPs": [{"ip": ctx.host_ip}],
        "phase": phase,
        "podIP": ctx.pod_ip,
        "podIPs": [{"ip": ctx.pod_ip}],
        "qosClass": "Burstable",
        "startTime": rfc3339(pod.bound_ms),
        **extra,
    }
    if pod.init_container:
        status["initContainerStatuses"] = [
            {
                "image": "docker.io/library/alpine:3.10",
                "imageID": "docker.io/library/alpine@sha256:" + namer.digest(),
                "lastState": {},
                "name": pod.init_container,
                "ready": True,
                "restartCount": 0,
                "started": False,
                "state": _terminated(
                    namer, started=pod.bound_ms + 1000, finished=pod.bound_ms + 3000, code=0
                ),
            }
        ]
    return status


def pod_object(pod: PodPlan, ctx: PodContext, namer: Namer) -> dict[str, Any]:
    """A Pod as `kubectl get pods -o json` shows it at `ctx.now_ms`."""
    owner = pod.owner
    metadata: dict[str, Any] = {
        "creationTimestamp": rfc3339(pod.created_ms),
        "labels": dict(pod.labels),
        "name": pod.name,
        "namespace": pod.namespace,
        "ownerReferences": [
            {
                "apiVersion": owner.api_version,
                "blockOwnerDeletion": True,
                "controller": True,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
            }
        ],
        "resourceVersion": str(ctx.resource_version),
        "uid": pod.uid,
    }
    if owner.kind in ("Job", "ReplicaSet", "DaemonSet"):
        metadata["generateName"] = pod.name[: pod.name.rfind("-") + 1]
    if pod.annotations:
        metadata["annotations"] = dict(pod.annotations)
    if pod.deleted_ms is not None and pod.deleted_ms <= ctx.now_ms:
        metadata["deletionGracePeriodSeconds"] = 30
        metadata["deletionTimestamp"] = rfc3339(pod.deleted_ms)
    containers = [
        _container(
            pod.container,
            pod.image,
            gpus=pod.gpus,
            cpu="8",
            memory="64Gi",
            gpu_limits=pod.gpu_limits,
        )
    ]
    if pod.sidecar:
        containers.append(
            _container(
                pod.sidecar, "docker.io/istio/proxyv2:1.23.2", gpus=0, cpu="500m", memory="512Mi"
            )
        )
    spec: dict[str, Any] = {
        "containers": containers,
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "restartPolicy": "Always" if owner.kind in ("ReplicaSet", "StatefulSet") else "Never",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    if ctx.node_name is not None:
        spec["nodeName"] = ctx.node_name
    if pod.init_container:
        spec["initContainers"] = [
            {
                "command": ["sh", "-c", "until nslookup $MASTER_ADDR; do sleep 2; done"],
                "image": "docker.io/library/alpine:3.10",
                "name": pod.init_container,
                "resources": {
                    "limits": {"cpu": "100m", "memory": "20Mi"},
                    "requests": {"cpu": "50m", "memory": "10Mi"},
                },
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": _status(pod, ctx, namer),
    }


def write_pod_list(path: Path, pods: list[dict[str, Any]]) -> None:
    ordered = sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    doc = {
        "apiVersion": "v1",
        "items": ordered,
        "kind": "List",
        "metadata": {"resourceVersion": ""},
    }
    path.write_text(json.dumps(doc, indent=4, sort_keys=True) + "\n", encoding="utf-8")


def node_object(
    name: str,
    *,
    labels: dict[str, str],
    resources: dict[str, str],
    created_ms: int,
    uid: str,
    annotations: dict[str, str] | None = None,
    cordoned_ms: int | None = None,
) -> dict[str, Any]:
    """A Node as `kubectl get nodes -o json` shows it: labels (GPU feature discovery's,
    the sharing labels of SPEC §7) and the GPU resources in capacity and allocatable; a node
    cordoned (`kubectl cordon`) since `cordoned_ms` is unschedulable and carries the taint
    the node controller adds, stamped with that time."""
    base = {"cpu": "96", "ephemeral-storage": "1843269236Ki", "memory": "1056462628Ki"}
    base["pods"] = "110"
    metadata: dict[str, Any] = {
        "creationTimestamp": rfc3339(created_ms),
        "labels": {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            **labels,
        },
        "name": name,
        "resourceVersion": "4099000",
        "uid": uid,
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {}
        if cordoned_ms is None
        else {
            "taints": [
                {
                    "effect": "NoSchedule",
                    "key": "node.kubernetes.io/unschedulable",
                    "timeAdded": rfc3339(cordoned_ms),
                }
            ],
            "unschedulable": True,
        },
        "status": {
            "allocatable": {**base, **resources},
            "capacity": {**base, **resources},
            "conditions": [
                {
                    "lastHeartbeatTime": rfc3339(created_ms),
                    "lastTransitionTime": rfc3339(created_ms),
                    "message": "kubelet is posting ready status",
                    "reason": "KubeletReady",
                    "status": "True",
                    "type": "Ready",
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.30.5",
                "operatingSystem": "linux",
            },
        },
    }


def write_node_list(path: Path, nodes: list[dict[str, Any]]) -> None:
    """`kubectl get nodes -o json`: a `v1 List` of Nodes, keys sorted."""
    doc = {
        "apiVersion": "v1",
        "items": sorted(nodes, key=lambda n: n["metadata"]["name"]),
        "kind": "List",
        "metadata": {"resourceVersion": ""},
    }
    path.write_text(json.dumps(doc, indent=4, sort_keys=True) + "\n", encoding="utf-8")


@dataclass(frozen=True, slots=True)
class Series:
    """One dcgm-exporter series: its labels and its samples (seconds, value)."""

    labels: dict[str, str]
    times_s: np.ndarray
    values: np.ndarray


def write_openmetrics(
    path: Path,
    families: dict[str, list[Series]],
    *,
    counters: frozenset[str] = frozenset(),
    precise: bool = False,
) -> int:
    """Gauges (and the `counters` families, whose samples are `<family>_total`) as
    OpenMetrics text, the input of `promtool tsdb create-blocks-from openmetrics`: each
    family's series together, samples in time order, `# EOF` last. Values have 6 significant
    digits, or as many as round-trip where `precise` (a counter's rate needs them all).
    Returns the sample lines written."""
    lines = 0
    with path.open("w", encoding="utf-8") as out:
        for name, series in families.items():
            kind = "counter" if name in counters else "gauge"
            sample = f"{name}_total" if kind == "counter" else name
            out.write(f"# TYPE {name} {kind}\n")
            for one in series:
                labels = ",".join(f'{k}="{v}"' for k, v in one.labels.items())
                head = f"{sample}{{{labels}}} "
                pairs = zip(one.times_s.tolist(), one.values.tolist(), strict=True)
                if precise:
                    body = [f"{head}{v!r} {t!r}\n" for t, v in pairs]
                else:
                    body = [f"{head}{v:.6g} {t}\n" for t, v in pairs]
                out.writelines(body)
                lines += len(body)
        out.write("# EOF\n")
    return lines


def write_watch_events(path: Path, events: list[tuple[str, dict[str, Any]]]) -> None:
    """`kubectl get pods -A -o json --watch --output-watch-events`: each event an indented
    JSON object `{"type": ..., "object": ...}`, back to back, keys sorted."""
    with path.open("w", encoding="utf-8") as out:
        for kind, obj in events:
            out.write(json.dumps({"object": obj, "type": kind}, indent=4, sort_keys=True) + "\n")
