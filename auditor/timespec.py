"""Times as a user writes them: one grammar for instants, durations, windows, days and weeks.

Every option and spec that takes a time reads it here, so that `--since 1w` and
`--policy 'idle>=1w'` accept the same words and refuse bad ones with the same message:

- an *instant* is ISO 8601, a date or a date-time; without a zone it is UTC
  (`parse_instant` → epoch milliseconds);
- a *duration* is a number and one unit of `s m h d w` (`30m`, `1.5h`, `7d`, `1w`;
  `parse_duration` → `timedelta`, `duration_ms` → whole milliseconds);
- a *window* is `--start`/`--end`, or `--since` ending now or at `--end`
  (`parse_window` → `(start_ms, end_ms)` or None for "all");
- a *day* is `YYYY-MM-DD`, `yesterday` or `today` in UTC, a *week* an ISO week `2026-W48`
  (`parse_day`, `parse_week`, `last_week`);
- a *time zone* is an IANA name (`parse_tz`).

A ground floor: it imports only `auditor.errors` and the standard library, so the classifier
may use it. Each bad value is one `InputError` naming the option it came from.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta, tzinfo

from auditor.errors import MAX_SHOWN, InputError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""Seconds per duration unit."""
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*")


def now_ms() -> int:
    """The current time in epoch milliseconds."""
    return int(datetime.now(UTC).timestamp() * 1000)


def parse_instant(text: str, *, option: str) -> int:
    """ISO 8601 date or date-time (`Z` or an offset; UTC where no zone is given) → epoch
    milliseconds."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"not an ISO 8601 time: {text[:MAX_SHOWN]!r}", field=option) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def duration_seconds(text: str, *, option: str) -> float:
    """`30m`, `1.5h`, `7d`, `1w`... → seconds."""
    m = _DURATION.fullmatch(text)
    if not m:
        raise InputError(f"not a duration like 30m, 12h, 7d: {text!r}", field=option)
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_duration(text: str, *, option: str) -> timedelta:
    """A duration (`duration_seconds`) as a `timedelta`."""
    return timedelta(seconds=duration_seconds(text, option=option))


def duration_ms(text: str, *, option: str) -> int:
    """A duration (`duration_seconds`) in whole milliseconds, rounded."""
    return round(duration_seconds(text, option=option) * 1000)


def parse_window(start: str | None, end: str | None, since: str | None) -> tuple[int, int] | None:
    """`--start`/`--end`, or `--since` ending now (or at `--end`) → `(start_ms, end_ms)`;
    None when none is given (the caller's "everything")."""
    if since is not None:
        if start is not None:
            raise InputError("give --since or --start, not both", field="--since")
        end_ms = parse_instant(end, option="--end") if end else now_ms()
        return end_ms - int(parse_duration(since, option="--since").total_seconds() * 1000), end_ms
    if start is None and end is None:
        return None
    if start is None or end is None:
        raise InputError(
            "give both --start and --end (or --since)",
            field="--start" if start is None else "--end",
        )
    return parse_instant(start, option="--start"), parse_instant(end, option="--end")


_OFFSET = re.compile(r"(?:UTC)?([+-])(\d{1,2})(?::?(\d{2}))?")


def parse_tz(name: str | None) -> tzinfo | None:
    """An IANA time zone name (`Europe/Berlin`, with its daylight saving time), or a fixed
    offset from UTC (`+02:00`, `-0530`, `UTC+2`); None stays None (UTC)."""
    if name is None:
        return None
    from datetime import timedelta, timezone
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    fixed = _OFFSET.fullmatch(name.strip())
    if fixed is not None:
        sign, hours, minutes = fixed.group(1), int(fixed.group(2)), int(fixed.group(3) or 0)
        if hours > 14 or minutes >= 60 or hours * 60 + minutes > 14 * 60:
            raise InputError(f"not an offset from UTC: {name[:40]!r}", field="--tz")
        delta = timedelta(hours=hours, minutes=minutes)
        return timezone(-delta if sign == "-" else delta)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(f"unknown time zone {name[:40]!r}", field="--tz") from None


def parse_day(text: str, *, now: datetime) -> tuple[int, int]:
    """`YYYY-MM-DD` or `yesterday`/`today` → that UTC day, so daily runs chain exactly."""
    if text in ("yesterday", "today"):
        day = now.date() - timedelta(days=1 if text == "yesterday" else 0)
    else:
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise InputError(
                f"not a day like 2026-11-23 or 'yesterday': {text!r}", field="--day"
            ) from None
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return int(start.timestamp() * 1000), int((start + timedelta(days=1)).timestamp() * 1000)


def parse_week(text: str) -> tuple[str, tuple[int, int]]:
    """`2026-W48` → its label and that ISO week, Monday 00:00 UTC to the next Monday."""
    m = re.fullmatch(r"(\d{4})-W(\d{2})", text.strip())
    if not m:
        raise InputError(f"not an ISO week like 2026-W48: {text!r}", field="--week")
    try:
        monday = date.fromisocalendar(int(m.group(1)), int(m.group(2)), 1)
    except ValueError:
        raise InputError(f"no such ISO week: {text!r}", field="--week") from None
    start = datetime(monday.year, monday.month, monday.day, tzinfo=UTC)
    end = start + timedelta(days=7)
    label = f"{m.group(1)}-W{m.group(2)}"
    return label, (int(start.timestamp() * 1000), int(end.timestamp() * 1000))


def last_week(now: datetime) -> str:
    """The ISO week before the one `now` is in."""
    year, week, _ = (now - timedelta(days=7)).isocalendar()
    return f"{year}-W{week:02d}"
