"""One grammar for times (`auditor.timespec`): `--since` and `--policy 'idle>=...'` read
durations alike, and refuse a bad one with the same words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from auditor import timespec
from auditor.classify.whatif import parse_policy
from auditor.cli import app
from auditor.errors import InputError

WEEK_MS = 7 * 86400 * 1000


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    assert CliRunner().invoke(app, ["--db", url, "db", "upgrade"]).exit_code == 0
    return url


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("30m", 1800),
        ("1.5h", 5400),
        ("7d", 604800),
        ("1w", 604800),
        (" 2 w ", 1209600),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert timespec.parse_duration(text, option="--since") == timedelta(seconds=seconds)
    assert timespec.duration_ms(text, option="--since") == seconds * 1000


def test_one_week_is_a_policy_length_and_a_window() -> None:
    assert parse_policy("idle>=1w,grace=1w").idle_ms == WEEK_MS
    assert parse_policy("idle>=1w,grace=1w").grace_ms == WEEK_MS
    start, end = timespec.parse_window(None, "2026-11-30T00:00:00Z", "1w") or (0, 0)
    assert end - start == WEEK_MS


def test_one_week_in_since_and_in_policy_on_the_command_line(db: str) -> None:
    result = CliRunner().invoke(
        app, ["--db", db, "whatif", "--policy", "idle>=1w", "--since", "1w"]
    )
    assert result.exit_code == 0, result.output
    assert "idle>=1w" in result.output


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--policy", "idle>=1x", "--since", "1w"], "--policy idle"),
        (["--policy", "idle>=1w", "--since", "1x"], "--since"),
    ],
)
def test_a_bad_duration_is_refused_in_the_same_words(db: str, args: list[str], field: str) -> None:
    result = CliRunner().invoke(app, ["--db", db, "whatif", *args])
    assert result.exit_code == 2
    assert f"field '{field}': not a duration like 30m, 12h, 7d: '1x'" in result.output


def test_instants_days_and_weeks() -> None:
    assert timespec.parse_instant("2026-11-23", option="--start") == timespec.parse_instant(
        "2026-11-23T00:00:00Z", option="--start"
    )
    with pytest.raises(InputError, match="not an ISO 8601 time"):
        timespec.parse_instant("soon", option="--start")
    now = datetime(2026, 11, 24, 3, tzinfo=UTC)
    start, end = timespec.parse_day("yesterday", now=now)
    assert (start, end) == timespec.parse_day("2026-11-23", now=now)
    assert end - start == 86400 * 1000
    label, (w0, w1) = timespec.parse_week(timespec.last_week(now))
    assert label == "2026-W47"
    assert w1 - w0 == WEEK_MS
    with pytest.raises(InputError, match="unknown time zone"):
        timespec.parse_tz("Mars/Olympus")
