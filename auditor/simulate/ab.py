"""A small A/B story with outputs (SPEC §8): one node, two changes, each before and after.

- **Serving**: the vLLM Deployment `abtest/chat` serves the same traffic before (A: batch 8,
  two replicas) and after (B: batch 32, one replica) raising its batch size. Each replica
  exports vLLM-style counters (`vllm:generation_tokens_total`, `vllm:request_success_total`)
  and the latency histogram `vllm:e2e_request_latency_seconds` every 15 s, written as
  OpenMetrics text for a Prometheus backfill (`serving.om.txt`). One replica of A restarts
  half-way: its counters reset to 0. The same counters' increases per 5 minutes are written
  as an outputs CSV (`serving_outputs.csv`) and the histogram's as bucket rows
  (`latency_rows`), for a demo without Prometheus.
- **Training**: the Job `abtest/Job/resnet` (4 GPUs) before (A: 2 DataLoader workers, the
  cards wait on input) and after (B: 8 workers) writes a step CSV of samples per 10 minutes
  with its eval loss (`training_outputs.csv`).

Files: `nodes/ab-h100-01.csv` (nvidia-smi), `pods.json`, the outputs above. Deterministic in
the seed; no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from auditor.model import Selection, Window
from auditor.simulate.plan import Ending, Namer, Owner, PodPlan
from auditor.simulate.writers import NVIDIA_SMI_HEADER, PodContext, pod_object, write_pod_list

NODE = "ab-h100-01"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
MEMORY_MIB = 81559
PERIOD_MS = 10_000
SCRAPE_MS = 15_000
INTERVAL_MS = 300_000
WINDOW_MS = 2 * 3_600_000
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, math.inf)
TOKENS_PER_REQUEST = 200.0


def _utc_ms(year: int, month: int, day: int, hour: int) -> int:
    return int(datetime(year, month, day, hour, tzinfo=UTC).timestamp()) * 1000


START_MS = _utc_ms(2026, 11, 22, 8)
"""Window A starts here; B starts three hours later (the change rolled out in between)."""


@dataclass(frozen=True)
class Variant:
    """One side of a change."""

    replicas: int
    capacity_tokens_s: float
    """Tokens per second one replica serves at 100 % utilisation."""
    latency_median_s: float
    latency_sigma: float
    workers: int
    train_util: float
    """Mean utilisation of the training cards while computing."""
    eval_loss: float


VARIANTS = {
    "A": Variant(2, 1600.0, 1.2, 0.45, 2, 52.0, 1.912),
    "B": Variant(1, 2600.0, 1.55, 0.45, 8, 88.0, 1.905),
}
SAMPLES_PER_BUSY_GPU_S = 40.0


@dataclass
class AbResult:
    """What `simulate_ab` wrote, and the selections of its two comparisons."""

    out_dir: Path
    node_csv: Path
    pods_json: Path
    serving_openmetrics: Path
    serving_csv: Path
    training_csv: Path
    windows: dict[str, Window]
    latency_rows: list[dict[str, object]] = field(default_factory=list)
    """(namespace, pod, metric, start_ms, end_ms, le, count): the histogram's increases."""

    @staticmethod
    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def selection(self, what: str, side: str) -> Selection:
        """The job of `what` ("serving" or "training") over the window of `side`."""
        job = "abtest/Deployment/chat" if what == "serving" else "abtest/Job/resnet"
        return Selection.of("job", job, self.windows[side])

    def selector(self, what: str, side: str) -> str:
        """The same as `compare` reads it from the command line."""
        return self.selection(what, side).text


def _norm_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _latency_cdf(le: float, *, median: float, sigma: float) -> float:
    if math.isinf(le):
        return 1.0
    return _norm_cdf((math.log(le) - math.log(median)) / sigma)


def _traffic(t_ms: np.ndarray) -> np.ndarray:
    """Requests per second at each instant: the same on both sides (a smooth daily curve)."""
    hours = (t_ms - START_MS) / 3_600_000
    return 6.0 + 1.5 * np.sin(hours / 3 * 2 * np.pi)  # a 3-hour cycle: A and B see the same


def simulate_ab(out_dir: Path, *, seed: int = 16) -> AbResult:
    rng = np.random.default_rng(seed)
    namer = Namer(np.random.default_rng(seed + 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "nodes").mkdir(exist_ok=True)
    uuids = [namer.gpu_uuid() for _ in range(8)]
    windows = {"A": Window(START_MS, START_MS + WINDOW_MS)}
    windows["B"] = Window(START_MS + 3 * 3_600_000, START_MS + 3 * 3_600_000 + WINDOW_MS)
    # sampled time: from 10 min before A to 10 min after B
    t0, t1 = START_MS - 600_000, windows["B"][1] + 600_000
    ticks = np.arange(t0, t1, PERIOD_MS, dtype=np.int64)
    util = np.zeros((8, ticks.size))
    pods: list[dict[str, Any]] = []
    om_lines: list[str] = []
    serving_rows: list[str] = ["pod,start,end,outputs,unit"]
    training_rows: list[str] = ["job,start,end,outputs,unit,quality,quality_better"]
    latency_rows: list[dict[str, object]] = []
    version = 9_000_000
    for side, (w0, w1) in windows.items():
        v = VARIANTS[side]
        bound, released = w0 - 300_000, w1 + 60_000
        active = (ticks >= w0 - 120_000) & (ticks < w1)
        # serving: the traffic split over the replicas
        template_hash = namer.suffix(10)
        rs = f"chat-{template_hash}"
        owner = Owner("apps/v1", "ReplicaSet", rs, namer.uid())
        for r in range(v.replicas):
            pod = PodPlan(
                name=f"{rs}-{namer.suffix()}",
                namespace="abtest",
                team="nlp",
                gpus=1,
                owner=owner,
                labels={
                    "app": "chat",
                    "pod-template-hash": template_hash,
                    "team": "nlp",
                    "variant": side,
                },
                image="docker.io/vllm/vllm-openai:v0.6.3",
                container="vllm",
            )
            rate = _traffic(ticks) / v.replicas * TOKENS_PER_REQUEST
            u = np.clip(rate / v.capacity_tokens_s * 100 + rng.normal(0, 2.0, ticks.size), 0, 100)
            util[4 + r] = np.where(active, np.round(u), util[4 + r])
            version += 7
            pods.append(
                _pod(
                    pod,
                    namer,
                    uid=namer.uid(),
                    gpus=(4 + r,),
                    times=(bound, released),
                    ending=Ending.DELETE,
                    version=version,
                )
            )
            reset_at = (w0 + w1) // 2 if side == "A" and r == 1 else None
            om_lines += _vllm_series(
                pod.name, v, replicas=v.replicas, window=Window(w0, w1), reset_at=reset_at
            )
            serving_rows += _serving_csv(pod.name, v, replicas=v.replicas, window=Window(w0, w1))
            latency_rows += _latency_rows(pod.name, v, replicas=v.replicas, window=Window(w0, w1))
        # training: one pod of 4 GPUs
        job_owner = Owner("batch/v1", "Job", "resnet", namer.uid())
        pod = PodPlan(
            name=f"resnet-{namer.suffix()}",
            namespace="abtest",
            team="vision",
            gpus=4,
            owner=job_owner,
            labels={"job-name": "resnet", "team": "vision", "variant": side},
            image="nvcr.io/nvidia/pytorch:24.10-py3",
        )
        # input stalls hold up every rank at once
        stall = rng.random(ticks.size) < (0.45 if v.workers < 4 else 0.04)
        for c in range(4):
            u = np.clip(v.train_util + rng.normal(0, 4.0, ticks.size), 0, 100)
            u = np.where(stall, rng.uniform(0, 4, ticks.size), u)
            util[c] = np.where(active, np.round(u), util[c])
        version += 7
        pods.append(
            _pod(
                pod,
                namer,
                uid=namer.uid(),
                gpus=(0, 1, 2, 3),
                times=(bound - 60_000, released),  # first: first-fit puts it on cards 0-3
                ending=Ending.COMPLETE,
                version=version,
            )
        )
        busy = util[0:4] / 100.0 * (PERIOD_MS / 1000)
        for a in range(w0, w1, 600_000):
            inside = (ticks >= a) & (ticks < a + 600_000)
            samples = float(busy[:, inside].sum()) * SAMPLES_PER_BUSY_GPU_S
            loss = v.eval_loss + 0.02 * (w1 - a) / WINDOW_MS
            training_rows.append(
                f"abtest/Job/resnet,{AbResult.iso(a)},{AbResult.iso(a + 600_000)},"
                f"{samples:.0f},samples,{loss:.4f},lower"
            )
    node_csv = out_dir / "nodes" / f"{NODE}.csv"
    node_csv.write_text(_nvidia_smi(ticks, util, uuids), encoding="utf-8")
    pods_json = out_dir / "pods.json"
    write_pod_list(pods_json, pods)
    om = out_dir / "serving.om.txt"
    om.write_text(_openmetrics(om_lines), encoding="utf-8")
    serving_csv = out_dir / "serving_outputs.csv"
    serving_csv.write_text("\n".join(serving_rows) + "\n", encoding="utf-8")
    training_csv = out_dir / "training_outputs.csv"
    training_csv.write_text("\n".join(training_rows) + "\n", encoding="utf-8")
    return AbResult(
        out_dir, node_csv, pods_json, om, serving_csv, training_csv, windows, latency_rows
    )


def _pod(
    pod: PodPlan,
    namer: Namer,
    *,
    uid: str,
    gpus: tuple[int, ...],
    times: tuple[int, int],
    ending: Ending,
    version: int,
) -> dict[str, Any]:
    bound, released = times
    pod.uid, pod.node, pod.gpu_indices = uid, 0, gpus
    pod.created_ms, pod.bound_ms, pod.started_ms = bound - 3000, bound, bound + 60_000
    pod.ending = ending
    if ending is Ending.DELETE:
        pod.deleted_ms = released
        pod.finished_ms = released + 10_000
        pod.main_finished_ms = released + 10_000
    else:
        pod.main_finished_ms = pod.finished_ms = released
    ctx = PodContext(
        node_name=NODE,
        host_ip="10.30.0.10",
        pod_ip=f"10.90.0.{len(gpus) + version % 200}",
        resource_version=version,
        now_ms=released + 3_600_000 * 6,
    )
    return pod_object(pod, ctx, namer)


def _requests(v: Variant, *, replicas: int, a: int, b: int) -> float:
    """Requests one replica served in [a, b): the traffic integrated at 1 s."""
    t = np.arange(a, b, 1000, dtype=np.int64)
    return float(_traffic(t).sum()) / replicas


def _vllm_series(
    pod: str, v: Variant, *, replicas: int, window: Window, reset_at: int | None
) -> list[str]:
    """Counter samples every 15 s over the window (and 5 min either side, idle there)."""
    labels = f'namespace="abtest",pod="{pod}",model_name="llama-3-8b"'
    out: list[str] = []
    req = 0.0
    prev = window[0] - 300_000
    for t in range(window[0] - 300_000, window[1] + 300_000, SCRAPE_MS):
        if reset_at is not None and prev < reset_at <= t:
            req = 0.0  # the server restarted: every counter starts again from 0
        if window[0] <= t <= window[1]:
            req += _requests(v, replicas=replicas, a=max(prev, window[0]), b=min(t, window[1]))
        prev = t
        ts = t / 1000
        out.append(f"vllm:request_success_total{{{labels}}} {req:.3f} {ts:.3f}")
        out.append(
            f"vllm:generation_tokens_total{{{labels}}} {req * TOKENS_PER_REQUEST:.3f} {ts:.3f}"
        )
        for le in LATENCY_BUCKETS:
            share = _latency_cdf(le, median=v.latency_median_s, sigma=v.latency_sigma)
            bound = "+Inf" if math.isinf(le) else f"{le:g}"
            out.append(
                f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="{bound}"}}'
                f" {req * share:.3f} {ts:.3f}"
            )
    return out


def _openmetrics(lines: list[str]) -> str:
    """The series grouped per metric name, each under a `# TYPE` line (gauges: promtool
    backfills counters and buckets alike; PromQL reads them by name)."""
    text: list[str] = []
    for name in (
        "vllm:request_success_total",
        "vllm:generation_tokens_total",
        "vllm:e2e_request_latency_seconds_bucket",
    ):
        text.append(f"# TYPE {name} gauge")
        text += [line for line in lines if line.startswith(name + "{")]
    text.append("# EOF")
    return "\n".join(text) + "\n"


def _serving_csv(pod: str, v: Variant, *, replicas: int, window: Window) -> list[str]:
    rows = []
    for a in range(window[0], window[1], INTERVAL_MS):
        tokens = _requests(v, replicas=replicas, a=a, b=a + INTERVAL_MS) * TOKENS_PER_REQUEST
        rows.append(
            f"abtest/{pod},{AbResult.iso(a)},{AbResult.iso(a + INTERVAL_MS)},{tokens:.0f},tokens"
        )
    return rows


def _latency_rows(
    pod: str, v: Variant, *, replicas: int, window: Window
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for a in range(window[0], window[1], INTERVAL_MS):
        n = _requests(v, replicas=replicas, a=a, b=a + INTERVAL_MS)
        for le in LATENCY_BUCKETS:
            share = _latency_cdf(le, median=v.latency_median_s, sigma=v.latency_sigma)
            rows.append(
                {
                    "namespace": "abtest",
                    "pod": pod,
                    "metric": "vllm:e2e_request_latency_seconds",
                    "start_ms": a,
                    "end_ms": a + INTERVAL_MS,
                    "le": le,
                    "count": n * share,
                }
            )
    return rows


def _nvidia_smi(ticks: np.ndarray, util: np.ndarray, uuids: list[str]) -> str:
    lines = [NVIDIA_SMI_HEADER]
    for k, t in enumerate(ticks.tolist()):
        stamp = datetime.fromtimestamp(t / 1000, UTC).strftime("%Y/%m/%d %H:%M:%S.000")
        for g, uuid in enumerate(uuids):
            u = int(util[g, k])
            mem = 60000 if u > 0 else 0
            power = 90 + 6 * u
            lines.append(
                f"{stamp}, {g}, {uuid}, {GPU_MODEL}, {u} %, {mem} MiB, {MEMORY_MIB} MiB,"
                f" {power:.2f} W, 1980 MHz, {40 + u // 4}, 0x0000000000000000"
            )
    return "\n".join(lines) + "\n"
