"""Keeping a store and what it writes in shape: a report written to a full disk is a fault
of the machine (exit 3, as docs/faults.md says); a rollup never grows the store; a file
imported twice at different offsets is said, and an import can be forgotten."""

from __future__ import annotations

import errno
from pathlib import Path

from smalldisk import tmpfs
from test_store_concurrency import WINDOW, seed
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.jobs.common import iso
from auditor.settings import Thresholds

runner = CliRunner()


def fill(path: Path) -> None:
    """Write zeros to `path` until its filesystem is full."""
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def test_a_report_to_a_full_disk_is_a_fault_of_the_machine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    seed(url)
    jobs.audit(url, window=WINDOW, thresholds=Thresholds())
    with tmpfs(tmp_path / "small", "64k") as disk:
        fill(disk / "filler")
        out = disk / "report.json"
        window = ["--start", iso(WINDOW[0]), "--end", iso(WINDOW[1])]
        result = runner.invoke(
            app, ["--db", url, "report", *window, "--format", "json", "--out", str(out)]
        )
        assert result.exit_code == 3, result.output
        line = result.output.strip()
        assert line.startswith("auditor: error: ")
        assert "No space left on device" in line
        assert str(out) in line
        assert not out.exists()
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no temporary left
