"""`auditor explain`: target names, per-card timelines that conserve time, and what a user reads.

The timeline rules are checked on hand-made gangs; the command on the simulator's `small`
cluster, whose first PyTorchJob has a thermally throttled slow rank by construction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_classify_properties import TH, clusters, windows
from typer.testing import CliRunner

from auditor import jobs
from auditor.classify import classify
from auditor.cli import app
from auditor.errors import InputError
from auditor.model import Window
from auditor.report.explain import Explanation, text_strip
from auditor.report.targets import resolve_target
from auditor.report.timeline import CardTimeline, bucketise
from auditor.settings import Thresholds

T0 = 1_700_000_000_000
STEP = 5_000
EXACT = 1e-6
"""Seconds: the timelines and the classifier agree to the microsecond (the float rounding
of summing buckets is all that may differ)."""


def _samples(gpu: str, utils: list[float], *, start: int = T0) -> pd.DataFrame:
    return pd.DataFrame(
        {"gpu": gpu, "ts_ms": [start + i * STEP for i in range(len(utils))], "util": utils}
    )


def _tenure(gpu: str, pod: str, *, gang: str, n: int) -> dict[str, object]:
    return {"gpu": gpu, "pod_uid": pod, "gang": gang, "start_ms": T0, "end_ms": T0 + n * STEP}


def _drawn(timelines: list[CardTimeline]) -> dict[tuple[str, str, str], float]:
    """Seconds per (gpu, pod, category) summed over the buckets of each card's timeline."""
    return {
        (t.gpu, t.pod_uid, c): float(v.sum())
        for t in timelines
        for c, v in t.seconds.items()
        if v.sum() != 0
    }


def _per_card(results: pd.DataFrame) -> dict[tuple[str, str, str], float]:
    """The classifier's results of held cards as (gpu, pod, category) -> seconds."""
    held = results[results["pod_uid"].notna()]
    sums = held.groupby(["gpu", "pod_uid", "category"])["seconds"].sum()
    return {(str(g), str(p), str(c)): float(v) for (g, p, c), v in sums.items()}


def _timelines(
    samples: pd.DataFrame, tenures: list[dict[str, object]], *, n: int, buckets: int
) -> dict[str, CardTimeline]:
    """The classifier's pieces of `[T0, T0 + n steps)`, drawn per card as explain draws them;
    their seconds are the classifier's results."""
    span = (T0, T0 + n * STEP)
    found = classify(
        samples, pd.DataFrame(tenures), window=Window(*span), thresholds=Thresholds(),
        keep_pieces=True,
    )  # fmt: skip
    assert found.pieces is not None
    timelines = bucketise(found.pieces, span=span, buckets=buckets)
    assert _drawn(timelines) == pytest.approx(_per_card(found.results), abs=EXACT)
    return {t.gpu: t for t in timelines}


def test_a_rank_behind_its_gang_waits_for_the_busiest_card() -> None:
    samples = pd.concat([_samples("A", [90.0] * 10), _samples("B", [30.0] * 10)])
    tenures = [_tenure("A", "p0", gang="j", n=10), _tenure("B", "p1", gang="j", n=10)]
    cards = _timelines(samples, tenures, n=10, buckets=10)
    b = cards["B"].seconds
    assert np.allclose(b["busy"], 1.5)  # each bucket is one 5 s sample
    assert np.allclose(b["straggler_wait"], 3.0)
    assert np.allclose(b["compute_idle"], 0.5)
    a = cards["A"].seconds
    assert np.allclose(a["straggler_wait"], 0.0)
    assert np.allclose(a["compute_idle"], 0.5)
    assert np.allclose(cards["B"].util, 30.0)
    assert cards["B"].dominant() == ["straggler_wait"] * 10


def test_an_idle_start_is_shaded_startup_where_the_classifier_puts_it() -> None:
    samples = _samples("A", [0.0] * 4 + [80.0] * 6)
    cards = _timelines(samples, [_tenure("A", "p0", gang="p0", n=10)], n=10, buckets=10)
    card = cards["A"]
    assert card.seconds["startup"].tolist() == [5.0] * 4 + [0.0] * 6
    assert np.allclose(card.seconds["compute_idle"][4:], 1.0)
    # 80 % busy after the start: one character in five of those is compute idle
    assert text_strip(card, 10) == "SSSS██i███"


def test_the_text_strip_draws_each_category_in_proportion_to_its_time() -> None:
    samples = _samples("A", [77.0] * 100)
    cards = _timelines(samples, [_tenure("A", "p0", gang="p0", n=100)], n=100, buckets=100)
    strip = text_strip(cards["A"], 50)
    assert len(strip) == 50
    # the first sample's slot is startup-free (active), the card 23 % compute idle throughout
    assert strip.count("i") == pytest.approx(0.23 * 50, abs=1)
    assert strip.count("█") == pytest.approx(0.77 * 50, abs=1)


def test_buckets_add_up_to_held_time_with_gaps_unobserved() -> None:
    # Samples cover [0, 50 s) and [150 s, 200 s) of a 200 s tenure; the 100 s between are
    # more than 3 periods without a sample: unobserved.
    samples = pd.concat(
        [_samples("A", [50.0] * 10), _samples("A", [50.0] * 10, start=T0 + 150_000)]
    )
    cards = _timelines(samples, [_tenure("A", "p0", gang="p0", n=40)], n=40, buckets=8)
    card = cards["A"]
    total = sum(card.seconds.values())
    assert np.allclose(total, 25.0)  # each bucket: 200 s / 8, all of it held
    assert card.seconds["unobserved"].sum() == pytest.approx(100.0)
    assert card.util[0] == pytest.approx(50.0)
    assert np.isnan(card.util[3])  # [75 s, 100 s): nothing observed
    assert card.dominant()[3] == "unobserved"
    assert text_strip(card, 8) == "█i????█i"  # half busy, half compute idle, then the gap


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_pieces_and_timelines_add_up_to_the_results(data: st.DataObject) -> None:
    """On random clusters (the classifier's property-test inputs), the pieces of a window
    sum to its results per card, pod and category, and so do the drawn timelines."""
    cluster = data.draw(clusters())
    a, _, b = data.draw(windows(cluster))
    buckets = data.draw(st.integers(1, 50))

    found = classify(
        cluster.samples, cluster.tenures, window=Window(a, b), thresholds=TH,
        markers=cluster.markers, keep_pieces=True,
    )  # fmt: skip

    pieces = found.pieces
    assert pieces is not None
    assert ((pieces["start_ms"] >= a) & (pieces["end_ms"] <= b)).all()
    assert (pieces["start_ms"] < pieces["end_ms"]).all()
    assert (pieces["seconds"] > 0).all()
    assert (pieces["seconds"] <= (pieces["end_ms"] - pieces["start_ms"]) / 1000 + EXACT).all()
    every = found.results.fillna({"pod_uid": "-"})
    from_pieces = pieces.fillna({"pod_uid": "-"}).groupby(["gpu", "pod_uid", "category"])
    assert from_pieces["seconds"].sum().to_dict() == pytest.approx(
        every.set_index(["gpu", "pod_uid", "category"])["seconds"].to_dict(), abs=EXACT
    )
    drawn = _drawn(bucketise(pieces, span=(a, b), buckets=buckets))
    assert drawn == pytest.approx(_per_card(found.results), abs=EXACT)


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


def _assert_shading_is_the_classification(ex: Explanation) -> None:
    assert ex.cards
    for card in ex.cards:
        assert card.totals
        for category, seconds in card.timeline.seconds.items():
            assert float(seconds.sum()) == pytest.approx(
                card.totals.get(category, 0.0), abs=EXACT
            ), (
                card.timeline.gpu,
                category,
            )
        assert set(card.totals) <= set(card.timeline.seconds)


@pytest.mark.parametrize(
    "target",
    ["vision/PyTorchJob/vit-h-pretrain", "research/PyTorchJob/moe-ablation", "Notebook/alice-dev"],
)
def test_the_shading_matches_the_classifier_per_category(small_db: str, target: str) -> None:
    """Over a whole job, the time shaded per category per card is the classifier's."""
    _assert_shading_is_the_classification(jobs.explain(small_db, target, thresholds=Thresholds()))


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("demo")
    jobs.demo(work, scenario="demo", log=lambda _: None)
    return f"sqlite:///{work / 'auditor.db'}"


@pytest.mark.parametrize(
    "target",
    [
        "vision/PyTorchJob/vit-h-pretrain",  # straggler, checkpoints, startup, teardown
        "nlp/PyTorchJob/llm-pretrain-7b",  # checkpoints over 12 hours of 16 cards
        "Notebook/alice-dev",  # reserved idle
        "Deployment/ranker",  # serving: compute idle, unobserved
    ],
)
def test_the_shading_matches_the_classifier_on_the_demo_cluster(demo_db: str, target: str) -> None:
    _assert_shading_is_the_classification(jobs.explain(demo_db, target, thresholds=Thresholds()))


@pytest.mark.parametrize(
    ("target", "message"),
    [("no-such-pod", "no job or pod 'no-such-pod'"), ("PyTorchJob", "no job or pod")],
)
def test_unknown_target_exits_2_with_one_line(small_db: str, target: str, message: str) -> None:
    out = CliRunner().invoke(app, ["--db", small_db, "explain", target])
    assert out.exit_code == 2
    assert out.output.count("\n") == 1
    assert message in out.output
