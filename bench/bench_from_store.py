"""`auditor audit --samples-from` against its fetch-and-parse floor, and its peak memory
against the window's length.

Backfills N GPUs (default 1,000: nodes of 8, half held by pods, a quarter with profiling
metrics) over H hours (default 24) at a 30 s scrape interval into a throwaway Prometheus
(Debian's `prometheus` and `promtool`), then, in the same run:
- audits the whole window from the store into a fresh SQLite store (pods stored first, as
  the watcher would have), recording every query it makes;
- the floor: the same queries fetched with a plain HTTP client and JSON-parsed, nothing else;
- peak memory (ru_maxrss of a child process) of the audit of the first 1/4, 1/2 and the
  whole window: flat where memory follows the chunk, not the window.
Run: .venv/bin/python bench/bench_from_store.py [--gpus 1000] [--hours 24]
(a quick check: --gpus 64 --hours 6).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from promserver import Card, backfill, start_prometheus

from auditor.collect.prometheus import PrometheusClient
from auditor.jobs import audit_from_store, open_store
from auditor.model import PodRecord, WorkloadKind
from auditor.settings import Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.writes import upsert_pods

HOUR = 3600
STEP = 30


def cards(n: int, start: int, end: int) -> list[Card]:
    out = []
    for i in range(n):
        node = f"node-{i // 8:04d}"
        held = [(start, end, "team-a", f"job-{i}")] if i % 2 == 0 else []
        out.append(Card(f"GPU-{i:06d}", i % 8, node, holders=held, profiling=i % 4 == 0))
    return out


METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": lambda c, t: float((t // STEP * 7 + c.gpu * 13) % 101),
    "DCGM_FI_DEV_FB_USED": lambda c, t: 1000.0 + t // STEP % 50,
    "DCGM_FI_DEV_FB_FREE": lambda c, t: 80_000.0 - t // STEP % 50,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": lambda c, t: float(4 if t // STEP % 40 == 0 else 0),
    "DCGM_FI_DEV_POWER_USAGE": lambda c, t: 300.0,
    "DCGM_FI_PROF_SM_ACTIVE": lambda c, t: (t // STEP % 10) / 10,
}


def new_store(path: Path, n: int, start: int) -> str:
    url = f"sqlite:///{path}"
    migrate.upgrade(make_engine(url))
    with open_store(url).begin() as conn:
        upsert_pods(
            conn,
            [
                PodRecord(
                    uid=f"uid-job-{i}",
                    namespace="team-a",
                    name=f"job-{i}",
                    node=f"node-{i // 8:04d}",
                    team="team-a",
                    job=f"Pod/job-{i}",
                    job_kind="Pod",
                    workload=WorkloadKind.TRAINING,
                    gang=f"uid-job-{i}",
                    gpu_count=1,
                    bound_ms=(start - 60) * 1000,
                )
                for i in range(0, n, 2)
            ],
        )
    return url


def floor(url: str, queries: list[tuple[str, float]]) -> tuple[float, int]:
    """Seconds to fetch and JSON-parse these instant queries, and the points they held."""
    points = 0
    started = time.perf_counter()
    for query, at in queries:
        body = urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(f"{url}/api/v1/query", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=300) as r:
            answer = json.loads(r.read())
        points += sum(len(s["values"]) for s in answer["data"]["result"])
    return time.perf_counter() - started, points


def child(args: argparse.Namespace) -> None:
    """One audit in this process; prints its seconds and peak RSS (MiB) as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        db = new_store(Path(tmp) / "a.db", args.gpus, args.start)
        started = time.perf_counter()
        stats = audit_from_store(
            db,
            samples_from=args.url,
            window=(args.start * 1000, args.end * 1000),
            thresholds=Thresholds(),
            step_s=STEP,
        )
        seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mib": rss, "points": stats.points}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    end = (int(time.time()) // 86_400 - 1) * 86_400
    start = end - round(args.hours * HOUR)
    fleet = cards(args.gpus, start, end)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        lines = backfill(
            fleet, root / "tsdb", start_s=start, end_s=end, interval_s=STEP, metrics=METRICS
        )
        print(
            f"backfilled {lines:,} samples of {args.gpus} GPUs in {time.perf_counter() - t0:.0f}s"
        )
        server = start_prometheus(root / "tsdb", root)
        try:
            made: list[tuple[str, float]] = []
            plain = PrometheusClient.query

            def recording(self: PrometheusClient, query: str, *, time_s: float):  # type: ignore[no-untyped-def]
                made.append((query, time_s))
                return plain(self, query, time_s=time_s)

            PrometheusClient.query = recording  # type: ignore[method-assign]
            db = new_store(root / "audit.db", args.gpus, start)
            t0 = time.perf_counter()
            stats = audit_from_store(
                db,
                samples_from=server.url,
                window=(start * 1000, end * 1000),
                thresholds=Thresholds(),
                step_s=STEP,
            )
            audit_s = time.perf_counter() - t0
            PrometheusClient.query = plain  # type: ignore[method-assign]
            floor_s, points = floor(server.url, made)
            print(
                f"audit from the store: {audit_s:.2f}s for {stats.points:,} points in "
                f"{stats.queries} queries ({stats.points / audit_s:,.0f} points/s); "
                f"{stats.audit.gpus} GPUs, {stats.audit.tenures} tenures"
            )
            print(
                f"fetch-and-parse floor, the same queries: {floor_s:.2f}s for {points:,} points "
                f"({points / floor_s:,.0f} points/s); audit / floor = {audit_s / floor_s:.2f}x"
            )
            for part in (4, 2, 1):
                first = end - (end - start) // part
                done = subprocess.run(
                    [sys.executable, __file__, "--child", "--gpus", str(args.gpus),
                     "--url", server.url, "--start", str(first), "--end", str(end)],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
                got = json.loads(done.stdout.strip().splitlines()[-1])
                print(
                    f"window {(end - first) / HOUR:g} h: peak RSS {got['rss_mib']:.0f} MiB, "
                    f"{got['seconds']:.1f}s, {got['points']:,} points"
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
