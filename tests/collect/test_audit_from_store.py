"""`auditor audit --samples-from URL` against a real Prometheus (backfilled with promtool)
and a real VictoriaMetrics (imported over its API), both on loopback.

What users rely on: the audit read straight from the metrics store stores exactly the
results of `import prometheus` then `audit` over the same series (exact pod labels, a pod
whose card is a guess from memory in use, an unallocated card, a MIG instance), on SQLite
and PostgreSQL, and no sample row; sharded runs add up to the unsharded one; a store that
refuses a query as too large gets smaller queries, and one that refuses every size is a
one-line error without the credentials.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from promserver import Card, PromServer, backfill, binaries, start_prometheus
from promserver import write_dcgm_openmetrics as openmetrics
from records import bare_pod
from sqlalchemy import func, select
from typer.testing import CliRunner
from vmserver import VmServer, prometheus_lines, start_victoria_metrics

from auditor.cli import app
from auditor.collect.prometheus import PrometheusClient, RawSource
from auditor.errors import InputError
from auditor.jobs import audit, audit_from_store, import_prometheus, open_store
from auditor.model import PodRecord
from auditor.settings import Thresholds
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.schema import (
    audit_causes,
    audit_results,
    audit_runs,
    gpu_assignments,
    gpu_samples,
    gpus,
)

STEP = 30
HOUR = 3600
START = (int(time.time()) // 86_400 - 3) * 86_400  # three days ago, midnight
END = START + 6 * HOUR

CARDS = [
    Card("GPU-a0", 0, "node-a", holders=[(START, END, "ml", "train-0")]),
    Card("GPU-a1", 1, "node-a", holders=[(START, END, "ml", "train-0")], profiling=True),
    Card("GPU-b0", 0, "node-b", holders=[(START, START + 3 * HOUR, "ml", "infer-0")]),
    Card("GPU-b1", 1, "node-b"),  # never held
    Card("GPU-c0", 0, "node-c"),  # held by a pod no label names: a guess from memory in use
    Card("GPU-c1", 1, "node-c", mig_instance=2, only=frozenset({"DCGM_FI_PROF_GR_ENGINE_ACTIVE"})),
]


def _util(card: Card, t: int) -> float:
    if card.uuid == "GPU-a0" and START + HOUR <= t < START + 3 * HOUR:
        return 0.0  # an idle stretch inside a tenure
    if card.uuid == "GPU-b1":
        return 0.0
    return float((t // STEP * 7 + card.gpu * 13) % 101)


def _memory(card: Card, t: int) -> float:
    if card.uuid == "GPU-c0":
        return 30_000.0 if t >= START + 2 * HOUR else 5.0  # the guessed pod's use
    return 1000.0 + t // STEP % 50


METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": _util,
    "DCGM_FI_DEV_FB_USED": _memory,
    "DCGM_FI_DEV_FB_FREE": lambda c, t: 80_000.0 - _memory(c, t),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": lambda c, t: float(4 if t // STEP % 40 == 0 else 0),
    "DCGM_FI_PROF_SM_ACTIVE": lambda c, t: (t // STEP % 10) / 10,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda c, t: (t // STEP % 13) / 100,
}


def _skip_or_fail(why: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{why}: required under CI", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        _skip_or_fail(found)
    root = tmp_path_factory.mktemp("prometheus-from-store")
    backfill(CARDS, root / "tsdb", start_s=START, end_s=END, interval_s=STEP, metrics=METRICS)
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def _series() -> str:
    out = io.StringIO()
    openmetrics(out, CARDS, start_s=START, end_s=END, interval_s=STEP, metrics=METRICS)
    return out.getvalue()


@pytest.fixture(scope="module")
def victoria(victoria_metrics: VmServer) -> VmServer:
    victoria_metrics.load(prometheus_lines(_series()), check=CHECK, at_s=END - STEP)
    return victoria_metrics


def _pod(name: str, uid: str, *, node: str, bound: int, **kw: object) -> PodRecord:
    return replace(bare_pod(name, uid, bound_ms=bound * 1000), node=node, **kw)  # type: ignore[arg-type]


def _pods() -> list[PodRecord]:
    return [
        _pod("train-0", "uid-train", node="node-a", bound=START - 600, gpu_count=2),
        _pod(
            "infer-0",
            "uid-infer",
            node="node-b",
            bound=START - 60,
            finished_ms=(START + 3 * HOUR) * 1000,
        ),
        _pod("guess-0", "uid-guess", node="node-c", bound=START + 2 * HOUR - 30),
    ]


def _store(db_url: str, *, waiting: bool = False) -> str:
    """A store with the pods; `waiting`: and one that waited 3 h for a card, never bound."""
    migrate.upgrade(make_engine(db_url))
    waited = replace(
        bare_pod("queued-0", "uid-queued", bound_ms=0),
        bound_ms=None,
        node=None,
        created_ms=(START + HOUR) * 1000,
        deleted_ms=(START + 4 * HOUR) * 1000,
        wait_reason="Unschedulable",
    )
    with open_store(db_url).begin() as conn:
        upsert_pods(conn, [*_pods(), *([waited] if waiting else [])])
    return db_url


def _free_causes(url: str) -> dict[str, float]:
    """Seconds per cause of `unallocated`, over every run."""
    with open_store(url).connect() as conn:
        rows = conn.execute(
            select(audit_causes.c.cause, func.sum(audit_causes.c.seconds))
            .where(audit_causes.c.category == "unallocated")
            .group_by(audit_causes.c.cause)
        ).all()
    return {str(c): float(x) for c, x in rows}


def _results(url: str) -> list[tuple[object, ...]]:
    with open_store(url).connect() as conn:
        rows = conn.execute(
            select(
                gpus.c.uuid,
                audit_results.c.pod_uid,
                audit_results.c.category,
                audit_results.c.seconds,
                audit_results.c.inferred,
                audit_results.c.estimated,
                audit_results.c.share,
            ).join(gpus, gpus.c.id == audit_results.c.gpu_id)
        ).all()
    return sorted((tuple(r) for r in rows), key=repr)


def _count(url: str, table: object) -> int:
    with open_store(url).connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


THRESHOLDS = Thresholds()


def _iso(t: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


CHECK = 'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a0"}'  # one sample: under every limit here


@pytest.fixture
def second_url(tmp_path: Path, db_url: str, request: pytest.FixtureRequest) -> str:
    """A second store of the same kind as `db_url`."""
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'second.db'}"
    url: str = request.getfixturevalue("pg_server").url("auditor_from_store_b")
    server = request.getfixturevalue("pg_server")
    server.admin("DROP DATABASE IF EXISTS auditor_from_store_b WITH (FORCE)")
    server.admin("CREATE DATABASE auditor_from_store_b")
    return url


@pytest.mark.slow
@pytest.mark.parametrize("engine_name", ["prometheus", "victoria-metrics"])
def test_the_audit_from_the_store_equals_import_then_audit(
    engine_name: str, db_url: str, second_url: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("prometheus" if engine_name == "prometheus" else "victoria")
    imported, direct = _store(db_url), _store(second_url)
    whole = (START * 1000, END * 1000)
    import_prometheus(imported, prometheus_url=server.url, window=whole, step_s=STEP)
    for window in (whole, ((START + HOUR) * 1000, (START + 4 * HOUR) * 1000)):
        audit(imported, window=window, thresholds=THRESHOLDS)
        stats = audit_from_store(
            direct, samples_from=server.url, window=window, thresholds=THRESHOLDS, step_s=STEP
        )
        expected = _results(imported)
        assert expected, "the audit stored results"
        assert _results(direct) == expected
        assert stats.audit.samples > 0
        assert stats.holdings == 3
    categories = {r[2] for r in _results(direct)}
    assert {"busy", "compute_idle", "unallocated"} <= categories
    assert any(r[1] == "uid-guess" and r[4] for r in _results(direct)), "the guess is made"
    assert _count(direct, gpu_samples) == 0
    assert _count(direct, gpu_assignments) == _count(imported, gpu_assignments) == 3
    with open_store(direct).connect() as conn:
        cards = {r.uuid: r for r in conn.execute(select(gpus))}
    assert cards["GPU-a0"].memory_total_mib == 80_000.0
    assert cards["GPU-c1/gi2"].parent_uuid == "GPU-c1"


@pytest.mark.slow
def test_sharded_audits_from_the_store_add_up_to_the_unsharded_one(
    prometheus: PromServer, tmp_path: Path
) -> None:
    """With a pod that waited for a card while cards sat free on every node: the shard
    that completes the set splits all their free time as the unsharded run does."""
    whole = (START * 1000, END * 1000)
    one = _store(f"sqlite:///{tmp_path / 'one.db'}", waiting=True)
    audit_from_store(
        one, samples_from=prometheus.url, window=whole, thresholds=THRESHOLDS, step_s=STEP
    )
    sharded = _store(f"sqlite:///{tmp_path / 'sharded.db'}", waiting=True)
    for i in range(3):
        audit_from_store(
            sharded,
            samples_from=prometheus.url,
            window=whole,
            thresholds=THRESHOLDS,
            step_s=STEP,
            shard=(i, 3),
        )
    assert _count(sharded, audit_runs) == 3
    assert _results(sharded) == _results(one)
    causes = _free_causes(one)
    assert causes["blocked"] > 0
    assert _free_causes(sharded) == pytest.approx(causes, rel=1e-9)


@pytest.mark.slow
def test_queries_whose_edges_split_a_minute_change_no_result(
    prometheus: PromServer, tmp_path: Path
) -> None:
    """10.5-minute queries: every other edge falls inside a minute, so a card's minute of
    memory in use comes in two queries' answers; it is still one minute, and the guessed
    placement made from those minutes is the same."""
    whole = (START * 1000, END * 1000)
    one = _store(f"sqlite:///{tmp_path / 'one.db'}")
    audit_from_store(
        one, samples_from=prometheus.url, window=whole, thresholds=THRESHOLDS, step_s=STEP
    )
    split = _store(f"sqlite:///{tmp_path / 'split.db'}")
    stats = audit_from_store(
        split,
        samples_from=prometheus.url,
        window=whole,
        thresholds=THRESHOLDS,
        step_s=STEP,
        chunk_s=630,
    )
    assert stats.queries > 6 * 3600 // 630, "the window came in many queries"
    got = _results(split)
    assert got == _results(one)
    assert any(r[1] == "uid-guess" and r[4] for r in got), "the guess is made"


@pytest.mark.slow
def test_an_answer_over_the_size_cap_is_asked_again_over_less_time(
    prometheus: PromServer,
) -> None:
    """A chunk whose answer would pass the client's byte cap is read in halves, as a
    refusal over the store's sample limit is: the same points, none twice."""
    window = {"first_ms": START * 1000, "end_ms": END * 1000, "series": 6}

    def read(source: RawSource) -> list[tuple[str, float, str]]:
        return sorted(
            (labels["UUID"], float(t), v)
            for labels, points in source.read("DCGM_FI_DEV_GPU_UTIL", **window)  # type: ignore[arg-type]
            for t, v in points
        )

    whole = RawSource(PrometheusClient(prometheus.url), period_ms=STEP * 1000)
    capped = RawSource(PrometheusClient(prometheus.url, max_bytes=16 << 10), period_ms=STEP * 1000)
    expected = read(whole)
    assert read(capped) == expected
    assert len(expected) == 5 * 6 * HOUR // STEP, "every card's points, once"
    assert capped.shrunk > 0
    assert whole.shrunk == 0


@pytest.mark.slow
def test_a_store_over_its_sample_limit_gets_smaller_queries(
    tmp_path: Path, prometheus: PromServer, victoria_metrics: VmServer
) -> None:
    expected_url = _store(f"sqlite:///{tmp_path / 'expected.db'}")
    whole = (START * 1000, END * 1000)
    audit_from_store(
        expected_url, samples_from=prometheus.url, window=whole, thresholds=THRESHOLDS, step_s=STEP
    )
    # about 750 points of each of 6 cards: 2,000 a query refuses the whole window
    data = tmp_path / "tight-tsdb"
    shutil.copytree(
        prometheus.root / "tsdb", data, ignore=shutil.ignore_patterns("lock", "wal", "chunks_head")
    )
    (tmp_path / "tight").mkdir()
    tight = start_prometheus(data, tmp_path / "tight", flags=["--query.max-samples=2000"])
    try:
        url = _store(f"sqlite:///{tmp_path / 'tight.db'}")
        stats = audit_from_store(
            url, samples_from=tight.url, window=whole, thresholds=THRESHOLDS, step_s=STEP
        )
        assert stats.shrunk > 0
        assert _results(url) == _results(expected_url)
    finally:
        tight.stop()
    # a store that refuses even one scrape period of these cards per query
    refusing = start_victoria_metrics(tmp_path / "refusing", flags=["-search.maxSamplesPerQuery=3"])
    try:
        refusing.load(prometheus_lines(_series()), check=CHECK, at_s=END - STEP)
        stuck = _store(f"sqlite:///{tmp_path / 'stuck.db'}")
        before = _count(stuck, gpus)
        secret = f"http://auditor:hunter2-secret@{refusing.url.removeprefix('http://')}"
        result = CliRunner().invoke(
            app,
            [
                "--db",
                stuck,
                "audit",
                "--samples-from",
                secret,
                "--start",
                _iso(START),
                "--end",
                _iso(END),
                "--step",
                "30s",
            ],
        )
    finally:
        refusing.stop()
    message = result.output
    assert result.exit_code != 0, message
    assert "Traceback" not in message
    assert "hunter2" not in message
    assert message.startswith("auditor: error: "), message
    assert message.count("\n") == 1, message
    assert _count(stuck, gpus) == before == 0, "nothing stored"


def test_a_bad_chunk_or_window_is_a_one_line_error(tmp_path: Path) -> None:
    url = _store(f"sqlite:///{tmp_path / 'a.db'}")
    with pytest.raises(InputError, match="--store-chunk"):
        audit_from_store(
            url,
            samples_from="http://127.0.0.1:9",
            window=(0, 1000),
            thresholds=THRESHOLDS,
            step_s=15,
            chunk_s=1,
        )
    with pytest.raises(InputError, match="cannot reach"):
        audit_from_store(
            url, samples_from="http://127.0.0.1:9", window=(0, 1000), thresholds=THRESHOLDS
        )


def _in(cluster: str, card: Card) -> Card:
    """`card` as the cluster `cluster` exports it to a store holding several: its series
    labelled `cluster`, west's cards other UUIDs on nodes of the same names."""
    uuid = card.uuid if cluster == "east" else f"{card.uuid}-w"
    return replace(card, uuid=uuid, extra={**card.extra, "cluster": cluster})


@pytest.fixture(scope="module")
def two_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """One store (a Thanos over two clusters, as far as the queries can tell) holding east's
    and west's dcgm-exporter series, told apart by their `cluster` label only."""
    found = binaries()
    if isinstance(found, str):
        _skip_or_fail(found)
    root = tmp_path_factory.mktemp("prometheus-two-clusters")
    cards = [_in(c, card) for c in ("east", "west") for card in CARDS]
    backfill(cards, root / "tsdb", start_s=START, end_s=END, interval_s=STEP, metrics=METRICS)
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def _both_stored(db_url: str) -> str:
    """East's and west's pods, of the same names on nodes of the same names."""
    migrate.upgrade(make_engine(db_url))
    with open_store(db_url).begin() as conn:
        upsert_pods(conn, _pods(), cluster="east")
        upsert_pods(conn, [replace(p, uid=f"w-{p.uid}") for p in _pods()], cluster="west")
    return db_url


@pytest.mark.slow
def test_a_store_of_two_clusters_is_read_one_cluster_at_a_time(
    two_clusters: PromServer, prometheus: PromServer, db_url: str, second_url: str, tmp_path: Path
) -> None:
    """With `--cluster-label cluster`, `import prometheus` and `audit --samples-from` read
    only the named cluster's series: east's results are those of a store holding east
    alone, and its cards, holdings and pods are east's."""
    whole = (START * 1000, END * 1000)
    imported, direct = _both_stored(db_url), _both_stored(second_url)
    import_prometheus(
        imported, prometheus_url=two_clusters.url, window=whole, step_s=STEP,
        cluster="east", cluster_label="cluster",
    )  # fmt: skip
    audit(imported, window=whole, thresholds=THRESHOLDS, cluster="east")
    stats = audit_from_store(
        direct, samples_from=two_clusters.url, window=whole, thresholds=THRESHOLDS,
        step_s=STEP, cluster="east", cluster_label="cluster",
    )  # fmt: skip
    alone = _store(f"sqlite:///{tmp_path / 'alone.db'}")
    audit_from_store(alone, samples_from=prometheus.url, window=whole, thresholds=THRESHOLDS,
                     step_s=STEP)  # fmt: skip
    expected = _results(alone)
    assert expected
    assert _results(imported) == expected
    assert _results(direct) == expected
    assert stats.holdings == 3
    for url in (imported, direct):
        with open_store(url).connect() as conn:
            cards = dict(conn.execute(select(gpus.c.uuid, gpus.c.cluster)).all())
            held = set(conn.execute(select(gpu_assignments.c.pod_uid)).scalars())
        assert cards
        assert set(cards.values()) == {"east"}
        assert not any(u.endswith("-w") for u in cards)
        assert held == {"uid-train", "uid-infer"}
