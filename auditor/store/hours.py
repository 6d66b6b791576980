"""Which stored rows of audit runs a read takes: whole runs, or their hours in a window.

Audit results, causes and SM rows are stored per UTC hour (`hour_ms`, SPEC §11): a report
of any whole-hour window inside audited runs sums the buckets inside it
(`auditor.report.windows.choose_slices` chooses them).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import ColumnElement, Table, and_, false, or_

from auditor.model import RunSlice


def parts_condition(table: Table, parts: Sequence[int | RunSlice]) -> ColumnElement[bool]:
    """The rows of `table` (run_id, hour_ms) that `parts` take: a run id takes the whole
    run, a `RunSlice` the run's buckets starting inside its window."""
    whole = [int(p) for p in parts if not isinstance(p, RunSlice)]
    sliced = [p for p in parts if isinstance(p, RunSlice)]
    terms: list[ColumnElement[bool]] = []
    if whole:
        terms.append(table.c.run_id.in_(whole))
    terms += [
        and_(table.c.run_id == s.run_id, table.c.hour_ms >= s.start_ms, table.c.hour_ms < s.end_ms)
        for s in sliced
    ]
    return or_(*terms) if terms else false()


def run_ids(parts: Sequence[int | RunSlice]) -> list[int]:
    """The runs `parts` read from, each once, in order."""
    return sorted({p.run_id if isinstance(p, RunSlice) else int(p) for p in parts})
