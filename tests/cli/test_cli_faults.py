"""Faults of the machine and the database, met through the real CLI: one line, exit 3, the
database as it was — never a traceback.

Each fault is real: a disk that fills (a 1 MiB tmpfs), a database file opened read-only, a
PostgreSQL server that ends the session in the middle of an audit, a port that is not a
number, a dialect the auditor does not speak.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pgserver import PgServer
from smalldisk import tmpfs
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate
from auditor.store import reads
from auditor.store.connection import make_engine

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"a traceback would reach the user: {result.exception!r}")
    return result.exit_code, result.output


def one_line(out: str) -> str:
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("auditor: error: "), out
    assert len(lines[0]) < 300
    assert "Traceback" not in out
    return lines[0]


def big_csv(path: Path, rows: int) -> Path:
    with path.open("w") as f:
        f.write("timestamp, index, uuid, utilization.gpu [%], memory.used [MiB]\n")
        for i in range(rows):
            minute, second = divmod(5 * i, 60)
            hour, minute = divmod(minute, 60)
            day, hour = divmod(hour, 24)
            f.write(
                f"2026/11/{1 + day:02d} {hour:02d}:{minute:02d}:{second:02d}.000, 0, "
                f"GPU-0000aaaa-0000-0000-0000-000000000000, 50 %, 100 MiB\n"
            )
    return path


def counts(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = reads.count_rows(conn)
    engine.dispose()
    return out


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB filesystem of its own (tmpfs), unmounted afterwards."""
    with tmpfs(tmp_path / "small-disk", "1m") as mount:
        yield mount


def test_a_full_disk_is_one_line_and_the_store_keeps_what_it_had(
    small_disk: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{small_disk / 'auditor.db'}"
    code, out = invoke(
        "--db", url, "import", "nvidia-smi", str(big_csv(tmp_path / "a.csv", 50)), "--node", "n1"
    )
    assert code == 0, out
    before = counts(url)
    code, out = invoke(
        "--db",
        url,
        "import",
        "nvidia-smi",
        str(big_csv(tmp_path / "b.csv", 60_000)),
        "--node",
        "n1",
    )
    assert code == 3
    assert "full" in one_line(out)
    assert counts(url) == before


def test_a_read_only_database_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "auditor.db"
    url = f"sqlite:///{db}"
    assert (
        invoke(
            "--db",
            url,
            "import",
            "nvidia-smi",
            str(big_csv(tmp_path / "a.csv", 10)),
            "--node",
            "n1",
        )[0]
        == 0
    )
    before = counts(url)
    read_only = f"sqlite:///file:{db}?mode=ro&uri=true"
    code, out = invoke(
        "--db",
        read_only,
        "import",
        "nvidia-smi",
        str(big_csv(tmp_path / "b.csv", 20)),
        "--node",
        "n1",
    )
    assert code == 3
    assert "readonly" in one_line(out).replace("read-only", "readonly")
    assert counts(url) == before


@pytest.mark.parametrize(
    ("url", "says"),
    [
        pytest.param("postgresql://auditor@127.0.0.1:abc/db", "port", id="port-not-a-number"),
        pytest.param("postgresql://auditor@127.0.0.1:99999/db", "port", id="port-out-of-range"),
        pytest.param("mysql://auditor@127.0.0.1/db", "mysql", id="unsupported-dialect"),
        pytest.param("sqlite:////nonexistent-dir/x/auditor.db", "open", id="no-such-directory"),
    ],
)
def test_a_database_url_that_cannot_work_is_one_line(url: str, says: str) -> None:
    code, out = invoke("--db", url, "report")
    assert code == 3
    assert says in one_line(out)


@pytest.mark.postgres
def test_postgresql_ending_the_session_mid_audit_is_one_line(
    pg_server: PgServer, pg_db_url: str, tmp_path: Path
) -> None:
    """The server ends the audit's session (as a restart or a failover does): one line, exit
    3, and the results stored before stay as they were."""
    sim = simulate(tmp_path / "c", scenario=SCENARIOS["small"])
    assert invoke("--db", pg_db_url, "db", "upgrade")[0] == 0
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(pg_db_url, path, node=node)
    jobs.import_pods(pg_db_url, sim.pods_json, config=Config())
    window = (sim.window_start_ms, sim.window_end_ms)
    jobs.audit(pg_db_url, window=window, thresholds=Thresholds())
    before = counts(pg_db_url)
    database = pg_db_url.rsplit("/", 1)[1]
    # every statement of a new session is cancelled by the server after 1 ms of work
    pg_server.admin(f"ALTER DATABASE {database} SET statement_timeout = 1")
    try:
        code, out = invoke(
            "--db", pg_db_url, "audit", "--start", "2026-01-01", "--end", "2027-01-01"
        )
    finally:
        pg_server.admin(f"ALTER DATABASE {database} RESET statement_timeout")
    assert code == 3
    one_line(out)
    assert counts(pg_db_url) == before
