"""`auditor whatif` (SPEC §9): idle policies replayed over history, against hand-computed cases.

Every case is one or a few cards sampled once a minute with the default thresholds (idle at
or below 5 %, reserved after 30 min, startup cap 30 min, teardown cap 10 min), so the numbers
can be computed by hand: when the policy fires, which pods it stops, what they still held
(released, by category), the busy time lost, and whether it was a false stop.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_classify_properties import TH as PROP_TH
from test_classify_properties import Cluster, clusters
from typer.testing import CliRunner

from auditor import jobs
from auditor.classify import classify
from auditor.classify.whatif import WhatIf, card_rows, parse_policy, what_if
from auditor.cli import app
from auditor.errors import InputError
from auditor.model import Window
from auditor.report.whatif import render_whatif_csv, render_whatif_json, render_whatif_table
from auditor.settings import Thresholds

M = 60_000
H = 60 * M
TH = Thresholds()


@dataclass
class Pod:
    uid: str
    utils: list[float]
    """One sample a minute from `start_min`; the tenure is exactly the samples' span."""
    gpu: str = ""
    gang: str = ""
    team: str = "research"
    kind: str = "Notebook"
    start_min: int = 0


def run(pods: list[Pod], policy: str, *, window: tuple[int, int] | None = None) -> WhatIf:
    """Replay `policy` over the pods' cards; a util of `math.inf` is a minute without any
    sample (the sampler was down)."""
    samples, tenures = [], []
    for p in pods:
        gpu = p.gpu or f"gpu-{p.uid}"
        t0 = p.start_min * M
        samples += [(gpu, t0 + i * M, u) for i, u in enumerate(p.utils) if not math.isinf(u)]
        tenures.append((gpu, p.uid, p.gang or f"pod/{p.uid}", t0, t0 + len(p.utils) * M))
    info = pd.DataFrame(
        [(p.uid, p.team, p.kind) for p in pods], columns=["uid", "team", "job_kind"]
    )
    ten = pd.DataFrame(tenures, columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms"])
    return what_if(
        pd.DataFrame(samples, columns=["gpu", "ts_ms", "util"]),
        ten,
        pods=info,
        policies=[parse_policy(policy)],
        window=window or (0, int(ten["end_ms"].max())),
        thresholds=TH,
    )


def total(result: WhatIf) -> dict[str, Any]:
    rec = result.totals().iloc[0].to_dict()
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in rec.items()}


NOTEBOOK = [50.0] * 60 + [0.0] * 300 + [50.0] * 60
"""Active 1 h at 50 %, idle 5 h, active 1 h again: a user who came back after lunch."""
CHECKPOINTING = ([90.0] * 25 + [0.0] * 5) * 8
"""4 h at 90 % with a 5-minute idle gap every 30 minutes (checkpoint writes)."""


@dataclass(frozen=True)
class Case:
    pods: list[Pod]
    policy: str
    stopped: int
    false_stops: int
    stop_min: float | None
    released: dict[str, float]
    busy_lost: float
    longest_spared_h: float = 0.0


CASES = {
    # idle from 1 h, so idle>=2h fires at 3 h: 3 h of reserved_idle and 1 h of the 50 % hour
    # (0.5 compute_idle) released, 0.5 busy lost: the notebook was active again
    "notebook back after 5 h: false stop under idle>=2h": Case(
        [Pod("nb", NOTEBOOK)],
        "idle>=2h",
        stopped=1,
        false_stops=1,
        stop_min=180,
        released={"reserved_idle": 3.0, "compute_idle": 0.5},
        busy_lost=0.5,
    ),
    "notebook back after 5 h: spared under idle>=6h": Case(
        [Pod("nb", NOTEBOOK)],
        "idle>=6h",
        stopped=0,
        false_stops=0,
        stop_min=None,
        released={},
        busy_lost=0.0,
        longest_spared_h=5.0,
    ),
    "kind scope: a notebook policy spares a PyTorchJob": Case(
        [Pod("nb", NOTEBOOK, kind="PyTorchJob")],
        "idle>=2h,kind=notebook",
        stopped=0,
        false_stops=0,
        stop_min=None,
        released={},
        busy_lost=0.0,
    ),
    "team scope: another team's policy spares it": Case(
        [Pod("nb", NOTEBOOK)],
        "idle>=2h,team=vision",
        stopped=0,
        false_stops=0,
        stop_min=None,
        released={},
        busy_lost=0.0,
    ),
    # the gaps are 5 min: never 30 min in a row, the longest stretch spared is 5 min
    "checkpoint gaps never reach the threshold": Case(
        [Pod("train", CHECKPOINTING, kind="PyTorchJob")],
        "idle>=30m",
        stopped=0,
        false_stops=0,
        stop_min=None,
        released={},
        busy_lost=0.0,
        longest_spared_h=5 / 60,
    ),
    # rank 1 idle from 30 min to the end: fires at 2 h 30; the whole gang stops; rank 0 was
    # computing (80 %): a false stop, 1.5 h x 0.8 busy lost, its 0.2 compute_idle released;
    # rank 1's idle tail is trailing: teardown for 10 min, reserved_idle after
    "gang with one idle rank: the whole job stops": Case(
        [
            Pod("r0", [80.0] * 240, gang="ml/job", kind="PyTorchJob"),
            Pod("r1", [80.0] * 30 + [0.0] * 210, gang="ml/job", kind="PyTorchJob"),
        ],
        "idle>=2h",
        stopped=2,
        false_stops=1,
        stop_min=150,
        released={"reserved_idle": 1.5, "compute_idle": 0.3},
        busy_lost=1.2,
    ),
    # 50 min of start-up (pulling the image), then 2 h at 60 %: a 1 h grace spares it ...
    "startup inside its grace is not stopped": Case(
        [Pod("nb", [0.0] * 50 + [60.0] * 120)],
        "idle>=30m,grace=1h",
        stopped=0,
        false_stops=0,
        stop_min=None,
        released={},
        busy_lost=0.0,
    ),
    # ... without it the policy fires at 30 min: 20 min of reserved_idle (startup is capped
    # at 30 min) and the active 2 h's 0.4 idle part released, 2 h x 0.6 busy lost
    "startup without grace is a false stop": Case(
        [Pod("nb", [0.0] * 50 + [60.0] * 120)],
        "idle>=30m",
        stopped=1,
        false_stops=1,
        stop_min=30,
        released={"reserved_idle": 20 / 60, "compute_idle": 0.8},
        busy_lost=1.2,
    ),
    # 8 % is active to the classifier: idle>=2h never fires, util<10 fires at 2 h and the
    # card never rises above 10 % again: released 1 h x 0.92, 0.08 busy lost, no false stop
    "util<10 counts 8 % as idle": Case(
        [Pod("inf", [8.0] * 180, kind="Deployment")],
        "idle>=2h,util<10",
        stopped=1,
        false_stops=0,
        stop_min=120,
        released={"compute_idle": 0.92},
        busy_lost=0.08,
    ),
    "8 % is active under the classifier's own idle test": Case(
        [Pod("inf", [8.0] * 180, kind="Deployment")],
        "idle>=2h",
        stopped=0,
        false_stops=0,
        stop_min=None,
        released={},
        busy_lost=0.0,
    ),
    # an outage (no samples for 40 min) inside an idle stretch neither breaks it nor counts:
    # 1 h idle, 40 min unobserved, 1 h idle fires at 2 h of observed idle = 2 h 40
    "a sampler outage neither breaks nor lengthens a stretch": Case(
        [Pod("nb", [30.0] * 10 + [0.0] * 60 + [math.inf] * 40 + [0.0] * 90)],
        "idle>=2h",
        stopped=1,
        false_stops=0,
        stop_min=170,
        released={"teardown": 0.0, "reserved_idle": 0.5},
        busy_lost=0.0,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_decision_table(name: str) -> None:
    case = CASES[name]
    result = run(case.pods, case.policy)
    got = total(result)
    assert (got["pods_stopped"], got["false_stops"]) == (case.stopped, case.false_stops)
    for cat in ("reserved_idle", "compute_idle", "teardown", "startup", "checkpoint"):
        want = case.released.get(cat, 0.0)
        assert got[f"released_{cat}_gpu_hours"] == pytest.approx(want, abs=1e-6), cat
    assert got["released_gpu_hours"] == pytest.approx(sum(case.released.values()), abs=1e-6)
    assert got["busy_lost_gpu_hours"] == pytest.approx(case.busy_lost, abs=1e-6)
    assert got["longest_spared_idle_hours"] == pytest.approx(case.longest_spared_h, abs=1e-6)
    stops = sorted(set(result.stops["stop_ms"].tolist()))
    assert stops == ([] if case.stop_min is None else [round(case.stop_min * M)])


def test_a_stop_before_the_window_releases_inside_it_and_counts_in_its_own_window() -> None:
    """A policy that had been on all along: the notebook stopped at 3 h releases its 4th to
    6th hours in a window of them, but the stop counts in the window that holds it."""
    later = run([Pod("nb", NOTEBOOK)], "idle>=2h", window=(4 * H, 6 * H))
    got = total(later)
    assert got["pods_stopped"] == 0
    assert got["released_reserved_idle_gpu_hours"] == pytest.approx(2.0)
    whole = total(run([Pod("nb", NOTEBOOK)], "idle>=2h"))
    early = total(run([Pod("nb", NOTEBOOK)], "idle>=2h", window=(0, 4 * H)))
    rest = total(run([Pod("nb", NOTEBOOK)], "idle>=2h", window=(4 * H, 7 * H)))
    for key in ("pods_stopped", "released_gpu_hours", "busy_lost_gpu_hours"):
        assert early[key] + rest[key] == pytest.approx(whole[key])


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("kind=Notebook", "--policy idle"),
        ("idle>=", "--policy idle"),
        ("idle>=2x", "--policy idle"),
        ("idle>=0m", "--policy idle"),
        ("idle=2h", "--policy idle"),
        ("idle>=2h,grace=soon", "--policy grace"),
        ("idle>=2h,util<lots", "--policy util"),
        ("idle>=2h,util<150", "--policy util"),
        ("idle>=2h,util>10", "--policy"),
        ("idle>=2h,colour=red", "--policy colour"),
        ("idle>=2h,team=a,team=b", "--policy team"),
        ("idle>=2h,,kind=x", "--policy"),
    ],
)
def test_a_bad_policy_is_one_error_naming_the_field(spec: str, field: str) -> None:
    with pytest.raises(InputError) as err:
        parse_policy(spec)
    assert err.value.field == field
    assert "\n" not in str(err.value)


def test_policy_fields() -> None:
    p = parse_policy(" idle>=4h, team=research, grace=1h ,util<10")
    assert (p.idle_ms, p.team, p.grace_ms, p.util_below, p.kind) == (4 * H, "research", H, 10, None)
    assert p.text == "idle>=4h, team=research, grace=1h ,util<10"


# ---------------------------------------------------------------- properties


@st.composite
def replays(draw: st.DrawFn) -> tuple[Cluster, pd.DataFrame, str]:
    cluster = draw(clusters())
    uids = sorted(set(cluster.tenures["pod_uid"]))
    pods = pd.DataFrame(
        {
            "uid": uids,
            "team": [draw(st.sampled_from(["a", "b"])) for _ in uids],
            "job_kind": [draw(st.sampled_from(["Notebook", "Job"])) for _ in uids],
        }
    )
    idle = draw(st.integers(1, 90))
    extra = draw(
        st.sampled_from(
            ["", ",kind=Notebook", ",team=a", ",grace=20s", ",util<60", ",util<100,grace=10s"]
        )
    )
    return cluster, pods, f"idle>={idle}s{extra}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replays(), st.data())
def test_released_never_exceeds_the_held_idle_of_the_same_scope(
    case: tuple[Cluster, pd.DataFrame, str], data: st.DataObject
) -> None:
    """Per team: released ≤ held idle (non-busy, observed) of the policy's scope; nothing is
    released or lost by a policy that stopped nobody; counts are whole and consistent."""
    cluster, pods, policy = case
    a = data.draw(st.integers(cluster.lo, cluster.hi))
    b = data.draw(st.integers(a + 1, cluster.hi + 1))
    result = what_if(
        cluster.samples,
        cluster.tenures,
        pods=pods,
        policies=[parse_policy(policy)],
        window=(a, b),
        thresholds=PROP_TH,
    )
    rows = result.rows
    slack = 1e-9
    assert (rows["released_gpu_hours"] <= rows["held_idle_gpu_hours"] + slack).all()
    # the held idle time of the scope, straight from the classifier's results for the window
    p = parse_policy(policy)
    mine = pods[
        (pods["job_kind"] == (p.kind or pods["job_kind"]))
        & (pods["team"] == (p.team or pods["team"]))
    ]
    gangs = set(cluster.tenures.loc[cluster.tenures["pod_uid"].isin(mine["uid"]), "gang"])
    scope = set(cluster.tenures.loc[cluster.tenures["gang"].isin(gangs), "pod_uid"])
    res = classify(
        cluster.samples, cluster.tenures, window=Window(a, b), thresholds=PROP_TH
    ).results
    res = res[res["pod_uid"].isin(scope) & ~res["category"].isin(["busy", "unobserved"])]
    team_of = dict(zip(pods["uid"], pods["team"], strict=True))
    held_idle = res.groupby(res["pod_uid"].map(team_of))["seconds"].sum() / 3600
    released = rows.set_index("team")["released_gpu_hours"]
    for team, hours in released.items():
        assert hours <= held_idle.get(team, 0.0) + 1e-6, team
    reported = rows.set_index("team")["held_idle_gpu_hours"]
    for team, hours in reported.items():
        assert hours == pytest.approx(held_idle.get(team, 0.0), abs=1e-6), team
    parts = rows[[c for c in rows.columns if c.startswith("released_") and c.count("_") > 2]]
    assert np.allclose(parts.sum(axis=1), rows["released_gpu_hours"])
    assert (parts >= -slack).all().all()
    assert (rows["false_stops"] <= rows["pods_stopped"]).all()
    assert (rows["busy_lost_gpu_hours"] >= -slack).all()
    if result.stops.empty:
        assert rows["pods_stopped"].sum() == 0
    else:
        assert ((result.stops["stop_ms"] >= a) & (result.stops["stop_ms"] < b)).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replays(), st.randoms(use_true_random=False))
def test_card_rows_take_pieces_in_any_order(
    case: tuple[Cluster, pd.DataFrame, str], shuffle: Any
) -> None:
    """The classifier's pieces come in the order card rows are built in (none is sorted);
    pieces in any other order give the same rows."""
    cluster = case[0]
    pieces = classify(
        cluster.samples,
        cluster.tenures,
        window=Window(cluster.lo, cluster.hi + 1),
        thresholds=PROP_TH,
        keep_pieces=True,
    ).pieces
    assert pieces is not None
    rows = card_rows(pieces)
    order = list(range(len(pieces)))
    shuffle.shuffle(order)
    pd.testing.assert_frame_equal(card_rows(pieces.iloc[order]), rows, check_exact=False)


# ---------------------------------------------------------------- through the store


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("whatif-demo")
    jobs.demo(work, scenario="small", log=lambda _: None)
    return f"sqlite:///{work / 'auditor.db'}"


POLICIES = ["idle>=2h", "idle>=30m,kind=Notebook", "idle>=4h,team=research,grace=1h"]


def test_same_store_same_bytes(demo_db: str) -> None:
    args = [a for p in POLICIES for a in ("--policy", p)]
    outputs = {}
    for fmt in ("table", "json", "csv"):
        first = CliRunner().invoke(app, ["--db", demo_db, "whatif", *args, "--format", fmt])
        again = CliRunner().invoke(app, ["--db", demo_db, "whatif", *args, "--format", fmt])
        assert first.exit_code == 0, first.output
        assert first.output == again.output
        outputs[fmt] = first.output
    assert outputs["table"].count("(all)") == len(POLICIES)
    csv_lines = outputs["csv"].splitlines()
    assert csv_lines[0].startswith("policy,team,pods_stopped,false_stops,released_gpu_hours")


def test_the_command_takes_its_workers(demo_db: str) -> None:
    """`--workers` as the audit takes it: the same output in one process or two."""
    args = ["--db", demo_db, "whatif", "--policy", POLICIES[0], "--format", "csv"]
    one = CliRunner().invoke(app, [*args, "--workers", "1"])
    two = CliRunner().invoke(app, [*args, "--workers", "2"])
    assert one.exit_code == 0, one.output
    assert two.output == one.output
    none = CliRunner().invoke(app, [*args, "--workers", "0"])
    assert none.exit_code == 2


def test_a_replay_in_worker_processes_is_the_replay_in_one(demo_db: str) -> None:
    """Chunks replayed by two workers (forked, or from a fork server beside another
    thread) sum to exactly what one process replays, pod by pod."""
    policies = [parse_policy(p) for p in POLICIES]

    def replay(workers: int) -> object:
        return jobs.whatif(
            demo_db, policies=policies, window=None, thresholds=Thresholds(), workers=workers
        )

    one = replay(1)
    two = replay(2)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        served = replay(2)
    finally:
        stop.set()
        other.join()
    for got in (two, served):
        assert isinstance(got, WhatIf)
        assert isinstance(one, WhatIf)
        pd.testing.assert_frame_equal(got.rows, one.rows)
        pd.testing.assert_frame_equal(got.stops, one.stops)
    assert isinstance(one, WhatIf)
    assert one.stops.shape[0] > 0, "pods were stopped: the replays compared are not empty"


def test_outputs_agree_and_name_the_policies_side_by_side(demo_db: str) -> None:
    import json

    result = jobs.whatif(
        demo_db, policies=[parse_policy(p) for p in POLICIES], window=None, thresholds=TH
    )
    doc = json.loads(render_whatif_json(result))
    assert [p["policy"] for p in doc["policies"]] == POLICIES
    for p in doc["policies"]:
        teams = p["teams"]
        assert p["totals"]["pods_stopped"] == sum(t["pods_stopped"] for t in teams)
        assert p["totals"]["released_gpu_hours"] == pytest.approx(
            sum(t["released_gpu_hours"] for t in teams), abs=1e-3
        )
        assert len(p["stops"]) == p["totals"]["pods_stopped"]
    research = doc["policies"][2]["teams"]
    assert {t["team"] for t in research} <= {"research"}
    assert render_whatif_csv(result).count("\r\n") == 1 + len(POLICIES) + sum(
        len(p["teams"]) for p in doc["policies"]
    )
    assert "idle>=30m,kind=Notebook" in render_whatif_table(result, width=220)


def test_the_html_report_carries_the_policies(demo_db: str, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    res = CliRunner().invoke(
        app,
        ["--db", demo_db, "report", "--format", "html", "--out", str(out), "--policy", "idle>=2h"],
    )
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "Idle policies: what-if" in page
    assert "<td>idle&gt;=2h</td>" in page


def test_a_bad_policy_on_the_command_line_exits_2_with_one_line(demo_db: str) -> None:
    res = CliRunner().invoke(app, ["--db", demo_db, "whatif", "--policy", "idle>=2h,grace=x"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1
    assert "field '--policy grace'" in lines[0]


def test_an_empty_store_says_so(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["--db", f"sqlite:///{tmp_path / 'e.db'}", "whatif", "--policy", "idle>=2h"]
    )
    assert res.exit_code == 2
    assert "no GPU samples" in res.output


def test_chunks_of_nodes_give_the_same_bytes_as_one_pass(demo_db: str) -> None:
    """Replayed node by node (each with its gangs' cards elsewhere) as in one pass."""
    from auditor.jobs.whatif import replay_stored

    policies = [parse_policy(p) for p in POLICIES]
    window = jobs.data_window(demo_db, period_s=TH.default_period_s)
    with jobs.open_store(demo_db).connect() as conn:
        whole = replay_stored(conn, policies=policies, window=window, thresholds=TH)
        apart = replay_stored(
            conn, policies=policies, window=window, thresholds=TH, chunk_samples=1
        )
    assert render_whatif_json(apart) == render_whatif_json(whole)
    assert render_whatif_csv(apart) == render_whatif_csv(whole)
    assert whole.totals()["pods_stopped"].sum() > 0  # not vacuous: some stops to agree on


GOLDEN = Path(__file__).parents[1] / "fixtures" / "whatif"


@pytest.mark.parametrize(
    ("name", "render"),
    [
        ("side_by_side.json", render_whatif_json),
        ("side_by_side.csv", render_whatif_csv),
        ("side_by_side.txt", render_whatif_table),
    ],
)
def test_golden_outputs(name: str, render: Any) -> None:
    """A notebook back after 5 h and a gang with one idle rank under three policies, as a
    user reads them. `AUDITOR_UPDATE_GOLDEN=1` rewrites the files (review the diff)."""
    import os

    pods = [
        Pod("nb", NOTEBOOK),
        Pod("r0", [80.0] * 240, gang="ml/job", kind="PyTorchJob", team="nlp"),
        Pod("r1", [80.0] * 30 + [0.0] * 210, gang="ml/job", kind="PyTorchJob", team="nlp"),
    ]
    policies = ["idle>=2h", "idle>=30m,kind=Notebook", "idle>=6h"]
    samples, tenures = [], []
    for p in pods:
        samples += [(f"gpu-{p.uid}", i * M, u) for i, u in enumerate(p.utils)]
        tenures.append((f"gpu-{p.uid}", p.uid, p.gang or f"pod/{p.uid}", 0, len(p.utils) * M))
    result = what_if(
        pd.DataFrame(samples, columns=["gpu", "ts_ms", "util"]),
        pd.DataFrame(tenures, columns=["gpu", "pod_uid", "gang", "start_ms", "end_ms"]),
        pods=pd.DataFrame(
            [(p.uid, "ml", f"{p.uid}-0", p.team, p.kind) for p in pods],
            columns=["uid", "namespace", "name", "team", "job_kind"],
        ),
        policies=[parse_policy(p) for p in policies],
        window=(0, 420 * M),
        thresholds=TH,
    )
    text = render(result)
    path = GOLDEN / name
    if os.environ.get("AUDITOR_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())
    assert text == path.read_bytes().decode(), f"{name} changed: AUDITOR_UPDATE_GOLDEN=1"
