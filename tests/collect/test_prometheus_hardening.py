"""`auditor import prometheus` against a Prometheus that answers what a real one never does.

What users rely on: a value no GPU can report (utilisation 150, -20, +Inf; a throttle
bitmask -1), an answer of any odd shape, a server that drips bytes, an answer too large, a
refusal, all end the import with one line naming what was wrong, exit 2, no traceback, and
the database as it was; NaN is "not read" (NULL); credentials reach the server in the
Authorization header, wherever the user gave them, and never reach the output.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from fakeprom import Reply, card, fake_prometheus, matrix
from sqlalchemy import select
from typer.testing import CliRunner, Result

from auditor.cli import app
from auditor.collect.prometheus import PrometheusClient, points_per_query
from auditor.errors import InputError
from auditor.jobs import open_store
from auditor.store.schema import metadata

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
WINDOW = ["--start", "2026-01-01T00:00:00Z", "--end", "2026-01-01T00:02:00Z", "--step", "30s"]
GOOD = [(T0 + 30.0 * i, f"{10 * i}") for i in range(4)]
SECRET = "s3cr3t-PW@x:y"


def metric_of(query: str) -> str:
    m = re.search(r"DCGM_\w+|kube_pod_info", query)
    assert m is not None, query
    return m[0]


def answers(by_metric: Mapping[str, Reply]) -> Callable[[str], Reply]:
    """Each metric's reply; a good utilisation series, and no series for the rest (no
    kube_pod_info either: the node is the Hostname)."""

    def respond(query: str) -> Reply:
        name = metric_of(query)
        default = matrix([card(GOOD)]) if name == "DCGM_FI_DEV_GPU_UTIL" else matrix([])
        return by_metric.get(name, default)

    return respond


def dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    with open_store(url).connect() as conn:
        return {
            t.name: sorted(tuple(map(repr, r)) for r in conn.execute(select(t)))
            for t in metadata.sorted_tables
        }


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("seeded") / "a.db"
    with fake_prometheus(answers({})) as fake:
        done = invoke(f"sqlite:///{path}", fake.url)
    assert done.exit_code == 0, done.output
    return path


@pytest.fixture
def db(seeded: Path, tmp_path: Path) -> str:
    """A store holding one earlier import, which every failed import must leave as it is."""
    shutil.copy(seeded, tmp_path / "a.db")
    return f"sqlite:///{tmp_path / 'a.db'}"


def invoke(db: str, url: str, *args: str, env: Mapping[str, str] | None = None) -> Result:
    cli = ["--db", db, "import", "prometheus", "--url", url, *WINDOW, *args]
    return CliRunner().invoke(app, cli, env=dict(env or {}))


def assert_one_line_error(done: Result, *, code: int = 2) -> str:
    out = done.output.strip()
    assert done.exit_code == code, out
    assert len(out.splitlines()) == 1, out
    assert out.startswith("auditor: error: "), out
    assert len(out) < 300, out
    assert "Traceback" not in out
    return out


def point(value: str) -> Reply:
    return matrix([card([(T0 + 30.0, value)])])


@pytest.mark.parametrize(
    ("metric", "value", "problem"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", "150", "outside 0..100"),
        ("DCGM_FI_DEV_GPU_UTIL", "-20", "outside 0..100"),
        ("DCGM_FI_DEV_GPU_UTIL", "+Inf", "outside 0..100"),
        ("DCGM_FI_DEV_GPU_UTIL", "lots", "not a number"),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "-1", "not a bitmask"),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "1.5", "not a bitmask"),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "1e30", "not a bitmask"),
        ("DCGM_FI_DEV_FB_USED", "-1", "outside 0.."),
        ("DCGM_FI_DEV_POWER_USAGE", "-Inf", "outside 0.."),
        ("DCGM_FI_DEV_GPU_TEMP", "1e9", "outside 0..200"),
        ("DCGM_FI_PROF_SM_ACTIVE", "1.5", "outside 0..1"),
    ],
)
def test_a_value_no_gpu_reports_refuses_the_import(
    db: str, metric: str, value: str, problem: str
) -> None:
    before = dump(db)
    with fake_prometheus(answers({metric: point(value)})) as fake:
        out = assert_one_line_error(invoke(db, fake.url))
    assert f"{metric} of GPU-0/0/node-a at 2026-01-01T00:00:30Z: '{value}' is {problem}" in out
    assert dump(db) == before


def test_nan_is_not_read_and_throttle_reasons_are_stored_as_hex(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    replies = {
        "DCGM_FI_DEV_GPU_UTIL": matrix([card([(T0, "NaN"), (T0 + 30.0, "55")])]),
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": matrix([card([(T0, "4"), (T0 + 30.0, "NaN")])]),
    }
    with fake_prometheus(answers(replies)) as fake:
        done = invoke(db, fake.url)
    assert done.exit_code == 0, done.output
    rows = dump(db)["gpu_samples"]
    from auditor.store.schema import gpu_samples

    with open_store(db).connect() as conn:
        got = conn.execute(
            select(
                gpu_samples.c.ts_ms, gpu_samples.c.util, gpu_samples.c.throttle_reasons
            ).order_by(gpu_samples.c.ts_ms)
        ).all()
    assert [tuple(r) for r in got] == [
        (T0 * 1000, None, "0x0000000000000004"),
        ((T0 + 30) * 1000, 55.0, None),
    ]
    assert len(rows) == 2


def body(obj: object) -> Reply:
    return Reply(body=json.dumps(obj).encode())


def answer_with(result: object, *, kind: str = "matrix") -> Reply:
    return body({"status": "success", "data": {"resultType": kind, "result": result}})


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(body=b"<html>not json</html>"), "did not answer JSON"),
        (body([1, 2]), "the answer is list, not an object"),
        (body({"status": "success"}), "no 'data' object"),
        (body({"status": "success", "data": {"resultType": "matrix"}}), "'result' is not a list"),
        (
            body({"status": "error", "errorType": "bad_data", "error": "x" * 5000}),
            "refused last_over_time(DCGM_FI_DEV_GPU_UTIL",
        ),
        (answer_with([], kind="vector"), "resultType 'vector', not 'matrix'"),
        (answer_with([1]), "a series is 1, not an object"),
        (answer_with([{"metric": [1], "values": []}]), "labels [1] are not an object of strings"),
        (answer_with([{"metric": {"UUID": 1}, "values": []}]), "not an object of strings"),
        (answer_with([{"metric": {}, "values": 7}]), "values 7 are not a list"),
        (answer_with([{"metric": {}, "values": [[1]]}]), "a point [1] is not [timestamp"),
        (answer_with([{"metric": {}, "values": [["a", "1"]]}]), "is not [timestamp"),
        (answer_with([{"metric": {}, "values": [[1, 1]]}]), "a point [1, 1] is not"),
        (answer_with([{"metric": {}, "values": [[True, "1"]]}]), "is not [timestamp"),
        (Reply(500, b"oops"), "answered HTTP 500"),
        (Reply(404, b""), "answered HTTP 404"),
    ],
)
def test_an_answer_of_an_odd_shape_is_one_line(db: str, reply: Reply, expected: str) -> None:
    before = dump(db)
    with fake_prometheus(answers({"DCGM_FI_DEV_GPU_UTIL": reply})) as fake:
        out = assert_one_line_error(invoke(db, fake.url))
    assert expected in out
    assert dump(db) == before


def test_a_server_dripping_bytes_meets_the_deadline(db: str) -> None:
    before = dump(db)
    slow = Reply(body=matrix([card(GOOD)]).body, drip_s=0.5)
    with fake_prometheus(answers({"DCGM_FI_DEV_GPU_UTIL": slow})) as fake:
        started = time.monotonic()
        out = assert_one_line_error(invoke(db, fake.url, "--timeout", "2s"))
        took = time.monotonic() - started
    assert "did not answer within 2s" in out
    assert took < 4.0
    assert dump(db) == before


def test_a_server_that_accepts_and_never_answers_meets_the_deadline(db: str) -> None:
    with fake_prometheus(answers({"DCGM_FI_DEV_GPU_UTIL": Reply(body=b"{}", drip_s=60)})) as fake:
        started = time.monotonic()
        out = assert_one_line_error(invoke(db, fake.url, "--timeout", "1s"))
        assert time.monotonic() - started < 3.0
    assert "did not answer within 1s" in out


@pytest.mark.parametrize("declared", [True, False])
def test_an_answer_over_the_cap_is_refused_without_reading_it_all(db: str, declared: bool) -> None:
    before = dump(db)
    huge = Reply(body=b" " * (64 << 20) + b"{}", length=declared)
    with fake_prometheus(answers({"DCGM_FI_DEV_GPU_UTIL": huge})) as fake:
        out = assert_one_line_error(invoke(db, fake.url))
    assert "answered more than 64 MiB: narrow the window or use a larger --step" in out
    assert dump(db) == before


def test_the_cap_and_deadline_are_the_clients_parameters() -> None:
    big = Reply(body=matrix([card(GOOD * 2000)]).body)
    with fake_prometheus(lambda q: big) as fake:
        client = PrometheusClient(fake.url, max_bytes=1 << 16, timeout_s=5)
        with pytest.raises(InputError, match="more than 0 MiB"):
            client.query_range("up", start_s=0, end_s=1, step_s=1)
        roomy = PrometheusClient(fake.url, max_bytes=1 << 20, timeout_s=5)
        [(labels, points)] = list(roomy.query_range("up", start_s=0, end_s=1, step_s=1))
    assert labels["UUID"] == "GPU-0"
    assert len(points) == 8000


def test_a_refused_connection_is_one_line(db: str) -> None:
    out = assert_one_line_error(invoke(db, "http://127.0.0.1:1"))
    assert "cannot reach Prometheus at http://127.0.0.1:1: Connection refused" in out


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/", "127.0.0.1:9090", "http://127.0.0.1:x/"])
def test_a_url_that_is_not_http_is_one_line(db: str, url: str) -> None:
    assert_one_line_error(invoke(db, url))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def with_secret_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "secret"
    path.write_text(text + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("how", "header"),
    [
        ("url", basic("admin", SECRET)),
        ("url-encoded", basic("admin", SECRET)),
        ("password-file", basic("reader", SECRET)),
        ("password-env", basic("reader", SECRET)),
        ("token-file", f"Bearer {SECRET}"),
        ("token-env", f"Bearer {SECRET}"),
    ],
)
def test_credentials_reach_the_server_and_not_the_output(
    db: str, tmp_path: Path, how: str, header: str
) -> None:
    args: list[str] = []
    env: dict[str, str] = {}
    with fake_prometheus(answers({}), require=header) as fake:
        url = fake.url
        host = url.removeprefix("http://")
        if how == "url":
            url = f"http://admin:{SECRET}@{host}"
        elif how == "url-encoded":
            url = f"http://admin:{SECRET.replace('@', '%40').replace(':', '%3A')}@{host}"
        elif how == "password-file":
            args = ["--basic-auth-user", "reader"]
            args += ["--basic-auth-password-file", str(with_secret_file(tmp_path, SECRET))]
        elif how == "password-env":
            args, env = ["--basic-auth-user", "reader"], {"AUDITOR_PROMETHEUS_PASSWORD": SECRET}
        elif how == "token-file":
            args = ["--bearer-token-file", str(with_secret_file(tmp_path, SECRET))]
        else:
            env = {"AUDITOR_PROMETHEUS_TOKEN": SECRET}
        done = invoke(db, url, *args, env=env)
        assert done.exit_code == 0, done.output
        assert set(fake.seen) == {header}
        assert f"from {fake.url} in" in done.output
    assert "s3cr3t" not in done.output
    assert "x:y" not in done.output


@pytest.mark.parametrize("wrong", ["url", "token-env", "none"])
def test_wrong_credentials_say_authentication_failed_and_nothing_secret(
    db: str, wrong: str
) -> None:
    before = dump(db)
    with fake_prometheus(answers({}), require=basic("admin", "right-one")) as fake:
        host = fake.url.removeprefix("http://")
        url = f"http://admin:{SECRET}@{host}" if wrong == "url" else fake.url
        env = {"AUDITOR_PROMETHEUS_TOKEN": SECRET} if wrong == "token-env" else {}
        out = assert_one_line_error(invoke(db, url, env=env))
    assert f"Prometheus at {fake.url} answered HTTP 401: authentication failed" in out
    assert "s3cr3t" not in out
    assert "x:y" not in out
    assert dump(db) == before


def test_a_token_and_basic_auth_together_are_refused(db: str, tmp_path: Path) -> None:
    token = with_secret_file(tmp_path, SECRET)
    out = assert_one_line_error(
        invoke(
            db, "http://127.0.0.1:1", "--bearer-token-file", str(token), "--basic-auth-user", "u"
        )
    )
    assert "not both" in out


def test_an_unreadable_secret_file_is_named_and_not_read_out(db: str, tmp_path: Path) -> None:
    out = assert_one_line_error(
        invoke(db, "http://127.0.0.1:1", "--bearer-token-file", str(tmp_path / "missing"))
    )
    assert "missing: field '--bearer-token-file': cannot read: No such file" in out


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        (Reply(body=json.dumps({"status": "success", "data": [{}] * 1000}).encode()), 200),
        (Reply(body=json.dumps({"status": "success", "data": [{}] * 4}).encode()), 10_000),
        (Reply(body=b'{"status": "success", "data": []}'), 10_000),
        (Reply(404, b"not found"), 10_000),  # a gateway without /api/v1/series
    ],
)
def test_many_gpus_make_shorter_chunks(series: Reply, expected: int) -> None:
    with fake_prometheus(answers({}), series=series) as fake:
        client = PrometheusClient(fake.url)
        assert points_per_query(client, start_s=0, end_s=1, max_points=10_000) == expected


def test_a_series_answer_of_an_odd_shape_is_one_line(db: str) -> None:
    with fake_prometheus(answers({}), series=Reply(body=b'{"status":"success","data":7}')) as fake:
        out = assert_one_line_error(invoke(db, fake.url))
    assert "series of DCGM_FI_DEV_GPU_UTIL oddly: 'data' is not a list" in out
