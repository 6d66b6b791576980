"""The latest complete audit on the watcher's /metrics: what a Prometheus scrape reads.

What a user relies on: the watcher, started as `auditor watch` starts it, serves the same
team × category GPU-hours and shares as `auditor report --format json`, the figures of a
bounded number of jobs, and the audit's window; it reads the store at most once a minute
whatever the scrape rate, keeps serving the last figures through a database outage, and
never counts a sharded audit whose shards are not all stored.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kubeapi import FakeApiServer, wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from two_clusters import CLUSTERS, load, simulate_clusters
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.jobs.metrics import READ_METRIC_NAMES, AuditCollector, latest_audit_figures
from auditor.model import CATEGORIES, DEFAULT_CLUSTER
from auditor.report.audit_metrics import AUDIT_METRIC_NAMES, AuditFigures, audit_families
from auditor.report.summary import GroupBy
from auditor.report.windows import latest_complete
from auditor.settings import Config, Thresholds
from auditor.simulate import SCENARIOS, SimulationResult, simulate
from auditor.store.connection import make_engine

runner = CliRunner()


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("metrics")
    url = f"sqlite:///{tmp / 'auditor.db'}"
    sim = simulate(tmp / "c", scenario=SCENARIOS["small"])
    for node, path in sorted(sim.node_csvs.items()):
        jobs.import_nvidia_smi(url, path, node=node)
    jobs.import_pods(url, sim.pods_json, config=Config())
    jobs.audit(url, window=(sim.window_start_ms, sim.window_end_ms), thresholds=Thresholds())
    return url


def report_json(url: str, *args: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["--db", url, "report", "--format", "json", *args])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.output)
    return rows


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


@contextmanager
def serving(url: str, tmp_path: Path, *, cluster: str = DEFAULT_CLUSTER) -> Iterator[str]:
    """`jobs.watch` of `cluster` as the CLI runs it, against the stand-in API server;
    yields its /metrics."""
    lines: list[str] = []
    stop = threading.Event()
    with FakeApiServer() as server:
        options = jobs.WatchOptions(
            kubeconfig=str(server.kubeconfig(tmp_path / "kubeconfig")),
            nodes=False,
            metrics_host="127.0.0.1",
            metrics_port=0,
            audit_top_jobs=3,
            cluster=cluster,
        )
        thread = threading.Thread(
            target=jobs.watch,
            args=(url, options),
            kwargs={"config": Config(), "log": lines.append, "stop": stop},
            daemon=True,
        )
        thread.start()
        try:
            line = wait_until(lambda: next((m for m in lines if "/metrics" in m), None))
            port = re.search(r":(\d+)/metrics", line)
            assert port is not None, line
            yield f"http://127.0.0.1:{port.group(1)}/metrics"
        finally:
            stop.set()
            thread.join(timeout=20)
    assert not thread.is_alive()


@pytest.fixture
def watcher(audited: str, tmp_path: Path) -> Iterator[str]:
    with serving(audited, tmp_path) as url:
        yield url


def test_the_watcher_serves_the_reports_team_figures(audited: str, watcher: str) -> None:
    got = scrape(watcher)
    teams = report_json(audited)

    hours = {(s["team"], s["category"]): v for s, v in got["auditor_audit_gpu_hours"]}
    want = {(r["team"], c.value): r[f"{c.value}_gpu_hours"] for r in teams for c in CATEGORIES}
    assert hours.keys() == want.keys()
    for key, value in want.items():
        assert hours[key] == pytest.approx(value, abs=1e-6), key  # JSON keeps 6 decimals
    for metric, field in (
        ("auditor_audit_scheduling_waste_ratio", "scheduling_waste_share"),
        ("auditor_audit_compute_idle_ratio", "compute_idle_share"),
        ("auditor_audit_inferred_mapping_ratio", "inferred_share"),
    ):
        shares = {s["team"]: v for s, v in got[metric]}
        expected = {r["team"]: r[field] for r in teams if r[field] is not None}
        assert shares == pytest.approx(expected, abs=1e-6), metric
    reserved = {s["team"]: v for s, v in got["auditor_audit_reserved_idle_ratio"]}
    assert reserved == pytest.approx(
        {
            r["team"]: r["reserved_idle_gpu_hours"] / r["allocated_gpu_hours"]
            for r in teams
            if r["allocated_gpu_hours"] > 0
        },
        abs=1e-6,
    )
    # every audit series names its cluster, first (a store of one cluster: the default)
    audit = [labels for name, series in got.items() if name.startswith("auditor_audit_")
             for labels, _ in series]  # fmt: skip
    assert audit
    assert all(labels.get("cluster") == DEFAULT_CLUSTER for labels in audit)
    # the health metrics are still there beside them
    # (the watcher's first list may still be under way at the first scrape)
    assert wait_until(lambda: "auditor_watch_relists_total" in scrape(watcher))


def test_the_watcher_serves_a_bounded_number_of_jobs_and_the_window(
    audited: str, watcher: str
) -> None:
    got = scrape(watcher)
    by_job = {(r["namespace"], r["job"]): r for r in report_json(audited, "--by", "job")}

    series = got["auditor_audit_job_gpu_hours"]
    served = {(s["job_namespace"], s["job_name"]) for s, _ in series}
    assert len(served) == 3  # --metrics-top-jobs
    wasted = {
        k: r["scheduling_waste_gpu_hours"] + r["compute_idle_gpu_hours"] for k, r in by_job.items()
    }
    assert sorted(wasted[k] for k in served) == sorted(wasted.values())[-3:]
    for labels, value in series:
        row = by_job[(labels["job_namespace"], labels["job_name"])]
        assert labels["team"] == row["team"]
        assert value == pytest.approx(row[f"{labels['category']}_gpu_hours"], abs=1e-6)
    window = jobs.build_report(audited, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None)
    start = got["auditor_audit_window_start_timestamp_seconds"][0][1]
    end = got["auditor_audit_window_end_timestamp_seconds"][0][1]
    assert (start, end) == (window.window[0] / 1000, window.window[1] / 1000)
    fleet = got["auditor_audit_capacity_gpu_hours"][0][1]
    assert fleet == pytest.approx(sum(v for _, v in got["auditor_audit_gpu_hours"]), rel=1e-9)


def test_every_family_the_renderer_can_emit_is_named(audited: str) -> None:
    figures = latest_audit_figures(make_engine(audited), cluster=DEFAULT_CLUSTER)

    names = {f.name for f in audit_families(figures, top_jobs=5)}

    assert {f"{n}" for n in names} == {n.removesuffix("_total") for n in AUDIT_METRIC_NAMES}


class Source:
    """A store read the tests control: figures, or a failure."""

    def __init__(self, figures: Any) -> None:
        self.figures = figures
        self.fail = False
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.fail:
            raise OSError("database is down")
        return self.figures


def exposition(collector: AuditCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_the_store_is_read_at_most_once_a_minute_and_an_outage_keeps_the_figures(
    audited: str,
) -> None:
    source = Source(latest_audit_figures(make_engine(audited), cluster=DEFAULT_CLUSTER))
    now = [1000.0]
    collector = AuditCollector(source, cluster=DEFAULT_CLUSTER, clock=lambda: now[0])

    first = exposition(collector)
    for _ in range(5):
        now[0] += 11.0
        assert exposition(collector) == first
    assert source.calls == 1
    now[0] += 5.0  # 60 s after the first read
    source.fail = True
    during = exposition(collector)

    assert source.calls == 2
    assert 'auditor_audit_read_errors_total{cluster="default"} 1.0' in during

    def hours(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("auditor_audit_gpu_hours{")]

    assert hours(during) == hours(first)
    assert hours(first)


def test_before_any_audit_only_the_read_metrics_are_served() -> None:
    text = exposition(AuditCollector(Source(None), cluster=DEFAULT_CLUSTER))

    served = {f.name for f in text_string_to_metric_families(text)}
    assert served == {"auditor_audit_read_errors", "auditor_audit_last_read_timestamp_seconds"}
    assert {"auditor_audit_read_errors_total"} < READ_METRIC_NAMES


def runs(rows: list[tuple[int, int, int, str, int]]) -> pd.DataFrame:
    columns = ["id", "window_start_ms", "window_end_ms", "shard", "created_ms"]
    return pd.DataFrame(rows, columns=columns)


@pytest.mark.parametrize(
    ("rows", "want"),
    [
        pytest.param([], None, id="no-runs"),
        pytest.param([(1, 0, 10, "all", 100)], ([1], (0, 10)), id="one-run"),
        pytest.param(
            [(1, 0, 10, "all", 100), (2, 10, 20, "all", 200)], ([2], (10, 20)), id="newest"
        ),
        pytest.param(
            [(1, 0, 10, "all", 100), (2, 10, 20, "0/2", 200)],
            ([1], (0, 10)),
            id="sharded-incomplete-is-skipped",
        ),
        pytest.param(
            [(1, 0, 10, "all", 100), (2, 10, 20, "0/2", 200), (3, 10, 20, "1/2", 210)],
            ([2, 3], (10, 20)),
            id="sharded-complete",
        ),
        pytest.param(
            [(1, 0, 10, "0/2", 100), (2, 0, 10, "all", 50)], ([2], (0, 10)), id="all-wins"
        ),
        pytest.param(
            [(1, 10, 20, "all", 100), (2, 0, 10, "all", 300)],
            ([2], (0, 10)),
            id="a-re-audit-of-an-older-window-is-the-latest-stored",
        ),
    ],
)
def test_latest_complete_audit(
    rows: list[tuple[int, int, int, str, int]], want: tuple[list[int], tuple[int, int]] | None
) -> None:
    got = latest_complete(runs(rows))

    assert (None if got is None else (got.run_ids, got.window)) == want


@pytest.mark.parametrize(
    ("rows", "cluster", "want"),
    [
        pytest.param(
            [(1, 0, 10, "all", 100, "a"), (2, 10, 20, "all", 200, "b")],
            "a",
            ([1], (0, 10)),
            id="another-clusters-newer-audit-does-not-hide-it",
        ),
        pytest.param(
            [
                (1, 0, 10, "all", 100, "a"),
                (2, 10, 20, "0/2", 200, "a"),
                (3, 10, 20, "1/2", 210, "b"),
            ],
            "a",
            ([1], (0, 10)),
            id="another-clusters-shard-does-not-complete-it",
        ),
        pytest.param(
            [
                (1, 0, 10, "all", 100, "a"),
                (2, 10, 20, "0/2", 200, "a"),
                (3, 10, 20, "1/2", 210, "b"),
            ],
            None,
            ([1], (0, 10)),
            id="no-window-of-two-clusters-is-one-audit",
        ),
        pytest.param(
            [(1, 0, 10, "all", 100, "a"), (2, 0, 10, "all", 300, "b")],
            None,
            ([2], (0, 10)),
            id="of-every-cluster-the-latest-is-one-clusters-runs",
        ),
        pytest.param([(1, 0, 10, "all", 100, "b")], "a", None, id="none-of-its-own"),
    ],
)
def test_latest_complete_audit_of_one_cluster(
    rows: list[tuple[int, int, int, str, int, str]],
    cluster: str | None,
    want: tuple[list[int], tuple[int, int]] | None,
) -> None:
    columns = ["id", "window_start_ms", "window_end_ms", "shard", "created_ms", "cluster"]

    got = latest_complete(pd.DataFrame(rows, columns=columns), cluster=cluster)

    assert (None if got is None else (got.run_ids, got.window)) == want
    if got is not None:
        assert got.cluster == {r[0]: r[5] for r in rows}[got.run_ids[0]]


# ---------------------------------------------------------------- several clusters


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimulationResult]:
    """Two clusters whose audits differ (another seed), with the same node names."""
    return simulate_clusters(tmp_path_factory.mktemp("metrics-clusters"))


def whole(sim: SimulationResult) -> tuple[int, int]:
    return sim.window_start_ms, sim.window_end_ms


@pytest.fixture(scope="module")
def alone(
    sims: dict[str, SimulationResult], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Each cluster in a database of its own, audited over its simulation."""
    tmp = tmp_path_factory.mktemp("metrics-alone")
    out = {}
    for name, sim in sims.items():
        url = f"sqlite:///{tmp / f'{name}.db'}"
        load(url, sim, name)
        jobs.audit(url, window=whole(sim), thresholds=Thresholds(), cluster=name)
        out[name] = url
    return out


@pytest.fixture(scope="module")
def shared_db(sims: dict[str, SimulationResult], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both clusters in one database, audited by one `auditor audit` (each its own run)."""
    path = tmp_path_factory.mktemp("metrics-shared") / "auditor.db"
    url = f"sqlite:///{path}"
    for name in CLUSTERS:
        load(url, sims[name], name)
    runs = jobs.audit_clusters(url, window=whole(sims["east"]), thresholds=Thresholds())
    assert [r.cluster for r in runs] == list(CLUSTERS)
    return path


@pytest.fixture
def shared(shared_db: Path, tmp_path: Path) -> str:
    """A copy of the shared database each test may write to."""
    copy = tmp_path / "shared.db"
    # SQLite's backup, not a file copy: what a connection still open left in the -wal file
    # (the audit runs) is copied too
    with closing(sqlite3.connect(shared_db)) as src, closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)
    return f"sqlite:///{copy}"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(figures: AuditFigures | None) -> Samples:
    """Every audit sample by name and labels, but when the audit was stored."""
    out: Samples = {}
    for family in audit_families(figures, top_jobs=5):
        for s in family.samples:
            if s.name != "auditor_audit_completed_timestamp_seconds":
                out[(s.name, tuple(s.labels.items()))] = s.value
    return out


def test_each_clusters_figures_are_those_of_a_database_holding_it_alone(
    shared: str, alone: dict[str, str]
) -> None:
    got = {c: latest_audit_figures(make_engine(shared), cluster=c) for c in CLUSTERS}

    for name in CLUSTERS:
        figures = got[name]
        assert figures is not None
        assert figures.cluster == name
        want = samples(latest_audit_figures(make_engine(alone[name]), cluster=name))
        have = samples(figures)
        assert have.keys() == want.keys(), name
        for key, value in want.items():
            assert have[key] == pytest.approx(value, abs=1e-9), key
        for family in audit_families(figures, top_jobs=5):
            for s in family.samples:  # the cluster comes first on every series
                assert next(iter(s.labels.items())) == ("cluster", name), s
    hours = [
        {k[1][1:]: v for k, v in samples(got[c]).items() if k[0] == "auditor_audit_gpu_hours"}
        for c in CLUSTERS
    ]
    assert hours[0].keys() == hours[1].keys()
    assert hours[0] != hours[1]  # the two audits differ: the test tells them apart


def test_a_cluster_of_none_audited_serves_no_figures(shared: str) -> None:
    assert latest_audit_figures(make_engine(shared), cluster="north") is None


def test_a_sharded_audit_in_progress_keeps_its_previous_and_is_not_completed_by_another_cluster(
    shared: str, sims: dict[str, SimulationResult]
) -> None:
    before = {c: samples(latest_audit_figures(make_engine(shared), cluster=c)) for c in CLUSTERS}
    # a newer window: east's shard 0/2 and west's shard 1/2 are stored, neither is complete
    start, end = whole(sims["east"])
    newer = (start + (end - start) // 2 // 3_600_000 * 3_600_000, end)
    jobs.audit(shared, window=newer, thresholds=Thresholds(), shard=(0, 2), cluster="east")
    jobs.audit(shared, window=newer, thresholds=Thresholds(), shard=(1, 2), cluster="west")

    for name in CLUSTERS:
        figures = latest_audit_figures(make_engine(shared), cluster=name)
        assert figures is not None
        assert figures.window == whole(sims["east"]), name
        assert samples(figures) == before[name]

    # east's own second shard completes east's, and west's figures stay as they were
    jobs.audit(shared, window=newer, thresholds=Thresholds(), shard=(1, 2), cluster="east")
    east = latest_audit_figures(make_engine(shared), cluster="east")
    assert east is not None
    assert east.window == newer
    west = latest_audit_figures(make_engine(shared), cluster="west")
    assert west is not None
    assert samples(west) == before["west"]


def test_each_clusters_watcher_serves_its_own_cluster(
    shared: str, alone: dict[str, str], tmp_path: Path
) -> None:
    for name in CLUSTERS:
        (tmp_path / name).mkdir()
        with serving(shared, tmp_path / name, cluster=name) as url:
            got = scrape(url)
        want = report_json(alone[name])
        hours = {
            (s["team"], s["category"]): v
            for s, v in got["auditor_audit_gpu_hours"]
            if s["cluster"] == name
        }
        assert len(hours) == len(got["auditor_audit_gpu_hours"])  # no other cluster's
        expected = {
            (r["team"], c.value): r[f"{c.value}_gpu_hours"] for r in want for c in CATEGORIES
        }
        assert hours == pytest.approx(expected, abs=1e-6)
        assert got["auditor_audit_read_errors_total"] == [({"cluster": name}, 0.0)]
