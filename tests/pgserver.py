"""A throwaway PostgreSQL server for the test session, and fresh databases inside it.

The server lives in a temporary directory, listens on 127.0.0.1 on a free port (and on a
socket in that directory), trusts every local connection and never fsyncs. As root it runs
as the `postgres` system user, since initdb refuses root. Binaries come from `$PG_BINDIR`,
`pg_config --bindir`, or the newest /usr/lib/postgresql/*/bin.

Where no server binaries are found, the tests that need one are skipped, except under CI
(the `CI` environment variable set), where PostgreSQL is required and they fail instead.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import psycopg
import pytest

SERVER_USER = "postgres"
"""The system user the server runs as when the tests run as root."""

START_TIMEOUT_S = 60


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None where there is none."""
    candidates: list[Path] = []
    if env := os.environ.get("PG_BINDIR"):
        candidates.append(Path(env))
    if pg_config := shutil.which("pg_config"):
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(Path(out.stdout.strip()))
        except (subprocess.SubprocessError, OSError):
            pass
    versioned = Path("/usr/lib/postgresql").glob("*/bin")
    candidates.extend(sorted(versioned, key=lambda p: _version_key(p.parent.name), reverse=True))
    if initdb := shutil.which("initdb"):
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def _runuser() -> str:
    for found in (shutil.which("runuser"), "/usr/sbin/runuser", "/sbin/runuser"):
        if found and Path(found).is_file():
            return found
    raise RuntimeError("running as root needs runuser (util-linux) to start PostgreSQL")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def unavailable(reason: str) -> NoReturn:
    """Skip the test asking for PostgreSQL; under CI, fail it."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"PostgreSQL is required under CI: {reason}", pytrace=False)
    pytest.skip(f"no PostgreSQL for this test: {reason}")


@dataclass
class PgServer:
    """One running server; `url(db)` is the SQLAlchemy URL of a database in it."""

    bindir: Path
    root: Path
    port: int
    as_user: str | None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_user is not None:
            cmd = [_runuser(), "-u", self.as_user, "--", *cmd]
        return subprocess.run(
            cmd,
            cwd=self.root,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=START_TIMEOUT_S + 30,
            check=False,
        )

    def _check(self, args: Sequence[str]) -> None:
        done = self._run(args)
        if done.returncode != 0:
            log = (
                self.log_file.read_text(errors="replace")[-4000:] if self.log_file.exists() else ""
            )
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}\n--- server log ---\n{log}"
            )

    def start(self) -> None:
        """Start the server, on a new data directory unless one is already there (a kept
        server's, `stop(keep=True)`)."""
        if not (self.data_dir / "PG_VERSION").exists():
            self._init()
        self._check(
            [
                "pg_ctl",
                "start",
                "--pgdata",
                str(self.data_dir),
                "--log",
                str(self.log_file),
                "--wait",
                "--timeout",
                str(START_TIMEOUT_S),
                "-o",
                self._options(),
            ]
        )

    def _init(self) -> None:
        self._check(
            [
                "initdb",
                "--pgdata",
                str(self.data_dir),
                "--username",
                "postgres",
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ]
        )

    def _options(self) -> str:
        return (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200"
        )

    def stop(self, *, keep: bool = False) -> None:
        """Stop the server and remove its directory; with `keep`, stop it cleanly and keep
        its data for a later `start_server(root=...)`."""
        if (self.data_dir / "postmaster.pid").exists():
            mode = "fast" if keep else "immediate"
            self._run(["pg_ctl", "stop", "--pgdata", str(self.data_dir), "--mode", mode])
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def admin(self, sql: str) -> None:
        """Run one statement outside a transaction (CREATE/DROP DATABASE) as `postgres`."""
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql.encode())


def start_server(root: Path | None = None) -> PgServer:
    """Start a server, or skip (fail under CI) where PostgreSQL is not installed.

    `root`: the server's directory, kept (its data reused if there) rather than a new
    temporary one: the benchmarks' `--keep`."""
    bindir = find_bindir()
    if bindir is None:
        unavailable("no initdb/pg_ctl/postgres found (set PG_BINDIR or install postgresql)")
    as_user: str | None = None
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(SERVER_USER)
        except KeyError:
            unavailable(f"running as root and there is no {SERVER_USER!r} user to run the server")
        as_user = SERVER_USER
    # /tmp: short enough for the socket path, and reachable by the server's user.
    kept = root is not None
    if root is None:
        root = Path(
            tempfile.mkdtemp(prefix="auditor-pg-", dir="/tmp" if Path("/tmp").is_dir() else None)
        )
    else:
        root.mkdir(mode=0o700, exist_ok=True)
    if as_user is not None:
        os.chown(root, pw.pw_uid, pw.pw_gid)
    last_error: RuntimeError | None = None
    for _attempt in range(3):  # a free port can be taken between finding and binding it
        server = PgServer(bindir=bindir, root=root, port=free_port(), as_user=as_user)
        try:
            server.start()
            return server
        except RuntimeError as e:
            last_error = e
            if kept:  # its data stays: only the port is tried again
                continue
            server.stop()
            root.mkdir(mode=0o700)
            if as_user is not None:
                os.chown(root, pw.pw_uid, pw.pw_gid)
    if not kept:
        shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"could not start PostgreSQL from {bindir}") from last_error


_numbers = itertools.count(1)


def new_database_name() -> str:
    return f"test_{next(_numbers)}"
