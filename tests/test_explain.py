"""`auditor explain`: target names, per-card timelines that conserve time, and what a user reads.

The timeline rules are checked on hand-made gangs; the command on the simulator's `small`
cluster, whose first PyTorchJob has a thermally throttled slow rank by construction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.errors import InputError
from auditor.report.targets import resolve_target
from auditor.report.timeline import CATEGORY_NAMES, bucketise, sample_segments
from auditor.settings import Thresholds

T0 = 1_700_000_000_000
STEP = 5_000
NO_FINDINGS = pd.DataFrame(
    columns=["kind", "gang", "gpu", "pod_uid", "start_ms", "end_ms", "seconds", "detail"]
)


def _samples(gpu: str, utils: list[float], *, start: int = T0) -> pd.DataFrame:
    return pd.DataFrame(
        {"gpu": gpu, "ts_ms": [start + i * STEP for i in range(len(utils))], "util": utils}
    )


def _tenure(gpu: str, pod: str, *, gang: str, n: int) -> dict[str, object]:
    return {"gpu": gpu, "pod_uid": pod, "gang": gang, "start_ms": T0, "end_ms": T0 + n * STEP}


def test_a_rank_behind_its_gang_waits_for_the_busiest_card() -> None:
    samples = pd.concat([_samples("A", [90.0] * 10), _samples("B", [30.0] * 10)])
    tenures = pd.DataFrame([_tenure("A", "p0", gang="j", n=10), _tenure("B", "p1", gang="j", n=10)])
    seg = sample_segments(samples, tenures, NO_FINDINGS, thresholds=Thresholds())
    b = seg[seg["gpu"] == "B"]
    assert np.allclose(b["busy"], 0.3)
    assert np.allclose(b["straggler_wait"], 0.6)
    assert np.allclose(b["compute_idle"], 0.1)
    a = seg[seg["gpu"] == "A"]
    assert np.allclose(a["straggler_wait"], 0.0)
    assert np.allclose(a["compute_idle"], 0.1)
    assert np.allclose(seg[CATEGORY_NAMES].sum(axis=1), 1.0)


def test_an_idle_card_in_a_startup_finding_is_shaded_startup() -> None:
    samples = _samples("A", [0.0] * 4 + [80.0] * 6)
    tenures = pd.DataFrame([_tenure("A", "p0", gang="p0", n=10)])
    findings = pd.DataFrame(
        [
            {"kind": "startup", "gang": "p0", "gpu": "A", "pod_uid": "p0", "start_ms": T0,
             "end_ms": T0 + 4 * STEP, "seconds": 20.0, "detail": None}
        ]
    )  # fmt: skip
    seg = sample_segments(samples, tenures, findings, thresholds=Thresholds())
    assert seg["startup"].tolist() == [1.0] * 4 + [0.0] * 6
    assert np.allclose(seg["compute_idle"].iloc[4:], 0.2)


def test_buckets_add_up_to_held_time_with_gaps_unobserved() -> None:
    # 20 samples cover 100 s of a 200 s tenure (the last one period): the rest is unobserved.
    samples = _samples("A", [50.0] * 20)
    tenures = pd.DataFrame([_tenure("A", "p0", gang="p0", n=40)])
    seg = sample_segments(samples, tenures, NO_FINDINGS, thresholds=Thresholds())
    (card,) = bucketise(seg, tenures, span=(T0, T0 + 40 * STEP), buckets=8)
    total = sum(card.seconds.values())
    assert np.allclose(total, 25.0)  # each bucket: 200 s / 8, all of it held
    assert card.seconds["unobserved"].sum() == pytest.approx(100.0)  # the last covers 5 s
    assert card.util[0] == pytest.approx(50.0)
    assert np.isnan(card.util[-1])
    assert card.dominant()[-1] == "unobserved"


PODS = pd.DataFrame(
    {
        "uid": ["u1", "u2", "u3", "u4"],
        "namespace": ["nlp", "nlp", "vision", "vision"],
        "name": ["train-master-0", "train-worker-0", "train-master-0", "web-1"],
        "job": ["PyTorchJob/train", "PyTorchJob/train", "PyTorchJob/train", "Deployment/web"],
    }
)


@pytest.mark.parametrize(
    ("target", "label", "uids"),
    [
        ("nlp/PyTorchJob/train", "nlp/PyTorchJob/train", ["u1", "u2"]),
        ("Deployment/web", "vision/Deployment/web", ["u4"]),
        ("nlp/train-worker-0", "nlp/train-worker-0", ["u2"]),
        ("web-1", "vision/web-1", ["u4"]),
    ],
)
def test_targets_name_a_job_or_a_pod(target: str, label: str, uids: list[str]) -> None:
    assert resolve_target(PODS, target) == (label, uids)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("PyTorchJob/train", "ambiguous: nlp/PyTorchJob/train, vision/PyTorchJob/train"),
        ("train-master-0", "ambiguous: nlp/train-master-0, vision/train-master-0"),
        ("nope", "no job or pod 'nope'"),
        ("a/b/c/d", "no job or pod"),
    ],
)
def test_ambiguous_and_unknown_targets_are_one_line_errors(target: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as e:
        resolve_target(PODS, target)
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("small")
    jobs.demo(work, scenario="small", log=lambda _: None)
    return f"sqlite:///{work / 'auditor.db'}"


def test_explain_names_the_slow_rank_and_the_next_steps(small_db: str, tmp_path: Path) -> None:
    page = tmp_path / "vit.html"
    out = CliRunner().invoke(
        app, ["--db", small_db, "explain", "vision/PyTorchJob/vit-h-pretrain", "--html", str(page)]
    )
    assert out.exit_code == 0, out.output
    text = out.output
    assert text.startswith("vision/PyTorchJob/vit-h-pretrain: ")
    assert "rank 0" in text
    assert "rank 1" in text
    assert "legend: █ busy" in text
    assert "startup" in text
    assert "Findings" in text
    assert "slowest card: vit-h-pretrain-worker-0 (rank 1)" in text
    assert "throttled: sw_thermal_slowdown" in text
    assert "Next steps:" in text
    assert "straggler_wait: the slow rank is" in text
    html = page.read_text(encoding="utf-8")
    assert "<title>GPU timeline of vision/PyTorchJob/vit-h-pretrain</title>" in html
    assert "straggler wait" in html
    assert "<svg" in html
    assert "http" not in html  # nothing fetched from the network


def test_explain_of_a_pod_shows_its_cards_only(small_db: str) -> None:
    ex = jobs.explain(small_db, "vit-h-pretrain-worker-0", thresholds=Thresholds())
    assert ex.target == "vision/vit-h-pretrain-worker-0"
    assert {c.pod for c in ex.cards} == {"vit-h-pretrain-worker-0"}


@pytest.mark.parametrize(
    "target",
    ["vision/PyTorchJob/vit-h-pretrain", "research/PyTorchJob/moe-ablation", "Notebook/alice-dev"],
)
def test_the_shading_matches_the_classifier_per_category(small_db: str, target: str) -> None:
    """Over a whole job, the time shaded per category is the classifier's, within a minute."""
    ex = jobs.explain(small_db, target, thresholds=Thresholds())
    assert ex.cards
    for card in ex.cards:
        for category, seconds in card.timeline.seconds.items():
            assert float(seconds.sum()) == pytest.approx(
                card.totals.get(category, 0.0), abs=60.0
            ), category


@pytest.mark.parametrize(
    ("target", "message"),
    [("no-such-pod", "no job or pod 'no-such-pod'"), ("PyTorchJob", "no job or pod")],
)
def test_unknown_target_exits_2_with_one_line(small_db: str, target: str, message: str) -> None:
    out = CliRunner().invoke(app, ["--db", small_db, "explain", target])
    assert out.exit_code == 2
    assert out.output.count("\n") == 1
    assert message in out.output
