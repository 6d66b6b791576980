"""What the causes of SPEC §10 cost the audit: the same fleet audited with every signal
present and with none, on SQLite, in one run.

    .venv/bin/python bench/bench_causes.py [--gpus 1000] [--hours 6] [--rounds 3]
        [--before DIR]

The fleet is `bench/fleet.py`'s (5 s samples, exact assignments). One store holds only its
samples and pods; a copy of it holds as well, every 30 s, a cgroup signal row per pod
(CPU-limit, throttling and pressure ratios), a PCIe/NVLink row per card, and a cordon on
one node in ten. Both are audited in turn, each audit in its own process (imports are not
audit time), `--rounds` times; the medians of wall-clock and of CPU seconds (both of the
audit's threads: wall-clock hides what the read-ahead thread overlaps, CPU counts it) and
their ratios are printed, with the median of each round's own ratio. Without signals the audit
still splits both categories (every idle second `unexplained`, every free one
`no_demand`): the ratio is the cost of reading and judging the signals. `--before DIR`, a
checkout of a release without causes (`git worktree add DIR <commit>`), adds its audit of
the bare store in the same rounds: the cost of the split itself.
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
sys.path.insert(0, str(ROOT / "bench"))

from fleet import make_fleet, sample_batches  # noqa: E402 - after the path it lives on

AUDIT = r"""
import json, sys, time
from auditor import jobs
from auditor.settings import Thresholds
import auditor.classify.pipeline, auditor.store.reads, auditor.store.signals  # noqa: F401
t, cpu = time.perf_counter(), time.process_time()
window = (int(sys.argv[2]), int(sys.argv[3]))
stats = jobs.audit(sys.argv[1], window=window, thresholds=Thresholds())
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": time.process_time() - cpu,
                  "samples": stats.samples}))
"""


def load(url: str, *, gpus: int, hours: float) -> tuple[int, int, int]:
    """The fleet's samples, pods and assignments; (start_ms, end_ms, samples)."""
    from auditor.store import bulk, migrate
    from auditor.store.connection import make_engine
    from auditor.store.pod_writes import upsert_pods
    from auditor.store.writes import upsert_assignments, upsert_gpus

    fleet = make_fleet(gpus=gpus, days=hours / 24)
    engine = make_engine(url)
    migrate.upgrade(engine)
    n = 0
    with engine.begin() as conn:
        ids = upsert_gpus(conn, fleet.gpus)
        upsert_pods(conn, fleet.pods)
        by_uid = {p.uid: p for p in fleet.pods}
        upsert_assignments(
            conn,
            [(uid, ids[card], by_uid[uid].bound_ms) for uid, card in fleet.assignments],
            source="pod-resources",
        )
    for frame in sample_batches(fleet, ids):
        with engine.begin() as conn:
            rows, spans, repeats = bulk.frame_rows(frame)
            bulk.write_rows(conn, rows, spans=spans, repeats=repeats)
        n += len(frame)
    engine.dispose()
    return fleet.start_ms, fleet.end_ms, n


def add_signals(url: str, *, start_ms: int, end_ms: int) -> tuple[int, int]:
    """Every signal, every 30 s: (pod rows, card rows) written."""
    import numpy as np
    from sqlalchemy import select

    from auditor.store.connection import make_engine
    from auditor.store.schema import gpus, pods
    from auditor.store.signals import write_card_signals, write_node_outages, write_pod_signals

    rng = np.random.default_rng(7)
    engine = make_engine(url)
    ticks = np.arange(start_ms, end_ms, 30_000)
    with engine.begin() as conn:
        held = conn.execute(select(pods.c.uid, pods.c.bound_ms, pods.c.finished_ms)).all()
        cards = conn.execute(select(gpus.c.id, gpus.c.node)).all()
        pod_rows = [
            {"pod_uid": uid, "source": "cgroup", "ts_ms": int(t),
             "cpu_limit_ratio": float(rng.uniform(0.2, 1.0)),
             "throttled_ratio": float(rng.uniform(0, 0.4)),
             "cpu_pressure": float(rng.uniform(0, 0.3)), "io_pressure": float(rng.uniform(0, 0.3))}
            for uid, lo, hi in held
            for t in ticks[(ticks >= (lo or start_ms)) & (ticks < (hi or end_ms))]
        ]  # fmt: skip
        card_rows = [
            {"gpu_id": gid, "ts_ms": int(t), "pcie_bytes_s": float(rng.uniform(0, 6e9)),
             "pcie_link_bytes_s": 32e9, "nvlink_bytes_s": float(rng.uniform(0, 3e9))}
            for gid, _ in cards
            for t in ticks
        ]  # fmt: skip
        write_pod_signals(conn, pod_rows)
        write_card_signals(conn, card_rows)
        nodes = sorted({n for _, n in cards})
        write_node_outages(
            conn,
            [
                {"node": n, "reason": "cordoned", "start_ms": start_ms + 3_600_000,
                 "end_ms": start_ms + 7_200_000}
                for n in nodes[::10]
            ],
        )  # fmt: skip
    engine.dispose()
    return len(pod_rows), len(card_rows)


def audit(url: str, start_ms: int, end_ms: int, *, tree: Path = ROOT) -> tuple[float, float]:
    """The audit's wall-clock and CPU seconds (both threads: reading ahead and classifying)."""
    done = subprocess.run(
        [sys.executable, "-c", AUDIT, url, str(start_ms), str(end_ms)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if done.returncode != 0:
        raise SystemExit(f"audit failed:\n{done.stderr}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return float(got["seconds"]), float(got["cpu"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="a checkout without causes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-causes-") as tmp:
        bare, full = Path(tmp) / "bare.db", Path(tmp) / "signals.db"
        start, end, n = load(f"sqlite:///{bare}", gpus=args.gpus, hours=args.hours)
        shutil.copy(bare, full)
        pod_rows, card_rows = add_signals(f"sqlite:///{full}", start_ms=start, end_ms=end)
        print(
            f"{args.gpus} GPUs x {args.hours:g} h: {n:,} samples; with signals: "
            f"{pod_rows:,} pod rows, {card_rows:,} card rows"
        )
        runs: dict[str, list[tuple[float, float]]] = {"without": [], "with": [], "before": []}
        for _ in range(args.rounds):  # in turn, so that the machine's load hits all alike
            runs["without"].append(audit(f"sqlite:///{bare}", start, end))
            runs["with"].append(audit(f"sqlite:///{full}", start, end))
            if args.before is not None:
                runs["before"].append(audit(f"sqlite:///{bare}", start, end, tree=args.before))
        report(runs)


def report(runs: dict[str, list[tuple[float, float]]]) -> None:
    """Medians of wall-clock and CPU seconds, their ratios, and the median of each round's
    own ratio (the two audits of a round ran back to back: a load that drifts over the
    rounds moves both)."""
    names = {"without": "without signals", "with": "with every signal", "before": "before causes"}
    for k, (what, unit) in enumerate((("wall", "s"), ("CPU", "s CPU"))):
        med = {n: statistics.median(x[k] for x in r) for n, r in runs.items() if r}
        for n, m in med.items():
            print(f"  {what}: audit {names[n]}: median {m:.2f} {unit}"
                  f"  {[round(x[k], 2) for x in runs[n]]}")  # fmt: skip
        pairs = zip(runs["with"], runs["without"], strict=True)
        paired = statistics.median(w[k] / o[k] for w, o in pairs)
        print(f"  {what}: with / without: {med['with'] / med['without']:.3f}x"
              f" (per round: median {paired:.3f}x)")  # fmt: skip
        if "before" in med:
            print(f"  {what}: without signals / before: {med['without'] / med['before']:.3f}x;"
                  f" with every signal / before: {med['with'] / med['before']:.3f}x")  # fmt: skip


if __name__ == "__main__":
    main()
