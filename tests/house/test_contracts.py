"""The import-linter contracts guard modules nobody has written yet.

The contracts in pyproject.toml name packages, not module lists: a module added tomorrow
under the readers, the agents or anywhere in `auditor` is checked the day it lands. Each
case copies the package and pyproject.toml to a temporary directory, adds one new module
that breaks a contract, and runs `lint-imports` there: it must fail naming that contract
and the new module. The unchanged copy must pass, so the failures are the new module's.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_lint import ROOT, tool

READERS_AND_AGENTS = "The readers and the agents never touch the store"
LAYERS = "Layers: the CLI calls jobs"
KUBERNETES = "kube.py alone imports kubernetes"
PYNVML = "nvml.py alone imports pynvml"
NO_IO = "The classification core and the report renderers do no I/O"


def copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(
        ROOT / "auditor", root / "auditor", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("lint-imports"), "--no-cache", "--no-logo"],
        cwd=root,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )


def test_the_unchanged_tree_keeps_every_contract(tmp_path: Path) -> None:
    done = lint_imports(copy_tree(tmp_path))

    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("path", "source", "contract"),
    [
        pytest.param(
            "auditor/collect/cache.py", "import sqlalchemy\n", READERS_AND_AGENTS, id="reader-sql"
        ),
        pytest.param(
            "auditor/collect/pods_cache.py",
            "from auditor.store import reads\n",
            READERS_AND_AGENTS,
            id="reader-store",
        ),
        pytest.param(
            "auditor/agents/sample/direct.py",
            "from sqlalchemy import select\n",
            READERS_AND_AGENTS,
            id="agent-sql",
        ),
        pytest.param(
            "auditor/agents/watch/direct.py",
            "from auditor.store.pod_writes import upsert_pods\n",
            READERS_AND_AGENTS,
            id="agent-store",
        ),
        pytest.param(
            "auditor/jobs/nodes.py", "import kubernetes\n", KUBERNETES, id="second-kube-client"
        ),
        pytest.param("auditor/agents/sample/power.py", "import pynvml\n", PYNVML, id="second-nvml"),
        pytest.param("auditor/report/live.py", "import sqlalchemy\n", NO_IO, id="report-sql"),
        pytest.param(
            "auditor/store/helpers.py", "from auditor import jobs\n", LAYERS, id="store-up"
        ),
        pytest.param("auditor/extra.py", '"""unplaced"""\n', LAYERS, id="new-package-unplaced"),
    ],
)
def test_a_new_module_that_breaks_a_contract_fails_it(
    tmp_path: Path, path: str, source: str, contract: str
) -> None:
    root = copy_tree(tmp_path)
    (root / path).write_text(source)

    done = lint_imports(root)

    assert done.returncode != 0, done.stdout
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert contract in " ".join(broken.split()), done.stdout
    module = path.removesuffix(".py").replace("/", ".")
    assert module in done.stdout, done.stdout
