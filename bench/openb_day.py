"""A day of Alibaba's OpenB GPU-sharing trace, replayed, imported and audited.

    .venv/bin/python bench/openb_day.py [--realdata DIR] [--hours 24] [--max-nodes N] [--out DIR]

(`--realdata` defaults to $AUDITOR_REALDATA, else ../shared/realdata from the repository.)

The busiest 24 h of the trace (most pods scheduled; `auditor.simulate.openb` documents the
placement and the utilisation model) is written as real inputs (Node objects with
`alibabacloud.com/gpu-milli`, pods asking `alibabacloud.com/gpu-milli` or `nvidia.com/gpu`,
nvidia-smi CSV per node at a 60 s period), imported into a fresh SQLite store and audited.
Prints the audit's capacity, held and unallocated GPU-hours, the fractional (gpu-milli) pods'
share of held capacity from the audit and straight from the trace (Σ gpu_milli/1000 ×
overlap), the simulator's truth beside them, and the wall time of each stage.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
START_MS = int(datetime(2026, 11, 23, tzinfo=UTC).timestamp()) * 1000
"""The replayed day starts here (the trace's own clock has an anonymised origin)."""


@dataclass(frozen=True)
class DayFigures:
    cards: int
    nodes: int
    pods: int
    samples: int
    capacity_h: float
    held_h: float
    unallocated_h: float
    fractional_h: float
    truth_capacity_h: float
    truth_held_h: float
    truth_unallocated_h: float
    truth_fractional_h: float
    trace_fractional_h: float
    trace_held_h: float
    simulate_s: float
    import_s: float
    audit_s: float

    @property
    def fractional_share(self) -> float:
        return self.fractional_h / self.held_h if self.held_h else 0.0

    @property
    def trace_fractional_share(self) -> float:
        return self.trace_fractional_h / self.trace_held_h if self.trace_held_h else 0.0


def replay_and_audit(
    realdata: Path, work: Path, *, hours: float = 24.0, max_nodes: int | None = None
) -> DayFigures:
    from auditor import jobs
    from auditor.model import PLATFORM_TEAM
    from auditor.report.summary import HOURS_COLUMNS, GroupBy
    from auditor.settings import Config, Thresholds
    from auditor.simulate.openb import FRACTIONAL_TEAM, load_openb, replay_day, trace_shares
    from auditor.simulate.sharedcluster import write_cluster

    started = time.perf_counter()
    trace = load_openb(realdata / "alibaba-gpu-v2023-openb")
    replay = replay_day(trace, start_ms=START_MS, hours=hours, max_nodes=max_nodes)
    result = write_cluster(work / "cluster", replay.cluster)
    simulated = time.perf_counter()

    url = f"sqlite:///{work / 'auditor.db'}"
    for node, path in sorted(result.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, result.nodes_json, config=Config())
    jobs.import_pods(url, result.pods_json, config=Config())
    imported = time.perf_counter()
    window = (result.window_start_ms, result.window_end_ms)
    jobs.audit(url, window=window, thresholds=Thresholds())
    audited = time.perf_counter()

    report = jobs.build_report(url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    rows = report.rows.set_index("team")
    totals = rows[HOURS_COLUMNS].sum(axis=1)
    platform = PLATFORM_TEAM
    held = float(totals.drop(platform, errors="ignore").sum())
    unallocated = float(rows["unallocated_gpu_hours"].sum())

    truth = result.truth.groupby("team")["gpu_seconds"].sum() / 3600
    truth_unalloc = result.truth.set_index(["team", "category"])["gpu_seconds"]
    frac_s, all_s = trace_shares(replay)
    return DayFigures(
        cards=result.physical_cards,
        nodes=len(replay.cluster.nodes),
        pods=len(replay.placed),
        samples=result.samples,
        capacity_h=float(totals.sum()),
        held_h=held,
        unallocated_h=unallocated,
        fractional_h=float(totals.get(FRACTIONAL_TEAM, 0.0)),
        truth_capacity_h=float(truth.sum()),
        truth_held_h=float(truth.drop(platform).sum()),
        truth_unallocated_h=float(truth_unalloc.get((platform, "unallocated"), 0.0)) / 3600,
        truth_fractional_h=float(truth.get(FRACTIONAL_TEAM, 0.0)),
        trace_fractional_h=frac_s / 3600,
        trace_held_h=all_s / 3600,
        simulate_s=simulated - started,
        import_s=imported - simulated,
        audit_s=audited - imported,
    )


def _print(f: DayFigures, hours: float) -> None:
    table = pd.DataFrame(
        {
            "audit": [f.capacity_h, f.held_h, f.unallocated_h, f.fractional_share],
            "truth": [
                f.truth_capacity_h,
                f.truth_held_h,
                f.truth_unallocated_h,
                f.truth_fractional_h / f.truth_held_h if f.truth_held_h else 0.0,
            ],
            "trace": [
                f.cards * hours,
                f.trace_held_h,
                f.cards * hours - f.trace_held_h,
                f.trace_fractional_share,
            ],
        },
        index=[
            "capacity GPU-h",
            "held GPU-h",
            "unallocated GPU-h",
            "fractional share of held",
        ],
    )
    print(
        f"OpenB busiest {hours:g} h: {f.nodes} nodes, {f.cards} cards, {f.pods} pods "
        f"(with their history), {f.samples:,} samples"
    )
    print(table.to_string(float_format=lambda v: f"{v:,.4f}"))
    print(
        f"wall: simulate {f.simulate_s:.1f} s, import {f.import_s:.1f} s, audit {f.audit_s:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    env = os.environ.get("AUDITOR_REALDATA")
    default = Path(env) if env else ROOT.parent / "shared" / "realdata"
    parser.add_argument("--realdata", type=Path, default=default)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--max-nodes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not (args.realdata / "alibaba-gpu-v2023-openb").is_dir():
        sys.exit(f"{args.realdata}/alibaba-gpu-v2023-openb: not found (pass --realdata)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        figures = replay_and_audit(
            args.realdata, args.out, hours=args.hours, max_nodes=args.max_nodes
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            figures = replay_and_audit(
                args.realdata, Path(tmp), hours=args.hours, max_nodes=args.max_nodes
            )
    _print(figures, args.hours)


if __name__ == "__main__":
    main()
