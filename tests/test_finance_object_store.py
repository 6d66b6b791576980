"""`export finance --out s3://...` against a real S3-compatible server on loopback.

What finance relies on: the object holds exactly the bytes the local file would, written in
one piece (no partial or pending multipart object, a re-export replaces it whole), with
credentials and endpoint read from the environment as the AWS SDK reads them; a write that
cannot be done is one line naming the URL, and leaves nothing behind.

The server is moto's standalone server (`moto.server.ThreadedMotoServer`), a real HTTP
S3 API on 127.0.0.1 that the real s3fs/botocore stack talks to.
"""

from __future__ import annotations

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

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")
pytest.importorskip("s3fs")

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


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An S3 server on loopback, the SDK's environment pointing at it, and a client."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    empty = tmp_path_factory.mktemp("aws")
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "finance-writer",
            "AWS_SECRET_ACCESS_KEY": "finance-writer-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_SHARED_CREDENTIALS_FILE": str(empty / "credentials"),
            "AWS_CONFIG_FILE": str(empty / "config"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "NO_PROXY": "127.0.0.1",
        }.items():
            env.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "HTTP_PROXY", "HTTPS_PROXY"):
            env.delenv(name, raising=False)
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        try:
            yield client
        finally:
            server.stop()


def export(db: str, *args: str) -> Any:
    return runner.invoke(app, ["--db", db, "export", "finance", "--week", WEEK, *args])


def csv_bytes(db: str) -> bytes:
    return jobs.export_finance(db, week=WEEK, config=Config()).encode("utf-8")


def test_the_object_is_the_local_file_byte_for_byte(db: str, s3: Any, tmp_path: Path) -> None:
    local = export(db, "--out", str(tmp_path / "finance-{week}.csv"))
    remote = export(db, "--out", f"s3://{BUCKET}/gpu/finance-{{week}}.csv")

    assert local.exit_code == 0, local.output
    assert remote.exit_code == 0, remote.output
    body = s3.get_object(Bucket=BUCKET, Key=f"gpu/finance-{WEEK}.csv")["Body"].read()
    assert body == (tmp_path / f"finance-{WEEK}.csv").read_bytes()
    assert body.startswith(b"week,week_start,week_end,team,")
    assert s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_a_re_export_replaces_the_object_whole(db: str, s3: Any) -> None:
    key = "again/finance.csv"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"x" * 200_000)  # longer than the CSV

    result = export(db, "--out", f"s3://{BUCKET}/{key}")

    assert result.exit_code == 0, result.output
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert body == csv_bytes(db)


def test_the_url_can_come_from_the_environment(
    db: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUDITOR_FINANCE_OUT", f"s3://{BUCKET}/env/finance-{{week}}.csv")

    result = export(db)

    assert result.exit_code == 0, result.output
    assert result.output == ""
    body = s3.get_object(Bucket=BUCKET, Key=f"env/finance-{WEEK}.csv")["Body"].read()
    assert body == csv_bytes(db)


def test_a_missing_bucket_is_one_line_and_writes_nothing(db: str, s3: Any) -> None:
    result = export(db, "--out", "s3://no-such-bucket/finance.csv")

    assert result.exit_code == 2
    line = result.output.strip()
    assert len(line.splitlines()) == 1
    assert "s3://no-such-bucket/finance.csv" in line
    assert "cannot write" in line
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert names == [BUCKET]


def test_refused_credentials_are_one_line_without_the_secret(
    db: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")

    result = export(db, "--out", f"s3://{BUCKET}/nocreds/finance.csv")

    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "finance-writer-secret" not in result.output
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="nocreds/")
    assert listed.get("KeyCount", 0) == 0


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
