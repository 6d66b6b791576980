"""Throughput of `auditor import prometheus`: a backfilled week of dcgm-exporter data.

Backfills a week of N GPUs (default 64: 8 nodes x 8, half held by pods, a quarter with
profiling metrics) at a 30 s scrape interval into a throwaway Prometheus (Debian's
`prometheus` and `promtool`), then imports it into a fresh SQLite (or --db) store and prints
samples per second, against the fetch-and-parse floor: the same queries the import made
(recorded as it made them), fetched with a plain HTTP client and JSON-parsed, nothing else.
`import / floor` is the floor's seconds over the import's: the share of the floor's speed the
import reaches. Imports (each into a fresh store) and floors alternate `--repeat` times and the
best of each is compared: the machines are shared, and both then read a warm Prometheus.
Run: .venv/bin/python bench/bench_prometheus_import.py [--gpus 64] [--days 7] [--repeat 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from promserver import Card, backfill, start_prometheus

from auditor.collect.prometheus import PrometheusClient
from auditor.jobs import import_prometheus, open_store
from auditor.jobs.imports import PrometheusImportStats
from auditor.model import PodRecord, WorkloadKind
from auditor.store.pod_writes import upsert_pods

DAY = 86_400


def add_pods(url: str, names: list[str], *, bound_s: int) -> None:
    """The pods the dcgm-exporter labels name, as the watcher would have stored them."""
    with open_store(url).begin() as conn:
        upsert_pods(
            conn,
            [
                PodRecord(
                    uid=f"uid-{name}",
                    namespace="team-a",
                    name=name,
                    node=None,
                    team="team-a",
                    job=f"Pod/{name}",
                    job_kind="Pod",
                    workload=WorkloadKind.TRAINING,
                    gang=f"uid-{name}",
                    gpu_count=1,
                    bound_ms=(bound_s - 60) * 1000,
                )
                for name in names
            ],
        )


def floor(url: str, made: list[tuple[str, bytes]]) -> tuple[float, int]:
    """Seconds to POST these (path, form) requests over one kept-alive connection and
    JSON-parse each answer, and the points of the matrices they held."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=300)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    points = 0
    started = time.perf_counter()
    for path, body in made:
        conn.request("POST", path, body=body, headers=headers)
        answer = json.loads(conn.getresponse().read())
        data = answer.get("data")
        if isinstance(data, dict) and data.get("resultType") == "matrix":
            points += sum(len(s["values"]) for s in data["result"])
    seconds = time.perf_counter() - started
    conn.close()
    return seconds, points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--step", type=int, default=30)
    parser.add_argument("--db", default=None, help="store URL (default: a new SQLite file)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="imports and floors, interleaved; best of each"
    )
    args = parser.parse_args()
    end = (int(time.time()) // DAY) * DAY
    start = end - args.days * DAY
    cards = [
        Card(
            f"GPU-{i:08d}",
            i % 8,
            f"node-{i // 8}",
            holders=[(start, end, "team-a", f"job-{i // 2}")] if i % 2 == 0 else (),
            profiling=i % 4 == 0,
        )
        for i in range(args.gpus)
    ]
    metrics = {
        "DCGM_FI_DEV_GPU_UTIL": lambda c, t: float((t // 30 + c.gpu) % 101),
        "DCGM_FI_DEV_FB_USED": lambda c, t: 20000.0,
        "DCGM_FI_DEV_FB_FREE": lambda c, t: 61000.0,
        "DCGM_FI_PROF_SM_ACTIVE": lambda c, t: 0.5,
    }
    with tempfile.TemporaryDirectory(prefix="bench-prom-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        lines = backfill(
            cards, root / "tsdb", start_s=start, end_s=end, interval_s=args.step, metrics=metrics
        )
        t1 = time.perf_counter()
        server = start_prometheus(root / "tsdb", root)
        try:
            print(f"backfilled {lines:,} series samples in {t1 - t0:.1f}s", flush=True)
            made: list[tuple[str, bytes]] = []
            plain = PrometheusClient._post

            def recording(self: PrometheusClient, path: str, body: bytes):  # type: ignore[no-untyped-def]
                made.append((f"{self._parts.path.rstrip('/')}{path}", body))
                return plain(self, path, body)

            imports: list[PrometheusImportStats] = []
            floors: list[float] = []
            for run in range(args.repeat):  # import, floor, import, floor, ...: both warm
                url = args.db or f"sqlite:///{root / f'auditor-{run}.db'}"
                add_pods(url, [f"job-{i // 2}" for i in range(0, args.gpus, 2)], bound_s=start)
                PrometheusClient._post = recording  # type: ignore[method-assign]
                try:
                    imports.append(
                        import_prometheus(
                            url,
                            prometheus_url=server.url,
                            window=(start * 1000, end * 1000),
                            step_s=args.step,
                        )
                    )
                finally:
                    PrometheusClient._post = plain  # type: ignore[method-assign]
                queries = made[: len(made) // (run + 1)]  # each import makes the same ones
                floor_s, points = floor(server.url, queries)
                floors.append(floor_s)
                if args.db:
                    break
        finally:
            server.stop()
    stats = min(imports, key=lambda s: s.seconds)
    print(
        f"imported {stats.samples:,} GPU samples of {stats.gpus} GPUs ({args.days} days, "
        f"{args.step}s step) and {stats.holdings:,} GPU->pod assignments in {stats.seconds:.2f}s "
        f"(best of {len(imports)}: {', '.join(f'{s.seconds:.2f}' for s in imports)}): "
        f"{stats.samples / stats.seconds:,.0f} samples/s"
    )
    floor_s = min(floors)
    print(
        f"fetch-and-parse floor, the same {len(queries)} queries: {floor_s:.2f}s for {points:,} "
        f"points (best of {len(floors)}: {', '.join(f'{f:.2f}' for f in floors)}): "
        f"{stats.samples / floor_s:,.0f} GPU samples/s"
    )
    print(
        f"import / floor = {floor_s / stats.seconds:.0%} of the floor's speed (best against best)"
    )


if __name__ == "__main__":
    main()
