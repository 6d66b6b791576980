"""The CLI's help: every command documented, fast to print, and mirrored in README.md.

`AUDITOR_UPDATE_README=1 pytest tests/cli/test_cli_help.py` rewrites README's CLI reference.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
START = "<!-- cli-reference:start -->"
END = "<!-- cli-reference:end -->"
COMMANDS: list[list[str]] = [
    [],
    ["import", "nvidia-smi"],
    ["import", "pods"],
    ["import", "prometheus"],
    ["import", "outputs"],
    ["import", "list"],
    ["import", "undo"],
    ["audit"],
    ["report"],
    ["explain"],
    ["whatif"],
    ["export", "finance"],
    ["compare"],
    ["rollup"],
    ["simulate"],
    ["demo"],
    ["watch"],
    ["sample"],
    ["db", "upgrade"],
    ["db", "current"],
]
HEAVY = ("pandas", "numpy", "sqlalchemy", "kubernetes", "pynvml", "alembic")


@functools.cache
def _help_cached(args: tuple[str, ...]) -> str:
    env = {
        **os.environ,
        "TERMINAL_WIDTH": "100",
        "_TYPER_FORCE_DISABLE_TERMINAL": "1",
        "NO_COLOR": "1",
    }
    out = subprocess.run(
        [sys.executable, "-m", "auditor", *args, "--help"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=ROOT,
    )
    return "\n".join(line.rstrip() for line in out.stdout.strip().splitlines())


def _help(args: list[str]) -> str:
    return _help_cached(tuple(args))


def reference() -> str:
    parts = [START, ""]
    for args in COMMANDS:
        title = " ".join(["auditor", *args])
        parts += [f"### `{title}`", "", "```text", _help(args), "```", ""]
    parts.append(END)
    return "\n".join(parts)


def test_readme_cli_reference_is_current() -> None:
    text = README.read_text(encoding="utf-8")
    assert START in text, "README.md lacks the CLI reference start marker"
    assert END in text, "README.md lacks the CLI reference end marker"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    fresh = head + reference() + tail
    if os.environ.get("AUDITOR_UPDATE_README"):
        README.write_text(fresh, encoding="utf-8")
    assert text == fresh, (
        "README's CLI reference is stale: AUDITOR_UPDATE_README=1 pytest tests/cli/test_cli_help.py"
    )


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "auditor")
def test_every_command_has_help_text(args: list[str]) -> None:
    text = _help(args)
    usage, _, body = text.partition("\n")
    assert usage.strip().startswith("Usage:")
    # a one-line description follows the usage line, and every option is explained
    assert body.strip(), f"`auditor {' '.join(args)}` has no help text"
    for line in body.splitlines():
        if line.strip().startswith("│ --") and "--help" not in line:
            assert len(line.split()) > 3, f"option without help: {line.strip()}"


def test_help_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from auditor.cli import app\n"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0\n"
        f"print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
