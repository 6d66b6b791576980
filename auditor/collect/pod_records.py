"""One pod, as the Kubernetes API writes it in JSON, into a `PodRecord` (SPEC §2.2).

Pure functions on plain dicts in the API's JSON shape (camelCase keys, RFC 3339 times), so
the kubectl-file reader and the live watcher share them. This module puts the record
together and checks what it stores as is (UID, name, namespace, phase, node); the rules
are each in their own module: `gpu_requests` (how many GPUs a pod holds, what share of a
card), `pod_times` (when it held them), `owners` (which team, job, rank and gang it
belongs to), all reading the pod through the accessors of `pod_fields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from auditor import limits
from auditor.collect import shares
from auditor.collect.gpu_requests import pod_gpu_ask
from auditor.collect.owners import PodView, controller_owner, env_rank, team_of, workload_of
from auditor.collect.pod_fields import mapping_at, optional_str, required_str, str_map
from auditor.collect.pod_times import pod_times
from auditor.collect.pod_waits import pod_wait
from auditor.errors import PodFieldError
from auditor.model import PodRecord
from auditor.settings import Sharing, TeamRules

DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
"""Annotations not kept on a record: a copy of the whole manifest, large and of no use here."""


def pod_record(
    pod: Mapping[str, Any],
    *,
    teams: TeamRules,
    event_ms: int | None = None,
    deleted: bool = False,
    adjusted: list[str] | None = None,
    sharing: Sharing | None = None,
    seen_ms: int | None = None,
) -> PodRecord | None:
    """The record of one observation of `pod`, or None when the pod holds no GPU (a Run:ai
    reservation pod is kept, holding none: SPEC §7; so is a pod naming ResourceClaims,
    whose claims say what it holds: SPEC §12). `sharing`: the config's extra names.

    `deleted` says the observation is a watch `DELETED` event; `event_ms` is when the caller
    saw that event, used as the deletion time when the pod carries no `deletionTimestamp`.
    Raises `PodFieldError` (an `InputError`) naming the field that cannot be read or stored
    (a UID, name or namespace too long or holding a NUL, a phase that is not a string, a GPU
    count out of range). Derived text that can be fitted is (`auditor.limits.fit_text`): a
    team taken from a 300-character annotation is cut, with a digest, rather than losing the
    pod's GPU-hours; the names of fields so fitted are appended to `adjusted` when given.

    `seen_ms` is when this observation was made (a kubectl file's capture time, the
    watcher's clock): a pod still waiting to be scheduled (`auditor.collect.pod_waits`) is
    known to wait until then (`wait_seen_ms`).
    """
    if not isinstance(pod, Mapping):
        raise PodFieldError("a pod must be a JSON object", field="(pod)")
    meta = mapping_at(pod, "metadata", "metadata")
    spec = mapping_at(pod, "spec", "spec")
    status = mapping_at(pod, "status", "status", required=False)

    uid = required_str(meta, "uid", "metadata.uid", limit=limits.UID_MAX)
    name = required_str(meta, "name", "metadata.name", limit=limits.NAME_MAX)
    namespace = required_str(meta, "namespace", "metadata.namespace", limit=limits.NAME_MAX)

    annotations = str_map(meta, "annotations", "metadata.annotations")
    ask = pod_gpu_ask(spec, namespace=namespace, annotations=annotations, sharing=sharing)
    if ask.count == 0 and ask.share_kind not in (shares.KIND_RESERVATION, shares.KIND_DRA):
        return None
    shares.hami_devices(annotations)  # the cards it names must be readable
    gpu_count, gpu_resource = ask.count, ask.resource

    labels = str_map(meta, "labels", "metadata.labels")
    phase = status.get("phase")
    if phase is not None and not isinstance(phase, str):
        raise PodFieldError(f"must be a string, got {type(phase).__name__}", field="status.phase")
    node = spec.get("nodeName")
    if node is not None and not isinstance(node, str):
        raise PodFieldError(f"must be a string, got {type(node).__name__}", field="spec.nodeName")
    if node and (len(node) > limits.NAME_MAX or not limits.is_clean(node)):
        raise PodFieldError("not a node name", field="spec.nodeName", value=node)
    times = pod_times(meta=meta, spec=spec, status=status, deleted=deleted, event_ms=event_ms)
    wait = pod_wait(spec=spec, status=status, labels=labels, annotations=annotations)
    if wait.reason is not None and times.bound_ms is not None:
        wait = replace(wait, reason=None, message=None)  # bound: it waits no more
    view = PodView(
        uid=uid,
        name=name,
        namespace=namespace,
        labels=labels,
        annotations=annotations,
        owner=controller_owner(meta),
        env_rank=env_rank(spec),
    )
    work = workload_of(view)
    team = team_of(view, teams)
    fitted = {
        "team": limits.fit_text(team, limits.NAME_MAX),
        "job": limits.fit_text(work.job, limits.JOB_MAX),
        "job_kind": limits.fit_text(work.job_kind, limits.KIND_MAX),
        "gang": limits.fit_text(work.gang, limits.GANG_MAX),
        "gpu_resource": limits.fit_text(gpu_resource, limits.RESOURCE_MAX),
    }
    if adjusted is not None:
        raw = {"team": team, "job": work.job, "job_kind": work.job_kind, "gang": work.gang}
        raw["gpu_resource"] = gpu_resource
        adjusted.extend(k for k, v in fitted.items() if v != raw[k])
    version = optional_str(meta, "resourceVersion")
    return PodRecord(
        uid=uid,
        namespace=namespace,
        name=name,
        node=node or None,
        team=fitted["team"],
        job=fitted["job"],
        job_kind=fitted["job_kind"],
        workload=work.workload,
        gang=fitted["gang"],
        gpu_count=gpu_count,
        gpu_resource=fitted["gpu_resource"],
        rank=work.rank,
        created_ms=times.created_ms,
        bound_ms=times.bound_ms,
        started_ms=times.started_ms,
        finished_ms=times.finished_ms,
        deleted_ms=times.deleted_ms,
        phase=limits.fit_text(phase, limits.PHASE_MAX) if phase else None,
        resource_version=(
            version
            if version and len(version) <= limits.VERSION_MAX and limits.is_clean(version)
            else None
        ),
        labels={limits.clean_text(k): limits.clean_text(v) for k, v in labels.items()},
        annotations={
            limits.clean_text(k): limits.clean_text(v)
            for k, v in annotations.items()
            if k not in DROPPED_ANNOTATIONS
        },
        share_kind=ask.share_kind,
        gpu_share=ask.share,
        gpu_mem_mib=ask.mem_mib,
        gpu_mem_share=ask.mem_share,
        wait_reason=wait.reason,
        wait_message=wait.message,
        wanted_model=wait.wanted_model,
        wait_seen_ms=seen_ms if wait.reason is not None else None,
    )
