"""The watcher killed (SIGKILL) at random points of a 1,000-event scenario and restarted.

A real `auditor watch` subprocess follows the stand-in API server while a producer plays a
seeded scenario of GPU pods being created, scheduled, started, finished and deleted (names
reused, CPU pods mixed in). The test kills the watcher 20 times at random moments and
restarts it; at the end the store must equal the scenario's truth: every pod, every time,
nothing lost, nothing extra, no deletion estimated.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubeapi import FakeApiServer, wait_until
from kubeobjects import T0, pod

ROOT = Path(__file__).resolve().parents[2]
S = 1000
EVENTS = 1000
KILLS = 20
STAGES = ("created", "bound", "started", "finished", "deleted")


@dataclass
class Scenario:
    """A seeded sequence of pod changes: ("put", pod) or ("delete", name)."""

    steps: list[tuple[str, Any]] = field(default_factory=list)
    truth: dict[str, dict[str, Any]] = field(default_factory=dict)


def scenario(seed: int, events: int = EVENTS) -> Scenario:
    rng = random.Random(seed)
    out = Scenario()
    live: dict[str, tuple[str, int, dict[str, int]]] = {}  # name -> (uid, stage, times)
    serial = 0
    while len(out.steps) < events:
        if not live or (len(live) < 25 and rng.random() < 0.3):
            name = f"job-{rng.randrange(40)}-worker"  # names come back after deletion
            if name in live:
                continue
            serial += 1
            uid = f"uid-{serial:05d}"
            gpus = 0 if rng.random() < 0.1 else rng.choice((1, 2, 8))
            live[name] = (uid, 0, {"created": T0 + serial * 10 * S, "gpus": gpus})
        else:
            name = rng.choice(sorted(live))
            uid, stage, times = live[name]
            if stage == 4:  # already being deleted: now it goes
                out.steps.append(("delete", name))
                del live[name]
                continue
            stage = rng.choice((stage + 1, 4)) if stage >= 1 else stage + 1
            times[STAGES[stage]] = times["created"] + (stage * 30 + rng.randrange(20)) * S
            live[name] = (uid, stage, times)
        uid, stage, times = live[name]
        out.steps.append(("put", _pod(name, uid, times)))
        if times["gpus"]:
            out.truth[uid] = _row(name, times)
    return out


def _pod(name: str, uid: str, times: dict[str, int]) -> dict[str, Any]:
    kw: dict[str, Any] = {k: times[k] for k in STAGES[1:] if k in times}
    if "finished" in kw and "started" not in kw:
        kw.pop("finished")
    return pod(name, uid=uid, gpus=times["gpus"], created=times["created"], **kw)


def _row(name: str, times: dict[str, int]) -> dict[str, Any]:
    finished = times.get("finished") if "started" in times else None
    return {
        "name": name,
        "node": "gpu-node-1" if "bound" in times else None,
        "gpu_count": times["gpus"],
        "created_ms": times["created"],
        "bound_ms": times.get("bound"),
        "started_ms": times.get("started"),
        "finished_ms": finished,
        "deleted_ms": times.get("deleted"),
        "deleted_estimated": False,
    }


COLUMNS: tuple[str, ...] = ("name", "node", "gpu_count", "created_ms", "bound_ms", "started_ms")
COLUMNS += ("finished_ms", "deleted_ms", "deleted_estimated")


def stored(url: str) -> dict[str, dict[str, Any]]:
    """The pods table by UID (plain sqlite3: cheap enough to poll beside the watcher)."""
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as db:
        rows = db.execute(f"SELECT uid, {', '.join(COLUMNS)} FROM pods").fetchall()
    out = {r[0]: dict(zip(COLUMNS, r[1:], strict=True)) for r in rows}
    for r in out.values():
        r["deleted_estimated"] = bool(r["deleted_estimated"])
    return out


def cursor(url: str) -> str | None:
    path = url.removeprefix("sqlite:///")
    if not Path(path).exists():
        return None
    with closing(sqlite3.connect(path, timeout=30)) as db:
        try:
            row = db.execute("SELECT resource_version FROM watch_cursors").fetchone()
        except sqlite3.OperationalError:  # not migrated yet
            return None
    return row[0] if row else None


def start_watcher(url: str, kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "auditor", "--db", url, "watch", "--kubeconfig", str(kubeconfig)]
    cmd += ["--no-nodes", "--metrics-port", "-1", "--watch-timeout", "5", "--read-timeout", "2"]
    with log.open("ab") as f:
        return subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=dict(os.environ)
        )


@pytest.mark.slow
def test_sigkill_at_random_points_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    rng = random.Random(20261202)
    plan = scenario(seed=5)
    url = f"sqlite:///{tmp_path / 'watch.db'}"
    log = tmp_path / "watcher.log"
    with FakeApiServer() as server:
        cluster = server.cluster
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
        proc = start_watcher(url, kubeconfig, log)
        wait_until(lambda: cursor(url), timeout=30)

        def play(steps: list[tuple[str, Any]]) -> None:
            for op, arg in steps:
                if op == "put":
                    cluster.put("pods", arg)
                else:
                    cluster.delete("pods", "ml", arg)
                time.sleep(rng.uniform(0.0, 0.02))

        # Each round plays a twentieth of the scenario while the watcher runs (or starts),
        # and kills it at a random moment after it has committed some of it.
        size = len(plan.steps) // KILLS
        started = time.monotonic()
        seen = [cursor(url)]
        for k in range(KILLS):
            feeder = threading.Thread(target=play, args=(plan.steps[k * size : (k + 1) * size],))
            feeder.start()
            wait_until(lambda: cursor(url) != seen[-1], timeout=60, every=0.05)
            time.sleep(rng.uniform(0.0, 0.4))
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            seen.append(cursor(url))
            feeder.join()
            proc = start_watcher(url, kubeconfig, log)
        play(plan.steps[KILLS * size :])
        want = plan.truth
        try:
            wait_until(lambda: stored(url) == want, timeout=60, every=0.3)
            # SIGTERM once the last watcher has set up its signal handlers
            wait_until(lambda: log.read_text().count("watching pods") == KILLS + 1, timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=15)
        elapsed = time.monotonic() - started
        # each start also asks whether the cluster serves DRA: discovery, not a list
        lists = [r for r in cluster.requests if "watch=" not in r and "/pods" in r]

    got = stored(url)
    lost = sum(1 for uid, r in want.items() for c, v in r.items() if got.get(uid, {}).get(c) != v)
    extra = len(set(got) - set(want))
    print(
        f"\nkill/restart: {len(plan.steps)} events, {KILLS} SIGKILL restarts, {len(want)} GPU pods,"
        f" lost {lost}, duplicated/extra {extra}, lists {len(lists)}, {elapsed:.1f}s;"
        f" cursors at the kills: {len(set(seen))} distinct of {len(seen)}"
    )
    assert code == 0, log.read_text()[-3000:]
    assert (lost, extra) == (0, 0)
    assert len(lists) == 1  # every restart resumed from the stored cursor
