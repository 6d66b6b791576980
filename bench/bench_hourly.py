"""The cost of storing audit results per UTC hour (SPEC §11), against a tree that does not.

    .venv/bin/python bench/bench_hourly.py --base REV [--gpus 64] [--days 1] [--repeat 2]

One SQLite store of the made-up fleet (`bench/fleet.py`, 5 s period) is written once and
copied; `REV` (a commit of this repository, exported with `git archive`) audits one copy
and this tree the other, alternately, each audit in its own process (its peak resident
memory its own). Prints each audit's seconds and peak MiB, the ratios of the medians, and
the bytes the result tables take per card-day (SQLite's `dbstat`) in each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LOAD = r"""
import sys
sys.path.insert(0, sys.argv[3])
from fleet import make_fleet, sample_batches
from auditor.store import bulk
from auditor.store.connection import make_engine
from auditor.store.migrate import upgrade
from auditor.store.writes import upsert_assignments, upsert_gpus
from auditor.store.pod_writes import upsert_pods
url, (gpus, days) = sys.argv[1], map(float, sys.argv[2].split("x"))
fleet = make_fleet(gpus=int(gpus), days=days)
engine = make_engine(url)
upgrade(engine)
with engine.begin() as conn:
    ids = upsert_gpus(conn, fleet.gpus)
    upsert_pods(conn, fleet.pods)
    by_uid = {p.uid: p for p in fleet.pods}
    upsert_assignments(conn, [(u, ids[c], by_uid[u].bound_ms) for u, c in fleet.assignments],
                       source="pod-resources")
for frame in sample_batches(fleet, ids):
    with engine.begin() as conn:
        rows, spans, repeats = bulk.frame_rows(frame)
        bulk.write_rows(conn, rows, spans=spans, repeats=repeats)
print(fleet.start_ms, fleet.end_ms)
"""

AUDIT = r"""
import json, resource, sys, time
from auditor import jobs
from auditor.settings import Thresholds
from auditor.store.connection import make_engine
from auditor.store.migrate import upgrade
import auditor.classify.pipeline, auditor.store.reads, auditor.store.writes  # noqa: F401
url, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
upgrade(make_engine(url))
t = time.perf_counter()
jobs.audit(url, window=(start, end), thresholds=Thresholds())
seconds = time.perf_counter() - t
engine = make_engine(url)
with engine.connect() as conn:
    size = {}
    for table in ("audit_results", "audit_causes", "audit_sm"):
        size[table] = int(conn.exec_driver_sql(
            "SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN (SELECT name FROM"
            f" sqlite_master WHERE tbl_name = '{table}')").scalar())
        size[table + "_rows"] = int(conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar())
import auditor
print(json.dumps({"seconds": seconds, "tree": auditor.__file__,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  **size}))
"""


def run(code: str, tree: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # run from the tree: `python -c` puts the working directory first on the path
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hourly-") as tmp_s:
        tmp = Path(tmp_s)
        base = tmp / "base"
        base.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.base, "auditor"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        seed = tmp / "seed.db"
        span = run(LOAD, base, f"sqlite:///{seed}", f"{args.gpus}x{args.days}", str(ROOT / "bench"))
        start, end = span.split()
        got: dict[str, list[dict[str, float]]] = {"base": [], "hourly": []}
        for i in range(args.repeat):
            for name, tree in (("base", base), ("hourly", ROOT)):
                db = tmp / f"{name}-{i}.db"
                shutil.copyfile(seed, db)
                got[name].append(json.loads(run(AUDIT, tree, f"sqlite:///{db}", start, end)))
                db.unlink()
    card_days = args.gpus * args.days
    print(f"fleet: {args.gpus} GPUs x {args.days:g} days, 5 s period, SQLite; base {args.base}")
    for name, runs in got.items():
        print(f"  {name:6s} ran {runs[0]['tree']}")
        for r in runs:
            print(f"  {name:6s} audit {r['seconds']:6.2f} s  peak {r['peak_mib']:6.0f} MiB")
        last = runs[-1]
        for table in ("audit_results", "audit_causes", "audit_sm"):
            print(
                f"  {name:6s} {table:13s} {last[table + '_rows']:7d} rows "
                f"{last[table] / card_days:9.0f} B per card-day"
            )
    med = {n: statistics.median(r["seconds"] for r in runs) for n, runs in got.items()}
    mem = {n: statistics.median(r["peak_mib"] for r in runs) for n, runs in got.items()}
    print(f"audit time hourly/base: {med['hourly'] / med['base']:.2f}x")
    print(f"audit peak memory hourly/base: {mem['hourly'] / mem['base']:.2f}x")


if __name__ == "__main__":
    main()
