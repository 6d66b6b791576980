"""`export finance --out s3://...` against a real S3-compatible server on loopback.

What finance relies on: the object holds exactly the bytes the local file would, written in
one piece (a re-export replaces it whole), with credentials and endpoint read from the
environment as the AWS SDKs name them; a write that cannot be done is one line naming the
URL and leaves nothing behind.

The server is moto's standalone S3 server (`moto_server`), a real HTTP S3 API on
127.0.0.1. moto needs botocore, whose python-dateutil bound clashes with the Kubernetes
client's, so it lives in a virtualenv of its own, `.tools/moto` (created by `.ci/run`, as
checkov's is); the auditor's side is the real obstore client it ships with.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.jobs.destinations import scheme_of
from auditor.report.finance import parse_week
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, simulate

obstore = pytest.importorskip("obstore")
from obstore.store import S3Store  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MOTO = ROOT / ".tools" / "moto" / "bin" / "moto_server"

runner = CliRunner()
WEEK = "2026-W48"
BUCKET = "finance-exports"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("finance-s3")
    url = f"sqlite:///{tmp / 'auditor.db'}"
    sim = simulate(tmp / "c", scenario=SCENARIOS["small"])
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, sim.pods_json, config=Config())
    week = parse_week(WEEK)
    jobs.audit(url, window=(week.start_ms, week.end_ms), thresholds=Thresholds())
    return url


def moto_server() -> str:
    if MOTO.is_file():
        return str(MOTO)
    if os.environ.get("CI"):
        pytest.fail("moto_server is required under CI (.ci/run creates .tools/moto)")
    pytest.skip(
        "no .tools/moto: python3 -m venv .tools/moto && .tools/moto/bin/pip install 'moto[server]'"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Bucket:
    """The test's own view of the bucket, through the same S3 API."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.store = S3Store(
            BUCKET,
            endpoint=endpoint,
            region="us-east-1",
            access_key_id="finance-writer",
            secret_access_key="finance-writer-secret",
            client_options={"allow_http": True},
        )

    def get(self, key: str) -> bytes:
        return bytes(obstore.get(self.store, key).bytes())

    def put(self, key: str, body: bytes) -> None:
        obstore.put(self.store, key, body)

    def exists(self, bucket: str) -> bool:
        req = urllib.request.Request(f"{self.endpoint}/{bucket}", method="HEAD")
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise
        return True

    def keys(self, prefix: str) -> list[str]:
        return [m["path"] for batch in obstore.list(self.store, prefix=prefix) for m in batch]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bucket]:
    """An S3 server on loopback, the SDK's environment pointing at it, and the bucket."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [moto_server(), "-H", "127.0.0.1", "-p", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        # create the bucket through the plain S3 API (a PUT on the bucket's path)
        req = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
        urllib.request.urlopen(req, timeout=10).close()
        with pytest.MonkeyPatch.context() as env:
            for name, value in {
                "AWS_ACCESS_KEY_ID": "finance-writer",
                "AWS_SECRET_ACCESS_KEY": "finance-writer-secret",
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ALLOW_HTTP": "true",
                "AWS_EC2_METADATA_DISABLED": "true",
                "NO_PROXY": "127.0.0.1",
            }.items():
                env.setenv(name, value)
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "HTTP_PROXY", "HTTPS_PROXY"):
                env.delenv(name, raising=False)
            yield Bucket(endpoint)
    finally:
        server.terminate()
        server.wait(timeout=10)


def export(db: str, *args: str) -> Any:
    return runner.invoke(app, ["--db", db, "export", "finance", "--week", WEEK, *args])


def csv_bytes(db: str) -> bytes:
    return jobs.export_finance(db, week=WEEK, config=Config()).encode("utf-8")


def test_the_object_is_the_local_file_byte_for_byte(db: str, s3: Bucket, tmp_path: Path) -> None:
    local = export(db, "--out", str(tmp_path / "finance-{week}.csv"))
    remote = export(db, "--out", f"s3://{BUCKET}/gpu/finance-{{week}}.csv")

    assert local.exit_code == 0, local.output
    assert remote.exit_code == 0, remote.output
    body = s3.get(f"gpu/finance-{WEEK}.csv")
    assert body == (tmp_path / f"finance-{WEEK}.csv").read_bytes()
    assert body.startswith(b"week,week_start,week_end,team,")
    assert s3.keys("gpu/") == [f"gpu/finance-{WEEK}.csv"]


def test_a_re_export_replaces_the_object_whole(db: str, s3: Bucket) -> None:
    key = "again/finance.csv"
    s3.put(key, b"x" * 200_000)  # longer than the CSV

    result = export(db, "--out", f"s3://{BUCKET}/{key}")

    assert result.exit_code == 0, result.output
    assert s3.get(key) == csv_bytes(db)


def test_the_url_can_come_from_the_environment(
    db: str, s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUDITOR_FINANCE_OUT", f"s3://{BUCKET}/env/finance-{{week}}.csv")

    result = export(db)

    assert result.exit_code == 0, result.output
    # nothing but the warning that no price is configured (every cost is 0.00)
    assert result.output.startswith("auditor: warning: no price for GPU model")
    assert len(result.output.splitlines()) == 1
    assert s3.get(f"env/finance-{WEEK}.csv") == csv_bytes(db)


def test_a_missing_bucket_is_one_line_and_writes_nothing(db: str, s3: Bucket) -> None:
    result = export(db, "--out", "s3://no-such-bucket/finance.csv")

    assert result.exit_code == 2
    line = result.output.strip()
    assert len(line.splitlines()) == 1
    assert "s3://no-such-bucket/finance.csv" in line
    assert "cannot write" in line
    assert not s3.exists("no-such-bucket")
    assert s3.exists(BUCKET)


def test_refused_credentials_are_one_line_without_the_secret(
    db: str, s3: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    # the SDK then asks the instance metadata service: make that a closed loopback port
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{free_port()}")

    result = export(db, "--out", f"s3://{BUCKET}/nocreds/finance.csv")

    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "finance-writer-secret" not in result.output
    assert s3.keys("nocreds/") == []


def test_an_unknown_scheme_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["--db", f"sqlite:///{tmp_path / 'none.db'}", "export", "finance", "--week", WEEK,
         "--out", "ftp://host/finance.csv"],
    )  # fmt: skip

    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "ftp://" in result.output
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize(
    ("target", "scheme"),
    [
        ("finance.csv", None),
        ("/exports/finance-{week}.csv", None),
        ("s3://bucket/key.csv", "s3"),
        ("GS://bucket/key.csv", "gs"),
        ("az://container/key.csv", "az"),
        ("file:///tmp/x.csv", "file"),
        ("dir with :// inside/x.csv", None),
    ],
)
def test_scheme_of(target: str, scheme: str | None) -> None:
    assert scheme_of(target) == scheme
