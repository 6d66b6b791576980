"""Several clusters in one database (SPEC §11): two simulated clusters whose node names, and
the names of some of their pods, collide; each cluster's figures equal those of a database
holding it alone, and `--by cluster` sums to the fleet."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pgserver import new_database_name
from sqlalchemy import select
from two_clusters import CLUSTERS, load, simulate_clusters
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.errors import GpuConflictError
from auditor.model import CATEGORIES, GpuRecord
from auditor.report.finance import TEXT_COLUMNS, parse_week
from auditor.settings import Thresholds
from auditor.simulate import SimulationResult
from auditor.store.connection import make_engine
from auditor.store.pod_writes import close_missing_pods
from auditor.store.schema import pods
from auditor.store.writes import upsert_gpus

runner = CliRunner()
HOURS = [f"{c.value}_gpu_hours" for c in CATEGORIES]
WEEK = "2026-W48"


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimulationResult]:
    return simulate_clusters(tmp_path_factory.mktemp("clusters"))


@pytest.fixture(scope="module")
def alone(
    sims: dict[str, SimulationResult], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """Each cluster in a database of its own, audited."""
    tmp = tmp_path_factory.mktemp("alone")
    out = {}
    for name, sim in sims.items():
        url = f"sqlite:///{tmp / f'{name}.db'}"
        load(url, sim, name)
        jobs.audit(url, window=window(sim), thresholds=Thresholds())
        out[name] = url
    return out


def window(sim: SimulationResult) -> tuple[int, int]:
    """The ISO week the simulation lies in: what the finance export needs audited."""
    week = parse_week(WEEK)
    assert week.start_ms <= sim.window_start_ms < sim.window_end_ms <= week.end_ms
    return week.start_ms, week.end_ms


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def shared(
    request: pytest.FixtureRequest,
    sims: dict[str, SimulationResult],
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """Both clusters in one database, SQLite and PostgreSQL, each audited by one `auditor
    audit` (read by the tests, never written)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('shared') / 'auditor.db'}"
    else:
        server = request.getfixturevalue("pg_server")
        name = new_database_name()
        server.admin(f"CREATE DATABASE {name}")
        url = server.url(name)
    jobs.db_upgrade(url)
    for name in CLUSTERS:
        load(url, sims[name], name)
    runs = jobs.audit_clusters(url, window=window(sims["east"]), thresholds=Thresholds())
    assert [r.cluster for r in runs] == list(CLUSTERS)
    return url


def cli(url: str, *args: str) -> str:
    result = runner.invoke(app, ["--db", url, *args])
    assert result.exit_code == 0, result.output
    return result.stdout  # without the warning of GPU models that have no price


def rows(url: str, *args: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads(cli(url, "report", "--format", "json", *args))
    return out


def close(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, abs=1e-9) if a is not None and b is not None else a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_the_clusters_collide_on_node_and_pod_names(sims: dict[str, SimulationResult]) -> None:
    """The precondition the rest relies on: nodes and pods of the same names."""
    east, west = (json.loads(sims[c].pods_json.read_text())["items"] for c in CLUSTERS)
    named = [
        {(p["metadata"].get("namespace"), p["metadata"]["name"]) for p in x} for x in (east, west)
    ]
    assert set(sims["east"].node_csvs) == set(sims["west"].node_csvs)
    assert named[0] & named[1]


@pytest.mark.parametrize("by", ["team", "job", "node", "gpu"])
def test_each_cluster_equals_a_database_holding_it_alone(
    shared: str, alone: dict[str, str], by: str
) -> None:
    for name in CLUSTERS:
        mine = rows(shared, "--by", by, "--cluster", name)
        assert close(mine, rows(alone[name], "--by", by)), (name, by)


def test_by_cluster_sums_to_the_fleet(shared: str, alone: dict[str, str]) -> None:
    per = {r["cluster"]: r for r in rows(shared, "--by", "cluster")}
    assert set(per) == set(CLUSTERS)
    fleet = rows(shared, "--by", "team")
    for col in HOURS:
        assert sum(r[col] for r in per.values()) == pytest.approx(
            sum(r[col] for r in fleet), abs=1e-5
        )
        # and each cluster's row is its own database's whole
        for name in CLUSTERS:
            assert per[name][col] == pytest.approx(sum(r[col] for r in rows(alone[name])), abs=1e-5)


def test_nodes_of_the_same_name_stay_apart(shared: str, sims: dict[str, SimulationResult]) -> None:
    by_node = rows(shared, "--by", "node")
    keys = {(r["cluster"], r["node"]) for r in by_node}
    assert len(by_node) == len(keys) == 2 * len(sims["east"].node_csvs)


@pytest.mark.parametrize("by", ["job", "pod"])
def test_jobs_and_pods_of_the_same_name_stay_apart(
    shared: str, alone: dict[str, str], by: str
) -> None:
    """A job `nlp/Job/llm-eval` in each cluster is two jobs, of two sets of pods: a row
    each, with its own cluster's waits and stragglers, each its own database's row."""
    both = rows(shared, "--by", by)
    keys = ["team", "namespace", by]
    named = [{tuple(r[k] for k in keys) for r in rows(alone[c], "--by", by)} for c in CLUSTERS]
    assert named[0] & named[1]  # names both clusters have
    assert len(both) == len({(r["cluster"], *(r[k] for k in keys)) for r in both})
    for name in CLUSTERS:
        mine = [{k: v for k, v in r.items() if k != "cluster"} for r in both
                if r["cluster"] == name]  # fmt: skip
        assert close(mine, rows(alone[name], "--by", by)), (name, by)


def test_outputs_that_name_no_cluster_go_only_to_a_name_one_cluster_has() -> None:
    """An output row names its job, not the job's cluster: a job of one cluster takes its
    outputs; of two jobs of one name in two clusters, neither does (whose were they?)."""
    import pandas as pd

    from auditor.report.compare import outputs_by_name

    keys = ["cluster", "team", "namespace", "job"]
    report = pd.DataFrame(
        [("east", "ml", "ml", "Job/x"), ("west", "ml", "ml", "Job/x"),
         ("east", "ml", "ml", "Job/y")], columns=keys,
    )  # fmt: skip
    outputs = pd.DataFrame(
        {"team": ["ml", "ml"], "namespace": ["ml", "ml"], "job": ["Job/x", "Job/y"],
         "unit": ["tokens", "tokens"], "in_window": [5.0, 7.0]}
    )  # fmt: skip
    got = outputs_by_name(report, outputs, keys)
    assert got.to_dict("records") == [
        {"cluster": "east", "team": "ml", "namespace": "ml", "job": "Job/y", "outputs": 7.0,
         "output_unit": "tokens"}
    ]  # fmt: skip


def test_finance_rows_name_their_cluster(shared: str, alone: dict[str, str]) -> None:
    week = WEEK
    both = list(csv.DictReader(io.StringIO(cli(shared, "export", "finance", "--week", week))))
    assert {r["cluster"] for r in both} == set(CLUSTERS)
    for name in CLUSTERS:
        own = list(
            csv.DictReader(io.StringIO(cli(alone[name], "export", "finance", "--week", week)))
        )
        # the whole file is rounded column by column (its columns sum exactly), so a
        # cluster's rows in it may differ from its own file's in the last digit
        one = [r for r in both if r["cluster"] == name]
        assert [list(r) for r in one] == [list(r) for r in own]
        for mixed, alone_row in zip(one, own, strict=True):
            for col, value in alone_row.items():
                if col in TEXT_COLUMNS:
                    assert mixed[col] == value, col
                elif value:
                    assert float(mixed[col]) == pytest.approx(float(value), abs=0.011), col
        only = list(
            csv.DictReader(
                io.StringIO(cli(shared, "export", "finance", "--week", week, "--cluster", name))
            )
        )
        assert only == own


def test_a_card_is_refused_in_a_second_cluster(
    shared: str, sims: dict[str, SimulationResult]
) -> None:
    """A GPU UUID is one physical card: recorded in `east`, it cannot be written as `west`'s."""
    engine = make_engine(shared)
    try:
        with engine.connect() as conn:
            uuid, node = conn.execute(
                select(pods.c.uid, pods.c.node).where(pods.c.cluster == "east").limit(1)
            ).one()
        from auditor.store.reads import read_gpus

        with engine.connect() as conn:
            card = read_gpus(conn, cluster="east").iloc[0]
        with (
            pytest.raises(GpuConflictError, match="cluster 'east', not 'west'"),
            engine.begin() as conn,
        ):
            upsert_gpus(conn, [GpuRecord(str(card["uuid"]), str(card["node"]))], cluster="west")
    finally:
        engine.dispose()
    assert uuid
    assert node


def test_a_watcher_of_one_cluster_closes_none_of_another(shared: str) -> None:
    """A relist of `east` that shows no pod closes east's open pods, never west's."""
    engine = make_engine(shared)
    try:
        with engine.connect() as conn, conn.begin() as tx:  # rolled back: the store is shared
            open_west = (
                conn.execute(
                    select(pods.c.uid).where(pods.c.cluster == "west", pods.c.deleted_ms.is_(None))
                )
                .scalars()
                .all()
            )
            closed = close_missing_pods(conn, listed_uids=[], at_ms=2**40, cluster="east")
            still = (
                conn.execute(
                    select(pods.c.uid).where(pods.c.cluster == "west", pods.c.deleted_ms.is_(None))
                )
                .scalars()
                .all()
            )
            cluster_of = dict(conn.execute(select(pods.c.uid, pods.c.cluster)).all())
            tx.rollback()
    finally:
        engine.dispose()
    assert open_west
    assert sorted(still) == sorted(open_west)
    assert closed
    assert {cluster_of[u] for u in closed} == {"east"}


def test_an_audit_without_cluster_names_them_where_it_must_choose(shared: str) -> None:
    result = runner.invoke(app, ["--db", shared, "whatif", "--policy", "idle>=1h"])
    assert result.exit_code != 0
    assert "east, west" in result.output
    assert "--cluster" in result.output
    assert "Traceback" not in result.output


def test_a_bad_cluster_name_is_one_line_naming_where(tmp_path: Path) -> None:
    config = tmp_path / "auditor.toml"
    config.write_text('cluster = "prod east"\n', encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    for args in (
        ["--config", str(config), "import", "pods", str(config)],
        ["import", "pods", "--cluster", "-x", str(config)],
        ["report", "--cluster", "a/b"],
    ):
        result = runner.invoke(app, ["--db", url, *args])
        assert result.exit_code != 0, args
        line = result.output.strip()
        assert "\n" not in line, (args, line)
        assert "cluster name" in line, (args, line)
    assert (
        "auditor.toml"
        in runner.invoke(
            app, ["--db", url, "--config", str(config), "import", "pods", str(config)]
        ).output
    )


def test_compare_of_a_team_in_both_clusters_adds_them(
    shared: str, alone: dict[str, str], sims: dict[str, SimulationResult]
) -> None:
    """A side reads the runs of the clusters its pods ran in, each covering the window."""
    from auditor.jobs.outputs_and_compare import side

    team = next(r["team"] for r in rows(alone["east"]) if r["allocated_gpu_hours"] > 0)
    start, end = (
        datetime.fromtimestamp(t / 1000, UTC).isoformat()
        for t in (sims["east"].window_start_ms, sims["east"].window_end_ms)
    )
    text = f"team={team}@{start}..{end}"
    sel = jobs.parse_side(text, option="A")
    both = side(shared, sel).figures["allocated_gpu_hours"]
    each = [side(alone[c], sel).figures["allocated_gpu_hours"] for c in CLUSTERS]
    assert both == pytest.approx(sum(each), abs=1e-9)


def test_a_bad_cluster_label_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'auditor.db'}"
    cases = {
        ("audit", "--cluster-label", "cluster"): "--cluster-label goes with --samples-from",
        (
            "import", "prometheus", "--url", "http://127.0.0.1:9", "--since", "1h",
            "--cluster", "east", "--cluster-label", "bad label",
        ): "not a label name",
    }  # fmt: skip
    for args, said in cases.items():
        result = runner.invoke(app, ["--db", url, *args])
        assert result.exit_code != 0, args
        assert said in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_explain_of_a_job_in_both_clusters_asks_which(shared: str, alone: dict[str, str]) -> None:
    engine = make_engine(shared)
    try:
        with engine.connect() as conn:
            of = {
                c: set(conn.execute(select(pods.c.namespace, pods.c.job).where(
                    pods.c.cluster == c, pods.c.node.is_not(None))).all())
                for c in CLUSTERS
            }  # fmt: skip
    finally:
        engine.dispose()
    namespace, job = sorted(of["east"] & of["west"])[0]
    target = f"{namespace}/{job}"
    asked = runner.invoke(app, ["--db", shared, "explain", target])
    assert asked.exit_code != 0
    assert "east, west" in asked.output
    assert "--cluster" in asked.output
    for name in CLUSTERS:
        assert cli(shared, "explain", target, "--cluster", name) == cli(
            alone[name], "explain", target
        )
