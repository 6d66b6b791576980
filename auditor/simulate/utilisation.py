"""Utilisation series per gang, each sample labelled with the category SPEC §3 gives it.

Every generator works on whole (cards × ticks) blocks with numpy. The shapes are chosen so
that the intended category is the only one the rules allow:

- active samples stay above the idle threshold (at least 6 %), idle ones at 0-3 %;
- stalls (data loader, host sync) are gang-wide, one or two samples (< 15 s: never a
  checkpoint candidate) and at random times;
- checkpoints are gang-wide gaps of 15 s-15 min at a regular interval (CV about 0.02), at
  least four of them;
- a rank idle while others compute is idle on its own cards only;
- long idle (notebooks) lasts 40 minutes or more, well past `reserved_after`;
- no idle feature touches another, the start or end of activity, or a sampler outage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from auditor.simulate.plan import Activity, GangPlan, Label, Profile

SEPARATION = 4
"""Active samples kept between two idle features."""


@dataclass(frozen=True, slots=True)
class Grid:
    """The nominal sampling ticks: `data_start_ms + k * period_ms` for k in [0, n)."""

    data_start_ms: int
    period_ms: int
    n: int

    def tick(self, t_ms: int | None) -> int:
        """The first tick at or after `t_ms` (clipped to [0, n]); n for None."""
        if t_ms is None:
            return self.n
        k = -((self.data_start_ms - t_ms) // self.period_ms)
        return int(min(max(k, 0), self.n))

    def ticks_of(self, seconds: float) -> int:
        return max(1, round(seconds * 1000 / self.period_ms))

    def utc_hours(self, a: int, b: int) -> np.ndarray:
        t = self.data_start_ms + np.arange(a, b, dtype=np.int64) * self.period_ms
        return (t % 86_400_000) / 3_600_000.0


@dataclass(slots=True)
class Frames:
    """Per card (row = node * gpus_per_node + index) and tick: what nvidia-smi will print."""

    util: np.ndarray
    label: np.ndarray
    mem: np.ndarray
    hot: np.ndarray
    """The card is thermally throttled."""

    @classmethod
    def empty(cls, cards: int, n: int) -> Frames:
        return cls(
            util=np.zeros((cards, n), dtype=np.int16),
            label=np.zeros((cards, n), dtype=np.int8),
            mem=np.zeros((cards, n), dtype=np.int32),
            hot=np.zeros((cards, n), dtype=bool),
        )


def _dilate(mask: np.ndarray, width: int) -> np.ndarray:
    """True wherever a True of `mask` (1-D) lies within `width` ticks."""
    if not mask.any():
        return mask.copy()
    kernel = np.ones(2 * width + 1, dtype=np.int32)
    return np.convolve(mask.astype(np.int32), kernel, mode="same") > 0


def _place_runs(
    rng: np.random.Generator, free: np.ndarray, *, count: int, lengths: tuple[int, int]
) -> list[tuple[int, int]]:
    """Up to `count` runs at random places where `free` holds, SEPARATION apart."""
    m = free.size
    if count <= 0 or m == 0:
        return []
    starts = np.sort(rng.integers(0, m, size=count))
    lens = rng.integers(lengths[0], lengths[1] + 1, size=count)
    ok = free.copy()
    runs = []
    for s, n in zip(starts.tolist(), lens.tolist(), strict=True):
        a, b = s - SEPARATION, s + n + SEPARATION
        if a < 0 or b > m or not ok[a:b].all():
            continue
        runs.append((s, n))
        ok[a:b] = False
    return runs


def _smooth_noise(rng: np.random.Generator, m: int, sd: float, width: int) -> np.ndarray:
    raw = rng.normal(0.0, sd, size=m + width)
    return np.convolve(raw, np.ones(width) / np.sqrt(width), mode="valid")[:m]


def _levels(rng: np.random.Generator, level: float, cards: int, m: int) -> np.ndarray:
    """Utilisation of cards computing in lockstep: a slow wave, shared and own noise."""
    t = np.arange(m)
    wave = float(rng.uniform(1.5, 4.0)) * np.sin(
        2 * np.pi * t / float(rng.uniform(240, 1080)) + float(rng.uniform(0, 2 * np.pi))
    )
    shared = level + wave + rng.normal(0.0, 1.2, size=m)
    levels: np.ndarray = shared[None, :] + rng.normal(0.0, 1.0, size=(cards, m))
    return levels


def _idle_util(rng: np.random.Generator, shape: tuple[int, ...], high: int) -> np.ndarray:
    """Idle samples: mostly 0 %, a few 1..high % (copies, context switches)."""
    u = rng.integers(0, high + 1, size=shape)
    return np.where(rng.random(size=shape) < 0.7, 0, u)


def training_block(
    rng: np.random.Generator,
    *,
    act: Activity,
    pod_of_card: np.ndarray,
    m: int,
    quiet: np.ndarray,
    ckpt_phase: int,
    grid: Grid,
) -> tuple[np.ndarray, ...]:
    """Utilisation, labels and throttled flags of a training gang's active stretch.

    `ckpt_phase` is the tick within the block at which the job's first activity fell (negative
    when it began before the samplers), so that checkpoints keep their rhythm.
    """
    cards = pod_of_card.size
    label = np.full((cards, m), Label.ACTIVE, dtype=np.int8)
    hot = np.zeros((cards, m), dtype=bool)
    busy_free = ~quiet
    if act.ckpt_interval_s > 0:
        step = grid.ticks_of(act.ckpt_interval_s)
        length = grid.ticks_of(act.ckpt_len_s)
        gaps = []
        j = 1
        while True:
            s = ckpt_phase + j * step + round(float(rng.normal(0, 0.015 * step)))
            n = max(3, round(length * float(rng.uniform(0.9, 1.1))))
            j += 1
            if s + n + SEPARATION >= m:
                break
            if s - SEPARATION >= 0 and busy_free[s - SEPARATION : s + n + SEPARATION].all():
                gaps.append((s, n))
        if len(gaps) >= 4:
            for s, n in gaps:
                label[:, s : s + n] = Label.CHECKPOINT
    pods = np.unique(pod_of_card)
    if act.straggler == "lagging" and pods.size > 1:
        free = busy_free & (label[0] == Label.ACTIVE) & ~_dilate(label[0] != Label.ACTIVE, 1)
        count = int(rng.integers(3, 6))
        for s, n in _place_runs(rng, free, count=count, lengths=(12, 30)):
            label[pod_of_card == pods[-1], s : s + n] = Label.WAIT
    gang_active = (label == Label.ACTIVE).all(axis=0)
    expected = act.stalls_per_hour * m * grid.period_ms / 3_600_000
    free = busy_free & gang_active
    for s, n in _place_runs(rng, free, count=int(rng.poisson(expected)), lengths=(1, 2)):
        label[:, s : s + n] = Label.STALL
    util = _levels(rng, act.level, cards, m)
    if act.straggler == "throttled":
        slow = int(np.flatnonzero(pod_of_card == pods[-1])[-1])
        util[slow] = rng.integers(96, 101, size=m)
        hot[slow] = True
    elif act.straggler == "lagging":
        slow = int(np.flatnonzero(pod_of_card == pods[0])[-1])
        util[slow] -= rng.uniform(20.0, 40.0, size=m)
    util = np.clip(np.rint(util), 8, 100).astype(np.int16)
    idle = label != Label.ACTIVE
    util[idle] = _idle_util(rng, (int(idle.sum()),), 3)
    util[label == Label.WAIT] = 0
    hot &= ~idle
    return util, label, hot


def inference_block(
    rng: np.random.Generator,
    *,
    act: Activity,
    cards: int,
    a: int,
    b: int,
    quiet: np.ndarray,
    grid: Grid,
) -> tuple[np.ndarray, np.ndarray]:
    """A serving replica following the day: low at night, a peak at `act.peak_hour`."""
    m = b - a
    hours = grid.utc_hours(a, b)
    phase = (1 + np.cos(2 * np.pi * (hours - act.peak_hour) / 24)) / 2
    curve = act.floor + (act.peak - act.floor) * phase**1.6
    base = curve + _smooth_noise(rng, m, 2.5, 6)
    util_f = base[None, :] + rng.normal(0.0, 1.0, size=(cards, m))
    label = np.full((cards, m), Label.ACTIVE, dtype=np.int8)
    # Now and then at night a whole sampling period passes without a request.
    p_empty = 0.02 * np.clip((22 - curve) / 12, 0, 1)
    near_quiet = _dilate(quiet, SEPARATION)
    last = -2 * SEPARATION
    for s in np.flatnonzero(~near_quiet & (rng.random(m) < p_empty)).tolist():
        if s - last > SEPARATION:
            label[:, s] = Label.STALL
            last = s
    util = np.clip(np.rint(util_f), 6, 100).astype(np.int16)
    util[label == Label.STALL] = 0
    return util, label


def notebook_block(
    rng: np.random.Generator, *, m: int, pauses: int, quiet: np.ndarray, grid: Grid
) -> tuple[np.ndarray, np.ndarray]:
    """Sessions of interactive work separated by absences of 40 minutes or more.

    The block starts and ends with a session. A session has cells of light or heavy work,
    short stalls, and at most `pauses` pauses of 2-8 minutes (too few to look regular).
    """
    minute = grid.ticks_of(60)
    label = np.full(m, Label.ACTIVE, dtype=np.int8)
    pos = 0
    while True:
        session = int(rng.integers(20 * minute, 70 * minute))
        absence = int(rng.integers(42 * minute, 110 * minute))
        if m - pos - session < absence + 10 * minute:
            break
        label[pos + session : pos + session + absence] = Label.RESERVED
        pos += session + absence
    level = np.empty(m)
    pos = 0
    while pos < m:
        cell = int(rng.integers(4 * minute, 25 * minute))
        heavy = rng.random() < 0.5
        level[pos : pos + cell] = rng.uniform(60, 93) if heavy else rng.uniform(15, 35)
        pos += cell
    free = ~quiet & (label == Label.ACTIVE) & ~_dilate(label != Label.ACTIVE, 2)
    for s, n in _place_runs(rng, free, count=int(rng.integers(0, pauses + 1)), lengths=(24, 96)):
        label[s : s + n] = Label.STALL
    free &= label == Label.ACTIVE
    expected = 6.0 * m * grid.period_ms / 3_600_000
    for s, n in _place_runs(rng, free, count=int(rng.poisson(expected)), lengths=(1, 2)):
        label[s : s + n] = Label.STALL
    util = np.clip(np.rint(level + rng.normal(0, 3.0, size=m)), 8, 100).astype(np.int16)
    idle = label != Label.ACTIVE
    util[idle] = 0
    return util[None, :], label[None, :]


def fill_gang(
    frames: Frames,
    gang: GangPlan,
    *,
    grid: Grid,
    gpus_per_node: int,
    quiet_nodes: np.ndarray,
    rng: np.random.Generator,
) -> None:
    """Write the gang's tenures (startup, activity, teardown) into `frames`."""
    cards = [pod.node * gpus_per_node + i for pod in gang.pods for i in pod.gpu_indices]
    pod_of_card = np.array([j for j, pod in enumerate(gang.pods) for _ in pod.gpu_indices])
    mem_level = gang.activity.mem_mib + rng.integers(-300, 300, size=len(cards))
    for j, pod in enumerate(gang.pods):
        k0, k1 = grid.tick(pod.bound_ms), grid.tick(pod.released_ms)
        rows = [c for c, p in zip(cards, pod_of_card.tolist(), strict=True) if p == j]
        if gang.profile is Profile.UNUSED:
            frames.label[rows, k0:k1] = Label.RESERVED
            continue
        ka, ke = grid.tick(gang.active_start_ms), grid.tick(gang.active_end_ms)
        started = grid.tick(pod.started_ms)
        exited = grid.tick(pod.main_finished_ms)
        frames.label[rows, k0:ka] = Label.LEAD
        frames.label[rows, ke:k1] = Label.TRAIL
        if ka > k0:
            frames.util[rows, k0:ka] = _idle_util(rng, (len(rows), ka - k0), 2)
            frames.util[rows, k0 : min(started, ka)] = 0
        for c in rows:
            level = int(mem_level[cards.index(c)])
            if ka > started:
                ramp = np.linspace(0, level, ka - max(started, k0) + 1)[1:]
                frames.mem[c, max(started, k0) : ka] = ramp.astype(np.int32)
            frames.mem[c, ke : min(exited, k1)] = level
    ka, ke = grid.tick(gang.active_start_ms), grid.tick(gang.active_end_ms)
    if gang.profile is Profile.UNUSED or ke <= ka:
        return
    nodes = sorted({pod.node for pod in gang.pods})
    quiet: np.ndarray = np.asarray(quiet_nodes[nodes, ka:ke].any(axis=0))
    quiet[:SEPARATION] = True
    quiet[-SEPARATION:] = True
    m = ke - ka
    act = gang.activity
    hot = np.zeros((len(cards), m), dtype=bool)
    if gang.profile is Profile.INFERENCE:
        util, label = inference_block(
            rng, act=act, cards=len(cards), a=ka, b=ke, quiet=quiet, grid=grid
        )
    elif gang.profile is Profile.NOTEBOOK:
        util, label = notebook_block(rng, m=m, pauses=act.pauses, quiet=quiet, grid=grid)
    else:
        assert gang.active_start_ms is not None
        first = -((grid.data_start_ms - gang.active_start_ms) // grid.period_ms)
        util, label, hot = training_block(
            rng,
            act=act,
            pod_of_card=pod_of_card,
            m=m,
            quiet=quiet,
            ckpt_phase=int(first) - ka,
            grid=grid,
        )
    frames.util[cards, ka:ke] = util
    frames.label[cards, ka:ke] = label
    frames.hot[cards, ka:ke] = hot
    noise = rng.integers(-48, 49, size=(len(cards), m))
    frames.mem[cards, ka:ke] = mem_level[:, None] + noise
