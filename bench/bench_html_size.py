"""Size of the HTML report for a 100-GPU fleet week (the product asks for under 1 MB).

Renders the synthetic week of tests/htmlweek.py (real summary and offender code, 8 job
timelines of 16 cards drawn at their worst for size) once per grouping and prints the bytes.

    .venv/bin/python bench/bench_html_size.py [--gpus 100] [--days 7] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from htmlweek import week_report

from auditor.report.html import render_report_html
from auditor.report.summary import GroupBy

LIMIT = 1_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=100)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--out", type=Path, help="Also write each page here.")
    args = parser.parse_args()
    worst = 0
    for by in (GroupBy.TEAM, GroupBy.NAMESPACE, GroupBy.JOB, GroupBy.POD, GroupBy.NODE):
        started = time.perf_counter()
        report, util, timelines = week_report(by=by, gpus=args.gpus, days=args.days)
        html = render_report_html(report, card_util=util, timelines=timelines)
        size = len(html.encode("utf-8"))
        worst = max(worst, size)
        print(
            f"--by {by.value:<9} {len(report.rows):>4} rows, {len(timelines)} timelines: "
            f"{size:>9,} bytes ({size / LIMIT:.0%} of 1 MB) in {time.perf_counter() - started:.1f}s"
        )
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"report-{by.value}.html").write_text(html, encoding="utf-8")
    return 0 if worst < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
