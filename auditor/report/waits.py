"""Queue waste per job (SPEC §10): the GPU-hours its pods asked for times the time they
waited to be scheduled, the scheduler's last word, and a gang's half-start (the GPU-hours
its early pods held while the rest waited). `report --by job` carries them as columns; the
table lists the jobs that waited longest.

A job that only waited (no pod of it held a card in the window) still gets its row, with
zero held hours: waiting is what it did.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.model import PLATFORM_TEAM

WAIT_COLUMNS = ["queue_wait_gpu_hours", "queue_wait_message", "half_start_gpu_hours"]
KEYS = ["team", "namespace", "job"]
WAITED_SHOWN = 5
"""Jobs listed under "Jobs that waited to be scheduled"."""


def job_waits(
    waits: pd.DataFrame,
    half_starts: pd.DataFrame,
    pods: pd.DataFrame,
    *,
    by_cluster: bool = False,
) -> pd.DataFrame:
    """Per (team, namespace, job): `WAIT_COLUMNS`; per (cluster, team, namespace, job) with
    `by_cluster` (a job of one name in two clusters is two jobs). `waits`:
    `store.demand.read_queue_waits`; `half_starts`: `classify.queue.gang_half_starts`;
    `pods`: uid, gang, namespace, team, cluster (to name a half-started gang's job)."""
    keys = ["cluster", *KEYS] if by_cluster else KEYS
    parts: list[pd.Series] = []
    if not waits.empty:
        hours = waits["cards"] * (waits["end_ms"] - waits["start_ms"]) / 3_600_000
        latest = waits.sort_values("end_ms", kind="stable").groupby(keys)["message"].last()
        queued = waits.assign(h=hours).groupby(keys)["h"].sum().rename("queue_wait_gpu_hours")
        parts += [queued, latest.rename("queue_wait_message")]
    if not half_starts.empty:
        # a gang is named inside its cluster: its pods are found by both where both are known
        on = ["cluster", "gang"] if "cluster" in half_starts and "cluster" in pods else ["gang"]
        gangs = pods.drop_duplicates(on).set_index(on)
        at = pd.MultiIndex.from_frame(half_starts[on]) if len(on) > 1 else half_starts["gang"]
        half = half_starts.assign(
            team=gangs["team"].reindex(at).to_numpy(),
            namespace=gangs["namespace"].reindex(at).to_numpy(),
            h=half_starts["gpu_seconds"] / 3600.0,
        )
        parts.append(half.groupby(keys)["h"].sum().rename("half_start_gpu_hours"))
    if not parts:
        return pd.DataFrame(columns=[*keys, *WAIT_COLUMNS])
    out = pd.concat(parts, axis=1)
    for col in WAIT_COLUMNS:
        if col not in out.columns:
            out[col] = np.nan if col == "queue_wait_message" else 0.0
    out["queue_wait_gpu_hours"] = out["queue_wait_gpu_hours"].fillna(0.0)
    out["half_start_gpu_hours"] = out["half_start_gpu_hours"].fillna(0.0)
    return out[WAIT_COLUMNS].reset_index()


def with_waits(rows: pd.DataFrame, waits: pd.DataFrame) -> pd.DataFrame:
    """`report --by job` rows with `WAIT_COLUMNS` (0 and null where a job did not wait),
    and a row for each job that only waited; per cluster where both carry one."""
    keys = [k for k in ("cluster", *KEYS) if k in rows.columns and k in waits.columns]
    merged = rows.merge(waits, on=keys, how="left")
    only_waited = waits.merge(rows[keys], on=keys, how="left", indicator=True)
    only_waited = only_waited[only_waited["_merge"] == "left_only"].drop(columns="_merge")
    # the report's order kept, the jobs that only waited after theirs, the platform last
    merged = pd.concat([merged, only_waited], ignore_index=True)
    only = merged.index >= len(rows)
    numeric = [c for c in rows.columns if c not in KEYS and pd.api.types.is_numeric_dtype(rows[c])]
    hours = [c for c in numeric if c.endswith("_gpu_hours")]
    merged.loc[only, hours] = 0.0
    for col in ("queue_wait_gpu_hours", "half_start_gpu_hours"):
        merged[col] = merged[col].fillna(0.0)
    merged["queue_wait_message"] = merged["queue_wait_message"].astype(object)
    merged.loc[merged["queue_wait_message"].isna(), "queue_wait_message"] = None
    platform_last = (merged["team"] == PLATFORM_TEAM).astype(int)
    merged = merged.iloc[np.argsort(platform_last.to_numpy(), kind="stable")]
    return merged.reset_index(drop=True)


def longest_waits(waits: pd.DataFrame, *, top: int = WAITED_SHOWN) -> pd.DataFrame:
    """The `top` jobs by queue wait, longest first."""
    if waits.empty:
        return waits
    waited = waits[waits["queue_wait_gpu_hours"] > 0]
    ranked = waited.sort_values(
        ["queue_wait_gpu_hours", *KEYS], ascending=[False, True, True, True]
    )
    return ranked.head(top).reset_index(drop=True)
