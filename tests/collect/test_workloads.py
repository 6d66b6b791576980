"""The rules that turn one pod (API JSON) into a PodRecord: GPUs, times, team, job, rank, gang.

The controller fixtures under fixtures/pods/controllers are pods in the shapes the
controllers write them (owner references, labels, annotations, env).
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from auditor.collect.gpu_requests import gpu_request
from auditor.collect.pod_records import pod_record
from auditor.collect.pod_times import parse_time
from auditor.errors import PodFieldError
from auditor.model import PodRecord, WorkloadKind
from auditor.settings import TeamRules

CONTROLLERS = Path(__file__).parents[1] / "fixtures" / "pods" / "controllers"
TEAMS = TeamRules(namespace_teams={"research": "applied-research", "nlp": "language"})
OWN = "own gang"  # expected gang of an independent pod: pod/<uid>


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONTROLLERS / f"{name}.json").read_text())
    return data


def ms(text: str) -> int:
    """Epoch ms of an ISO time, computed independently of the code under test."""
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def record(pod: dict[str, Any], teams: TeamRules = TEAMS, **kw: Any) -> PodRecord:
    rec = pod_record(pod, teams=teams, **kw)
    assert rec is not None
    return rec


# ---------------------------------------------------------------------------------------------
# the decision table: one pod per controller


@pytest.mark.parametrize(
    ("fixture", "job", "job_kind", "rank", "gang", "workload", "team"),
    [
        # Kubernetes Indexed Job: independent pods; team from the `team` label
        ("job-indexed", "Job/eval-sweep", "Job", 3, OWN, WorkloadKind.BATCH, "evals"),
        # Kubeflow training operator: the job is the gang
        (
            "pytorchjob-master",
            "PyTorchJob/llama-ft",
            "PyTorchJob",
            0,
            "llm-train/PyTorchJob/llama-ft",
            WorkloadKind.TRAINING,
            "foundation-models",
        ),
        (
            "pytorchjob-worker",  # worker 1 is RANK 2 (master is 0); team: the namespace
            "PyTorchJob/llama-ft",
            "PyTorchJob",
            2,
            "llm-train/PyTorchJob/llama-ft",
            WorkloadKind.TRAINING,
            "llm-train",
        ),
        (
            "pytorchjob-legacy-worker",  # pre-1.0 labels; team from the namespace mapping
            "PyTorchJob/legacy-bert",
            "PyTorchJob",
            1,
            "nlp/PyTorchJob/legacy-bert",
            WorkloadKind.TRAINING,
            "language",
        ),
        (
            "tfjob-worker",
            "TFJob/resnet-tf",
            "TFJob",
            1,
            "vision/TFJob/resnet-tf",
            WorkloadKind.TRAINING,
            "vision",
        ),
        (
            "mpijob-worker",
            "MPIJob/bert-mpi",
            "MPIJob",
            1,
            "nlp/MPIJob/bert-mpi",
            WorkloadKind.TRAINING,
            "language",
        ),
        (
            "mpijob-launcher",  # owned by a batch Job, but part of the MPIJob; not a rank
            "MPIJob/bert-mpi",
            "MPIJob",
            None,
            "nlp/MPIJob/bert-mpi",
            WorkloadKind.TRAINING,
            "language",
        ),
        (
            "volcano-worker",
            "VolcanoJob/ddp-volcano",
            "VolcanoJob",
            1,
            "research/VolcanoJob/ddp-volcano",
            WorkloadKind.TRAINING,
            "applied-research",
        ),
        (
            "jobset-worker",  # owned by a batch Job that the JobSet owns
            "JobSet/pretrain",
            "JobSet",
            2,
            "research/JobSet/pretrain",
            WorkloadKind.TRAINING,
            "applied-research",
        ),
        (
            "trainjob-node",  # Kubeflow Trainer v2: a JobSet named after the TrainJob
            "TrainJob/qwen-sft",
            "TrainJob",
            1,
            "llm-train/TrainJob/qwen-sft",
            WorkloadKind.TRAINING,
            "llm-train",
        ),
        (
            "lws-worker",  # one LeaderWorkerSet group is a gang; team from the annotation
            "LeaderWorkerSet/vllm-70b",
            "LeaderWorkerSet",
            2,
            "serving/LeaderWorkerSet/vllm-70b/1",
            WorkloadKind.INFERENCE,
            "inference-platform",
        ),
        (
            "rayjob-worker",  # the gang is the Ray cluster, the job the RayJob
            "RayJob/tune-hpo",
            "RayJob",
            None,
            "recsys/RayCluster/tune-hpo-raycluster-x2k9d",
            WorkloadKind.TRAINING,
            "recsys",
        ),
        (
            "raycluster-head",
            "RayCluster/shared-ray",
            "RayCluster",
            None,
            "recsys/RayCluster/shared-ray",
            WorkloadKind.TRAINING,
            "recsys",
        ),
        # serving replicas are independent
        (
            "rayservice-worker",
            "RayService/sd-xl",
            "RayService",
            None,
            OWN,
            WorkloadKind.INFERENCE,
            "serving",
        ),
        (
            "deployment",
            "Deployment/llama3-8b-chat",
            "Deployment",
            None,
            OWN,
            WorkloadKind.INFERENCE,
            "chat",
        ),
        (
            "statefulset",
            "StatefulSet/triton-ensemble",
            "StatefulSet",
            1,
            OWN,
            WorkloadKind.INFERENCE,
            "serving",
        ),
        (
            "notebook",
            "Notebook/alice-gpu-nb",
            "Notebook",
            None,
            OWN,
            WorkloadKind.NOTEBOOK,
            "kubeflow-alice",
        ),
        (
            "bare-pod",
            "Pod/nccl-allreduce-test",
            "Pod",
            None,
            OWN,
            WorkloadKind.OTHER,
            "platform-debug",
        ),
        # forward compatible: an owner kind no rule knows is the job, each pod its own gang
        (
            "unknown-owner",
            "Workflow/finetune-pipeline-8xk2p",
            "Workflow",
            None,
            OWN,
            WorkloadKind.OTHER,
            "mlops",
        ),
    ],
)
def test_controller_decision_table(
    fixture: str,
    job: str,
    job_kind: str,
    rank: int | None,
    gang: str,
    workload: WorkloadKind,
    team: str,
) -> None:
    pod = load(fixture)
    rec = record(pod)
    expected_gang = f"pod/{pod['metadata']['uid']}" if gang == OWN else gang
    result = (rec.job, rec.job_kind, rec.rank, rec.gang, rec.workload, rec.team)
    assert result == (job, job_kind, rank, expected_gang, workload, team)


def test_team_label_and_annotation_keys_are_configurable() -> None:
    pod = load("bare-pod")
    pod["metadata"]["labels"]["acme.io/team"] = "networking"
    pod["metadata"]["annotations"] = {"acme.io/owner": "sre"}
    assert record(pod, TeamRules(label="acme.io/team")).team == "networking"
    assert record(pod, TeamRules(label="x", annotation="acme.io/owner")).team == "sre"
    mapped = TeamRules(label="x", annotation="y", namespace_teams={"platform-debug": "sre"})
    assert record(pod, mapped).team == "sre"
    assert record(pod, TeamRules(label="x", annotation="y")).team == "platform-debug"


def test_an_empty_team_label_falls_through_to_the_next_source() -> None:
    pod = load("deployment")
    pod["metadata"]["labels"]["team"] = ""
    assert record(pod).team == "serving"


# ---------------------------------------------------------------------------------------------
# rank and job fallbacks, when a controller's usual marks are missing


def test_pytorchjob_rank_without_rank_env_is_left_to_the_job() -> None:
    worker, master = load("pytorchjob-worker"), load("pytorchjob-master")
    for pod in (worker, master):
        pod["spec"]["containers"][0]["env"] = [
            e for e in pod["spec"]["containers"][0]["env"] if e["name"] != "RANK"
        ]
    assert record(worker).rank is None  # 1 or 2: only the job's pods tell (the store settles)
    assert record(master).rank == 0


def test_volcano_rank_from_the_pod_name_without_a_task_index() -> None:
    pod = load("volcano-worker")
    for section in ("labels", "annotations"):
        del pod["metadata"][section]["volcano.sh/task-index"]
    assert record(pod).rank == 1  # ddp-volcano-worker-1


def test_statefulset_rank_from_the_name_ordinal_without_a_pod_index_label() -> None:
    pod = load("statefulset")
    del pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"]
    assert record(pod).rank == 1  # triton-ensemble-1


def test_jobset_without_completion_index_ranks_by_the_global_job_index() -> None:
    pod = load("jobset-worker")
    for section in ("labels", "annotations"):
        del pod["metadata"][section]["batch.kubernetes.io/job-completion-index"]
        pod["metadata"][section]["jobset.sigs.k8s.io/job-global-index"] = "5"
    assert record(pod).rank == 5


def test_replicaset_without_a_deployment_is_its_own_job() -> None:
    pod = load("deployment")
    del pod["metadata"]["labels"]["pod-template-hash"]
    rec = record(pod)
    assert (rec.job, rec.job_kind) == ("ReplicaSet/llama3-8b-chat-7d9f8c6b5d", "ReplicaSet")


def test_pod_orphaned_by_its_job_keeps_the_job_from_its_labels() -> None:
    pod = load("job-indexed")
    del pod["metadata"]["ownerReferences"]
    rec = record(pod)
    assert (rec.job, rec.rank, rec.gang) == ("Job/eval-sweep", 3, f"pod/{rec.uid}")


def test_the_controller_owner_reference_wins_over_others() -> None:
    pod = load("bare-pod")
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "anchor", "uid": "u1"},
        {
            "apiVersion": "acme.io/v1",
            "kind": "Sweep",
            "name": "lr",
            "uid": "u2",
            "controller": True,
        },
    ]
    assert record(pod).job == "Sweep/lr"
    del pod["metadata"]["ownerReferences"][1]["controller"]
    assert record(pod).job == "ConfigMap/anchor"


# ---------------------------------------------------------------------------------------------
# GPUs


def spec(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"containers": list(containers)}
    if init:
        out["initContainers"] = list(init)
    return out


def c(name: str, section: str = "limits", **res: str) -> dict[str, Any]:
    return {"name": name, "image": "x", "resources": {section: dict(res)}}


GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(
    ("pod_spec", "expected"),
    [
        (spec(c("app", cpu="1")), (0, GPU)),
        (spec(c("app", **{GPU: "2"})), (2, GPU)),
        (spec(c("app", "requests", **{GPU: "2"})), (2, GPU)),
        (spec(c("a", **{GPU: "1"}), c("b", **{GPU: "3"})), (4, GPU)),
        # an init container holds its GPUs before the app starts: the larger counts
        (spec(c("app", **{GPU: "2"}), init=(c("warmup", **{GPU: "4"}),)), (4, GPU)),
        (spec(c("app", **{GPU: "4"}), init=(c("warmup", **{GPU: "1"}),)), (4, GPU)),
        # a sidecar (restartPolicy Always) runs beside the app
        (
            spec(
                c("app", **{GPU: "2"}),
                init=({**c("side", **{GPU: "1"}), "restartPolicy": "Always"},),
            ),
            (3, GPU),
        ),
        (spec(c("app", **{"nvidia.com/mig-1g.10gb": "1"})), (1, "nvidia.com/mig-1g.10gb")),
        (
            spec(
                c("a", **{"nvidia.com/mig-1g.10gb": "2"}), c("b", **{"nvidia.com/mig-2g.20gb": "1"})
            ),
            (3, "nvidia.com/mig-1g.10gb,nvidia.com/mig-2g.20gb"),
        ),
        (spec(c("app", **{"amd.com/gpu": "1"})), (0, GPU)),
    ],
)
def test_gpu_request(pod_spec: dict[str, Any], expected: tuple[int, str]) -> None:
    assert gpu_request(pod_spec) == expected


def test_limits_win_over_requests() -> None:
    container = {"name": "app", "resources": {"requests": {GPU: "1"}, "limits": {GPU: "2"}}}
    assert gpu_request({"containers": [container]}) == (2, GPU)


@pytest.mark.parametrize("quantity", ["1.5", "500m", "", "two", True, -1, 1.0])
def test_a_gpu_quantity_that_is_not_a_whole_number_is_an_error(quantity: object) -> None:
    pod = load("bare-pod")
    pod["spec"]["containers"][0]["resources"]["limits"][GPU] = quantity
    with pytest.raises(PodFieldError) as e:
        pod_record(pod, teams=TEAMS)
    assert e.value.field == "spec.containers[0].resources.limits.nvidia.com/gpu"


def test_a_pod_without_gpus_gives_no_record() -> None:
    pod = load("bare-pod")
    for section in ("limits", "requests"):
        del pod["spec"]["containers"][0]["resources"][section][GPU]
    assert pod_record(pod, teams=TEAMS) is None


# ---------------------------------------------------------------------------------------------
# times


def test_running_pod() -> None:
    pod = load("pytorchjob-master")
    rec = record(pod)
    assert rec.node == "gpu-h100-pool-2e91d-03"
    assert (rec.created_ms, rec.bound_ms, rec.started_ms) == (
        ms("2025-11-03T09:02:11Z"),
        ms("2025-11-03T09:02:12Z"),
        ms("2025-11-03T09:06:40Z"),
    )
    assert (rec.finished_ms, rec.deleted_ms, rec.released_ms) == (None, None, None)
    assert rec.phase == "Running"
    assert rec.resource_version == pod["metadata"]["resourceVersion"]


def test_succeeded_pod_finished_when_its_container_terminated() -> None:
    rec = record(load("job-indexed"))
    assert rec.phase == "Succeeded"
    assert rec.finished_ms == ms("2025-11-03T07:41:09Z")
    assert rec.released_ms == rec.finished_ms


def test_failed_pod_finished_when_its_container_terminated() -> None:
    pod = load("job-indexed")
    pod["status"]["phase"] = "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    terminated.update(exitCode=1, reason="Error", finishedAt="2025-11-03T07:20:00Z")
    assert record(pod).finished_ms == ms("2025-11-03T07:20:00Z")


def two_containers(pod: dict[str, Any], *, second_state: dict[str, Any]) -> dict[str, Any]:
    """`pod` with a second container (a sidecar app container) in `second_state`."""
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"].append({"name": "log-shipper", "image": "fluent-bit:3.1"})
    status = copy.deepcopy(pod["status"]["containerStatuses"][0])
    status.update(name="log-shipper", image="fluent-bit:3.1", state=second_state)
    pod["status"]["containerStatuses"].append(status)
    return pod


def test_not_finished_while_one_container_still_runs() -> None:
    pod = load("job-indexed")
    pod["status"]["phase"] = "Running"
    pod = two_containers(pod, second_state={"running": {"startedAt": "2025-11-03T07:02:50Z"}})
    assert record(pod).finished_ms is None


def test_finished_at_the_last_container_to_terminate() -> None:
    later = {
        "terminated": {
            "exitCode": 0,
            "reason": "Completed",
            "startedAt": "2025-11-03T07:02:50Z",
            "finishedAt": "2025-11-03T07:45:00Z",
        }
    }
    rec = record(two_containers(load("job-indexed"), second_state=later))
    assert rec.finished_ms == ms("2025-11-03T07:45:00Z")
    assert rec.started_ms == ms("2025-11-03T07:02:48Z")  # the earliest start


def test_a_restarting_container_has_not_finished_its_pod() -> None:
    """restartPolicy OnFailure/Always: a terminated container comes back; only the phase or a
    deletion makes it final."""
    pod = load("pytorchjob-master")  # OnFailure, Running
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "startedAt": "2025-11-03T09:06:40Z",
            "finishedAt": "2025-11-03T09:30:00Z",
        }
    }
    assert record(pod).finished_ms is None
    pod["status"]["phase"] = "Failed"
    assert record(pod).finished_ms == ms("2025-11-03T09:30:00Z")


def test_started_counts_a_restarted_containers_first_run() -> None:
    pod = load("pytorchjob-master")
    cs = pod["status"]["containerStatuses"][0]
    cs["restartCount"] = 1
    cs["lastState"] = {
        "terminated": {
            "exitCode": 137,
            "reason": "OOMKilled",
            "startedAt": "2025-11-03T09:06:40Z",
            "finishedAt": "2025-11-03T09:20:00Z",
        }
    }
    cs["state"] = {"running": {"startedAt": "2025-11-03T09:20:15Z"}}
    rec = record(pod)
    assert rec.started_ms == ms("2025-11-03T09:06:40Z")
    assert rec.finished_ms is None


def test_failed_without_container_records_ends_at_its_last_condition() -> None:
    """An evicted pod whose containers the kubelet never reported terminated."""
    pod = load("pytorchjob-master")
    pod["status"].update(
        phase="Failed", reason="Evicted", message="The node was low on resource: ephemeral-storage."
    )
    for cond in pod["status"]["conditions"]:
        if cond["type"] in ("Ready", "ContainersReady"):
            cond.update(status="False", lastTransitionTime="2025-11-03T11:00:00Z")
    assert record(pod).finished_ms == ms("2025-11-03T11:00:00Z")


def test_deleted_pod() -> None:
    pod = load("pytorchjob-master")
    pod["metadata"]["deletionTimestamp"] = "2025-11-03T12:00:30Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    rec = record(pod)
    assert rec.deleted_ms == ms("2025-11-03T12:00:30Z")
    assert rec.released_ms == rec.deleted_ms


def test_deleted_event_without_deletion_timestamp() -> None:
    finished = load("job-indexed")
    assert record(finished, deleted=True).deleted_ms == ms("2025-11-03T07:41:09Z")
    assert record(finished, deleted=True, event_ms=123).deleted_ms == 123
    assert record(finished).deleted_ms is None  # not a deletion
    running = load("pytorchjob-master")
    assert record(running, deleted=True).deleted_ms is None  # no time known


def test_never_scheduled_pod_is_kept_and_holds_nothing() -> None:
    pod = load("pytorchjob-worker")
    del pod["spec"]["nodeName"]
    pod["status"] = {
        "phase": "Pending",
        "qosClass": "Guaranteed",
        "conditions": [
            {
                "lastProbeTime": None,
                "lastTransitionTime": "2025-11-03T09:02:11Z",
                "message": "0/12 nodes are available: 12 Insufficient nvidia.com/gpu.",
                "reason": "Unschedulable",
                "status": "False",
                "type": "PodScheduled",
            }
        ],
    }
    rec = record(pod)
    assert (rec.node, rec.bound_ms, rec.started_ms, rec.finished_ms) == (None, None, None, None)
    assert rec.gpu_count == 8


def test_pod_placed_without_the_scheduler_is_bound_at_its_first_condition() -> None:
    pod = load("bare-pod")
    pod["status"]["conditions"] = [
        c for c in pod["status"]["conditions"] if c["type"] != "PodScheduled"
    ]
    assert record(pod).bound_ms == ms("2025-11-03T09:45:01Z")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-11-03T09:02:11Z", "2025-11-03T09:02:11+00:00"),
        ("2025-11-03T10:02:11+01:00", "2025-11-03T09:02:11+00:00"),
        ("2025-11-03T04:32:11-04:30", "2025-11-03T09:02:11+00:00"),
        ("2025-11-03T09:02:11.5Z", "2025-11-03T09:02:11.500+00:00"),
        ("2025-11-03T09:02:11.123456789Z", "2025-11-03T09:02:11.123+00:00"),
        ("2025-11-03t09:02:11.120z", "2025-11-03T09:02:11.120+00:00"),
    ],
)
def test_parse_time(text: str, expected: str) -> None:
    assert parse_time(text, field="f") == ms(expected)


@pytest.mark.parametrize(
    "text",
    ["yesterday", "2025-11-03T09:02:11", "2025-13-03T09:02:11Z", "2025-11-03", 1762160531],
)
def test_a_time_that_is_not_rfc3339_is_an_error(text: object) -> None:
    with pytest.raises(PodFieldError) as e:
        parse_time(text, field="metadata.creationTimestamp")
    assert e.value.field == "metadata.creationTimestamp"


def test_errors_name_the_field() -> None:
    pod = load("pytorchjob-master")
    [sched] = [x for x in pod["status"]["conditions"] if x["type"] == "PodScheduled"]
    sched["lastTransitionTime"] = "soon"
    with pytest.raises(PodFieldError) as e:
        pod_record(pod, teams=TEAMS)
    assert e.value.field == "status.conditions[PodScheduled].lastTransitionTime"
    assert e.value.value == "soon"
    for key in ("uid", "name", "namespace"):
        pod = load("pytorchjob-master")
        del pod["metadata"][key]
        with pytest.raises(PodFieldError) as e:
            pod_record(pod, teams=TEAMS)
        assert e.value.field == f"metadata.{key}"


def test_labels_and_annotations_are_kept_except_the_last_applied_manifest() -> None:
    pod = load("deployment")
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{}"
    rec = record(pod)
    assert rec.labels["pod-template-hash"] == "7d9f8c6b5d"
    assert rec.annotations == {"prometheus.io/port": "8000", "prometheus.io/scrape": "true"}
