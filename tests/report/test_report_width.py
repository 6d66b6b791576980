"""The terminal report never cuts a name a user types back (`auditor explain JOB`, a card's
UUID, a node): as wide as its content in a file or pipe, the terminal's width in a terminal,
folded onto the next line where a terminal is too narrow for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from htmlweek import week_report

from auditor.report.render import render_table
from auditor.report.summary import GroupBy

KEYS = {GroupBy.JOB: "job", GroupBy.POD: "pod", GroupBy.GPU: "gpu", GroupBy.NODE: "node"}


def names(by: GroupBy) -> list[str]:
    report, _, _ = week_report(by=by, gpus=16, days=1)
    return [str(v) for v in report.rows[KEYS[by]] if isinstance(v, str)]


def unfolded(text: str) -> str:
    """The table's cells joined across the lines a folded cell runs over: each column's
    pieces of one row, in order, with the borders and padding taken out."""
    cells: dict[int, str] = {}
    for line in text.splitlines():
        if "│" not in line:
            continue
        for i, piece in enumerate(line.split("│")):
            cells[i] = cells.get(i, "") + piece.strip()
    return "\n".join(cells.values())


@pytest.mark.parametrize("by", list(KEYS))
def test_without_a_width_every_name_is_whole_on_its_line(by: GroupBy) -> None:
    report, _, _ = week_report(by=by, gpus=16, days=1)
    text = render_table(report)
    assert "…" not in text
    lines = text.splitlines()
    for name in names(by):
        assert any(name in line for line in lines), name
    for offender in report.offenders["offender"]:
        assert any(str(offender) in line for line in lines), offender


@pytest.mark.parametrize("by", list(KEYS))
def test_a_wide_terminal_is_used_whole(by: GroupBy) -> None:
    report, _, _ = week_report(by=by, gpus=16, days=1)
    text = render_table(report, width=250)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 250
    for name in names(by):
        assert name in text, name


@pytest.mark.parametrize("by", [GroupBy.JOB, GroupBy.GPU])
def test_a_narrow_terminal_folds_names_and_cuts_none(by: GroupBy) -> None:
    report, _, _ = week_report(by=by, gpus=16, days=1)
    text = render_table(report, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    joined = re.sub(r"\s+", "", unfolded(text))
    for name in names(by):
        assert name.replace(" ", "") in joined, name
    assert "…" not in "".join(line.split("│")[1] for line in text.splitlines() if "│" in line)


def test_the_cli_uses_the_whole_width_of_a_real_terminal(tmp_path: Path) -> None:
    """`auditor report` in a 250-column pseudo-terminal: the card UUIDs come out whole."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    from auditor import jobs

    jobs.demo(tmp_path, scenario="small", log=lambda _: None)
    db = f"sqlite:///{tmp_path / 'auditor.db'}"
    out = {}
    for cols in (250, 90):
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "auditor", "--db", db, "report", "--by", "gpu"],
            stdout=follower, stderr=follower, stdin=follower, env=env,
        )  # fmt: skip
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0
        os.close(leader)
        out[cols] = b"".join(chunks).decode("utf-8").replace("\r\n", "\n")
    wide, narrow = out[250], out[90]
    assert max(len(line) for line in wide.splitlines()) <= 250
    assert max(len(line) for line in narrow.splitlines()) <= 90
    report = jobs.build_report(db, start_ms=None, end_ms=None, by=GroupBy.GPU, team=None)
    uuids = [str(g) for g in report.rows["gpu"]]
    assert all(u in wide for u in uuids)  # whole on one line in a wide terminal
    assert "…" not in wide
