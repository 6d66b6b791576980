"""SPEC §10's signals out of a real Prometheus: `import prometheus` fills pod_signals
(source cadvisor) and card_signals, `import outputs --url` fills pod_signals (source
serving).

The series are backfilled from real scrapes (tests/fixtures/signals, SOURCE.md): cAdvisor's
own exposition of a throttled, pressured container, a Kubernetes node's cgroup v2 cpu.stat
of a throttled container and of its pod, dcgm-exporter's PCIe gauges of a card a pod held,
its NVLink gauges of an A100, Triton's /metrics. A scrape holds each counter's value once:
here each counter grows linearly from 0 (the container's start, `RAMP_FROM`) to that real
value at the window's end, so every `rate()` is the real value / `RAMP_S` and every ratio
of two counters is the ratio of the real values. Gauges keep their real value throughout.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from promserver import PromServer, backfill_text, binaries, start_prometheus
from records import bare_pod
from sqlalchemy import select

from auditor import jobs
from auditor.jobs.common import open_store
from auditor.model import PodRecord
from auditor.store import migrate
from auditor.store.connection import make_engine
from auditor.store.pod_writes import upsert_pods
from auditor.store.schema import card_signals, gpus, pod_signals

FIXTURES = Path(__file__).parents[1] / "fixtures" / "signals"
T0 = 1_795_248_000  # a multiple of 300 s
STEP = 15
WINDOW = (T0 * 1000, (T0 + 600) * 1000)
RAMP_FROM = T0 - 120
RAMP_TO = T0 + 600
RAMP_S = RAMP_TO - RAMP_FROM
GRID = range(T0, T0 + 600, STEP)
REUSE_AT = T0 + 300
"""loader-0 is replaced by a pod of the same name (a StatefulSet's next pod) here."""
NAN_AT = T0 + 195
"""trainer-0's network counter reads NaN at this scrape."""
BAD_PCIE_AT = T0 + 150

_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)\{(.*)\} (\S+)")


def fixture_series(name: str) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of each sample line of a fixture."""
    out = []
    for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
        m = _LINE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def cgroup_stat(name: str) -> dict[str, float]:
    lines = (FIXTURES / name).read_text(encoding="utf-8").split("\n")
    return {k: float(v) for k, v in (ln.split() for ln in lines if ln.strip())}


CADVISOR = fixture_series("cadvisor-prometheus_metrics.txt")
REAL = {m: sum(v for mm, _, v in CADVISOR if mm == m) for m in {m for m, _, _ in CADVISOR}}
"""The golden file's value of each series (CPU usage summed over its four per-CPU rows)."""
CONTAINER = cgroup_stat("cgroupv2-cpu.stat")
POD_CGROUP = cgroup_stat("cgroupv2-pod-cpu.stat")
PCIE = {m: v for m, _, v in fixture_series("dcgm-exporter-rtx4000-pcie.txt")}
PCIE_LABELS = fixture_series("dcgm-exporter-rtx4000-pcie.txt")[0][1]
NVLINK = fixture_series("dcgm-exporter-a100-nvlink-tx.txt")
TRITON = fixture_series("triton-trtllm-metrics.txt")


def fmt(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


class Text:
    def __init__(self) -> None:
        self.families: dict[str, list[str]] = {}

    def add(self, metric: str, labels: dict[str, str], value: float | str, t: int) -> None:
        self.families.setdefault(metric, []).append(f"{metric}{{{fmt(labels)}}} {value} {t}")

    def counter(self, metric: str, labels: dict[str, str], final: float) -> None:
        """A counter from 0 at RAMP_FROM to `final` at RAMP_TO, scraped every STEP."""
        for t in range(RAMP_FROM, RAMP_TO + 1, STEP):
            self.add(metric, labels, f"{final * (t - RAMP_FROM) / RAMP_S:.17g}", t)

    def gauge(self, metric: str, labels: dict[str, str], value: float) -> None:
        for t in range(RAMP_FROM, RAMP_TO + 1, STEP):
            self.add(metric, labels, f"{value:.17g}", t)

    def text(self) -> str:
        out = []
        for metric, lines in self.families.items():
            out.append(f"# TYPE {metric} gauge")
            out.extend(lines)
        return "\n".join([*out, "# EOF"]) + "\n"


def kubelet(labels: dict[str, str], namespace: str, pod: str, container: str) -> dict[str, str]:
    """cAdvisor's labels as the kubelet serves them: with namespace, pod and container."""
    kept = {k: v for k, v in labels.items() if not k.startswith("container_")}
    return {**kept, "container": container, "namespace": namespace, "pod": pod}


def series_text() -> str:
    s = Text()
    # trainer-0: cAdvisor's golden container, CPU-limited (quota 10000 / period 100000)
    for metric, labels, _ in CADVISOR:
        lab = kubelet(labels, "ml", "trainer-0", "trainer")
        if metric in {"container_spec_cpu_quota", "container_spec_cpu_period"}:
            s.gauge(metric, lab, REAL[metric])
        elif metric == "container_cpu_usage_seconds_total":
            s.counter(metric, lab, next(v for m, lb, v in CADVISOR if lb == labels and m == metric))
        elif metric.startswith("container_network_"):
            pod_level = kubelet(labels, "ml", "trainer-0", "")  # the pod's network namespace
            s.counter(metric, pod_level, REAL[metric])
            s.counter(metric, {**pod_level, "interface": "lo"}, 1e9)  # loopback: not counted
        else:
            s.counter(metric, lab, REAL[metric])
    rx = s.families["container_network_receive_bytes_total"]
    nan_line = next(i for i, ln in enumerate(rx) if ln.endswith(f" {NAN_AT}") and "eth0" in ln)
    rx[nan_line] = re.sub(r" \S+ (\d+)$", r" NaN \1", rx[nan_line])
    # loader-0: a Kubernetes node's throttled container; its pod's own cgroup (container="")
    # and a sandbox row ("POD") carry the pod's totals, which must not be added to it
    stats = {"container_cpu_usage_seconds_total": "usage_usec",
             "container_cpu_cfs_periods_total": "nr_periods",
             "container_cpu_cfs_throttled_periods_total": "nr_throttled"}  # fmt: skip
    for metric, key in stats.items():
        scale = 1e-6 if key == "usage_usec" else 1.0
        base = {"id": "/kubepods.slice/kubepods-pod2fdafb62.slice", "image": ""}
        s.counter(metric, kubelet(base, "ml", "loader-0", "loader"), CONTAINER[key] * scale)
        s.counter(metric, kubelet(base, "ml", "loader-0", ""), POD_CGROUP[key] * scale)
        s.counter(metric, kubelet(base, "ml", "loader-0", "POD"), POD_CGROUP[key] * scale)
    # late-0: stored, but bound half-way through: its earlier series match no pod
    s.counter("container_cpu_cfs_periods_total", kubelet({}, "ml", "late-0", "c"), 1000)
    s.counter("container_cpu_cfs_throttled_periods_total", kubelet({}, "ml", "late-0", "c"), 10)
    # bad-0: throttled periods twice its periods: a counter pair no kernel writes
    s.counter("container_cpu_cfs_periods_total", kubelet({}, "ml", "bad-0", "c"), 1000)
    s.counter("container_cpu_cfs_throttled_periods_total", kubelet({}, "ml", "bad-0", "c"), 2000)
    # unknown-0: not in the store; its series are not even asked for
    s.counter("container_cpu_cfs_periods_total", kubelet({}, "ml", "unknown-0", "c"), 1000)
    # dcgm-exporter: the RTX card's PCIe (real gauges), an A100's NVLink
    rtx = {k: v for k, v in PCIE_LABELS.items() if k != "pod_uid"}
    for t in range(RAMP_FROM, RAMP_TO + 1, STEP):
        s.add("DCGM_FI_DEV_GPU_UTIL", rtx, 3, t)
        for metric, value in PCIE.items():
            bad = metric == "DCGM_FI_PROF_PCIE_TX_BYTES" and t == BAD_PCIE_AT
            s.add(metric, rtx, "5e12" if bad else f"{value:.17g}", t)
        for metric, labels, value in NVLINK[:2]:
            s.add("DCGM_FI_DEV_GPU_UTIL", labels, 0, t)
            s.add(metric, labels, f"{value:g}", t)
        # gpu 0 also reads RX (the "always returns 0"); gpu 1 has TX only
        s.add("DCGM_FI_PROF_NVLINK_RX_BYTES", NVLINK[0][1], 0, t)
    # serving: vLLM, TGI, Triton pods (Triton's labels and names from its /metrics)
    for t in range(RAMP_FROM, RAMP_TO + 1, STEP):
        vllm = {"engine": "0", "model_name": "m", "namespace": "serve", "pod": "vllm-0"}
        s.add("vllm:num_requests_running", vllm, 3 if t < T0 + 300 else 0, t)
        s.add("vllm:num_requests_waiting", vllm, 1 if t < T0 + 300 else 0, t)
        tgi = {"namespace": "serve", "pod": "tgi-0"}
        s.add("tgi_batch_current_size", tgi, 4, t)
        s.add("tgi_queue_size", tgi, 2, t)
        ghost = {"namespace": "serve", "pod": "ghost"}
        s.add("tgi_queue_size", ghost, 1, t)
        for metric, labels, value in TRITON:
            lab = {**labels, "namespace": "serve", "pod": "triton-0"}
            if metric == "nv_inference_pending_request_count":
                s.add(metric, lab, f"{value:g}", t)
            elif metric == "nv_inference_compute_infer_duration_us":
                # from the scrape's 0, two requests in execution at every instant
                s.add(metric, lab, f"{value + 2e6 * (t - RAMP_FROM):g}", t)
    return s.text()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    found = binaries()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"{found}: required under CI", pytrace=False)
        pytest.skip(found)
    root = tmp_path_factory.mktemp("prom-signals")
    backfill_text(series_text(), root / "tsdb")
    server = start_prometheus(root / "tsdb", root)
    yield server
    server.stop()


def pod(
    namespace: str, name: str, uid: str, *, bound: int, finished: int | None = None
) -> PodRecord:
    rec = bare_pod(
        name, uid, bound_ms=bound * 1000, finished_ms=None if finished is None else finished * 1000
    )
    return replace(rec, namespace=namespace, team=namespace)


@pytest.fixture
def store(db_url: str) -> str:
    migrate.upgrade(make_engine(db_url))
    with open_store(db_url).begin() as conn:
        upsert_pods(
            conn,
            [
                pod("ml", "trainer-0", "uid-trainer", bound=T0 - 3600),
                pod("ml", "loader-0", "uid-loader-old", bound=T0 - 7200, finished=REUSE_AT),
                pod("ml", "loader-0", "uid-loader-new", bound=REUSE_AT),
                pod("ml", "late-0", "uid-late", bound=T0 + 450),
                pod("ml", "bad-0", "uid-bad", bound=T0 - 60),
                pod("serve", "vllm-0", "uid-vllm", bound=T0 - 60),
                pod("serve", "tgi-0", "uid-tgi", bound=T0 - 60),
                pod("serve", "triton-0", "uid-triton", bound=T0 - 60),
            ],
        )
    return db_url


def rows(url: str, source: str) -> dict[tuple[str, int], dict[str, float | None]]:
    with open_store(url).connect() as conn:
        found = conn.execute(select(pod_signals).where(pod_signals.c.source == source)).all()
    return {(r.pod_uid, r.ts_ms // 1000): dict(r._mapping) for r in found}


def cards(url: str) -> dict[tuple[str, int], tuple[float | None, float | None]]:
    with open_store(url).connect() as conn:
        stmt = select(gpus.c.uuid, card_signals).join(gpus, gpus.c.id == card_signals.c.gpu_id)
        found = conn.execute(stmt).all()
    return {(r.uuid, r.ts_ms // 1000): (r.pcie_bytes_s, r.nvlink_bytes_s) for r in found}


def test_cadvisor_and_dcgm_signals_are_stored_per_pod_and_card(
    prometheus: PromServer, store: str
) -> None:
    stats = jobs.import_prometheus(store, prometheus_url=prometheus.url, window=WINDOW, step_s=STEP)
    got = rows(store, "cadvisor")

    # trainer-0, from cAdvisor's golden container: every ratio is its real values' ratio
    trainer = got[("uid-trainer", T0 + 60)]
    assert trainer["throttled_ratio"] == pytest.approx(
        REAL["container_cpu_cfs_throttled_periods_total"] / REAL["container_cpu_cfs_periods_total"]
    )  # 18 / 723
    cores = REAL["container_spec_cpu_quota"] / REAL["container_spec_cpu_period"]  # 0.1 core
    usage = REAL["container_cpu_usage_seconds_total"] / RAMP_S
    assert trainer["cpu_limit_ratio"] == pytest.approx(usage / cores, rel=1e-6)
    assert trainer["cpu_pressure"] == pytest.approx(
        REAL["container_pressure_cpu_waiting_seconds_total"] / RAMP_S, rel=1e-6
    )
    assert trainer["io_pressure"] == pytest.approx(
        REAL["container_pressure_io_waiting_seconds_total"] / RAMP_S, rel=1e-6
    )
    net = (
        REAL["container_network_receive_bytes_total"]
        + REAL["container_network_transmit_bytes_total"]
    )
    assert trainer["net_bytes_s"] == pytest.approx(net / RAMP_S, rel=1e-6)  # lo left out
    # the NaN scrape spoils rate() where it is the first or last sample of the one-minute
    # window (between, rate() reads the ends only): those points are skipped and counted,
    # the pod's other signals at them kept, its network elsewhere kept
    spoiled = [NAN_AT, NAN_AT + 60]
    assert [t for t in GRID if got[("uid-trainer", t)]["net_bytes_s"] is None] == spoiled
    assert all(got[("uid-trainer", t)]["throttled_ratio"] is not None for t in spoiled)
    assert stats.signals_bad["container_network_receive_bytes_total"] == len(spoiled)

    # loader-0: the container's own ratio (496/1197), not with its pod's rows added (0.53);
    # no CPU quota series: no limit ratio; the name's two pods each get their own time
    loader = {t: r for (uid, t), r in got.items() if uid.startswith("uid-loader")}
    for (uid, t), r in got.items():
        if uid.startswith("uid-loader"):
            assert r["throttled_ratio"] == pytest.approx(
                CONTAINER["nr_throttled"] / CONTAINER["nr_periods"]
            )
            assert r["cpu_limit_ratio"] is None
            assert uid == ("uid-loader-old" if t < REUSE_AT else "uid-loader-new")
    assert sorted(loader) == list(GRID)

    # late-0 bound at T0+450: its series before then (but a step's slack) match no pod
    late = sorted(t for uid, t in got if uid == "uid-late")
    assert late == [t for t in GRID if t >= T0 + 450 - STEP]
    assert stats.signals_unmatched == len([t for t in GRID if t < T0 + 450 - STEP])
    # bad-0's throttled/periods of 2 is refused at every point; unknown-0 was not asked for
    assert not any(uid == "uid-bad" and r["throttled_ratio"] for (uid, _), r in got.items())
    assert stats.signals_bad["throttled_ratio"] == len(GRID)
    assert stats.pod_signals == len(got)

    # cards: PCIe rx+tx of the real gauges; the bad point skipped; NVLink where both read
    traffic = cards(store)
    rtx = PCIE_LABELS["UUID"]
    pcie = PCIE["DCGM_FI_PROF_PCIE_RX_BYTES"] + PCIE["DCGM_FI_PROF_PCIE_TX_BYTES"]
    assert traffic[(rtx, T0)] == (pcie, None)
    assert (rtx, BAD_PCIE_AT) not in traffic
    assert stats.signals_bad["DCGM_FI_PROF_PCIE_TX_BYTES"] == 1
    a100_0, a100_1 = NVLINK[0][1]["UUID"], NVLINK[1][1]["UUID"]
    assert traffic[(a100_0, T0)] == (None, 0.0)  # both directions read 0: a reading
    assert not any(uuid == a100_1 for uuid, _ in traffic)  # TX alone: no guess
    assert stats.card_signals == len(traffic)

    # a second import over the same window stores the same rows, no more
    again = jobs.import_prometheus(store, prometheus_url=prometheus.url, window=WINDOW, step_s=STEP)
    assert rows(store, "cadvisor") == got
    assert cards(store) == traffic
    assert again.pod_signals == stats.pod_signals


def test_serving_queues_are_stored_per_pod(prometheus: PromServer, store: str) -> None:
    stats = jobs.import_outputs_prometheus(
        store, prometheus_url=prometheus.url, window=WINDOW, step_s=STEP, latency=""
    )
    got = rows(store, "serving")
    assert got[("uid-vllm", T0 + 15)]["requests_running"] == 3
    assert got[("uid-vllm", T0 + 15)]["requests_waiting"] == 1
    assert got[("uid-vllm", T0 + 315)]["requests_running"] == 0  # a serving pod, no demand
    assert got[("uid-vllm", T0 + 315)]["requests_waiting"] == 0
    assert (got[("uid-tgi", T0)]["requests_running"], got[("uid-tgi", T0)]["requests_waiting"]) == (
        4,
        2,
    )
    triton = got[("uid-triton", T0 + 60)]
    assert triton["requests_waiting"] == 0  # the real pending gauge
    assert triton["requests_running"] == pytest.approx(2.0)  # compute time per second
    assert stats.queue_unresolved == len(GRID)  # serve/ghost is not in the database
    assert stats.queue_rows == len(got) == 3 * len(GRID)
    again = jobs.import_outputs_prometheus(
        store, prometheus_url=prometheus.url, window=WINDOW, step_s=STEP, latency=""
    )
    assert rows(store, "serving") == got
    assert again.queue_rows == stats.queue_rows
