"""`auditor compare A B`: the verdict rule and the confounders as decision tables, and the
command end to end on the simulator's A/B story (SQLite)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from auditor import jobs
from auditor.cli import app
from auditor.report.compare import Side, compare_sides, confounders, failed_conditions
from auditor.settings import Config, Thresholds
from auditor.simulate.ab import NODE, simulate_ab
from auditor.store import migrate
from auditor.store.connection import make_engine

HOUR = 3_600_000


def figures(**over: Any) -> dict[str, Any]:
    """One side of a comparison: 10 GPUs for 10 h, 1 M tokens, p50 1 s, p95 2 s, loss 2.0."""
    base: dict[str, Any] = {
        "allocated_gpu_hours": 100.0,
        "busy_gpu_hours": 60.0,
        "unobserved_gpu_hours": 0.0,
        "outputs": 1_000_000.0,
        "output_unit": "tokens",
        "latency_p50_s": 1.0,
        "latency_p95_s": 2.0,
        "quality": 2.0,
        "quality_better": "lower",
        "gpu_models": ["NVIDIA H100 80GB HBM3"],
        "gpus_held_avg": 10.0,
        "world_size": 10,
        "unobserved_share": 0.0,
        "estimated_share": 0.0,
    }
    base.update(over)
    hours = 10.0
    out = base["outputs"]
    alloc = base["allocated_gpu_hours"]
    base.setdefault("outputs_per_hour", out / hours if out is not None else None)
    base["gpu_hours_per_1k_outputs"] = 1000 * alloc / out if out else None
    base["throughput_per_gpu_hour"] = out / alloc if out is not None and alloc else None
    return base


BEFORE = figures()
BETTER = {"allocated_gpu_hours": 80.0, "gpus_held_avg": 8.0 + 2.4}
"""The same traffic on fewer GPU-hours (the average GPU count still rounds to 10)."""


@pytest.mark.parametrize(
    ("after", "failed"),
    [
        pytest.param(BETTER, [], id="all-hold"),
        pytest.param(
            {**BETTER, "allocated_gpu_hours": 100.0}, ["gpu_hours_per_output"], id="same-gpu-hours"
        ),
        pytest.param(
            {**BETTER, "outputs": 900_000.0, "allocated_gpu_hours": 70.0},
            ["throughput"],
            id="cheaper-per-output-but-10pct-less-served",
        ),
        pytest.param({**BETTER, "outputs": 970_000.0}, [], id="3pct-less-served-within-tolerance"),
        pytest.param({**BETTER, "latency_p95_s": 2.2}, ["latency"], id="p95-10pct-worse"),
        pytest.param({**BETTER, "latency_p50_s": 1.06}, ["latency"], id="p50-6pct-worse"),
        pytest.param({**BETTER, "latency_p95_s": 2.09}, [], id="p95-within-tolerance"),
        pytest.param({**BETTER, "quality": 2.2}, ["quality"], id="loss-10pct-worse"),
        pytest.param({**BETTER, "quality": 2.09}, [], id="loss-within-tolerance"),
        pytest.param(
            {**BETTER, "outputs": 1_300_000.0, "allocated_gpu_hours": 140.0},
            ["gpu_hours_per_output"],
            id="more-outputs-but-dearer-per-output",
        ),
        pytest.param(
            {**BETTER, "latency_p95_s": 2.5, "quality": 2.5, "allocated_gpu_hours": 120.0},
            ["latency", "quality", "gpu_hours_per_output"],
            id="three-fail-all-named",
        ),
        pytest.param(
            {"allocated_gpu_hours": 50.0, "outputs": 500_000.0},
            ["throughput", "gpu_hours_per_output"],
            id="fewer-gpu-hours-by-serving-less",
        ),
        pytest.param(
            {"allocated_gpu_hours": 50.0, "outputs": 600_000.0},
            ["throughput"],
            id="cheaper-per-output-but-serving-40pct-less",
        ),
        pytest.param(
            {**BETTER, "outputs": None}, ["throughput", "gpu_hours_per_output"], id="no-outputs"
        ),
    ],
)
def test_verdict(after: dict[str, Any], failed: list[str]) -> None:
    assert failed_conditions(BEFORE, figures(**after), tol=0.05) == failed


@pytest.mark.parametrize("better", ["lower", "higher"])
def test_quality_direction(better: str) -> None:
    a = figures(quality=0.80, quality_better=better)
    b = figures(**BETTER, quality=0.70, quality_better=better)

    failed = failed_conditions(a, b, tol=0.05)

    assert failed == ([] if better == "lower" else ["quality"])


def test_latency_is_not_judged_where_a_side_has_none() -> None:
    assert (
        failed_conditions(
            BEFORE, figures(**BETTER, latency_p50_s=None, latency_p95_s=None), tol=0.05
        )
        == []
    )


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        pytest.param({}, [], id="none"),
        pytest.param(
            {"gpu_models": ["NVIDIA A100-SXM4-80GB"]}, ["different GPU models"], id="gpu-model"
        ),
        pytest.param({"gpus_held_avg": 16.0}, ["different GPU count"], id="gpu-count"),
        pytest.param({"world_size": 8}, ["different world size"], id="world-size"),
        pytest.param({"outputs": 1_250_000.0}, ["traffic differs by +25 %"], id="traffic-up"),
        pytest.param({"outputs": 780_000.0}, ["traffic differs by -22 %"], id="traffic-down"),
        pytest.param({"outputs": 1_150_000.0}, [], id="traffic-within-20pct"),
        pytest.param({"output_unit": "requests"}, ["different output units"], id="unit"),
        pytest.param(
            {"unobserved_share": 0.08}, ["8 % unobserved time on side B"], id="unobserved"
        ),
        pytest.param(
            {"estimated_share": 0.30}, ["30 % estimated-attribution time on side B"], id="estimated"
        ),
    ],
)
def test_confounders(after: dict[str, Any], expected: list[str]) -> None:
    found = confounders(BEFORE, figures(**after))

    assert len(found) == len(expected)
    for text, start in zip(found, expected, strict=True):
        assert text.startswith(start), text


def test_training_samples_per_hour_is_not_traffic() -> None:
    a = figures(output_unit="samples")
    b = figures(output_unit="samples", outputs=2_000_000.0)

    assert confounders(a, b) == []


def test_a_comparison_names_its_verdict() -> None:
    a = Side("a", (0, 10 * HOUR), BEFORE)
    b = Side("b", (0, 10 * HOUR), figures(**BETTER, latency_p95_s=3.0))

    result = compare_sides(a, b)

    assert (result.verdict, result.failed) == ("does not hold", ["latency"])


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    root = tmp_path_factory.mktemp("ab")
    url = f"sqlite:///{root / 'auditor.db'}"
    migrate.upgrade(make_engine(url))
    ab = simulate_ab(root / "sim")
    jobs.import_nvidia_smi(url, ab.node_csv, node=NODE)
    jobs.import_pods(url, ab.pods_json, config=Config())
    for window in ab.windows.values():
        jobs.audit(url, window=window, thresholds=Thresholds())
    jobs.import_outputs_csv(url, ab.serving_csv)
    jobs.import_outputs_csv(url, ab.training_csv)
    jobs.store_latency_rows(url, ab.latency_rows)
    return url, ab


def run_compare(url: str, *args: str) -> Any:
    return CliRunner().invoke(app, ["--db", url, "compare", *args])


def test_json_of_the_serving_change(story: tuple[str, Any]) -> None:
    url, ab = story

    result = run_compare(
        url, ab.selector("serving", "A"), ab.selector("serving", "B"), "--format", "json"
    )

    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert set(body) == {"a", "b", "confounders", "verdict", "failed"}
    for side in (body["a"], body["b"]):
        for field in (
            "allocated_gpu_hours",
            "busy_gpu_hours",
            "compute_idle_gpu_hours",
            "unallocated_gpu_hours",
            "outputs",
            "output_unit",
            "gpu_hours_per_1k_outputs",
            "throughput_per_gpu_hour",
            "latency_p50_s",
            "latency_p95_s",
            "quality",
        ):
            assert field in side
    assert body["a"]["allocated_gpu_hours"] == pytest.approx(4.0)
    assert body["b"]["allocated_gpu_hours"] == pytest.approx(2.0)
    assert body["b"]["outputs"] == pytest.approx(body["a"]["outputs"], rel=0.01)
    assert body["b"]["latency_p95_s"] > body["a"]["latency_p95_s"] * 1.05
    assert body["verdict"] == "does not hold"
    assert body["failed"] == ["latency"]
    assert [c.split(":")[0] for c in body["confounders"]] == ["different GPU count"]


def test_table_and_html_of_the_training_change(story: tuple[str, Any], tmp_path: Path) -> None:
    url, ab = story
    a, b = ab.selector("training", "A"), ab.selector("training", "B")

    table = run_compare(url, a, b)
    page = run_compare(url, a, b, "--format", "html", "--out", str(tmp_path / "ab.html"))

    assert table.exit_code == 0, table.output
    assert "Verdict: the change holds." in table.output
    assert "(outputs in samples)" in table.output
    assert page.exit_code == 0, page.output
    html = (tmp_path / "ab.html").read_text(encoding="utf-8")
    assert "The change holds" in html
    assert "<table>" in html


@pytest.mark.parametrize(
    ("side", "message"),
    [
        ("job=abtest/chat@2026-11-22T08:00..2026-11-22T10:00", "not namespace/Kind/name"),
        ("team=nlp", "SELECTOR@START..END"),
        ("team=nlp@2026-11-22T10:00..2026-11-22T08:00", "ends before it starts"),
        ("team=nobody@2026-11-22T08:00..2026-11-22T10:00", "no pods match"),
        ("team=nlp@2026-11-20T08:00..2026-11-20T10:00", "not fully audited"),
    ],
)
def test_bad_sides_are_one_line_errors(story: tuple[str, Any], side: str, message: str) -> None:
    url, ab = story

    result = run_compare(url, side, ab.selector("serving", "B"))

    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_demo_tells_the_ab_story_and_keeps_its_own_window_latest(tmp_path: Path) -> None:
    from auditor.simulate import SCENARIOS

    text = jobs.demo(tmp_path, log=lambda _: None)

    story = text[text.index("A/B: did the change make the work cheaper?") :]
    serving, training = story.split("Training abtest/resnet")
    assert "Verdict: the change does not hold (failed: latency)." in serving
    assert "different GPU count" in serving
    assert "Verdict: the change holds." in training
    assert "Confounders: none found" in training
    start = SCENARIOS["demo"].start_ms
    report = jobs.build_report(
        f"sqlite:///{tmp_path / 'auditor.db'}", start_ms=None, end_ms=None, by=by("team"), team=None
    )
    assert report.window[0] == start


def by(name: str) -> Any:
    from auditor.report.summary import GroupBy

    return GroupBy(name)
