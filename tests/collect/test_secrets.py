"""No password reaches a user: not in an error, not in a log line, not in a traceback.

A known password with the characters that break URL parsers (`s3cr3t-PW@x:y`) is put in the
database URL (well-formed, percent-encoded, malformed), in the Prometheus URL and in a
password file; every error path that can be triggered runs, and its output and logs are
searched for the password and for its tail after the `@`.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fakeprom import Reply, fake_prometheus
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from auditor.agents.sample.buffer import DiskBuffer
from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.sampler import Sampler, SamplerSettings
from auditor.agents.serve import setup_logging
from auditor.cli import app
from auditor.errors import StoreError
from auditor.jobs import open_store
from auditor.model import GpuRecord, GpuSample
from auditor.redact import redact
from auditor.store.connection import make_engine
from auditor.store.sample_sink import StoreSink

SECRET = "s3cr3t-PW@x:y"
ENCODED = "s3cr3t-PW%40x%3Ay"
LEAKS = ("s3cr3t", "PW@", "x:y", ENCODED)
WINDOW = ["--since", "1h", "--step", "30s"]


def assert_no_secret(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, text


DB_URLS = [
    f"postgres//auditor:{SECRET}@127.0.0.1:1/db",  # no ':' after the scheme
    f"postgresql://auditor:{SECRET}@127.0.0.1:1/db",  # '@' and ':' unescaped
    f"postgresql://auditor:{ENCODED}@127.0.0.1:1/db",  # well-formed: connection refused
    f"postgresql+nosuchdriver://auditor:{ENCODED}@127.0.0.1:1/db",
    f"postgresql://auditor:{ENCODED}@127.0.0.1:notaport/db",
    f"postgresql://auditor@127.0.0.1:1/db?password={ENCODED}&sslpassword={ENCODED}",
]


@pytest.mark.parametrize("url", DB_URLS)
@pytest.mark.parametrize("how", ["option", "env", "file"])
@pytest.mark.parametrize("command", [["db", "current"], ["audit", "--since", "1h"]])
def test_a_database_url_error_shows_no_password(
    url: str, how: str, command: list[str], tmp_path: Path
) -> None:
    args, env = ["--db", url], {}
    if how == "env":
        args, env = [], {"AUDITOR_DB_URL": url}
    elif how == "file":
        (tmp_path / "url").write_text(url + "\n", encoding="utf-8")
        args, env = [], {"AUDITOR_DB_URL_FILE": str(tmp_path / "url")}
    done = CliRunner().invoke(app, [*args, *command], env=env)
    out = done.output.strip()
    assert done.exit_code == 3, out
    assert out.startswith("auditor: error: "), out
    assert len(out.splitlines()) == 1, out
    assert "127.0.0.1" in out  # still says which database
    assert_no_secret(out)


def test_make_engine_and_open_store_errors_show_no_password() -> None:
    for url in DB_URLS:
        with pytest.raises(StoreError) as caught:
            open_store(url)
        assert_no_secret(str(caught.value))
        assert_no_secret(repr(caught.value))


def test_an_engine_url_shows_no_password() -> None:
    engine = make_engine(f"postgresql://auditor:{ENCODED}@127.0.0.1:1/db")
    assert_no_secret(repr(engine))
    assert_no_secret(str(engine.url))


@pytest.mark.parametrize(
    "prometheus",
    [
        f"http://admin:{SECRET}@127.0.0.1:1",
        f"http://admin:{ENCODED}@127.0.0.1:1/prom",
        f"http://admin:{SECRET}@127.0.0.1:x",
        f"ftp://admin:{SECRET}@127.0.0.1:1",
    ],
)
def test_an_unreachable_prometheus_shows_no_password(prometheus: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    done = CliRunner().invoke(
        app, ["--db", db, "import", "prometheus", "--url", prometheus, *WINDOW]
    )
    assert done.exit_code == 2, done.output
    assert_no_secret(done.output)
    assert "admin" not in done.output or "admin:***" in done.output


@pytest.mark.parametrize("source", ["url", "file", "env"])
def test_a_refusing_prometheus_shows_no_password(source: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    (tmp_path / "pw").write_text(SECRET, encoding="utf-8")
    refuse = Reply(401, b'{"status":"error","error":"unauthorized"}')
    with fake_prometheus(lambda q: refuse) as fake:
        url, args, env = fake.url, ["--basic-auth-user", "admin"], {}
        if source == "url":
            url, args = fake.url.replace("http://", f"http://admin:{SECRET}@"), []
        elif source == "file":
            args += ["--basic-auth-password-file", str(tmp_path / "pw")]
        else:
            env = {"AUDITOR_PROMETHEUS_PASSWORD": SECRET}
        cli = ["--db", db, "import", "prometheus", "--url", url, *WINDOW, *args]
        done = CliRunner().invoke(app, cli, env=env)
        assert fake.seen  # the credentials went to the server...
    assert done.exit_code == 2, done.output
    assert "authentication failed" in done.output
    assert_no_secret(done.output)  # ...and nowhere else


@pytest.fixture
def auditor_logs() -> Iterator[io.StringIO]:
    """The services' logging setup, writing to a buffer; the `auditor` logger restored."""
    root = logging.getLogger("auditor")
    saved = (root.handlers[:], root.level, root.propagate)
    stream = io.StringIO()
    yield stream
    root.handlers[:], root.level, root.propagate = saved[0], saved[1], saved[2]


@pytest.mark.parametrize("json_format", [False, True])
def test_the_service_log_redacts_messages_arguments_and_tracebacks(
    auditor_logs: io.StringIO, json_format: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stderr", auditor_logs)
    setup_logging(json_format=json_format)
    log = logging.getLogger("auditor.agents.sample.sampler")
    url = f"postgresql://auditor:{SECRET}@db:5432/auditor"
    log.warning("store write failed, %d passes kept: %s", 3, StoreError(f"cannot use {url}"))
    log.warning(f"plain {url} and password={SECRET} and Authorization: Bearer {SECRET}")
    log.warning("extra", extra={"db": url})
    try:
        raise RuntimeError(f"connect to {url} failed")
    except RuntimeError:
        log.exception("failed")
    text = auditor_logs.getvalue()
    assert_no_secret(text)
    assert "store write failed, 3 passes kept: cannot use postgresql://auditor:***@db" in text
    assert "RuntimeError: connect to postgresql://auditor:***@db:5432/auditor failed" in text
    if json_format:
        assert [json.loads(line)["level"] for line in text.splitlines()] == ["warning"] * 3 + [
            "error"
        ]


@dataclass
class OneCard:
    taken_ms: int = 1_767_225_600_000
    gpus: Sequence[GpuRecord] = (GpuRecord("GPU-0", "node-a", 0, "H100"),)
    samples: Sequence[GpuSample] = (GpuSample("GPU-0", 1_767_225_600_000, 50.0),)
    problems: Sequence[object] = field(default_factory=tuple)

    def read(self) -> OneCard:
        return self


@pytest.mark.parametrize("url", DB_URLS[:3])
def test_the_sampler_logs_a_failed_flush_without_the_password(
    url: str, auditor_logs: io.StringIO, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.stderr", auditor_logs)
    setup_logging(json_format=False)  # what `auditor sample` sets up
    buffer = DiskBuffer(tmp_path / "buffer.db", max_batches=10)
    sampler = Sampler(
        reader=OneCard(),
        holders=None,
        sink=StoreSink(lambda: open_store(url)),
        buffer=buffer,
        metrics=SamplerMetrics(CollectorRegistry()),
        settings=SamplerSettings(),
    )
    try:
        sampler.sample_once()
        assert sampler.flush() is False
        assert sampler.flush() is False
    finally:
        buffer.close()
    text = auditor_logs.getvalue()
    assert text.count("store write failed, 1 passes kept") == 2, text
    assert_no_secret(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres//u:PASSWORD@h/db", "postgres//u:***@h/db"),
        (f"postgresql://u:{SECRET}@h/db", "postgresql://u:***@h/db"),
        ("'postgresql://u:p/a#s?s@h/db'", "'postgresql://u:***@h/db'"),
        ("u:pa//ss@h", "u:***@h"),
        ("see http://a:b@h1 and https://c:d@h2/x", "see http://a:***@h1 and https://c:***@h2/x"),
        ("host=h password=hunter22 dbname=x", "host=h password=*** dbname=x"),
        ("password='a b c' host=x", "password=*** host=x"),
        ("postgresql://u@h/db?sslpassword=zzz", "postgresql://u@h/db?sslpassword=***"),
        ("http://h/api?token=abc", "http://h/api?token=***"),
        ("Authorization: Bearer abcdefghij", "Authorization: ***"),
        ("'postgresql://u:p w@h'", "'postgresql://u:***@h'"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("http://host:9090/api/v1", "http://host:9090/api/v1"),
        ("mail bob@example.com", "mail bob@example.com"),
        ("postgresql://u:***@h/db", "postgresql://u:***@h/db"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected
