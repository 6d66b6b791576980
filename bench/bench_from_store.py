"""`auditor audit --samples-from` against its fetch-and-parse floor, its throughput per
audit pod (`--shard`), and its peak memory against the window's length.

Backfills N GPUs (default 1,000: nodes of 8, half held by pods, a quarter with profiling
metrics) over H hours (default 24) at a 30 s scrape interval into a throwaway Prometheus
(Debian's `prometheus` and `promtool`) and, where `victoria-metrics` and `vmctl` are
installed, copies the same blocks into a throwaway VictoriaMetrics; then, per store:
- audits the whole window from the store into a fresh SQLite store (pods stored first, as
  the watcher would have), recording every query it makes;
- the floor: the same queries fetched with a plain HTTP client and JSON-parsed, nothing else;
- one shard of `--shards` (default 4), as one pod of an Indexed Job runs it: its seconds,
  of which discovery (the whole fleet's pass every shard makes), and the samples it
  classified per second;
and on Prometheus the peak memory (ru_maxrss of a child process) of the audit of the first
1/4, 1/2 and the whole window, and of the one shard: flat where memory follows the chunk,
not the window.
Run: .venv/bin/python bench/bench_from_store.py [--gpus 1000] [--hours 24] [--shards 4]
(a quick check: --gpus 64 --hours 6).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
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
from auditor.store.pod_writes import upsert_pods

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
            shard=None if args.shard is None else (args.shard, args.shards),
        )
        seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mib": rss, "points": stats.points}))


def peak(args: argparse.Namespace, url: str, first: int, end: int, shard: int | None) -> dict:  # type: ignore[type-arg]
    """The child's figures: one audit of [first, end) (one shard of `args.shards`)."""
    command = [sys.executable, __file__, "--child", "--gpus", str(args.gpus), "--url", url,
               "--start", str(first), "--end", str(end), "--shards", str(args.shards)]  # fmt: skip
    if shard is not None:
        command += ["--shard", str(shard)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    got: dict = json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[type-arg]
    return got


def victoria(root: Path, tsdb: Path) -> tuple[object, str] | None:
    """A VictoriaMetrics holding the blocks under `tsdb` (copied with `vmctl prometheus`),
    and its URL; None where it is not installed."""
    from vmserver import binary, start_victoria_metrics

    vmctl = shutil.which("vmctl")
    if binary() is None or vmctl is None or shutil.which("script") is None:
        print("victoria-metrics: skipped (victoria-metrics, vmctl or script not installed)")
        return None
    server = start_victoria_metrics(root / "vm")
    t0 = time.perf_counter()
    copy = (
        f"{vmctl} prometheus --prom-snapshot={tsdb} --vm-addr={server.url} -s "
        "--prom-concurrency=2 --vm-disable-progress-bar"
    )
    # vmctl insists on a terminal: `script` gives it one
    subprocess.run(["script", "-qec", copy, "/dev/null"], check=True, capture_output=True)
    urllib.request.urlopen(f"{server.url}/internal/force_flush", timeout=60).close()
    print(f"copied into victoria-metrics in {time.perf_counter() - t0:.0f}s")
    return server, server.url


def measure(
    args: argparse.Namespace, name: str, url: str, root: Path, window: tuple[int, int]
) -> None:
    """The whole audit against its floor, and one shard's throughput, on the store at `url`."""
    start, end = window
    made: list[tuple[str, float]] = []
    plain = PrometheusClient.query

    def recording(self: PrometheusClient, query: str, *, time_s: float):  # type: ignore[no-untyped-def]
        made.append((query, time_s))
        return plain(self, query, time_s=time_s)

    PrometheusClient.query = recording  # type: ignore[method-assign]
    try:
        db = new_store(root / f"audit-{name}.db", args.gpus, start)
        t0 = time.perf_counter()
        stats = audit_from_store(
            db, samples_from=url, window=(start * 1000, end * 1000),
            thresholds=Thresholds(), step_s=STEP,
        )  # fmt: skip
        audit_s = time.perf_counter() - t0
    finally:
        PrometheusClient.query = plain  # type: ignore[method-assign]
    floor_s, points = floor(url, made)
    print(
        f"{name}: audit from the store: {audit_s:.2f}s for {stats.points:,} points in "
        f"{stats.queries} queries ({stats.points / audit_s:,.0f} points/s; discovery "
        f"{stats.discovery_s:.1f}s); {stats.audit.gpus} GPUs, {stats.audit.samples:,} samples "
        f"classified ({stats.audit.samples / audit_s:,.0f}/s), {stats.audit.tenures} tenures"
    )
    print(
        f"{name}: fetch-and-parse floor, the same queries: {floor_s:.2f}s for {points:,} points "
        f"({points / floor_s:,.0f} points/s); audit / floor = {audit_s / floor_s:.2f}x"
    )
    db = new_store(root / f"shard-{name}.db", args.gpus, start)
    t0 = time.perf_counter()
    one = audit_from_store(
        db, samples_from=url, window=(start * 1000, end * 1000),
        thresholds=Thresholds(), step_s=STEP, shard=(0, args.shards),
    )  # fmt: skip
    shard_s = time.perf_counter() - t0
    print(
        f"{name}: shard 0/{args.shards}: {shard_s:.2f}s (discovery {one.discovery_s:.1f}s), "
        f"{one.audit.gpus} GPUs, {one.audit.samples:,} samples classified: "
        f"{one.audit.samples / shard_s:,.0f} samples/s per audit pod "
        f"({one.audit.samples / (shard_s - one.discovery_s):,.0f}/s after discovery); "
        f"discovery covers the whole fleet's {stats.audit.samples:,} samples at "
        f"{stats.audit.samples / one.discovery_s:,.0f}/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--shard", type=int, help=argparse.SUPPRESS)
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
        vm = victoria(root, root / "tsdb")
        server = start_prometheus(root / "tsdb", root)
        try:
            measure(args, "prometheus", server.url, root, (start, end))
            if vm is not None:
                measure(args, "victoria-metrics", vm[1], root, (start, end))
            for part in (4, 2, 1):
                first = end - (end - start) // part
                got = peak(args, server.url, first, end, None)
                print(
                    f"window {(end - first) / HOUR:g} h: peak RSS {got['rss_mib']:.0f} MiB, "
                    f"{got['seconds']:.1f}s, {got['points']:,} points"
                )
            got = peak(args, server.url, start, end, 0)
            print(
                f"shard 0/{args.shards}, {(end - start) / HOUR:g} h: peak RSS "
                f"{got['rss_mib']:.0f} MiB, {got['seconds']:.1f}s"
            )
        finally:
            server.stop()
            if vm is not None:
                vm[0].stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
