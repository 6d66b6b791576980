"""What counts as a GPU pod waiting to be scheduled, why, and for which card (SPEC §10), and
what a node observation says of its outages: decision tables over the API's shapes, and
the real shapes of tests/fixtures/waits (SOURCE.md) through the kubectl reader."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from auditor.collect.kubectl_json import read_kubectl_json
from auditor.collect.nodes import node_row
from auditor.collect.pod_records import pod_record
from auditor.collect.pod_times import parse_time
from auditor.collect.pod_waits import bounded_message, pod_wait, wanted_model
from auditor.limits import MESSAGE_MAX
from auditor.model import NodeState, PodRecord
from auditor.settings import TeamRules

WAITS = Path(__file__).parents[1] / "fixtures" / "waits"
TEAMS = TeamRules()
GATE = {"name": "kueue.x-k8s.io/admission"}


def ms(text: str) -> int:
    got = parse_time(text, field="t")
    assert got is not None
    return got


def cond(status: str, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"type": "PodScheduled", "status": status,
                         "lastTransitionTime": "2025-11-03T08:00:01Z"}  # fmt: skip
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    return c


@pytest.mark.parametrize(
    ("spec", "status", "meta", "want"),
    [
        # bound or ended: not waiting, whatever else it says
        ({"nodeName": "n1"}, {"conditions": [cond("False", "Unschedulable", "x")]}, {}, None),
        ({}, {"conditions": [cond("True")]}, {}, None),
        ({}, {"phase": "Failed", "conditions": [cond("False", "Unschedulable")]}, {}, None),
        ({}, {"phase": "Succeeded"}, {}, None),
        # the scheduler said no
        ({}, {"phase": "Pending", "conditions": [cond("False", "Unschedulable", "0/3 nodes")]},
         {}, ("Unschedulable", "0/3 nodes")),
        # held by a queue: Kueue's gate, any gate, the API server's gated condition
        ({"schedulingGates": [GATE]}, {"phase": "Pending"}, {},
         ("SchedulingGated", "held by scheduling gates: kueue.x-k8s.io/admission")),
        ({"schedulingGates": [GATE, {"name": "example.com/quota"}]},
         {"conditions": [cond("False", "Unschedulable", "stale")]}, {},
         ("SchedulingGated",
          "held by scheduling gates: kueue.x-k8s.io/admission, example.com/quota")),
        ({}, {"conditions": [cond("False", "SchedulingGated", "Scheduling is blocked")]}, {},
         ("SchedulingGated", "Scheduling is blocked")),
        # a gang scheduler's pod group: by annotation, label or scheduler name
        ({}, {"phase": "Pending"}, {"annotations": {"scheduling.k8s.io/group-name": "pg-1"}},
         ("PodGroup", "waiting for pod group pg-1")),
        ({}, {"phase": "Pending"}, {"annotations": {"pod-group-name": "kai-pg"}},
         ("PodGroup", "waiting for pod group kai-pg")),
        ({}, {"phase": "Pending"}, {"labels": {"scheduling.x-k8s.io/pod-group": "cos"}},
         ("PodGroup", "waiting for pod group cos")),
        ({"schedulerName": "kai-scheduler"}, {"phase": "Pending"}, {}, ("PodGroup", None)),
        ({"schedulerName": "volcano"},
         {"conditions": [cond("False", "Unschedulable", "pod group is not ready")]}, {},
         ("Unschedulable", "pod group is not ready")),
        # not judged yet, or refused for a reason that is no wait for a card
        ({}, {"phase": "Pending"}, {}, None),
        ({}, {"conditions": [cond("False", "SchedulerError", "volume binding")]}, {}, None),
        ({"schedulerName": "default-scheduler"}, {}, {}, None),
    ],
)  # fmt: skip
def test_what_counts_as_waiting(
    spec: dict[str, Any], status: dict[str, Any], meta: dict[str, Any], want: Any
) -> None:
    got = pod_wait(
        spec=spec,
        status=status,
        labels=meta.get("labels", {}),
        annotations=meta.get("annotations", {}),
    )
    assert (None if got.reason is None else (got.reason, got.message)) == want


def affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}  # fmt: skip


def expr(op: str, *values: str, key: str = "nvidia.com/gpu.product") -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ({}, None),
        ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
         "NVIDIA-A100-SXM4-80GB"),
        ({"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-l4"}}, "nvidia-l4"),
        ({"nodeSelector": {"pool": "gpu"}}, None),
        (affinity([expr("In", "NVIDIA-H100-80GB-HBM3")]), "NVIDIA-H100-80GB-HBM3"),
        (affinity([expr("In", "A", "B")]), None),  # either: any of two kinds is no one kind
        (affinity([expr("In", "A", "B"), expr("In", "B", "C")]), "B"),  # ANDed in a term
        (affinity([expr("In", "A")], [expr("In", "A")]), "A"),
        (affinity([expr("In", "A")], [expr("In", "B")]), None),  # ORed terms
        (affinity([expr("In", "A")], [expr("Exists", key="zone")]), None),  # a term of any
        (affinity([expr("NotIn", "A")]), None),
        ({"affinity": "garbage"}, None),
    ],
)  # fmt: skip
def test_the_card_a_pod_asks_for(spec: dict[str, Any], want: str | None) -> None:
    assert wanted_model(spec) == want


def test_messages_are_bounded_on_a_whole_word_and_keep_no_secret() -> None:
    long = "0/400 nodes are available: " + ", ".join(
        f"{i} node(s) had untolerated taint {{pool-{i}: true}}" for i in range(40)
    )
    got = bounded_message(long)
    assert got is not None
    assert len(got) <= MESSAGE_MAX
    assert got.endswith("…")
    assert long.startswith(got[:-1])
    assert long[len(got) - 1] in " ,"  # cut between words
    assert bounded_message("pull failed: token=s3cr3t  at\nhttps://u:pw@reg.example/x") == (
        "pull failed: token=*** at https://u:***@reg.example/x"
    )
    assert bounded_message("") is None


def pods_of(path: Path, seen_ms: int = 7) -> dict[str, PodRecord]:
    records = read_kubectl_json(path, teams=TEAMS, node_ms=seen_ms)
    return {r.name: r for r in records if isinstance(r, PodRecord)}


def test_real_shapes_of_waiting_pods_are_read() -> None:
    got = pods_of(WAITS / "pending-pods.json", seen_ms=ms("2025-11-03T09:00:00Z"))
    assert sorted(got) == [
        "llm-pretrain-worker-0",
        "mnist-gang-worker-1",
        "triton-inference-server-5b6c7f889c-f54c6",
        "triton-inference-server-5b6c7f889c-q7m2x",
    ]  # the CPU pod is dropped, pending or not
    triton = got["triton-inference-server-5b6c7f889c-f54c6"]
    assert (triton.wait_reason, triton.wanted_model) == ("Unschedulable", "NVIDIA-A100-SXM4-80GB")
    assert triton.wait_message is not None
    assert triton.wait_message.startswith("0/12 nodes are available: 3 Insufficient nvidia.com/gpu")
    seen = ms("2025-11-03T09:00:00Z")
    assert (triton.node, triton.bound_ms, triton.wait_seen_ms) == (None, None, seen)
    kueue = got["llm-pretrain-worker-0"]
    assert (kueue.wait_reason, kueue.wait_message, kueue.wanted_model, kueue.gpu_count) == (
        "SchedulingGated",
        "held by scheduling gates: kueue.x-k8s.io/admission",
        "NVIDIA-H100-80GB-HBM3",
        8,
    )
    gang = got["mnist-gang-worker-1"]
    assert (gang.wait_reason, gang.wait_message, gang.wanted_model) == (
        "PodGroup", "waiting for pod group mnist-gang-9c1d0e9f", None,
    )  # fmt: skip
    running = got["triton-inference-server-5b6c7f889c-q7m2x"]
    assert (running.wait_reason, running.wait_seen_ms) == (None, None)
    assert running.bound_ms == ms("2025-11-02T12:00:01Z")


def test_a_bound_observation_carries_no_wait_even_with_an_old_condition() -> None:
    doc = json.loads((WAITS / "pending-pods.json").read_text())
    pod = copy.deepcopy(doc["items"][0])
    pod["spec"]["nodeName"] = "gpu-a100-pool-7f2c1-01"
    pod["status"]["conditions"].append(
        {"type": "Ready", "status": "False", "lastTransitionTime": "2025-11-03T08:05:00Z"}
    )
    rec = pod_record(pod, teams=TEAMS, seen_ms=9)
    assert rec is not None
    assert (rec.wait_reason, rec.wait_seen_ms) == (None, None)
    assert rec.bound_ms is not None  # placed by nodeName: holds, waits not


def states_of(path: Path, node_ms: int) -> list[NodeState]:
    rows = [r for r in read_kubectl_json(path, teams=TEAMS, node_ms=node_ms) if isinstance(r, dict)]
    return [r["state"] for r in rows]


def test_node_outages_from_real_node_shapes() -> None:
    now = ms("2025-11-03T10:00:00Z")
    got = {s.node: s for s in states_of(WAITS / "nodes-outages.json", now)}
    assert got["gpu-a100-pool-7f2c1-02"].outages == {"cordoned": ms("2025-11-03T06:15:42Z")}
    assert got["gpu-a100-pool-7f2c1-03"].outages == {"not_ready": ms("2025-11-03T07:42:10Z")}
    # the kubelet's last heartbeat dates an observation in a file, not the file's time
    assert got["gpu-a100-pool-7f2c1-03"].seen_ms == ms("2025-11-03T07:41:20Z")
    assert got["gpu-h100-pool-2e91d-04"].outages == {"short": ms("2025-11-03T09:58:12Z")}
    healthy = got["gpu-h100-pool-2e91d-03"]
    assert (healthy.outages, healthy.ready_since_ms) == ({}, ms("2025-10-28T14:03:30Z"))


@pytest.mark.parametrize(
    ("spec", "ready", "capacity", "want"),
    [
        ({"unschedulable": True}, "True", "8", {"cordoned": 50}),
        ({"taints": [{"key": "node.kubernetes.io/unschedulable", "timeAdded": "bad"}]},
         "True", "8", {"cordoned": 50}),
        ({"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unschedulable",
          "effect": "NoSchedule", "timeAdded": "1970-01-01T00:00:00.020Z"}]},
         "True", "8", {"cordoned": 20}),
        ({}, "False", "8", {"not_ready": 10}),
        ({}, "Unknown", "8", {"not_ready": 10}),
        ({}, None, "8", {}),  # no Ready condition: no signal, no outage
        ({}, "True", "9", {"short": 50}),
        ({"unschedulable": True}, "False", "9", {"cordoned": 50, "not_ready": 10, "short": 50}),
    ],
)  # fmt: skip
def test_node_state_decisions(
    spec: dict[str, Any], ready: str | None, capacity: str, want: dict[str, int]
) -> None:
    conditions = (
        []
        if ready is None
        else [{"type": "Ready", "status": ready, "lastTransitionTime": "1970-01-01T00:00:00.010Z"}]
    )
    obj = {
        "metadata": {"name": "n"},
        "spec": spec,
        "status": {
            "capacity": {"nvidia.com/gpu": capacity},
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": conditions,
        },
    }
    assert node_row(obj, at_ms=50)["state"].outages == want
