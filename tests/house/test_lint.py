"""The static checks as tests, so one `pytest` run is the whole gate.

ruff (lint and format), mypy (strict, over the files pyproject.toml names) and
import-linter (the layer contracts in pyproject.toml), each run as its own process from
the same environment as pytest, in the repository root.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    """The tool installed beside this Python, else the one on PATH."""
    beside = BIN / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'", pytrace=False)
    return found


@pytest.mark.parametrize(
    ("name", "args"),
    [
        pytest.param("ruff", ["check", "--no-cache", "."], id="ruff-check"),
        pytest.param("ruff", ["format", "--check", "--no-cache", "."], id="ruff-format"),
        pytest.param("mypy", [], id="mypy"),
        pytest.param("lint-imports", ["--no-cache", "--no-logo"], id="import-linter"),
    ],
)
def test_static_check_passes(name: str, args: list[str]) -> None:
    done = subprocess.run(
        [tool(name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
        check=False,
    )

    if done.returncode != 0:
        pytest.fail(f"{' '.join([name, *args])}:\n{done.stdout}{done.stderr}", pytrace=False)
