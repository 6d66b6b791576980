"""Throughput of the classifier on a synthetic cluster: prints samples/s and peak RSS.

100 GPUs (12 nodes of 8, plus 4) sampled every 5 s for one day (1.7 M samples) with jitter,
unreadable samples and a sampler outage; pods of 1, 2, 4 and 8 cards (multi-card pods are
gangs) come and go; utilisation has periodic gang-wide gaps, a
slow rank, stalls and random imbalance between ranks.

    .venv/bin/python bench/bench_classify.py [--gpus 100] [--days 1] [--period 5] [--repeat 3]
        [--categorical]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np
import pandas as pd

from auditor.classify import classify
from auditor.model import Window
from auditor.settings import Thresholds

DAY_MS = 86_400_000


def synthetic(
    *, gpus: int, days: float, period_s: float, seed: int = 7
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Samples and tenures of a made-up cluster (vectorised over samples)."""
    rng = np.random.default_rng(seed)
    period = int(period_s * 1000)
    span = int(days * DAY_MS)
    n_per = span // period
    base = 1_767_225_600_000  # 2026-01-01
    frames: list[pd.DataFrame] = []
    tenures: list[tuple[str, str, str, int, int]] = []
    uuids = [f"GPU-{i:04d}" for i in range(gpus)]
    for node in range(0, gpus, 8):
        cards = uuids[node : node + 8]
        t = 0
        pod = 0
        while t < span:
            size = int(rng.choice([1, 2, 4, 8]))
            length = int(rng.integers(1, 8) * 3_600_000)
            gap = int(rng.integers(0, 2) * 1_800_000)
            start, end = t + gap, min(t + gap + length, span)
            uid = f"pod-{node}-{pod}"
            for card in cards[:size]:
                tenures.append((card, uid, uid, base + start, base + end))
            t = end
            pod += 1
    tenure_frame = pd.DataFrame(tenures, columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms"])
    for i, uuid in enumerate(uuids):
        ts = base + np.arange(n_per, dtype=np.int64) * period
        ts = ts + rng.integers(-200, 200, n_per)
        phase = (ts // 60_000) % 30
        util = np.where(phase == 0, 0.0, rng.uniform(30, 100, n_per))
        util = np.where(rng.random(n_per) < 0.05, rng.uniform(0, 5, n_per), util)
        if i % 8 == 3:
            util = util * 0.6  # a slow rank
        util[rng.random(n_per) < 0.01] = np.nan
        keep = np.ones(n_per, dtype=bool)
        if i % 10 == 0:
            keep[n_per // 2 : n_per // 2 + 720] = False  # an hour's outage
        frames.append(pd.DataFrame({"gpu": uuid, "ts_ms": ts[keep], "util": util[keep]}))
    samples = pd.concat(frames, ignore_index=True)
    samples["gpu"] = samples["gpu"].astype(object)
    return samples, tenure_frame


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=100)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--period", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--categorical", action="store_true", help="pass the gpu column as a categorical"
    )
    args = parser.parse_args(argv)
    samples, tenures = synthetic(gpus=args.gpus, days=args.days, period_s=args.period)
    if args.categorical:
        samples["gpu"] = samples["gpu"].astype("category")
    start = int(samples["ts_ms"].min())
    window = Window(start, start + int(args.days * DAY_MS))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    best = float("inf")
    for _ in range(args.repeat):
        began = time.perf_counter()
        out = classify(samples, tenures, window=window, thresholds=Thresholds())
        best = min(best, time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = len(samples)
    print(f"samples: {n:,}  tenures: {len(tenures):,}  best of {args.repeat}: {best:.3f} s")
    print(f"throughput: {n / best:,.0f} samples/s")
    print(f"peak RSS: {peak:,.0f} MiB (after building the input: {rss_before:,.0f} MiB)")
    print(f"results: {len(out.results)} rows, findings: {len(out.findings)} rows")


if __name__ == "__main__":
    main(sys.argv[1:])
