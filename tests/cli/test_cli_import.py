"""Imports through the real CLI on SQLite and PostgreSQL: idempotent, and bad input is one line,
exit code 2 and an untouched database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_store import GOOD_CSV, LATER, counts, invoke, pod


@pytest.fixture
def db(db_url: str) -> str:
    """A migrated store: `auditor db upgrade` is how a PostgreSQL database is prepared."""
    code, out = invoke(db_url, "db", "upgrade")
    assert code == 0, out
    return db_url


@pytest.fixture
def csv_file(tmp_path: Path) -> Path:
    path = tmp_path / "node-a.csv"
    path.write_text(GOOD_CSV, encoding="utf-8")
    return path


def test_reimporting_a_file_changes_nothing(db: str, csv_file: Path, tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    pods.write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod("u1"), pod("u2", gpus=0)]})
    )
    assert invoke(db, "import", "nvidia-smi", str(csv_file), "--node", "node-a")[0] == 0
    assert invoke(db, "import", "pods", str(pods))[0] == 0
    first = counts(db)
    code, out = invoke(db, "import", "nvidia-smi", str(csv_file), "--node", "node-a")
    assert code == 0, out
    assert invoke(db, "import", "pods", str(pods))[0] == 0
    assert counts(db) == first
    # the pod without GPUs was dropped; the unreadable utilisation stayed NULL
    assert first["pods"] == 1
    assert first["gpu_samples"] == 4


BAD_CSV = {
    "malformed line": (GOOD_CSV + "2026/11/23 08:00:10.000, 0, GPU-aaaa\n" + LATER, ":6", None),
    "unknown column": (GOOD_CSV.replace("memory.total [MiB]", "vibes [MiB]"), ":1", "vibes"),
    "bad timestamp": (GOOD_CSV + LATER.replace("08:00:10.000", "25:61:00"), ":6", "timestamp"),
    "util not a number": (GOOD_CSV + LATER.replace("50 %", "lots %"), ":6", "utilization.gpu"),
}


@pytest.mark.parametrize("case", list(BAD_CSV))
def test_bad_nvidia_smi_input_leaves_the_database_untouched(
    db: str, csv_file: Path, tmp_path: Path, case: str
) -> None:
    assert invoke(db, "import", "nvidia-smi", str(csv_file), "--node", "node-a")[0] == 0
    before = counts(db)
    text, line, field = BAD_CSV[case]
    bad = tmp_path / "bad.csv"
    bad.write_text(text.replace("GPU-aaaa", "GPU-cccc"), encoding="utf-8")
    code, out = invoke(db, "import", "nvidia-smi", str(bad), "--node", "node-b")
    assert code == 2
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("auditor: error: ")
    assert f"bad.csv{line}" in lines[0]
    if field:
        assert field in lines[0]
    assert "Traceback" not in out
    assert counts(db) == before


BAD_JSON = {
    "not json": ('{"kind": "List", "items": [', "bad.json:1"),
    "not a pod list": (
        json.dumps({"apiVersion": "v1", "kind": "ServiceList", "items": []}),
        "ServiceList",
    ),
    "bad timestamp": (
        json.dumps({"kind": "List", "items": [pod("u9")]}).replace(
            "2026-11-23T07:59:30Z", "yesterday"
        ),
        "lastTransitionTime",
    ),
}


@pytest.mark.parametrize("case", list(BAD_JSON))
def test_bad_pod_input_leaves_the_database_untouched(db: str, tmp_path: Path, case: str) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"kind": "List", "items": [pod("u1")]}))
    assert invoke(db, "import", "pods", str(good))[0] == 0
    before = counts(db)
    text, expected = BAD_JSON[case]
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    code, out = invoke(db, "import", "pods", str(bad))
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1, out
    assert "bad.json" in out
    assert expected in out
    assert counts(db) == before


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    for args in (
        ["nvidia-smi", str(tmp_path / "nope.csv"), "--node", "n"],
        ["pods", str(tmp_path / "nope.json")],
    ):
        code, out = invoke(db, "import", *args)
        assert code == 2
        assert "nope." in out
        assert len(out.strip().splitlines()) == 1


def test_unreachable_postgres_is_one_line() -> None:
    code, out = invoke("postgresql://nobody@127.0.0.1:1/none", "report")
    assert code == 3
    assert out.startswith("auditor: error: cannot use postgresql://nobody@127.0.0.1:1/none: ")
    assert "Connection refused" in out
    assert len(out.strip().splitlines()) == 1
