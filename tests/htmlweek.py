"""A synthetic fleet week for the HTML report: 100 GPUs x 7 days, built without a database.

`week_report` returns what `jobs.build_report_html` hands the renderer: a `Report` made by
the real summary and offender code from synthetic audit results, the per-card
utilisation, and job timelines at the report's 200 time slots drawn as badly for size as a
timeline can be (the biggest category changes in every slot, every slot has a utilisation
point). Shared by tests/report/test_report_html.py and bench/bench_html_size.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.model import CATEGORIES
from auditor.report.explain import Card, Explanation
from auditor.report.offenders import top_offenders
from auditor.report.render import Report
from auditor.report.summary import GroupBy, held_cards_utilisation, summarise, totals
from auditor.report.timeline import CATEGORY_NAMES, CardTimeline

DAY_S = 86_400
START_MS = 1_795_392_000_000  # 2026-11-23 00:00 UTC, a Monday
TEAMS = ("vision", "nlp", "recsys", "research", "speech", "ads")


def _results(*, gpus: int, days: int, rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for g in range(gpus):
        node = f"gpu-node-{g // 8:02d}"
        for d in range(days):
            team = TEAMS[(g // 8 + d) % len(TEAMS)]
            job = f"PyTorchJob/{team}-run-{g // 8:02d}-{d}"
            pod = f"{team}-run-{g // 8:02d}-{d}-worker-{g % 8 // 4}"
            share = rng.dirichlet(np.ones(len(CATEGORIES)) * 0.6) * DAY_S
            for cat, seconds in zip(CATEGORIES, share, strict=True):
                held = cat.value != "unallocated"
                rows.append(
                    {
                        "run_id": d + 1, "gpu": f"GPU-{g:04d}-{'0' * 28}", "node": node,
                        "gpu_model": "H100", "pod_uid": f"uid-{g // 4}-{d}" if held else None,
                        "category": cat.value, "seconds": float(seconds), "inferred": False,
                        "namespace": team if held else None, "pod": pod if held else None,
                        "team": team if held else None, "job": job if held else None,
                        "job_kind": "PyTorchJob", "workload": "training", "rank": g % 8 // 4,
                        "gang": f"{team}/{job}",
                    }
                )  # fmt: skip
    return pd.DataFrame(rows).astype({"rank": "Int64"})


def _findings() -> pd.DataFrame:
    cols = ["kind", "gang", "gpu", "node", "pod_uid", "namespace", "pod", "rank", "job", "team",
            "start_ms", "end_ms", "seconds", "detail"]  # fmt: skip
    return pd.DataFrame(columns=cols)


def _explanation(
    i: int, target: str, *, cards: int, buckets: int, days: int, rng: np.random.Generator
) -> Explanation:
    lo, hi = START_MS, START_MS + days * DAY_S * 1000
    edges = np.linspace(lo, hi, buckets + 1).astype(np.int64)
    slot = (hi - lo) / buckets / 1000
    out = []
    for c in range(cards):
        seconds = {k: np.zeros(buckets) for k in CATEGORY_NAMES}
        idle = [k for k in CATEGORY_NAMES if k not in ("busy", "unallocated")]
        for b in range(buckets):  # a different biggest idle category in every slot
            seconds["busy"][b] = slot * 0.3
            seconds[idle[(b + c) % len(idle)]][b] = slot * 0.7
        util = rng.uniform(0, 100, buckets)
        timeline = CardTimeline(
            f"GPU-{i:02d}{c:02d}-{'0' * 30}", f"uid-{i}-{c // 8}", edges, util, seconds
        )
        totals = {k: float(v.sum()) for k, v in seconds.items()}
        out.append(
            Card(timeline, f"job-{i}-worker-{c // 8}", "ml", c // 8, f"gpu-node-{c // 8}", totals)
        )
    rows = [
        {"kind": kind, "gang": f"ml/PyTorchJob/job-{i}", "gpu": t.timeline.gpu, "pod_uid": "u",
         "start_ms": lo + k * 3_600_000, "end_ms": lo + k * 3_600_000 + 600_000, "seconds": 600.0,
         "detail": "idle for 31 min mid-run", "pod": t.pod, "rank": t.rank, "node": t.node}
        for k, t in enumerate(out) for kind in ("startup", "reserved_idle", "teardown")
    ]  # fmt: skip
    steps = [("straggler_wait", "check the slow rank's node"), ("checkpoint", "checkpoint async")]
    return Explanation(target, (lo, hi), out, pd.DataFrame(rows), "training", steps)


def week_report(
    *, by: GroupBy = GroupBy.TEAM, gpus: int = 100, days: int = 7, jobs: int = 8, cards: int = 16
) -> tuple[Report, list[float], list[Explanation]]:
    """(report, per-card utilisation, job timelines) of a synthetic fleet week."""
    rng = np.random.default_rng(4)
    results = _results(gpus=gpus, days=days, rng=rng)
    report = Report(
        window=(START_MS, START_MS + days * DAY_S * 1000),
        by=by.value,
        rows=summarise(results, by=by),
        totals=totals(results),
        offenders=top_offenders(results, _findings(), top=3),
    )
    util = held_cards_utilisation(results)["util_pct"].tolist()
    named = [str(o) for o in report.offenders["offender"] if str(o).count("/") == 2]
    targets = list(dict.fromkeys(named))[:jobs]
    timelines = [
        _explanation(i, t, cards=cards, buckets=200, days=days, rng=rng)
        for i, t in enumerate(targets)
    ]
    return report, util, timelines
