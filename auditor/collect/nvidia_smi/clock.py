"""The node's clock: nvidia-smi's zone-less local timestamps as epoch milliseconds UTC.

`LocalClock` reads `YYYY/MM/DD HH:MM:SS.mmm` in the node's time zone, refuses times before
2000 (`EARLIEST_MS`: a clock that was reset) or after the caller's "now", and a local time
that does not exist (the hour skipped in spring). A local time that occurs twice (the hour
a clock is set back) is read as its first occurrence, unless that would put it more than a
minute before a time already read and the second occurrence would not: a log runs
forward, so it is then in the repeated hour. The row parser asks it one cell at a time
(`epoch_ms`); the fast path one minute at a time (`offsets`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo

from auditor.collect.nvidia_smi.cells import BadCell, is_missing
from auditor.errors import shown

_TIMESTAMP = re.compile(r"(\d{4})/(\d{1,2})/(\d{1,2}) (\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_MS = timedelta(milliseconds=1)
_REPEAT_TOLERANCE_MS = 60_000
"""How far back a repeated local time must go before it is read as its second occurrence."""

EARLIEST_MS = 946_684_800_000
"""2000-01-01T00:00:00Z: no GPU log is older; a 1970 date is a clock that was reset."""


class LocalClock:
    """Turns nvidia-smi's zone-less local timestamps into epoch milliseconds UTC.

    The work per minute (date arithmetic, the zone's offsets) is done once and cached:
    consecutive rows share their minute.
    """

    def __init__(self, tz: tzinfo, *, not_after_ms: int | None = None) -> None:
        self._tz = tz
        self._not_after_ms = not_after_ms
        fixed = tz.utcoffset(None) if isinstance(tz, timezone) else None
        self._fixed_ms = None if fixed is None else fixed // _MS
        # (the "YYYY/MM/DD HH:MM" text, its local ms, first and second UTC offset in ms)
        self._minute: tuple[str, int, int, int] = ("", 0, 0, 0)
        self.latest_ms: int | None = None
        self._offsets: dict[int, int | None] = {}

    @property
    def not_after_ms(self) -> int | None:
        return self._not_after_ms

    def offsets(self, key: int) -> int | None:
        """The UTC ms of local minute `key` (YYYYMMDDHHMM as a number), or None where the
        minute does not exist or happens twice in the zone (or is no date at all)."""
        known = self._offsets.get(key, False)
        if known is not False:
            return known
        year, rest = divmod(key, 100_000_000)
        month, rest = divmod(rest, 1_000_000)
        day, rest = divmod(rest, 10_000)
        hour, minute = divmod(rest, 100)
        found: int | None = None
        try:
            days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
        except ValueError:
            days = None
        if days is not None and hour <= 23 and minute <= 59:
            minute_ms = ((days * 24 + hour) * 60 + minute) * 60_000
            if self._fixed_ms is not None:
                found = minute_ms - self._fixed_ms
            else:
                local = datetime(year, month, day, hour, minute, tzinfo=self._tz)
                first = local.utcoffset()
                second = local.replace(fold=1).utcoffset()
                back = local.astimezone(UTC).astimezone(self._tz).replace(tzinfo=None)
                if first is not None and first == second and back == local.replace(tzinfo=None):
                    found = minute_ms - first // _MS
        if len(self._offsets) > 100_000:
            self._offsets.clear()
        self._offsets[key] = found
        return found

    def epoch_ms(self, cells: Sequence[str], column: int) -> int:
        cell = cells[column]
        match = _TIMESTAMP.fullmatch(cell)
        if match is None:
            if not cell or is_missing(cell):
                raise BadCell(column, f"no timestamp, found {shown(cell)}")
            raise BadCell(column, f"expected YYYY/MM/DD HH:MM:SS.mmm, found {shown(cell)}")
        key = cell[: match.end(5)]
        if key != self._minute[0]:
            self._minute = self._minute_of(key, match, column)
        _, minute_ms, first, second = self._minute
        seconds = int(match.group(6))
        if seconds > 59:
            raise BadCell(column, f"no such time of day in {shown(cell)}")
        fraction = match.group(7)
        local_ms = minute_ms + seconds * 1000 + (int(fraction.ljust(3, "0")[:3]) if fraction else 0)
        utc_ms = local_ms - first
        latest = self.latest_ms
        if first != second and latest is not None:
            # A local time that happens twice (clocks set back): read as the first occurrence
            # unless that goes back past a time already read and the second does not.
            repeat_ms = local_ms - second
            if utc_ms < latest - _REPEAT_TOLERANCE_MS and repeat_ms >= latest:
                utc_ms = repeat_ms
        if not EARLIEST_MS <= utc_ms <= (self._not_after_ms or utc_ms):
            when = "before 2000" if utc_ms < EARLIEST_MS else "in the future"
            raise BadCell(column, f"{cell} is {when}: is the node's clock set right?")
        if latest is None or utc_ms > latest:
            self.latest_ms = utc_ms
        return utc_ms

    def _minute_of(self, key: str, match: re.Match[str], column: int) -> tuple[str, int, int, int]:
        year, month, day, hour, minute = (int(match.group(g)) for g in range(1, 6))
        try:
            days = date(year, month, day).toordinal() - _EPOCH_ORDINAL
        except ValueError:
            raise BadCell(column, f"no such date in {shown(match.group(0))}") from None
        if hour > 23 or minute > 59:
            raise BadCell(column, f"no such time of day in {shown(match.group(0))}")
        minute_ms = ((days * 24 + hour) * 60 + minute) * 60_000
        if self._fixed_ms is not None:
            return key, minute_ms, self._fixed_ms, self._fixed_ms
        local = datetime(year, month, day, hour, minute, tzinfo=self._tz)
        first = local.utcoffset()
        second = local.replace(fold=1).utcoffset()
        if first is None or second is None:
            raise ValueError(f"time zone {self._tz!r} gives no UTC offset")
        if local.astimezone(UTC).astimezone(self._tz).replace(tzinfo=None) != local.replace(
            tzinfo=None
        ):
            raise BadCell(
                column, f"{match.group(0)} does not exist in {self._tz} (clocks went forward)"
            )
        return key, minute_ms, first // _MS, second // _MS
