"""The idle-streak alert (manifests/components/idle-streaks), unit-tested with `promtool test
rules` (Debian's `prometheus` package) on hand-made series of the sampler's gauge.

What an on-call person relies on: a card held idle past 2 h alerts (after 5 min pending), with
the pod and card named; a card that is active again before 2 h, or that the pod releases,
does not (or stops).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

RULE = Path(__file__).resolve().parents[1] / "manifests/components/idle-streaks/prometheusrule.yaml"

SERIES = 'auditor_gpu_idle_streak_seconds{{node="n1",gpu="{gpu}",namespace="ml",pod="{pod}"}}'

TESTS = f"""
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 5m
    input_series:
      # idle from the start, 5 min a step: above 2 h from 2 h 05
      - series: '{SERIES.format(gpu="GPU-a", pod="nb-0")}'
        values: '0+300x40'
      # active again at 1 h 40, idle after: never 2 h in a row within the test
      - series: '{SERIES.format(gpu="GPU-b", pod="train-0")}'
        values: '0+300x20 0+300x20'
      # idle, then the pod releases the card at 2 h 30: the series ends
      - series: '{SERIES.format(gpu="GPU-c", pod="nb-1")}'
        values: '0+300x30'
    alert_rule_test:
      - eval_time: 2h05m
        alertname: GpuHeldIdle
        exp_alerts: []
      - eval_time: 2h10m
        alertname: GpuHeldIdle
        exp_alerts:
          - exp_labels: {{severity: warning, node: n1, gpu: GPU-a, namespace: ml, pod: nb-0}}
            exp_annotations:
              summary: GPU held idle by ml/nb-0
              description: >-
                Pod ml/nb-0 has held GPU GPU-a on node n1 idle (utilisation at or below the
                idle threshold) for 2h 10m 0s. Release the GPU, or check the job; `auditor
                explain ml/nb-0` shows its timeline.
          - exp_labels: {{severity: warning, node: n1, gpu: GPU-c, namespace: ml, pod: nb-1}}
            exp_annotations:
              summary: GPU held idle by ml/nb-1
              description: >-
                Pod ml/nb-1 has held GPU GPU-c on node n1 idle (utilisation at or below the
                idle threshold) for 2h 10m 0s. Release the GPU, or check the job; `auditor
                explain ml/nb-1` shows its timeline.
      - eval_time: 3h10m
        alertname: GpuHeldIdle
        exp_alerts:
          - exp_labels: {{severity: warning, node: n1, gpu: GPU-a, namespace: ml, pod: nb-0}}
            exp_annotations:
              summary: GPU held idle by ml/nb-0
              description: >-
                Pod ml/nb-0 has held GPU GPU-a on node n1 idle (utilisation at or below the
                idle threshold) for 3h 10m 0s. Release the GPU, or check the job; `auditor
                explain ml/nb-0` shows its timeline.
"""


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def test_the_alert_fires_on_a_card_held_idle_and_resolves_when_released(
    promtool: str, tmp_path: Path
) -> None:
    rule = yaml.safe_load(RULE.read_text())
    assert rule["kind"] == "PrometheusRule"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    (tmp_path / "test.yaml").write_text(TESTS)
    check = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
