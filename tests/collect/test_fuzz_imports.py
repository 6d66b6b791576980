"""Fuzz every file importer through the real CLI: no traceback, one short line, nothing
written on a refusal.

Real fixture files (kubectl JSON and YAML lists, watch streams, single pods, nodes;
nvidia-smi CSVs of every layout) are damaged by a seeded mutator (`tests/mutate.py`) and
imported into a SQLite store that already holds data. Each case must end in success
(exit 0) or a refusal: exit 2 or 3, one line `auditor: error: ...` under 300 characters,
no traceback, and the store's contents exactly as before. `AUDITOR_FUZZ_CASES` sets the
number of cases per importer (default 150, a few seconds each in CI); a longer run prints
its counts.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from random import Random

import pytest
from mutate import CSV_HOSTILE, JSON_HOSTILE, mutate
from pgserver import new_database_name
from sqlalchemy import select
from typer.testing import CliRunner

from auditor.cli import app
from auditor.store.connection import make_engine
from auditor.store.schema import metadata

FIXTURES = Path(__file__).parents[1] / "fixtures"
CASES = int(os.environ.get("AUDITOR_FUZZ_CASES", "150"))
PG_CASES = max(1, CASES // 3)
"""PostgreSQL enforces what SQLite does not (VARCHAR lengths, NUL in text): fewer cases,
each dearer, on the same seeds."""
runner = CliRunner()

POD_FILES = sorted(
    [
        *(FIXTURES / "pods").glob("*.json"),
        *sorted((FIXTURES / "pods" / "controllers").glob("*.json"))[:6],
        *(FIXTURES / "pods" / "yaml").glob("*.yaml"),  # the same, dumped as kubectl YAML
    ]
)
CSV_FILES = sorted((FIXTURES / "nvidia_smi").glob("*.csv"))


def dump(url: str) -> str:
    """A digest of every row of every table, in key order."""
    engine = make_engine(url)
    digest = hashlib.sha256()
    try:
        with engine.connect() as conn:
            for table in metadata.sorted_tables:
                order = list(table.primary_key.columns) or list(table.columns)
                for row in conn.execute(select(table).order_by(*order)):
                    digest.update(repr(tuple(row)).encode("utf-8", "surrogatepass"))
    finally:
        engine.dispose()
    return digest.hexdigest()


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding samples and pods already, so a refusal has something to keep."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'auditor.db'}"
    else:
        server = request.getfixturevalue("pg_server")
        name = new_database_name()
        server.admin(f"CREATE DATABASE {name}")
        url = server.url(name)
        assert runner.invoke(app, ["--db", url, "db", "upgrade"]).exit_code == 0
    csv = runner.invoke(
        app, ["--db", url, "import", "nvidia-smi", str(CSV_FILES[0]), "--node", "n0"]
    )
    assert csv.exit_code == 0, csv.output
    pods = runner.invoke(app, ["--db", url, "import", "pods", str(FIXTURES / "pods/list.json")])
    assert pods.exit_code == 0, pods.output
    return url


def run_case(store: str, tmp: Path, args: list[str], data: bytes, before: str) -> str | None:
    """Import `data` into a store whose digest is `before`; "" for a success (the store may
    have changed), None for a refusal that kept the contract, else what broke it."""
    path = tmp / "input"
    path.write_bytes(data)
    result = runner.invoke(app, ["--db", store, *args, str(path)])
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"exception {type(result.exception).__name__}: {str(result.exception)[:200]}"
    if "Traceback" in out:
        return "a traceback in the output"
    if result.exit_code == 0:
        return ""
    if result.exit_code not in (2, 3):
        return f"exit {result.exit_code}: {out[:200]!r}"
    lines = out.splitlines()
    if len(lines) != 1 or not lines[0].startswith("auditor: error: "):
        return f"not one error line: {out[:300]!r}"
    if len(lines[0]) >= 300:
        return f"error line of {len(lines[0])} characters: {lines[0][:120]!r}"
    if dump(store) != before:
        return f"refused ({lines[0][:120]!r}) but the store changed"
    return None


@pytest.mark.parametrize(
    ("importer", "files", "hostile", "seed"),
    [
        pytest.param(["import", "pods"], POD_FILES, JSON_HOSTILE, 1201, id="pods"),
        pytest.param(
            ["import", "nvidia-smi", "--node", "fuzz-node"], CSV_FILES, CSV_HOSTILE, 1202, id="csv"
        ),
    ],
)
def test_damaged_files_are_imported_or_refused_cleanly(
    store: str,
    tmp_path: Path,
    importer: list[str],
    files: list[Path],
    hostile: tuple[bytes, ...],
    seed: int,
) -> None:
    rng = Random(seed)
    originals = [f.read_bytes() for f in files]
    failures: list[str] = []
    cases = CASES if store.startswith("sqlite") else PG_CASES
    digest = dump(store)
    for case in range(cases):
        data = mutate(rng.choice(originals), rng, hostile)
        problem = run_case(store, tmp_path, importer, data, digest)
        if problem:
            failures.append(f"case {case}: {problem}")
            (tmp_path / f"failed-{case}").write_bytes(data)
        if problem is not None:  # imported, or broke the contract: the store may have changed
            digest = dump(store)
    dialect = store.split(":", maxsplit=1)[0]
    print(f"{importer[1]} on {dialect}: {cases} cases, {len(failures)} failures")
    assert not failures, f"{len(failures)} of {cases} cases broke the contract:\n" + "\n".join(
        failures[:15]
    )
