"""Time zones of nvidia-smi logs: a fixed offset is a zone too, and a log imported again
with another `--tz` is named (its copy lands hours away from the first)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from cli_store import invoke
from sqlalchemy import Engine

from auditor.errors import InputError
from auditor.timespec import parse_tz


@pytest.mark.parametrize(
    ("text", "hours"), [("+02:00", 2.0), ("-0530", -5.5), ("UTC+2", 2.0), ("+14:00", 14.0)]
)
def test_a_fixed_offset_is_a_zone(text: str, hours: float) -> None:
    zone = parse_tz(text)
    assert zone is not None
    assert zone.utcoffset(None) == timedelta(hours=hours)


@pytest.mark.parametrize("text", ["+15:00", "+02:60", "Mars/Olympus"])
def test_a_bad_zone_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(InputError, match="--tz"):
        parse_tz(text)


def log(path: Path) -> Path:
    lines = ["timestamp, uuid, utilization.gpu [%], memory.used [MiB]"]
    for i in range(20):
        lines.append(f"2026/11/23 08:00:{i * 2:02d}.000, GPU-a, {(i * 37) % 100} %, 900 MiB")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def db(db_url: str, engine: Engine) -> str:
    return db_url


def test_a_log_imported_again_with_another_zone_is_named(tmp_path: Path, db: str) -> None:
    path = log(tmp_path / "node-a.csv")
    assert invoke(db, "import", "nvidia-smi", str(path))[0] == 0
    code, out = invoke(db, "import", "nvidia-smi", str(path), "--tz", "+02:00")
    assert code == 0, out
    assert "its first readings are stored already, 2 h later" in out
    assert "another --tz?" in out
    # the same log again in the same zone is a re-import, not a shift
    code, out = invoke(db, "import", "nvidia-smi", str(path), "--tz", "+02:00")
    assert "(20 already stored)" in out
    assert "warning" not in out
