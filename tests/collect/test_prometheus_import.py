"""`auditor import prometheus` against a real Prometheus holding a backfilled week of
dcgm-exporter data (Debian's `prometheus` and `promtool`, started here on loopback).

What users rely on: every sample of the week arrives once, with its value, across query
chunks; the pod labels become exact GPU -> pod spans (a reused pod name maps to the pod of
that time; a card without `pod` is unallocated); a re-run changes nothing; a Prometheus
that refuses or cannot be reached is a one-line error.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from fakeprom import Reply, card, fake_prometheus, matrix
from promserver import Card, Plain, PromServer, backfill, binaries, start_prometheus
from records import bare_pod
from sqlalchemy import func, select
from typer.testing import CliRunner

from auditor.cli import app
from auditor.errors import InputError
from auditor.jobs import import_prometheus, open_store
from auditor.model import GpuRecord, PodRecord
from auditor.store import migrate, reads
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.schema import gpu_assignments, gpu_samples, gpus
from auditor.store.writes import upsert_gpus

STEP = 30
DAY = 86_400
END = (int(time.time()) // DAY) * DAY  # midnight today: well within retention
START = END - 7 * DAY
POINTS = 7 * DAY // STEP

CARDS = [
    Card(
        "GPU-0000",
        0,
        "node-a",
        holders=[
            (START, START + 2 * DAY, "ml", "train-0"),
            (START + 3 * DAY, END, "ml", "train-0"),  # the name again, a new pod
        ],
    ),
    Card("GPU-1111", 1, "node-a", holders=[(START, END, "ml", "infer-0")], profiling=True),
    Card("GPU-2222", 0, "node-b"),  # never held
    Card("GPU-3333", 1, "node-b", mig_instance=2),
]


def util(card: Card, t: int) -> float:
    return float((t // STEP * 7 + card.gpu * 13 + len(card.hostname)) % 101)


METRICS = {
    "DCGM_FI_DEV_GPU_UTIL": util,
    "DCGM_FI_DEV_FB_USED": lambda c, t: 1000.0 + t // STEP % 50,
    "DCGM_FI_DEV_FB_FREE": lambda c, t: 80000.0 - t // STEP % 50,
    "DCGM_FI_PROF_SM_ACTIVE": lambda c, t: (t // STEP % 10) / 10,
}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"{found}: required under CI", pytrace=False)
        pytest.skip(found)
    root = tmp_path_factory.mktemp("prometheus")
    backfill(CARDS, root / "tsdb", start_s=START, end_s=END, interval_s=STEP, metrics=METRICS)
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def pod(name: str, uid: str, *, bound: int, finished: int | None = None) -> PodRecord:
    return bare_pod(
        name, uid, bound_ms=bound * 1000, finished_ms=None if finished is None else finished * 1000
    )


@pytest.fixture
def migrated(db_url: str) -> str:
    migrate.upgrade(make_engine(db_url))
    return db_url


@pytest.fixture
def store(migrated: str) -> str:
    with open_store(migrated).begin() as conn:
        upsert_pods(
            conn,
            [
                pod("train-0", "uid-train-1", bound=START - 60, finished=START + 2 * DAY),
                pod("train-0", "uid-train-2", bound=START + 3 * DAY - 10),
                pod("infer-0", "uid-infer", bound=START - 3600),
            ],
        )
    return migrated


@pytest.mark.slow
def test_a_backfilled_week_round_trips(prometheus: PromServer, store: str) -> None:
    window = (START * 1000, END * 1000)
    stats = import_prometheus(store, prometheus_url=prometheus.url, window=window, step_s=STEP)
    assert (stats.samples, stats.gpus, stats.holdings, stats.unresolved) == (4 * POINTS, 4, 3, 0)
    with open_store(store).connect() as conn:
        cards = {r.uuid: r for r in conn.execute(select(gpus))}
        assert cards["GPU-0000"].node == "node-a"
        assert cards["GPU-0000"].gpu_index == 0
        assert cards["GPU-0000"].model == "NVIDIA H100 80GB HBM3"
        assert cards["GPU-0000"].memory_total_mib == 81000.0
        assert cards["GPU-3333/gi2"].parent_uuid == "GPU-3333"
        assert cards["GPU-3333/gi2"].mig_profile == "1g.10gb"
        rows = conn.execute(
            select(gpus.c.uuid, gpu_samples.c.ts_ms, gpu_samples.c.util, gpu_samples.c.sm_active)
            .join(gpus, gpus.c.id == gpu_samples.c.gpu_id)
            .order_by(gpus.c.uuid, gpu_samples.c.ts_ms)
        ).all()
        spans = conn.execute(
            select(
                gpu_assignments.c.pod_uid,
                gpus.c.uuid,
                gpu_assignments.c.first_seen_ms,
                gpu_assignments.c.last_seen_ms,
                gpu_assignments.c.source,
            )
            .join(gpus, gpus.c.id == gpu_assignments.c.gpu_id)
            .order_by(gpu_assignments.c.pod_uid)
        ).all()
    by_card: dict[str, list[tuple[int, float | None, float | None]]] = {}
    for uuid, ts, u, sm in rows:
        by_card.setdefault(uuid, []).append((ts, u, sm))
    card = {c.uuid if c.mig_instance is None else f"{c.uuid}/gi{c.mig_instance}": c for c in CARDS}
    for uuid, got in by_card.items():
        expected = [
            (t * 1000, util(card[uuid], t), (t // STEP % 10) / 10 if uuid == "GPU-1111" else None)
            for t in range(START, END, STEP)
        ]
        assert got == expected, uuid
    ms = 1000
    assert [tuple(s) for s in spans] == [
        ("uid-infer", "GPU-1111", START * ms, (END - STEP) * ms, "dcgm-exporter"),
        ("uid-train-1", "GPU-0000", START * ms, (START + 2 * DAY - STEP) * ms, "dcgm-exporter"),
        ("uid-train-2", "GPU-0000", (START + 3 * DAY) * ms, (END - STEP) * ms, "dcgm-exporter"),
    ]
    last_day = ((END - DAY) * 1000, END * 1000)
    again = import_prometheus(store, prometheus_url=prometheus.url, window=last_day, step_s=STEP)
    assert (again.samples, again.already) == (0, 4 * DAY // STEP)
    with open_store(store).connect() as conn:
        assert conn.execute(select(func.count()).select_from(gpu_samples)).scalar() == 4 * POINTS
        assert conn.execute(select(func.count()).select_from(gpu_assignments)).scalar() == 3


def test_pods_unknown_to_the_store_are_reported_not_invented(
    prometheus: PromServer, migrated: str
) -> None:
    window = ((END - DAY) * 1000, END * 1000)
    stats = import_prometheus(migrated, prometheus_url=prometheus.url, window=window, step_s=STEP)
    assert stats.samples == 4 * DAY // STEP
    assert (stats.holdings, stats.unresolved) == (0, 2)


def test_the_cli_imports_a_window(prometheus: PromServer, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(END - 3600))
    end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(END))
    args = ["--db", db, "import", "prometheus", "--url", prometheus.url]
    result = CliRunner().invoke(app, [*args, "--start", start, "--end", end, "--step", "30s"])
    assert result.exit_code == 0, result.output
    assert f"imported {4 * 120} samples of 4 GPUs" in result.output


def test_a_refusing_prometheus_is_a_one_line_error_and_stores_nothing(
    prometheus: PromServer, migrated: str
) -> None:
    window = (START * 1000, END * 1000)
    with pytest.raises(InputError, match="exceeded maximum resolution of 11,000 points"):
        import_prometheus(
            migrated, prometheus_url=prometheus.url, window=window, step_s=STEP, max_points=20_000
        )
    with open_store(migrated).connect() as conn:
        assert conn.execute(select(func.count()).select_from(gpu_samples)).scalar() == 0


def test_an_unreachable_prometheus_is_a_clear_error(migrated: str) -> None:
    with pytest.raises(InputError, match=r"cannot reach Prometheus at http://127\.0\.0\.1:9"):
        import_prometheus(
            migrated, prometheus_url="http://127.0.0.1:9", window=(0, 60_000), step_s=STEP
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start", "2026-01-02", "--end", "2026-01-01"], "window ends before it starts"),
        (["--since", "1h", "--step", "0s"], "the step must be positive"),
        (["--since", "1h", "--step", "fast"], "not a duration like"),
        ([], "give --start and --end, or --since"),
    ],
)
def test_bad_options_are_one_line_errors(args: list[str], message: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    result = CliRunner().invoke(
        app, ["--db", db, "import", "prometheus", "--url", "http://127.0.0.1:9", *args]
    )
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


# ------------------------------------------------------------------ real-world clusters
# One Prometheus, three windows of two hours each, one cluster setup in each:
#   A: relabelling adds `kubernetes_node` (Hostname is the exporter pod's name);
#   B: no node label; Hostname is the exporter pod's name, kube-state-metrics' kube_pod_info
#      names its node; the exporter pod on node-b is replaced mid-window (two pod names),
#      and node-c's kube-state-metrics is scraped with honor_labels off (exported_*);
#   C: neither: a host-networked exporter (Hostname is the node) and a MIG instance that
#      exports only DCGM_FI_PROF_GR_ENGINE_ACTIVE, 41 % active; a pod `trainer-0` of a
#      StatefulSet that is no exporter shares a card's Hostname.
H = 3600
W_END = END
W_START = W_END - 6 * H
A, B, C = (W_START, W_START + 2 * H), (W_START + 2 * H, W_START + 4 * H), (W_END - 2 * H, W_END)
REPLACED = B[0] + H
GR_ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"

WORLD = [
    Card(
        "GPU-A0",
        0,
        "dcgm-exporter-ab12c",
        extra={"kubernetes_node": "node-a"},
        hostnames=[(A[0], A[1], "dcgm-exporter-ab12c")],
    ),
    Card(
        "GPU-B0",
        0,
        "",
        hostnames=[
            (B[0], REPLACED, "nvidia-dcgm-exporter-old11"),
            (REPLACED, B[1], "nvidia-dcgm-exporter-new22"),
        ],
    ),
    Card("GPU-C0", 0, "", hostnames=[(B[0], B[1], "nvidia-dcgm-exporter-hl33")]),
    Card("GPU-H0", 0, "", hostnames=[(C[0], C[1], "gpu-host-7")], profiling=True),
    Card(
        "GPU-H1",
        1,
        "",
        mig_instance=3,
        mig_profile="3g.40gb",
        hostnames=[(C[0], C[1], "gpu-host-7")],
        only=frozenset({GR_ENGINE}),
    ),
    Card("GPU-T0", 0, "", hostnames=[(C[0], C[1], "trainer-0")]),
]


def ksm(
    pod: str, node: str, start: int, end: int, *, honor: bool = True, kind: str = "DaemonSet"
) -> Plain:
    subject = (
        {"pod": pod, "node": node}
        if honor
        else {
            "exported_pod": pod,
            "exported_node": node,
            "pod": "kube-state-metrics-0",
            "node": "node-ksm",
        }
    )
    return Plain(
        "kube_pod_info",
        {"namespace": "gpu-operator", "created_by_kind": kind, **subject},
        start,
        end,
    )


KUBE_POD_INFO = [
    ksm("nvidia-dcgm-exporter-old11", "node-b", B[0] - 600, REPLACED + 60),  # ends late
    ksm("nvidia-dcgm-exporter-new22", "node-b", REPLACED + 15, B[1]),  # starts a little late
    ksm("nvidia-dcgm-exporter-hl33", "node-c", B[0], B[1], honor=False),
    ksm("trainer-0", "node-x", C[0], C[1], kind="StatefulSet"),
]

WORLD_METRICS = {**METRICS, GR_ENGINE: lambda c, t: 0.41}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"{found}: required under CI", pytrace=False)
        pytest.skip(found)
    root = tmp_path_factory.mktemp("world")
    backfill(
        WORLD,
        root / "tsdb",
        start_s=W_START,
        end_s=W_END,
        interval_s=STEP,
        metrics=WORLD_METRICS,
        plain=KUBE_POD_INFO,
    )
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def cli_import(db: str, url: str, window: tuple[int, int], *more: str) -> str:
    args = ["--db", db, "import", "prometheus", "--url", url, "--step", f"{STEP}s"]
    result = CliRunner().invoke(
        app, [*args, "--start", iso(window[0]), "--end", iso(window[1]), *more]
    )
    assert result.exit_code == 0, result.output
    return result.output


def nodes(db: str) -> dict[str, tuple[str, str | None]]:
    with open_store(db).connect() as conn:
        return {r.uuid: (r.node, r.util_source) for r in conn.execute(select(gpus))}


@pytest.mark.parametrize(
    "option", [[], ["--node-label", "gpu_node", "--node-label", "kubernetes_node"]]
)
def test_the_node_label_names_the_node(world: PromServer, migrated: str, option: list[str]) -> None:
    out = cli_import(migrated, world.url, A, *option)
    assert nodes(migrated) == {"GPU-A0": ("node-a", "DCGM_FI_DEV_GPU_UTIL")}
    assert "; nodes from label kubernetes_node\n" in out


def test_a_node_label_not_given_is_not_read(world: PromServer, migrated: str) -> None:
    out = cli_import(migrated, world.url, A, "--node-label", "gpu_node")
    assert nodes(migrated) == {"GPU-A0": ("dcgm-exporter-ab12c", "DCGM_FI_DEV_GPU_UTIL")}
    assert "nodes from Hostname (no node label and no kube_pod_info" in out


def test_an_exporter_pod_replaced_mid_window_keeps_the_card_on_its_node(
    world: PromServer, migrated: str
) -> None:
    # chunks of 50 points (25 minutes): the pod is replaced inside one, and each pod's
    # name is looked up in the chunks where it shows
    stats = import_prometheus(
        migrated,
        prometheus_url=world.url,
        window=(B[0] * 1000, B[1] * 1000),
        step_s=STEP,
        max_points=50,
    )
    assert nodes(migrated) == {
        "GPU-B0": ("node-b", "DCGM_FI_DEV_GPU_UTIL"),
        "GPU-C0": ("node-c", "DCGM_FI_DEV_GPU_UTIL"),  # exported_pod/exported_node
    }
    assert stats.node_sources == {"kube_pod_info (exporter pods)": 2}
    assert stats.samples == 2 * 2 * H // STEP  # both pods' samples, on one card each
    out = cli_import(migrated, world.url, B)
    assert "; nodes from kube_pod_info (exporter pods)\n" in out


def test_a_card_stored_under_its_exporter_pod_is_refused_naming_node_label(
    world: PromServer, migrated: str
) -> None:
    with open_store(migrated).begin() as conn:  # an import of before the fix
        upsert_gpus(conn, [GpuRecord("GPU-B0", "nvidia-dcgm-exporter-old11", 0)])
    args = ["--db", migrated, "import", "prometheus", "--url", world.url, "--step", "30s"]
    result = CliRunner().invoke(app, [*args, "--start", iso(B[0]), "--end", iso(B[1])])
    assert result.exit_code == 2
    assert "already recorded on node 'nvidia-dcgm-exporter-old11', not 'node-b'" in result.output
    assert "--node-label" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_without_label_or_kube_pod_info_the_node_is_hostname_and_the_summary_says_so(
    world: PromServer, migrated: str
) -> None:
    out = cli_import(migrated, world.url, C)
    assert nodes(migrated) == {
        "GPU-H0": ("gpu-host-7", "DCGM_FI_DEV_GPU_UTIL"),  # GPU_UTIL wins over GR_ENGINE
        "GPU-H1/gi3": ("gpu-host-7", GR_ENGINE),
        "GPU-H1": ("gpu-host-7", None),  # the instance's physical card: its uncarved slices
        "GPU-T0": ("trainer-0", "DCGM_FI_DEV_GPU_UTIL"),  # a StatefulSet's pod: no exporter
    }
    summary = out.splitlines()[0]
    assert summary.endswith(
        "; nodes from Hostname (no node label and no kube_pod_info: if dcgm-exporter does not "
        "run with host networking these are pod names; see --node-label and --node); "
        f"utilisation of 1 GPU from {GR_ENGINE} (MIG instances)"
    )


def test_a_mig_instance_names_its_card_and_profile(world: PromServer, migrated: str) -> None:
    """SPEC §7: a MIG instance is a share of its physical card; GPU_I_PROFILE says which."""
    cli_import(migrated, world.url, C)
    with open_store(migrated).connect() as conn:
        cards = reads.read_gpus(conn).set_index("uuid")
    assert cards.loc["GPU-H1/gi3", "parent_uuid"] == "GPU-H1"
    assert cards.loc["GPU-H1/gi3", "mig_profile"] == "3g.40gb"
    assert pd.isna(cards.loc["GPU-H0", "mig_profile"])


def test_a_mig_instance_with_only_gr_engine_active_is_41_percent_and_reported(
    world: PromServer, migrated: str
) -> None:
    cli_import(migrated, world.url, C)
    with open_store(migrated).connect() as conn:
        utils = (
            conn.execute(
                select(gpu_samples.c.util)
                .join(gpus, gpus.c.id == gpu_samples.c.gpu_id)
                .where(gpus.c.uuid == "GPU-H1/gi3")
            )
            .scalars()
            .all()
        )
    assert utils == [41.0] * (2 * H // STEP)
    runner = CliRunner()
    window = ["--start", iso(C[0]), "--end", iso(C[1])]
    audited = runner.invoke(app, ["--db", migrated, "audit", *window])
    assert audited.exit_code == 0, audited.output
    done = runner.invoke(app, ["--db", migrated, "report", "--by", "gpu", "--format", "json"])
    assert done.exit_code == 0, done.output
    rows = {r["gpu"]: r for r in json.loads(done.output)}
    # --by gpu shows physical cards (SPEC §7): the instance is a part of GPU-H1
    assert "GPU-H1/gi3" not in rows
    assert rows["GPU-H1"]["util_source"] == GR_ENGINE
    assert rows["GPU-H0"]["util_source"] == "DCGM_FI_DEV_GPU_UTIL"
    assert list(rows["GPU-H0"])[:3] == ["node", "gpu", "util_source"]
    csv_out = runner.invoke(app, ["--db", migrated, "report", "--by", "gpu", "--format", "csv"])
    assert csv_out.output.splitlines()[0].startswith("node,gpu,util_source,")
    table = runner.invoke(app, ["--db", migrated, "report", "--by", "gpu"]).output
    assert f"Utilisation of 1 GPU from {GR_ENGINE} (MIG instances)." in table
    [mig_row] = [line for line in table.splitlines() if "GPU-H1" in line]
    assert "GR_ENG" in mig_row  # the metric, short (GR_ENGINE_ACTIVE) and cut to fit
    html = runner.invoke(app, ["--db", migrated, "report", "--format", "html"]).output
    assert f"Utilisation of 1 GPU from {GR_ENGINE} (MIG instances)." in html


def test_gpu_util_is_used_where_present_and_gr_engine_elsewhere(migrated: str) -> None:
    t0 = float(W_START)
    replies = {
        "DCGM_FI_DEV_GPU_UTIL": matrix([card([(t0, "30")])]),
        GR_ENGINE: matrix([card([(t0, "0.9"), (t0 + 30, "0.07"), (t0 + 60, "0.29")])]),
    }

    def respond(query: str) -> Reply:
        for name, reply in replies.items():
            if name in query:
                return reply
        return matrix([])

    with fake_prometheus(respond) as fake:
        stats = import_prometheus(
            migrated,
            prometheus_url=fake.url,
            window=(W_START * 1000, (W_START + 90) * 1000),
            step_s=STEP,
        )
    assert stats.util_sources == {GR_ENGINE: 1}  # 2 of its 3 readings
    with open_store(migrated).connect() as conn:
        got = conn.execute(select(gpu_samples.c.util).order_by(gpu_samples.c.ts_ms)).scalars()
        assert list(got) == [30.0, 7.0, 29.0]
        assert nodes(migrated) == {"GPU-0": ("node-a", GR_ENGINE)}


def test_a_later_source_names_the_utilisation_source_and_moves_nothing(migrated: str) -> None:
    with open_store(migrated).begin() as conn:
        upsert_gpus(conn, [GpuRecord("GPU-x", "n1", 0)], util_source="nvidia-smi")
        upsert_gpus(conn, [GpuRecord("GPU-x", "n1", 0, "H100")])  # says none: kept
    assert nodes(migrated) == {"GPU-x": ("n1", "nvidia-smi")}
    with open_store(migrated).begin() as conn:
        upsert_gpus(conn, [GpuRecord("GPU-x", "n1", 0, util_source="nvml")])  # no conflict
    assert nodes(migrated) == {"GPU-x": ("n1", "nvml")}


def test_a_prometheus_import_is_taken_back_exactly_and_then_its_cards(
    prometheus: PromServer, migrated: str
) -> None:
    """Undo of the second hour's import removes exactly its samples (the first hour's stay,
    and so do the cards, which the first import added); undo of the first then removes the
    rest and the cards only it had added, a MIG instance and its card among them."""
    from auditor.jobs import list_imports, undo_import

    hour = (END - 3600) * 1000
    before = import_prometheus(
        migrated, prometheus_url=prometheus.url, window=(hour - 3_600_000, hour), step_s=STEP
    )
    engine = make_engine(migrated)
    with engine.connect() as conn:
        kept = conn.execute(select(gpu_samples).order_by("gpu_id", "ts_ms")).all()
        cards = conn.execute(select(gpus).order_by(gpus.c.id)).all()
    wrong = import_prometheus(
        migrated,
        prometheus_url=prometheus.url,
        window=(hour, END * 1000),
        step_s=STEP,
        nodes={"GPU-9999": "node-z"},
    )
    assert wrong.samples == 4 * 120
    assert wrong.import_id == before.import_id + 1
    entry = list_imports(migrated)[-1]
    assert (entry.kind, entry.rows_written, entry.options["node"]) == (
        "prometheus",
        4 * 120,
        {"GPU-9999": "node-z"},
    )
    done = undo_import(migrated, wrong.import_id)
    assert (done.samples, done.gpus) == (4 * 120, ())
    with engine.connect() as conn:
        assert conn.execute(select(gpu_samples).order_by("gpu_id", "ts_ms")).all() == kept
        assert conn.execute(select(gpus).order_by(gpus.c.id)).all() == cards
    done = undo_import(migrated, before.import_id)
    assert done.samples == len(kept)
    assert len(done.gpus) == len(cards)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(gpus)).scalar() == 0
    engine.dispose()
