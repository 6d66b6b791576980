"""When a pod held its GPUs: its tenure times, read from its metadata, conditions and
container statuses (SPEC §2.2), as epoch milliseconds UTC.

`created` is `metadata.creationTimestamp`; `bound` the `PodScheduled=True`
condition (for a pod placed on a node without the scheduler, the earliest condition);
`started` the earliest container start (current or previous run; a run whose `finishedAt`
precedes its `startedAt` is refused, naming the field); `finished` the last
container's `finishedAt`, once every container has terminated for good (the pod is
Succeeded/Failed, cannot restart, or is being deleted); `deleted` is
`metadata.deletionTimestamp`, the time the kubelet is told to have stopped the pod by.
A watch `DELETED` event without one (the API server removes a pod that never ran or had
already finished at once) is dated by the caller's `event_ms`, else by `finished`, else
left unknown: a kubectl file carries no event times, and such a pod held no GPU after it
finished anyway.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from auditor.collect.pod_fields import list_at, mapping_at
from auditor.errors import PodFieldError, shown

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodTimes:
    created_ms: int | None = None
    bound_ms: int | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    deleted_ms: int | None = None


def pod_times(
    *,
    meta: Mapping[str, Any],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    deleted: bool = False,
    event_ms: int | None = None,
) -> PodTimes:
    """The tenure times of one observation of a pod (see the module docstring)."""
    created = parse_time(meta.get("creationTimestamp"), field="metadata.creationTimestamp")
    deletion = parse_time(meta.get("deletionTimestamp"), field="metadata.deletionTimestamp")

    conditions = list_at(status, "conditions", "status.conditions")
    cond_times: list[int] = []
    bound: int | None = None
    for i, cond in enumerate(conditions):
        if not isinstance(cond, Mapping):
            raise PodFieldError(
                "a condition must be a JSON object", field=f"status.conditions[{i}]"
            )
        ctype = cond.get("type")
        label = ctype if isinstance(ctype, str) and ctype else str(i)
        t = parse_time(
            cond.get("lastTransitionTime"), field=f"status.conditions[{label}].lastTransitionTime"
        )
        if t is None:
            continue
        cond_times.append(t)
        if ctype == "PodScheduled" and cond.get("status") == "True":
            bound = t
    if bound is None and spec.get("nodeName") and cond_times:
        bound = min(cond_times)

    statuses = list_at(status, "containerStatuses", "status.containerStatuses")
    starts: list[int] = []
    ends: list[int] = []
    all_terminated = bool(statuses)
    for i, cs in enumerate(statuses):
        if not isinstance(cs, Mapping):
            raise PodFieldError(
                "a container status must be a JSON object", field=f"status.containerStatuses[{i}]"
            )
        cname = cs.get("name")
        where = f"status.containerStatuses[{cname if isinstance(cname, str) else i}]"
        state = mapping_at(cs, "state", f"{where}.state", required=False)
        last = mapping_at(cs, "lastState", f"{where}.lastState", required=False)
        running = mapping_at(state, "running", f"{where}.state.running", required=False)
        terminated = mapping_at(state, "terminated", f"{where}.state.terminated", required=False)
        previous = mapping_at(last, "terminated", f"{where}.lastState.terminated", required=False)
        for section, prefix in (
            (running, "state.running"),
            (terminated, "state.terminated"),
            (previous, "lastState.terminated"),
        ):
            t = parse_time(section.get("startedAt"), field=f"{where}.{prefix}.startedAt")
            if t is not None:
                starts.append(t)
                if section is not running:
                    _not_before(section, t, field=f"{where}.{prefix}.finishedAt")
        if state.get("terminated") is not None:
            end = parse_time(
                terminated.get("finishedAt"), field=f"{where}.state.terminated.finishedAt"
            )
            if end is None:
                all_terminated = False
            else:
                ends.append(end)
        else:
            all_terminated = False

    phase = status.get("phase")
    if not isinstance(phase, str):
        phase = None
    final = (
        phase in TERMINAL_PHASES
        or spec.get("restartPolicy") == "Never"
        or deletion is not None
        or deleted
    )
    finished: int | None = None
    if all_terminated and final:
        finished = max(ends)
    elif phase in TERMINAL_PHASES:
        # Failed before or without container records (evicted, admission refused): the
        # latest thing the kubelet wrote is the best end there is.
        finished = max([*ends, *cond_times], default=None)

    deleted_ms = deletion
    if deleted_ms is None and deleted:
        deleted_ms = event_ms if event_ms is not None else finished
    return PodTimes(
        created_ms=created,
        bound_ms=bound,
        started_ms=min(starts) if starts else None,
        finished_ms=finished,
        deleted_ms=deleted_ms,
    )


def _not_before(terminated: Mapping[str, Any], started: int, *, field: str) -> None:
    """A terminated run's `finishedAt` before its `startedAt` is refused: a clock or a writer
    gone wrong, and a tenure that ends before it starts holds nothing."""
    value = terminated.get("finishedAt")
    end = parse_time(value, field=field)
    if end is not None and end < started:
        began = terminated.get("startedAt")
        raise PodFieldError(
            f"{shown(value)} is before its startedAt {began}", field=field, value=value
        )


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def parse_time(value: object, *, field: str) -> int | None:
    """RFC 3339 (`Z` or an offset, optional fraction) to epoch ms UTC; None stays None.

    Fractions below a millisecond are truncated, as Kubernetes' own MicroTime is.
    """
    if value is None:
        return None
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise PodFieldError(f"not an RFC 3339 time: {shown(value)}", field=field, value=value)
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zulu, sign, off_h, off_m = m.groups()[6:]
    try:
        tz = (
            UTC
            if zulu
            else timezone(
                (1 if sign == "+" else -1) * timedelta(hours=int(off_h), minutes=int(off_m))
            )
        )
        dt = datetime(year, month, day, hour, minute, second, tzinfo=tz)
    except ValueError as e:
        raise PodFieldError(
            f"not an RFC 3339 time: {shown(value)} ({e})", field=field, value=value
        ) from e
    ms = int((frac or "0")[:3].ljust(3, "0"))
    return int(dt.timestamp()) * 1000 + ms
