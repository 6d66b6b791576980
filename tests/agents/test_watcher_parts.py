"""The watcher's pure parts and its loop over a scripted source: backoff, relist decisions,
selectors, nodes, health and metrics, JSON logs, and the CLI's one-line errors."""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from random import Random
from typing import Any

import pytest
from typer.testing import CliRunner

from auditor.agents.serve import JsonFormatter
from auditor.agents.watch.kube import Event, Expired, Page, Unavailable
from auditor.agents.watch.metrics import WatchMetrics, serve
from auditor.agents.watch.watcher import Backoff, LoopOptions, Reflector
from auditor.cli import app
from auditor.collect.nodes import node_row
from auditor.collect.selectors import matcher

# ------------------------------------------------------------------ backoff


def test_backoff_delays_are_the_data_given_within_the_jitter() -> None:
    backoff = Backoff(delays_s=(1.0, 2.0, 4.0), jitter=0.25)
    rng = Random(1)

    delays = [backoff.delay(n, rng) for n in range(6)]

    for got, base in zip(delays, (1.0, 2.0, 4.0, 4.0, 4.0, 4.0), strict=True):
        assert base * 0.75 <= got <= base * 1.25
    assert len({round(d, 6) for d in delays[2:]}) > 1  # jittered, not a fixed beat


# ------------------------------------------------------------------ the loop, scripted


class CountingStop(threading.Event):
    """A stop signal that records each wait (the backoff) and fires after `limit` waits."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        if len(self.waits) >= self.limit:
            self.set()
        return self.is_set()


class ScriptedSource:
    """Each list and each watch takes the next item of its script: a value or an exception."""

    kind = "pods"

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[str] = []

    def list_page(self, *, limit: int, token: str | None = None) -> Page:
        self.calls.append("list")
        item = self.lists.pop(0) if self.lists else Page([], "1", None)
        if isinstance(item, Exception):
            raise item
        return item

    def watch(self, *, resource_version: str, timeout_s: int) -> Iterator[list[Event]]:
        self.calls.append(f"watch@{resource_version}")
        item = self.watches.pop(0) if self.watches else Unavailable("script over")
        if isinstance(item, Exception):
            raise item
        yield from item


class MemorySink:
    def __init__(self, cursor: str | None = None) -> None:
        self.stored = cursor
        self.applied: list[tuple[list[str], str]] = []

    def cursor(self) -> str | None:
        return self.stored

    def replace(self, items: list[dict[str, Any]], *, resource_version: str, at_ms: int) -> int:
        self.stored = resource_version
        return len(items)

    def apply(self, events: list[Event], *, resource_version: str, at_ms: int) -> int:
        self.applied.append(([e.type for e in events], resource_version))
        self.stored = resource_version
        return len(events)


def ev(etype: str, rv: str) -> Event:
    return Event(etype, {"metadata": {"resourceVersion": rv}})


def run(source: ScriptedSource, sink: MemorySink, *, waits: int) -> CountingStop:
    stop = CountingStop(waits)
    options = LoopOptions(min_watch_s=0.0, backoff=Backoff(delays_s=(1.0, 2.0, 5.0), jitter=0.0))
    Reflector(source, sink, metrics=WatchMetrics(("pods",)), stop=stop, options=options).run()
    return stop


def test_a_stored_cursor_is_resumed_without_a_list() -> None:
    source = ScriptedSource([], [[[ev("ADDED", "8"), ev("MODIFIED", "9")]]])
    sink = MemorySink(cursor="7")

    run(source, sink, waits=1)

    assert source.calls[:2] == ["watch@7", "watch@9"]
    assert sink.applied == [(["ADDED", "MODIFIED"], "9")]


def test_unavailable_backs_off_by_the_table_and_resumes_from_the_cursor() -> None:
    source = ScriptedSource([Page([], "5", None)], [Unavailable("x")] * 4)

    stop = run(source, MemorySink(), waits=4)

    assert stop.waits == [1.0, 2.0, 5.0, 5.0]
    assert source.calls == ["list", "watch@5", "watch@5", "watch@5", "watch@5"]


def test_410_relists_at_once_then_backs_off_when_it_repeats() -> None:
    gone = Expired("too old resource version")
    source = ScriptedSource(
        [Page([], "5", None), Page([], "6", None), Page([], "7", None)], [gone, gone]
    )

    stop = run(source, MemorySink(), waits=2)

    assert source.calls[:5] == ["list", "watch@5", "list", "watch@6", "list"]
    assert stop.waits[0] == 1.0  # the second 410 in a row waited; the first did not


def test_bookmarks_move_the_cursor_and_unknown_events_pass_through() -> None:
    batch = [ev("BOOKMARK", "12")]
    later = [ev("SOMETHING-NEW", "13"), ev("ADDED", "14")]
    source = ScriptedSource([Page([], "10", None)], [[batch, later]])
    sink = MemorySink()

    run(source, sink, waits=1)

    assert sink.applied == [(["BOOKMARK"], "12"), (["SOMETHING-NEW", "ADDED"], "14")]
    assert source.calls[-1] == "watch@14"


def test_a_repeated_batch_at_the_cursor_is_not_written_again() -> None:
    source = ScriptedSource([], [[[ev("MODIFIED", "9")], [ev("MODIFIED", "9")]]])
    sink = MemorySink(cursor="8")

    run(source, sink, waits=1)

    assert sink.applied == [(["MODIFIED"], "9")]


# ------------------------------------------------------------------ selectors and nodes


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        (None, {}, True),
        ("team=vision", {"team": "vision"}, True),
        ("team==vision", {"team": "nlp"}, False),
        ("team!=vision", {}, True),
        ("team in (a, b),gpu", {"team": "b", "gpu": "1"}, True),
        ("team notin (a,b)", {"team": "a"}, False),
        ("!spot", {"spot": "true"}, False),
        ("spot", {"spot": ""}, True),
    ],
)
def test_label_selectors_match_like_the_api(
    selector: str | None, labels: dict[str, str], selected: bool
) -> None:
    assert matcher(selector)(labels) is selected


@pytest.mark.parametrize(
    ("spec", "labels", "capacity", "want"),
    [
        ({}, {"nvidia.com/gpu.product": "H100"}, {"nvidia.com/gpu": "8"}, ("H100", 8, False)),
        ({"unschedulable": True}, {}, {"nvidia.com/mig-1g.10gb": "7"}, (None, 7, True)),
        (
            {"taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
            {"cloud.google.com/gke-accelerator": "nvidia-l4"},
            {"cpu": "8"},
            ("nvidia-l4", 0, True),
        ),
    ],
)
def test_node_rows(
    spec: dict[str, Any], labels: dict[str, str], capacity: dict[str, str], want: tuple[Any, ...]
) -> None:
    obj = {
        "metadata": {"name": "n", "labels": labels},
        "spec": spec,
        "status": {"capacity": capacity},
    }

    got = node_row(obj, at_ms=5)

    assert (got["gpu_model"], got["gpu_capacity"], got["unschedulable"]) == want


# ------------------------------------------------------------------ health, metrics, logs


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_healthz_fails_until_a_sync_and_again_when_syncs_stop() -> None:
    now = [1000.0]
    metrics = WatchMetrics(("pods", "nodes"))
    server = serve(metrics, address="127.0.0.1", port=0, max_age_s=60, clock=lambda: now[0])
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert fetch(f"{base}/healthz")[0] == 503
        metrics.synced("pods", 1000.0)
        metrics.synced("nodes", 1000.0)
        metrics.event("pods", "ADDED")
        metrics.relist("pods")
        assert fetch(f"{base}/healthz") == (200, "ok\n")
        now[0] = 1061.0
        code, body = fetch(f"{base}/healthz")
        assert (code, body) == (503, "not synced within 60s: pods, nodes\n")
        code, text = fetch(f"{base}/metrics")
    finally:
        server.shutdown()

    assert code == 200
    assert 'auditor_watch_events_total{kind="pods",type="ADDED"} 1.0' in text
    assert 'auditor_watch_relists_total{kind="pods"} 1.0' in text
    assert 'auditor_watch_last_sync_timestamp_seconds{kind="pods"} 1000.0' in text


def test_json_logs_are_one_object_a_line_with_the_extra_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "auditor.watch", "levelname": "INFO", "msg": "listed %d", "args": (3,)}
    )
    record.kind = "pods"

    line = JsonFormatter().format(record)

    assert json.loads(line) | {"time": "t"} == {
        "time": "t",
        "level": "info",
        "logger": "auditor.watch",
        "message": "listed 3",
        "kind": "pods",
    }


# ------------------------------------------------------------------ the command


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--selector", "team in (a"], "cannot read label selector part"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "no usable Kubernetes configuration"),
    ],
)
def test_watch_answers_bad_options_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(
        app, ["--db", f"sqlite:///{tmp_path / 'a.db'}", "watch", "--metrics-port", "-1", *args]
    )

    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
