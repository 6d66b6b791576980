"""Live idle streaks on the sampler's /metrics (SPEC §9), over the fake NVML library.

What an alert relies on: a held idle card's `auditor_gpu_idle_streak_seconds` grows pass by
pass, drops to 0 the pass the card is active, survives a sampler restart (resumed from the
stored samples) and disappears when the pod releases the card.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from fake_nvml.build import fake_nvml_library, render_script, write_script
from fake_podresources import FakeContainer, FakePodResources
from prometheus_client import CollectorRegistry
from test_sampler import GPU_A, GPU_B, T0, Clock, add_pods, kubelet, pod, script, store

from auditor.agents.sample.buffer import DiskBuffer
from auditor.agents.sample.metrics import SamplerMetrics, serve
from auditor.agents.sample.nvml import NvmlReader
from auditor.agents.sample.podresources import PodResourcesClient
from auditor.agents.sample.sampler import Sampler, SamplerSettings
from auditor.agents.sample.streaks import IdleStreaks
from auditor.jobs import open_store
from auditor.jobs.services import restored_streaks
from auditor.store.sample_sink import StoreSink

__all__ = ["fake_nvml_library", "kubelet", "script", "store"]

STREAK = re.compile(r"^auditor_gpu_idle_streak_seconds\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


class Node:
    """A sampler with idle streaks over the fake library and kubelet, on a manual clock,
    serving /metrics over HTTP."""

    def __init__(self, url: str, *, tmp: Path, socket: Path, clock: Clock) -> None:
        self.clock = clock
        self.reader = NvmlReader(node="node-a", clock=clock)
        self.reader.open()
        self.metrics = SamplerMetrics(CollectorRegistry(), clock=clock)
        streaks = IdleStreaks(
            self.metrics.registry,
            node="node-a",
            idle_threshold_pct=5.0,
            restored=restored_streaks(url, node="node-a", idle_threshold_pct=5.0),
        )
        self.sampler = Sampler(
            reader=self.reader,
            holders=PodResourcesClient(socket, timeout_s=1),
            sink=StoreSink(lambda: open_store(url)),
            buffer=DiskBuffer(tmp / "buffer.db", max_batches=100),
            metrics=self.metrics,
            settings=SamplerSettings(holding_ttl_s=600),
            clock=clock,
            streaks=streaks,
        )
        self.server = serve(self.metrics, address="127.0.0.1", port=0, max_age_s=60)

    def passes(self, n: int) -> None:
        for _ in range(n):
            self.sampler.sample_once()
            self.clock.t += 5

    def streaks(self) -> dict[tuple[str, str], float]:
        """(gpu, pod) -> seconds, read from /metrics as Prometheus scrapes it."""
        url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            m = STREAK.match(line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
                assert (labels["node"], labels["namespace"]) == ("node-a", "ml")
                out[(labels["gpu"], labels["pod"])] = float(m.group("value"))
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.reader.close()


def set_utils(script: Path, a: float, b: float) -> None:
    write_script(script, render_script([{**GPU_A, "util": a}, {**GPU_B, "util": b}]))


def test_streak_grows_resets_survives_a_restart_and_goes_with_the_card(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    add_pods(store, pod("train-0", "uid-1", bound_s=T0 - 100))
    clock = Clock(T0)
    set_utils(script, 0, 40)  # A idle, B busy
    node = Node(store, tmp=tmp_path / "one", socket=kubelet.socket, clock=clock)
    try:
        node.passes(1)
        first = node.streaks()
        # a sample stands for the time from its own stamp: idle since the first idle sample
        assert first[("GPU-bbbb", "train-0")] == 0
        node.passes(3)
        grown = node.streaks()
        assert grown[("GPU-aaaa", "train-0")] == first[("GPU-aaaa", "train-0")] + 15
        assert grown[("GPU-bbbb", "train-0")] == 0

        set_utils(script, 60, 40)  # A active: its streak resets
        node.passes(1)
        assert node.streaks()[("GPU-aaaa", "train-0")] == 0
        set_utils(script, 0, 3)  # idle again, both (3 % is at or below the 5 % threshold)
        node.passes(4)
        before = node.streaks()
        assert before[("GPU-aaaa", "train-0")] == before[("GPU-bbbb", "train-0")] > 0
        assert node.sampler.flush()
    finally:
        node.close()

    # the sampler restarts 30 s later: the streaks go on from the store, not from 0
    clock.t += 30
    again = Node(store, tmp=tmp_path / "two", socket=kubelet.socket, clock=clock)
    try:
        again.passes(1)
        resumed = again.streaks()
        for card in ("GPU-aaaa", "GPU-bbbb"):
            assert resumed[(card, "train-0")] == before[(card, "train-0")] + 30 + 5

        # the pod releases card A: its series disappears; B's goes on
        kubelet.containers = [FakeContainer("ml", "train-0", "c", "nvidia.com/gpu", ["GPU-bbbb"])]
        again.passes(1)
        left = again.streaks()
        assert set(left) == {("GPU-bbbb", "train-0")}
        assert left[("GPU-bbbb", "train-0")] == resumed[("GPU-bbbb", "train-0")] + 5

        # a new pod on card A starts its own streak, from its own first idle sample
        kubelet.containers = [
            FakeContainer("ml", "train-0", "c", "nvidia.com/gpu", ["GPU-bbbb"]),
            FakeContainer("ml", "eval-0", "c", "nvidia.com/gpu", ["GPU-aaaa"]),
        ]
        again.passes(1)
        now = again.streaks()
        assert now[("GPU-aaaa", "eval-0")] < left[("GPU-bbbb", "train-0")]
    finally:
        again.close()


def test_a_failing_kubelet_keeps_the_streaks(
    store: str, script: Path, kubelet: FakePodResources, tmp_path: Path
) -> None:
    clock = Clock(T0)
    set_utils(script, 0, 0)
    node = Node(store, tmp=tmp_path, socket=kubelet.socket, clock=clock)
    try:
        node.passes(2)
        before = node.streaks()
        kubelet.stop()  # the mapping fails this pass: no holder is known, none is forgotten
        node.passes(1)
        assert set(node.streaks()) == set(before)
        assert node.metrics.registry.get_sample_value("auditor_sampler_pod_resources_errors_total")
    finally:
        node.close()


def test_an_unreachable_store_at_start_means_fresh_streaks(tmp_path: Path) -> None:
    assert (
        restored_streaks("postgresql://nobody@127.0.0.1:1/none", node="n", idle_threshold_pct=5)
        == {}
    )
