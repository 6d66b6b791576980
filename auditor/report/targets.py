"""Which pods a name on the command line means: `namespace/Kind/name`, `Kind/name`,
`namespace/pod` or a pod name, read against the pod records. Unknown and ambiguous names are
one-line `InputError`s that list the candidates."""

from __future__ import annotations

import pandas as pd

from auditor.errors import InputError


def _matches(pods: pd.DataFrame, target: str) -> tuple[str, pd.DataFrame]:
    parts = target.strip().split("/")
    ns, name, job = pods["namespace"], pods["name"], pods["job"]
    if len(parts) == 3:
        hit = pods[(ns == parts[0]) & (job == f"{parts[1]}/{parts[2]}")]
        return "job", hit
    if len(parts) == 2:
        as_job = pods[job == target]
        as_pod = pods[(ns == parts[0]) & (name == parts[1])]
        if len(as_job) and len(as_pod):
            return "both", pd.concat([as_job, as_pod])
        return ("job", as_job) if len(as_job) else ("pod", as_pod)
    if len(parts) == 1 and parts[0]:
        return "pod", pods[name == parts[0]]
    return "none", pods.iloc[0:0]


def resolve_target(pods: pd.DataFrame, target: str) -> tuple[str, list[str]]:
    """(label, pod uids) of a target; unknown or ambiguous names are one-line InputErrors."""
    kind, hit = _matches(pods, target)
    if hit.empty:
        raise InputError(
            f"no job or pod {target!r} (give namespace/Kind/name, Kind/name, namespace/pod "
            "or a pod name)",
            field="JOB_OR_POD",
        )
    if kind == "job":
        jobs = sorted({f"{n}/{j}" for n, j in zip(hit["namespace"], hit["job"], strict=True)})
        if len(jobs) > 1:
            raise InputError(f"{target!r} is ambiguous: {', '.join(jobs)}", field="JOB_OR_POD")
        return jobs[0], sorted(hit["uid"].astype(str))
    names = sorted({f"{n}/{p}" for n, p in zip(hit["namespace"], hit["name"], strict=True)})
    if kind == "both":
        names = sorted(
            {*names, *{f"{n}/{j}" for n, j in zip(hit["namespace"], hit["job"], strict=True)}}
        )
    if len(names) > 1 or kind == "both":
        raise InputError(f"{target!r} is ambiguous: {', '.join(names)}", field="JOB_OR_POD")
    return names[0], sorted(hit["uid"].astype(str))
