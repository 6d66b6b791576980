"""Fuzz the Prometheus import through the real CLI: a scripted server (tests/fakeprom.py)
answers each query with a good dcgm-exporter answer damaged by the seeded mutator
(tests/mutate.py). The contract is the file importers': success, or one line under 300
characters with exit 2 or 3, no traceback, and a store exactly as before.
`AUDITOR_FUZZ_CASES` scales it (a fifth of it: 30 cases by default, each a whole import)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from random import Random

import pytest
from fakeprom import Reply, card, fake_prometheus
from mutate import JSON_HOSTILE, mutate
from test_fuzz_imports import dump
from typer.testing import CliRunner

from auditor.cli import app

CASES = max(1, int(os.environ.get("AUDITOR_FUZZ_CASES", "150")) // 5)
T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
WINDOW = ["--start", "2026-01-01T00:00:00Z", "--end", "2026-01-01T00:02:00Z", "--step", "30s"]
runner = CliRunner()


def good_answer(query: str) -> bytes:
    """What dcgm-exporter data looks like for `query`: two cards, one held by a pod, with
    utilisation and memory (other metrics and kube_pod_info: no series)."""
    result: list[object] = []
    if any(
        m in query for m in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
    ):
        values = [(T0 + 30.0 * i, f"{10 * i}") for i in range(4)]
        result = [
            card(values, namespace="ml", pod="train-0", container="main"),
            card(values, UUID="GPU-1", gpu="1"),
        ]
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}, indent=1
    ).encode()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prom-fuzz") / "seed.db"
    with fake_prometheus(lambda q: Reply(body=good_answer(q))) as fake:
        done = runner.invoke(
            app, ["--db", f"sqlite:///{path}", "import", "prometheus", "--url", fake.url, *WINDOW]
        )
    assert done.exit_code == 0, done.output
    return path


def test_damaged_answers_are_imported_or_refused_cleanly(seeded: Path, tmp_path: Path) -> None:
    db_path = tmp_path / "a.db"
    with sqlite3.connect(seeded) as source, sqlite3.connect(db_path) as copy:
        source.backup(copy)  # the seed's last writes may still be in its WAL
    url = f"sqlite:///{db_path}"
    rng = Random(1203)
    failures: list[str] = []
    digest = dump(url)
    for case in range(CASES):
        # one query of the import gets a damaged answer; the others are good
        victim = rng.choice(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"])
        damaged: dict[str, bytes] = {}

        def respond(query: str, victim: str = victim, damaged: dict[str, bytes] = damaged) -> Reply:
            body = good_answer(query)
            if victim in query:
                body = damaged.setdefault(victim, mutate(body, rng, JSON_HOSTILE))
            return Reply(body=body)

        with fake_prometheus(respond) as fake:
            done = runner.invoke(
                app,
                ["--db", url, "import", "prometheus", "--url", fake.url, *WINDOW, "--timeout", "5"],
            )
        out = done.output
        problem: str | None = None
        if done.exception is not None and not isinstance(done.exception, SystemExit):
            problem = f"exception {type(done.exception).__name__}: {str(done.exception)[:160]}"
        elif "Traceback" in out:
            problem = "a traceback in the output"
        elif done.exit_code != 0:
            lines = out.strip().splitlines()
            if done.exit_code not in (2, 3) or len(lines) != 1:
                problem = f"exit {done.exit_code}: {out[:200]!r}"
            elif not lines[0].startswith("auditor: error: ") or len(lines[0]) >= 300:
                problem = f"not one short error line: {lines[0][:120]!r}"
            elif dump(url) != digest:
                problem = f"refused ({lines[0][:100]!r}) but the store changed"
        if problem:
            failures.append(f"case {case} ({victim}): {problem}")
        if done.exit_code == 0 or problem:
            digest = dump(url)
    print(f"prometheus: {CASES} cases, {len(failures)} failures")
    assert not failures, "\n".join(failures[:10])
