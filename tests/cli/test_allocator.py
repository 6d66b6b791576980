"""A command that ends keeps the memory it frees for its next arrays (`auditor.allocator`);
the services leave glibc's own policy alone."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import auditor.allocator
from auditor.cli import app

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from auditor.allocator import keep_freed_memory
    assert keep_freed_memory()

def rounds():  # twenty arrays of 3 MiB, written, then all dropped: a classifier's pass
    arrays = [np.ones(3 << 17) for _ in range(20)]
    del arrays

rounds()
rounds()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return int(done.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_arrays_are_reused_without_a_page_fault() -> None:
    """As glibc sets it, the third pass maps its 60 MiB afresh (the second's were given
    back), a page fault per 4 KiB; kept, it takes the same pages again."""
    assert faults("default") > 10_000
    assert faults("keep") < 500


def test_off_glibc_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert auditor.allocator.keep_freed_memory() is False


@pytest.mark.parametrize(
    "variable",
    [("MALLOC_ARENA_MAX", "2"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576")],
)
def test_a_users_own_malloc_tuning_wins(
    monkeypatch: pytest.MonkeyPatch, variable: tuple[str, str]
) -> None:
    monkeypatch.setenv(*variable)
    assert auditor.allocator.keep_freed_memory() is False


@pytest.mark.parametrize(
    ("command", "keeps"),
    [
        (["audit", "--help"], True),
        (["explain", "--help"], True),
        (["report", "--help"], True),
        (["whatif", "--help"], True),
        (["import", "prometheus", "--help"], True),
        (["demo", "--help"], True),
        (["sample", "--help"], False),
        (["watch", "--help"], False),
    ],
)
def test_commands_that_end_keep_freed_memory_and_services_do_not(
    monkeypatch: pytest.MonkeyPatch, command: list[str], keeps: bool
) -> None:
    asked: list[bool] = []

    def keep() -> bool:
        asked.append(True)
        return True

    monkeypatch.setattr(auditor.allocator, "keep_freed_memory", keep)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert bool(asked) is keeps
