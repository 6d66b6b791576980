"""What ships: the wheel carries the migrations and data files an installed auditor needs,
and the container recipe lints clean and runs as a non-root user."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_migrations_and_data(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("gpu_waste_auditor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "auditor/migrations/env.py",
        "auditor/migrations/script.py.mako",
        "auditor/migrations/versions/0001_initial.py",
        "auditor/data/nvidia_smi_fields.txt",
        "auditor/py.typed",
    ):
        assert needed in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "auditor = auditor.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_containerfile_lints_clean_and_runs_as_non_root() -> None:
    text = (ROOT / "Containerfile").read_text()
    assert "USER 10001:10001" in text
    assert 'ENTRYPOINT ["auditor"]' in text
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists() and not shutil.which("hadolint"):
        pytest.skip("hadolint is not installed (pip install '.[test]')")
    out = subprocess.run(
        [str(hadolint if hadolint.exists() else "hadolint"), str(ROOT / "Containerfile")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
