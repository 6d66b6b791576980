"""Why held cards idle (SPEC §10), simulated: each GPU pod's cause story, the infrastructure
signals that tell it, and the ground truth of the causes inside `compute_idle`.

Every GPU pod gets a story from its workload: a training pod is input-bound (its CPU at its
limit, CFS-throttled, or waiting on I/O) in episodes, or moves data over PCIe, or, in a
multi-card gang, talks over NVLink and the network, or shows nothing (`unexplained`), or runs
where cAdvisor sees no cgroup of it at all (no rows); a serving pod has requests running and
waiting by the day's traffic (`batching`), none at night now and then (`low_demand`), and the
embedding server runs out of CPU at its peak (`input_bound`). On top come the signals every
job shows outside its compute: weights loaded over PCIe during startup, checkpoints written
(I/O pressure, PCIe), artifacts uploaded during teardown (network). They hold while the card
is in `startup`, `checkpoint` or `teardown` and so never decide anything there, but a scrape
taken during them is still the latest reading for a while after: the truth keeps that.

Signals are *scraped*: cAdvisor (per node, through the kubelet) and dcgm-exporter (per node)
every `SCRAPE_MS`, each node at its own offset, and each vLLM server on its own. A row stands
for the time from its scrape to the next one, for at most `STALE_MS` (one node's kubelet is
not scraped for a while: its pods' rows stop). Each row's values follow the plan's flags with
clear margins around SPEC §10's default thresholds, so a flag is exactly whether its rule
holds.

The truth the auditor's causes are checked against is computed from these readings by
`simulate.cause_truth`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from auditor.simulate.plan import GangPlan, Label, PodPlan, Profile
from auditor.simulate.utilisation import Grid
from auditor.simulate.writers import Series

SCRAPE_MS = 30_000
"""Scrape interval of cAdvisor, dcgm-exporter and the vLLM servers."""
STALE_MS = 180_000
"""A reading stands for the time after its scrape for at most this long (the auditor's
`signal_stale_s` default)."""
LEAD_MS = 10 * 60_000
"""Scrapes start this long before the samplers' data."""

CPU_LIMIT = 8.0
"""The main container's CPU limit (`limits.cpu: "8"` in the pod JSON)."""
CFS_PERIOD_US = 100_000
CFS_QUOTA_US = int(CPU_LIMIT * CFS_PERIOD_US)

IDLE_CAUSES = (
    "input_bound",
    "host_transfer",
    "communication",
    "batching",
    "low_demand",
    "unexplained",
)
"""SPEC §10's causes of `compute_idle`, in the order the rules are tried."""
FREE_CAUSES = ("unavailable", "blocked", "no_demand")

TRAINING_STORIES = ("input_cpu", "input_throttled", "input_io", "host_transfer", "quiet")
GANG_STORIES = ("communication", "input_cpu", "host_transfer", "quiet")


@dataclass(frozen=True, slots=True)
class Spans:
    """A union of half-open intervals [start, end) in epoch ms, sorted and disjoint."""

    start: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, int]]) -> Spans:
        kept = sorted((int(a), int(b)) for a, b in pairs if b > a)
        merged: list[list[int]] = []
        for a, b in kept:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        arr = np.array(merged, dtype=np.int64).reshape(-1, 2)
        return cls(arr[:, 0], arr[:, 1])

    def at(self, t: np.ndarray) -> np.ndarray:
        """Whether each time lies inside the union."""
        i = np.searchsorted(self.start, t, side="right") - 1
        ok = i >= 0
        out = np.zeros(t.shape, dtype=bool)
        out[ok] = t[ok] < self.end[i[ok]]
        return out

    def __or__(self, other: Spans) -> Spans:
        pairs = list(zip(self.start.tolist(), self.end.tolist(), strict=True))
        pairs += list(zip(other.start.tolist(), other.end.tolist(), strict=True))
        return Spans.of(pairs)


NONE = Spans.of([])


def episodes(rng: np.random.Generator, a: int, b: int, *, share: float, mean_on_s: float) -> Spans:
    """Alternating on/off stretches over [a, b): on about `share` of the time, in stretches
    of `mean_on_s` on average (exponential lengths)."""
    if share <= 0 or b <= a:
        return NONE
    if share >= 1:
        return Spans.of([(a, b)])
    mean_off_s = mean_on_s * (1 - share) / share
    pairs = []
    t = a
    on = bool(rng.random() < share)
    while t < b:
        length = int(rng.exponential(mean_on_s if on else mean_off_s) * 1000) + 1000
        if on:
            pairs.append((t, min(b, t + length)))
        t += length
        on = not on
    return Spans.of(pairs)


@dataclass(slots=True)
class PodFlags:
    """What one pod's signals say, as stretches of time: the plan behind its readings."""

    cpu_limit: Spans = NONE
    throttled: Spans = NONE
    cpu_pressure: Spans = NONE
    io_pressure: Spans = NONE
    pcie: Spans = NONE
    nvlink: Spans = NONE
    network: Spans = NONE
    cpu_busy: Spans = NONE
    """CPU well used but under the thresholds (loading, startup): realism, no rule."""


@dataclass(frozen=True, slots=True)
class PodStory:
    pod: int
    story: str
    cadvisor: bool
    """cAdvisor sees the pod's cgroups (else it has no CPU or network rows at all)."""
    serving: bool
    multi_card: bool
    flags: PodFlags


@dataclass(frozen=True)
class Signals:
    """The scraped readings, as the store takes them, and the plan's flags beside them."""

    pod_rows: pd.DataFrame
    """pod_uid, source (cadvisor | serving), ts_ms, the seven pod signals (NaN where the
    source gives none), and the flags: input (an input-bound rule holds), network (≥ the
    communication threshold), queued (requests running or waiting)."""
    card_rows: pd.DataFrame
    """gpu_uuid, ts_ms, pcie_bytes_s, pcie_link_bytes_s (NaN: dcgm-exporter's series do
    not give the link), nvlink_bytes_s, and the flags pcie and nvlink."""
    families: dict[str, list[Series]]
    """The same readings as the exporters' series (counters and gauges), for OpenMetrics."""
    counters: frozenset[str]
    """Which families are counters."""
    stories: list[PodStory]
    scrape_gap: tuple[str, int, int] | None
    """(node, start, end): the node's kubelet was not scraped."""


def _phase_spans(pod: PodPlan, gang: GangPlan, label: np.ndarray, grid: Grid) -> PodFlags:
    """Signals every job shows outside its compute: loading at startup, checkpoints,
    uploading at teardown."""
    flags = PodFlags()
    if gang.profile is Profile.UNUSED or gang.active_start_ms is None:
        return flags
    start = Spans.of([(pod.started_ms, gang.active_start_ms)])
    flags.pcie = start
    flags.cpu_busy = start
    ck = (label == Label.CHECKPOINT).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ck, [0]])))
    ms = grid.data_start_ms + edges * grid.period_ms
    ckpt = Spans.of(list(zip(ms[0::2].tolist(), ms[1::2].tolist(), strict=True)))
    flags.io_pressure = ckpt
    flags.pcie = flags.pcie | ckpt
    if gang.active_end_ms is not None and pod.released_ms is not None:
        flags.network = Spans.of([(gang.active_end_ms, pod.released_ms)])
    return flags


def _story(
    j: int,
    pod: PodPlan,
    gang: GangPlan,
    *,
    label: np.ndarray,
    grid: Grid,
    end_ms: int,
    rng: np.random.Generator,
) -> PodStory:
    flags = _phase_spans(pod, gang, label, grid)
    multi = gang.gpus > 1
    a = gang.active_start_ms if gang.active_start_ms is not None else pod.bound_ms
    b = gang.active_end_ms if gang.active_end_ms is not None else end_ms
    profile = gang.profile
    cadvisor = True
    serving = profile is Profile.INFERENCE

    def ep(share: float, mean_on_s: float) -> Spans:
        return episodes(rng, a, b, share=share, mean_on_s=mean_on_s)

    if profile is Profile.INFERENCE:
        story = "serving"
        if pod.container == "image-embed":  # its CPU pre-processing runs out at the peak
            story = "serving_cpu"
            act = gang.activity
            t = np.arange(a - a % 60_000, b, 60_000, dtype=np.int64)
            hot = _traffic(act.floor, act.peak, act.peak_hour, t) > act.floor + 0.75 * (
                act.peak - act.floor
            )
            flags.cpu_limit = Spans.of([(int(x), int(x) + 60_000) for x in t[hot]])
    elif profile is Profile.NOTEBOOK:
        story = "notebook"
        flags.io_pressure = flags.io_pressure | ep(0.15, 600)
    elif profile is Profile.UNUSED:
        story = "cpu_only"  # the dedup job works on CPU only: its card never idles "compute"
        flags.cpu_limit = Spans.of([(pod.bound_ms, pod.released_ms or end_ms)])
        flags.throttled = flags.cpu_limit
    elif profile is Profile.DISTRIBUTED:
        story = "communication"
        flags.nvlink = ep(0.85, 1500)
        flags.network = flags.network | ep(0.6, 900)
        flags.cpu_limit = ep(0.12, 300)
    else:
        names = GANG_STORIES if multi else TRAINING_STORIES
        weights = [0.45, 0.25, 0.15, 0.15] if multi else [0.22, 0.12, 0.16, 0.25, 0.25]
        story = str(names[int(rng.choice(len(names), p=weights))])
        if story == "input_cpu":
            flags.cpu_limit = ep(0.7, 1200)
            flags.throttled = flags.cpu_limit
            flags.cpu_pressure = flags.cpu_limit | ep(0.1, 300)
            flags.network = flags.network | ep(0.3, 600)  # streams shards; no gang: no rule
        elif story == "input_throttled":
            flags.throttled = ep(0.6, 900)
        elif story == "input_io":
            flags.io_pressure = flags.io_pressure | ep(0.65, 1500)
        elif story == "host_transfer":
            flags.pcie = flags.pcie | ep(0.7, 1200)
            flags.cpu_limit = ep(0.15, 400)  # now and then the CPU is the limit first
            flags.throttled = flags.cpu_limit
        elif story == "communication":
            flags.nvlink = ep(0.8, 1800)
            flags.pcie = flags.pcie | ep(0.1, 300)  # staging copies: PCIe first in order
        if not multi and story == "quiet" and rng.random() < 0.5:
            story, cadvisor = "unrecorded", False  # a runtime whose cgroups cAdvisor misses
    return PodStory(j, story, cadvisor, serving, multi, flags)


def _scrapes(first: int, a: int, b: int) -> np.ndarray:
    """Scrape times of a target whose first scrape is at `first`, inside [a, b)."""
    k0 = max(0, -((first - a) // SCRAPE_MS))
    t = first + np.arange(k0, max(k0, (b - first) // SCRAPE_MS + 1), dtype=np.int64) * SCRAPE_MS
    return t[(t >= a) & (t < b)]


def _margin(rng: np.random.Generator, hot: np.ndarray, lo_hi: tuple[float, float],
            cold: tuple[float, float]) -> np.ndarray:  # fmt: skip
    """Values in `lo_hi` where `hot`, in `cold` elsewhere."""
    up = rng.uniform(*lo_hi, size=hot.size)
    down = rng.uniform(*cold, size=hot.size)
    return np.where(hot, up, down)


def _traffic(pod_act_floor: float, peak: float, peak_hour: float, t_ms: np.ndarray) -> np.ndarray:
    """The serving replica's utilisation curve (`utilisation.inference_block`), 0-100."""
    hours = (t_ms % 86_400_000) / 3_600_000.0
    phase = (1 + np.cos(2 * np.pi * (hours - peak_hour) / 24)) / 2
    curve: np.ndarray = pod_act_floor + (peak - pod_act_floor) * phase**1.6
    return curve


def plan_signals(
    *,
    pods: list[PodPlan],
    gang_of: list[GangPlan],
    label: np.ndarray,
    grid: Grid,
    gpus_per_node: int,
    nodes: list[str],
    uuids: list[str],
    gpu_model: str,
    end_ms: int,
    rng: np.random.Generator,
) -> Signals:
    """Each GPU pod's story and every scrape of cAdvisor, dcgm-exporter and vLLM."""
    g = gpus_per_node
    first = grid.data_start_ms - LEAD_MS
    cad_first = first + rng.integers(0, SCRAPE_MS, size=len(nodes))
    dcgm_first = first + rng.integers(0, SCRAPE_MS, size=len(nodes))
    gap_node = int(rng.integers(0, len(nodes)))
    gap_a = grid.data_start_ms + int(rng.uniform(0.3, 0.7) * (end_ms - grid.data_start_ms))
    gap_a -= gap_a % 1000
    gap = (gap_a, gap_a + 9 * 60_000)
    stories = []
    for j, (pod, gang) in enumerate(zip(pods, gang_of, strict=True)):
        row = pod.node * g + pod.gpu_indices[0]
        stories.append(_story(j, pod, gang, label=label[row], grid=grid, end_ms=end_ms, rng=rng))

    pod_frames: list[pd.DataFrame] = []
    fam: dict[str, list[Series]] = {name: [] for name in FAMILY_ORDER}
    for st in stories:
        pod = pods[st.pod]
        gang = gang_of[st.pod]
        until = end_ms if pod.released_ms is None else min(pod.released_ms, end_ms)
        if st.cadvisor:
            t = _scrapes(int(cad_first[pod.node]), max(pod.started_ms, first), until)
            if pod.node == gap_node:
                t = t[(t < gap[0]) | (t >= gap[1])]
            if t.size >= 2:
                pod_frames.append(_cadvisor(st, pod, t, fam, rng))
        if st.serving and gang.active_start_ms is not None:
            own_first = first + int(rng.integers(0, SCRAPE_MS))
            t = _scrapes(own_first, max(gang.active_start_ms - SCRAPE_MS, first), until)
            if t.size:
                pod_frames.append(_vllm(pod, gang, t, fam=fam, rng=rng))
    pod_rows = pd.concat(pod_frames, ignore_index=True)

    card_frames = []
    holders: list[list[int]] = [[] for _ in uuids]
    for st in stories:
        pod = pods[st.pod]
        for i in pod.gpu_indices:
            holders[pod.node * g + i].append(st.pod)
    for c, uuid in enumerate(uuids):
        node = c // g
        t = _scrapes(int(dcgm_first[node]), first, end_ms)
        card_frames.append(
            _dcgm(
                index=c % g,
                uuid=uuid,
                node=nodes[node],
                model=gpu_model,
                t=t,
                holders=holders[c],
                pods=pods,
                stories=stories,
                fam=fam,
                rng=rng,
            )
        )
    card_rows = pd.concat(card_frames, ignore_index=True)
    return Signals(
        pod_rows=pod_rows,
        card_rows=card_rows,
        families={k: _grouped(v) for k, v in fam.items() if v},
        counters=COUNTERS,
        stories=stories,
        scrape_gap=(nodes[gap_node], gap[0], gap[1]),
    )


def _grouped(series: list[Series]) -> list[Series]:
    """One series per label set, samples in time order: OpenMetrics wants each series'
    samples together (a free card's labels come back after each pod that held it)."""
    by: dict[tuple[tuple[str, str], ...], list[Series]] = {}
    for one in series:
        by.setdefault(tuple(one.labels.items()), []).append(one)
    out = []
    for parts in by.values():
        times = np.concatenate([p.times_s for p in parts])
        values = np.concatenate([p.values for p in parts])
        order = np.argsort(times, kind="stable")
        out.append(Series(parts[0].labels, times[order], values[order]))
    return out


FAMILY_ORDER = (
    "container_cpu_usage_seconds",
    "container_cpu_cfs_periods",
    "container_cpu_cfs_throttled_periods",
    "container_spec_cpu_quota",
    "container_spec_cpu_period",
    "container_pressure_cpu_waiting_seconds",
    "container_pressure_io_waiting_seconds",
    "container_network_receive_bytes",
    "container_network_transmit_bytes",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
COUNTERS = frozenset(
    {
        "container_cpu_usage_seconds",
        "container_cpu_cfs_periods",
        "container_cpu_cfs_throttled_periods",
        "container_pressure_cpu_waiting_seconds",
        "container_pressure_io_waiting_seconds",
        "container_network_receive_bytes",
        "container_network_transmit_bytes",
    }
)
"""OpenMetrics counters (samples named `<family>_total`); the rest are gauges."""


def _cadvisor(
    st: PodStory, pod: PodPlan, t: np.ndarray, fam: dict[str, list[Series]],
    rng: np.random.Generator,
) -> pd.DataFrame:  # fmt: skip
    """cAdvisor's counters at each scrape, and per scrape after the first the row the store
    takes: each ratio is the counter's increase since the previous scrape over the time."""
    f = st.flags
    at = t[1:]
    n = at.size
    limit = f.cpu_limit.at(at)
    throttled = f.throttled.at(at)
    cpu_p = f.cpu_pressure.at(at)
    io_p = f.io_pressure.at(at)
    net = f.network.at(at)
    busy = f.cpu_busy.at(at)
    usage = np.where(
        limit, rng.uniform(0.92, 0.995, n), np.where(busy, rng.uniform(0.55, 0.85, n),
                                                       rng.uniform(0.15, 0.7, n))
    )  # fmt: skip
    dt_s = np.diff(t) / 1000.0
    periods = np.rint(dt_s * 1e6 / CFS_PERIOD_US - rng.integers(0, 25, n)).astype(np.int64)
    thr_share = _margin(rng, throttled, (0.3, 0.7), (0.0, 0.15))
    thr = np.rint(thr_share * periods).astype(np.int64)
    cpu_psi = _margin(rng, cpu_p | limit, (0.22, 0.5), (0.0, 0.12))
    io_psi = _margin(rng, io_p, (0.25, 0.6), (0.0, 0.1))
    net_rate = _margin(rng, net, (1.3e9, 6e9), (1e6, 0.6e9))
    rx_share = rng.uniform(0.3, 0.7, n)
    rx = np.rint(net_rate * dt_s * rx_share).astype(np.int64)
    tx = np.rint(net_rate * dt_s * (1 - rx_share)).astype(np.int64)
    usage_inc = usage * CPU_LIMIT * dt_s
    cpu_w = cpu_psi * dt_s
    io_w = io_psi * dt_s

    def counter(start: float, inc: np.ndarray) -> np.ndarray:
        c: np.ndarray = np.concatenate([[start], start + np.cumsum(inc)])
        return c

    base = {"namespace": pod.namespace, "pod": pod.name}
    cont = {**base, "container": pod.container}
    secs = t / 1000.0
    u = counter(float(rng.uniform(5, 60)), usage_inc)
    per = counter(float(rng.integers(50, 600)), periods.astype(np.float64))
    th = counter(0.0, thr.astype(np.float64))
    cw = counter(float(rng.uniform(0, 3)), cpu_w)
    iw = counter(float(rng.uniform(0, 3)), io_w)
    nrx = counter(float(rng.integers(10**5, 10**8)), rx.astype(np.float64))
    ntx = counter(float(rng.integers(10**5, 10**8)), tx.astype(np.float64))
    for name, values, labels in (
        ("container_cpu_usage_seconds", u, {**cont, "cpu": "total"}),
        ("container_cpu_cfs_periods", per, cont),
        ("container_cpu_cfs_throttled_periods", th, cont),
        ("container_spec_cpu_quota", np.full(t.size, float(CFS_QUOTA_US)), cont),
        ("container_spec_cpu_period", np.full(t.size, float(CFS_PERIOD_US)), cont),
        ("container_pressure_cpu_waiting_seconds", cw, cont),
        ("container_pressure_io_waiting_seconds", iw, cont),
        ("container_network_receive_bytes", nrx, {**base, "interface": "eth0"}),
        ("container_network_transmit_bytes", ntx, {**base, "interface": "eth0"}),
    ):
        fam[name].append(Series(labels, secs, values))
    # the rows as a reader of these counters computes them
    quota = CFS_QUOTA_US / CFS_PERIOD_US
    cpu_ratio = np.diff(u) / dt_s / quota
    thr_ratio = np.diff(th) / np.diff(per)
    cpu_pr = np.diff(cw) / dt_s
    io_pr = np.diff(iw) / dt_s
    net_bs = (np.diff(nrx) + np.diff(ntx)) / dt_s
    return pd.DataFrame(
        {
            "pod_uid": pod.uid,
            "source": "cadvisor",
            "ts_ms": at,
            "cpu_limit_ratio": cpu_ratio,
            "throttled_ratio": thr_ratio,
            "cpu_pressure": cpu_pr,
            "io_pressure": io_pr,
            "net_bytes_s": net_bs,
            "requests_running": np.nan,
            "requests_waiting": np.nan,
            "input": limit | throttled | cpu_p | io_p,
            "network": net,
            "queued": False,
        }
    )


def _vllm(
    pod: PodPlan, gang: GangPlan, t: np.ndarray, *, fam: dict[str, list[Series]],
    rng: np.random.Generator,
) -> pd.DataFrame:  # fmt: skip
    """vLLM's queue gauges at each scrape: requests follow the day's traffic."""
    act = gang.activity
    util = _traffic(act.floor, act.peak, act.peak_hour, t)
    lam = 0.06 * util
    running = rng.poisson(lam)
    waiting = rng.poisson(np.maximum(0.0, lam - 3.0) * 0.8)
    labels = {
        "namespace": pod.namespace,
        "pod": pod.name,
        "model_name": pod.labels.get("app", pod.container),
    }
    secs = t / 1000.0
    fam["vllm:num_requests_running"].append(Series(labels, secs, running.astype(np.float64)))
    fam["vllm:num_requests_waiting"].append(Series(labels, secs, waiting.astype(np.float64)))
    return pd.DataFrame(
        {
            "pod_uid": pod.uid,
            "source": "serving",
            "ts_ms": t,
            "cpu_limit_ratio": np.nan,
            "throttled_ratio": np.nan,
            "cpu_pressure": np.nan,
            "io_pressure": np.nan,
            "net_bytes_s": np.nan,
            "requests_running": running.astype(np.float64),
            "requests_waiting": waiting.astype(np.float64),
            "input": False,
            "network": False,
            "queued": (running + waiting) > 0,
        }
    )


def _dcgm(
    *,
    index: int,
    uuid: str,
    node: str,
    model: str,
    t: np.ndarray,
    holders: list[int],
    pods: list[PodPlan],
    stories: list[PodStory],
    fam: dict[str, list[Series]],
    rng: np.random.Generator,
) -> pd.DataFrame:
    """dcgm-exporter's PCIe and NVLink gauges of one card at each scrape, with the pod
    labels of whoever holds it then (dcgm-exporter's Kubernetes mapping)."""
    holder = np.full(t.size, -1, dtype=np.int64)
    for j in holders:
        p = pods[j]
        end = np.iinfo(np.int64).max if p.released_ms is None else p.released_ms
        holder[(t >= p.bound_ms) & (t < end)] = j
    pcie = np.zeros(t.size, dtype=bool)
    nvl = np.zeros(t.size, dtype=bool)
    for j in holders:
        on = holder == j
        pcie[on] = stories[j].flags.pcie.at(t[on])
        nvl[on] = stories[j].flags.nvlink.at(t[on])
    held = holder >= 0
    pcie_rate = np.where(
        held, _margin(rng, pcie, (20e9, 45e9), (5e7, 1.8e9)), rng.uniform(1e6, 2e7, t.size)
    )
    multi = np.array([stories[j].multi_card if j >= 0 else False for j in holder.tolist()])
    nvl_rate = np.where(multi, _margin(rng, nvl, (5e9, 120e9), (0.0, 0.5e9)), 0.0)
    split = rng.uniform(0.35, 0.65, t.size)
    pcie_rx = np.rint(pcie_rate * split)
    pcie_tx = np.rint(pcie_rate * (1 - split))
    nvl_rx = np.rint(nvl_rate * 0.5)
    nvl_tx = np.rint(nvl_rate * 0.5)
    base = {
        "gpu": str(index),
        "UUID": uuid,
        "device": f"nvidia{index}",
        "modelName": model,
        "Hostname": node,
    }
    change = np.flatnonzero(np.diff(holder)) + 1
    secs = t / 1000.0
    for a, b in zip([0, *change.tolist()], [*change.tolist(), t.size], strict=True):
        labels = dict(base)
        if holder[a] >= 0:
            p = pods[int(holder[a])]
            labels |= {"container": p.container, "namespace": p.namespace, "pod": p.name}
        for name, values in (
            ("DCGM_FI_PROF_PCIE_RX_BYTES", pcie_rx),
            ("DCGM_FI_PROF_PCIE_TX_BYTES", pcie_tx),
            ("DCGM_FI_PROF_NVLINK_RX_BYTES", nvl_rx),
            ("DCGM_FI_PROF_NVLINK_TX_BYTES", nvl_tx),
        ):
            fam[name].append(Series(labels, secs[a:b], values[a:b]))
    return pd.DataFrame(
        {
            "gpu_uuid": uuid,
            "ts_ms": t,
            "pcie_bytes_s": pcie_rx + pcie_tx,
            "pcie_link_bytes_s": np.nan,
            "nvlink_bytes_s": nvl_rx + nvl_tx,
            "pcie": held & pcie,
            "nvlink": multi & nvl,
        }
    )
