"""The latest complete audit as Prometheus metric families, for the watcher's `/metrics`.

Pure: audit results in, `GaugeMetricFamily` objects out; the store read and the once-a-minute
cache live in `auditor.jobs.metrics`. The figures are the report's own (`summarise` by team
and by job, `totals`), so a dashboard reads what `auditor report --format json` prints.

Cardinality is bounded by design: one series per team × category (teams are few), the
fleet's ratios, and the figures of the `top_jobs` jobs that wasted most (scheduling waste
plus compute idle), never one series per pod or card. Every family's first label is the
audited cluster's name (one value per watcher), so the watchers of several clusters
scraped into one Prometheus stay apart. Label values are names made
`terminal_safe` and escaped by the exposition writer, as in `auditor.report.prometheus`.

Every name this module can emit is in `AUDIT_METRIC_NAMES`: the tests check that the
shipped alerting rules and dashboard name only metrics the auditor exports.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import pandas as pd
from prometheus_client.core import GaugeMetricFamily, Metric

from auditor.model import CATEGORIES, PLATFORM_TEAM, SCHEDULING_WASTE, Window
from auditor.report.causes import SPLITS
from auditor.report.summary import GroupBy, summarise, totals
from auditor.report.text import terminal_safe

PREFIX = "auditor_audit"
TOP_JOBS = 10
"""Jobs whose figures are served (those that wasted most): bounded label cardinality."""


@dataclass(frozen=True)
class AuditFigures:
    """What the metrics show of one audit: its cluster, its window, when it was stored, the
    summaries."""

    cluster: str
    """The cluster audited (SPEC §11): every family carries it as its first label."""
    window: Window
    completed_ms: int
    """When the audit run was stored (the latest shard's time for a sharded audit)."""
    teams: pd.DataFrame
    """`summarise(by=team)` rows, the platform's last."""
    jobs: pd.DataFrame
    """`summarise(by=job)` rows."""
    totals: dict[str, float]


def audit_figures(
    results: pd.DataFrame,
    *,
    cluster: str,
    window: Window,
    completed_ms: int,
    causes: pd.DataFrame | None = None,
) -> AuditFigures:
    """The figures of one audit of `cluster` from its stored results (as `reads.read_results`
    gives them) and cause rows (`auditor.store.signals.read_causes`)."""
    return AuditFigures(
        cluster=cluster,
        window=window,
        completed_ms=completed_ms,
        teams=summarise(results, by=GroupBy.TEAM, causes=causes),
        jobs=summarise(results, by=GroupBy.JOB, causes=causes),
        totals=totals(results),
    )


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 and math.isfinite(part) else None


_TEAM_RATIOS: tuple[tuple[str, str, str], ...] = (
    # (name suffix, numerator column, help)
    (
        "scheduling_waste_ratio",
        "scheduling_waste_gpu_hours",
        "Scheduling waste (reserved idle, startup, teardown, checkpoint, straggler wait) "
        "as a share of the team's held GPU-hours.",
    ),
    (
        "compute_idle_ratio",
        "compute_idle_gpu_hours",
        "Compute idle as a share of the team's held GPU-hours.",
    ),
    (
        "reserved_idle_ratio",
        "reserved_idle_gpu_hours",
        "Reserved idle (cards held but idle for long stretches) as a share of the team's "
        "held GPU-hours.",
    ),
    (
        "unobserved_ratio",
        "unobserved_gpu_hours",
        "Held GPU-hours no sample covers, as a share of the team's held GPU-hours.",
    ),
)


CLUSTER_LABEL = "cluster"
"""The first label of every audit family: the watchers of several clusters scraped into one
Prometheus (or Thanos, Mimir) serve series that stay apart."""


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=[CLUSTER_LABEL, *(labels or [])])


def audit_families(figures: AuditFigures | None, *, top_jobs: int = TOP_JOBS) -> list[Metric]:
    """The metric families of an audit; none before the first audit (alerts use `absent`)."""
    if figures is None:
        return []
    c = terminal_safe(figures.cluster)
    out: list[Metric] = []
    teams = figures.teams.to_dict("records")
    hours = _gauge(
        "gpu_hours",
        "GPU-hours per team and waste category in the latest complete audit's window "
        f"(team {PLATFORM_TEAM} holds unallocated capacity and unheld cards' unobserved time).",
        ["team", "category"],
    )
    held = _gauge(
        "allocated_gpu_hours",
        "GPU-hours held by the team's pods in the latest complete audit's window.",
        ["team"],
    )
    for rec in teams:
        team = terminal_safe(str(rec["team"]))
        for cat in CATEGORIES:
            hours.add_metric([c, team, cat.value], float(rec[f"{cat.value}_gpu_hours"]))
        held.add_metric([c, team], float(rec["allocated_gpu_hours"]))
    out += [hours, held]
    for suffix, column, doc in _TEAM_RATIOS:
        family = _gauge(suffix, doc, ["team"])
        for rec in teams:
            value = _ratio(float(rec[column]), float(rec["allocated_gpu_hours"]))
            if value is not None:  # the platform holds nothing: no share to speak of
                family.add_metric([c, terminal_safe(str(rec["team"]))], value)
        out.append(family)
    inferred = _gauge(
        "inferred_mapping_ratio",
        "Share of the team's held GPU-hours whose card-to-pod mapping was inferred rather "
        "than recorded.",
        ["team"],
    )
    for rec in teams:
        value = rec["inferred_share"]
        if value is not None and not pd.isna(value):
            inferred.add_metric([c, terminal_safe(str(rec["team"]))], float(value))
    out.append(inferred)
    out += _cause_families(c, teams)
    out += _fleet_families(c, figures.totals)
    out += _job_families(c, figures.jobs, top_jobs=top_jobs)
    for name, doc, value in (
        ("window_start_timestamp_seconds", "Start of the latest complete audit's window.",
         figures.window[0]),
        ("window_end_timestamp_seconds", "End of the latest complete audit's window.",
         figures.window[1]),
        ("completed_timestamp_seconds", "When the latest complete audit was stored.",
         figures.completed_ms),
    ):  # fmt: skip
        family = _gauge(name, doc)
        family.add_metric([c], value / 1000)
        out.append(family)
    return out


def _cause_families(c: str, teams: list[dict[Hashable, Any]]) -> list[Metric]:
    """GPU-hours per team, split category and cause (SPEC §10), and the share of each split
    that rests on no recorded signal."""
    hours = _gauge(
        "cause_gpu_hours",
        "GPU-hours per team of each cause inside compute_idle and unallocated in the latest "
        "complete audit's window (the causes of a category sum to its gpu_hours).",
        ["team", "category", "cause"],
    )
    blind = _gauge(
        "no_signal_ratio",
        "Share of the team's compute_idle or unallocated GPU-hours whose cause rests on no "
        "recorded signal (unexplained, or no_demand without pod records).",
        ["team", "category"],
    )
    for rec in teams:
        team = terminal_safe(str(rec["team"]))
        for category, names, _ in SPLITS:
            for name in names:
                value = rec.get(f"{category}_{name}_gpu_hours")
                if isinstance(value, float) and value > 0:
                    hours.add_metric([c, team, category, name], value)
            share = rec.get(f"{category}_no_signal_share")
            if isinstance(share, float) and not math.isnan(share):
                blind.add_metric([c, team, category], share)
    return [hours, blind]


def _fleet_families(c: str, t: dict[str, float]) -> list[Metric]:
    alloc, capacity = t["allocated_gpu_hours"], t["capacity_gpu_hours"]
    values = (
        ("capacity_gpu_hours", "GPU-hours of capacity in the latest complete audit's window.",
         capacity),
        ("fleet_scheduling_waste_ratio", "Scheduling waste as a share of all held GPU-hours.",
         _ratio(t["scheduling_waste_gpu_hours"], alloc)),
        ("fleet_compute_idle_ratio", "Compute idle as a share of all held GPU-hours.",
         _ratio(t["compute_idle_gpu_hours"], alloc)),
        ("fleet_inferred_mapping_ratio",
         "Share of all held GPU-hours whose card-to-pod mapping was inferred.",
         t["inferred_share"] if alloc > 0 else None),
        ("fleet_unobserved_ratio",
         "Share of the fleet's capacity that no sample covers (collection gaps).",
         _ratio(t["unobserved_gpu_hours"], capacity)),
    )  # fmt: skip
    out: list[Metric] = []
    for name, doc, value in values:
        family = _gauge(name, doc)
        if value is not None:
            family.add_metric([c], float(value))
        out.append(family)
    return out


WASTE_COLUMNS = [f"{c.value}_gpu_hours" for c in SCHEDULING_WASTE] + ["compute_idle_gpu_hours"]
"""What a job wasted: scheduling waste plus compute idle."""


def top_wasting_jobs(jobs: pd.DataFrame, *, top: int) -> pd.DataFrame:
    """The `top` jobs with the most scheduling waste plus compute idle (ties: held hours,
    then names), the platform's row excluded."""
    held = jobs[jobs["team"] != PLATFORM_TEAM]
    wasted = held[WASTE_COLUMNS].sum(axis=1)
    ranked = held.assign(_w=wasted).sort_values(
        ["_w", "allocated_gpu_hours", "namespace", "job"],
        ascending=[False, False, True, True],
        kind="stable",
    )
    return ranked[ranked["_w"] > 0].head(max(top, 0)).drop(columns="_w")


JOB_LABELS = ("team", "job_namespace", "job_name")
"""Not `namespace` and `job`: Prometheus sets those on every scraped series (the target's),
and would rename ours `exported_namespace`, `exported_job`."""


def _job_families(c: str, jobs: pd.DataFrame, *, top_jobs: int) -> list[Metric]:
    keys = ["team", "namespace", "job"]
    labels = list(JOB_LABELS)
    hours = _gauge(
        "job_gpu_hours",
        f"GPU-hours per category of the jobs that wasted most (at most {top_jobs}: scheduling "
        "waste plus compute idle) in the latest complete audit's window; job_name is Kind/name.",
        [*labels, "category"],
    )
    held = _gauge("job_allocated_gpu_hours", "GPU-hours held by each of those jobs' pods.", labels)
    for rec in top_wasting_jobs(jobs, top=top_jobs).to_dict("records"):
        names = [terminal_safe(str(rec[k])) for k in keys]
        for cat in CATEGORIES:
            if cat.value != "unallocated":  # a job holds its cards: never unallocated
                hours.add_metric([c, *names, cat.value], float(rec[f"{cat.value}_gpu_hours"]))
        held.add_metric([c, *names], float(rec["allocated_gpu_hours"]))
    return [hours, held]


AUDIT_METRIC_NAMES: frozenset[str] = frozenset(
    f"{PREFIX}_{name}"
    for name in (
        "gpu_hours",
        "allocated_gpu_hours",
        *(suffix for suffix, _, _ in _TEAM_RATIOS),
        "inferred_mapping_ratio",
        "cause_gpu_hours",
        "no_signal_ratio",
        "capacity_gpu_hours",
        "fleet_scheduling_waste_ratio",
        "fleet_compute_idle_ratio",
        "fleet_inferred_mapping_ratio",
        "fleet_unobserved_ratio",
        "job_gpu_hours",
        "job_allocated_gpu_hours",
        "window_start_timestamp_seconds",
        "window_end_timestamp_seconds",
        "completed_timestamp_seconds",
    )
)
"""Every family `audit_families` emits (a test checks it against what it yields)."""
