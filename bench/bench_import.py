"""Import throughput and peak memory for a large nvidia-smi CSV, into SQLite and PostgreSQL.

    .venv/bin/python bench/bench_import.py [--rows 1000000]

Each import runs in a child process, so its peak resident memory is its own. PostgreSQL is a
throwaway server started like the tests start theirs (skipped where none is installed).
Prints figures from one run; the machines are shared, so compare ratios within a run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CHILD = """
import resource, sys, time
from pathlib import Path
from auditor import jobs
t = time.perf_counter()
stats = jobs.import_nvidia_smi(sys.argv[1], Path(sys.argv[2]), node="bench-node")
print(stats.rows, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_csv(path: Path, rows: int, gpus: int = 8) -> None:
    start = datetime(2026, 11, 23, tzinfo=UTC)
    ticks = rows // gpus
    with path.open("w", encoding="ascii") as f:
        f.write(
            "timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], "
            "memory.total [MiB], power.draw [W], clocks.sm [MHz], temperature.gpu\n"
        )
        for t in range(ticks):
            stamp = (start + timedelta(seconds=5 * t)).strftime("%Y/%m/%d %H:%M:%S.000")
            for g in range(gpus):
                util = (t * 7 + g * 13) % 101
                f.write(
                    f"{stamp}, {g}, GPU-bench-{g:04d}, NVIDIA H100 80GB HBM3, {util} %, "
                    f"{40000 + util} MiB, 81559 MiB, {100 + util * 5}.00 W, 1980 MHz, 60\n"
                )


def run_child(url: str, csv: Path) -> tuple[int, float, float]:
    """Import in a child process; its rows, seconds and own peak RSS in MiB."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(csv)], capture_output=True, text=True, check=True
    )
    rows, seconds, peak_kib = out.stdout.split()
    return int(rows), float(seconds), int(peak_kib) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "bench.csv"
        t = time.perf_counter()
        write_csv(csv, args.rows)
        print(
            f"wrote {args.rows:,} rows ({csv.stat().st_size / 1e6:.0f} MB) "
            f"in {time.perf_counter() - t:.1f}s"
        )
        targets = [("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}")]
        server = None
        try:
            from pgserver import find_bindir, start_server

            if find_bindir() is not None:
                server = start_server()
                server.admin("CREATE DATABASE bench")
                from auditor.store import migrate

                migrate.upgrade(server.url("bench"))
                targets.append(("postgresql", server.url("bench")))
            else:
                print("postgresql: skipped (no server binaries found)")
            for name, url in targets:
                rows, seconds, peak = run_child(url, csv)
                print(
                    f"{name:<11} {rows:>10,} samples in {seconds:6.1f}s = "
                    f"{rows / seconds:>9,.0f} samples/s, peak RSS {peak:,.0f} MiB"
                )
        finally:
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
