"""GPU pods' CPU signals from their cgroups (SPEC §10): limit use, throttling, pressure.

The sampler reads each GPU pod's pod-level cgroup every pass and turns two passes' counters
into rates over the time between them:

- `cpu_limit_ratio` = Δusage / (Δt · quota / period): the share of its CPU limit the pod
  used (None without a quota);
- `throttled_ratio` = Δnr_throttled / Δnr_periods: the share of CFS periods it was
  throttled in (None when no period passed: a pod without a quota has none);
- `cpu_pressure`, `io_pressure` = Δ`some total` / Δt (both µs): the share of the time some
  task of the pod waited for CPU or I/O (PSI; None on cgroup v1, or where PSI is off).

cgroup v2 (one tree; `cgroup.controllers` at its root): `cpu.stat` (usage_usec, nr_periods,
nr_throttled, throttled_usec), `cpu.max` ("max 100000" or "200000 100000"), `cpu.pressure`,
`io.pressure`. cgroup v1: `cpuacct/…/cpuacct.usage` (ns), `cpu/…/cpu.stat` (nr_periods,
nr_throttled, throttled_time in ns), `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us`,
under `cpu,cpuacct` (or `cpu` and `cpuacct` apart). No PSI in v1.

A pod's cgroup is found by its UID under either kubelet driver, per QoS class:

    systemd:  kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice
              (guaranteed: kubepods.slice/kubepods-pod<uid with _>.slice)
    cgroupfs: kubepods/burstable/pod<uid>   (guaranteed: kubepods/pod<uid>)

The parsing is pure; `CgroupSignals` is the small file-reading edge, over a root path
(the host's `/sys/fs/cgroup`, mounted read-only), so tests hand it a fake tree. A file that
cannot be read or parsed is a `CgroupFileError` for that pod this pass, never for the pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from auditor.errors import AuditorError
from auditor.model import PodSignal

MAX_FILE_BYTES = 64 * 1024
"""A cgroup file is a few lines; more is not one."""
QOS = ("", "burstable", "besteffort")
"""QoS classes' sub-trees of kubepods ("": guaranteed, right under it)."""


class CgroupFileError(AuditorError):
    """A pod's cgroup file that is there but cannot be read or parsed."""


@dataclass(frozen=True, slots=True)
class CpuCounters:
    """One reading of a pod's cgroup: cumulative counters (µs) and its CPU quota."""

    usage_us: int
    nr_periods: int | None
    nr_throttled: int | None
    throttled_us: int | None
    quota_cpus: float | None
    """quota / period (CPUs the pod may use); None without a limit."""
    cpu_some_us: int | None
    io_some_us: int | None


def parse_flat_keyed(text: str, *, what: str) -> dict[str, int]:
    """`key value` lines (`cpu.stat`) as a dict of integers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise CgroupFileError(f"{what}: not a 'key value' line: {line[:80]!r}")
        try:
            out[parts[0]] = int(parts[1])
        except ValueError as e:
            raise CgroupFileError(f"{what}: not an integer: {line[:80]!r}") from e
    return out


def parse_cpu_max(text: str) -> float | None:
    """`cpu.max` ("max 100000", "200000 100000") as CPUs (quota / period); None: no limit."""
    parts = text.split()
    if len(parts) not in (1, 2):
        raise CgroupFileError(f"cpu.max: not 'quota period': {text[:80]!r}")
    if parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) == 2 else 100_000
    except ValueError as e:
        raise CgroupFileError(f"cpu.max: not integers: {text[:80]!r}") from e
    if quota <= 0 or period <= 0:
        raise CgroupFileError(f"cpu.max: not positive: {text[:80]!r}")
    return quota / period


def parse_v1_quota(quota_text: str, period_text: str) -> float | None:
    """`cpu.cfs_quota_us` / `cpu.cfs_period_us` as CPUs; None for quota -1 (no limit)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError as e:
        raise CgroupFileError(f"cpu.cfs_quota_us/period_us: not integers: {quota_text!r}") from e
    if quota < 0:
        return None
    if quota == 0 or period <= 0:
        raise CgroupFileError(f"cpu.cfs_quota_us/period_us: {quota}/{period}")
    return quota / period


def parse_pressure_some_total(text: str, *, what: str) -> int:
    """The `total=` (µs) of the `some` line of a PSI file (`cpu.pressure`, `io.pressure`)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "some":
            for field in parts[1:]:
                key, _, value = field.partition("=")
                if key == "total":
                    try:
                        return int(value)
                    except ValueError as e:
                        raise CgroupFileError(f"{what}: bad total: {line[:80]!r}") from e
    raise CgroupFileError(f"{what}: no 'some … total=' line")


def pod_dir_names(uid: str) -> Iterator[str]:
    """Relative paths a pod's cgroup may have, systemd driver first, then cgroupfs."""
    under = uid.replace("-", "_")
    for qos in QOS:
        if qos:
            yield f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{under}.slice"
        else:
            yield f"kubepods.slice/kubepods-pod{under}.slice"
    for qos in QOS:
        yield f"kubepods/{qos}/pod{uid}" if qos else f"kubepods/pod{uid}"


def _ratio(num: float, den: float) -> float | None:
    return None if den <= 0 else max(0.0, num / den)


def signal_between(
    pod_uid: str, before: CpuCounters, after: CpuCounters, *, start_ms: int, end_ms: int
) -> PodSignal | None:
    """The pod's signals between two readings, stamped with the first (the start of the
    time they average, as GPU samples are); None when no time passed or a counter went
    back (the cgroup was recreated)."""
    dt_us = (end_ms - start_ms) * 1000
    d_usage = after.usage_us - before.usage_us
    if dt_us <= 0 or d_usage < 0:
        return None
    limit = None
    if after.quota_cpus is not None:
        limit = _ratio(d_usage, dt_us * after.quota_cpus)
    throttled = None
    if None not in (after.nr_periods, before.nr_periods, after.nr_throttled, before.nr_throttled):
        d_periods = after.nr_periods - before.nr_periods  # type: ignore[operator]
        d_throttled = after.nr_throttled - before.nr_throttled  # type: ignore[operator]
        throttled = _ratio(d_throttled, d_periods) if d_throttled >= 0 else None

    def pressure(a: int | None, b: int | None) -> float | None:
        return None if a is None or b is None or a < b else min(1.0, (a - b) / dt_us)

    return PodSignal(
        pod_uid,
        start_ms,
        cpu_limit_ratio=limit,
        throttled_ratio=throttled,
        cpu_pressure=pressure(after.cpu_some_us, before.cpu_some_us),
        io_pressure=pressure(after.io_some_us, before.io_some_us),
    )


def _read(path: Path) -> str | None:
    """A file's text; None when it is not there (a controller or PSI that is off)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CgroupFileError(f"{path}: {e}") from e
    if len(raw) > MAX_FILE_BYTES:
        raise CgroupFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    return raw.decode("ascii", errors="replace")


def read_v2(pod_dir: Path) -> CpuCounters:
    """A cgroup v2 pod directory's counters."""
    stat_text = _read(pod_dir / "cpu.stat")
    if stat_text is None:
        raise CgroupFileError(f"{pod_dir}/cpu.stat: missing")
    stat = parse_flat_keyed(stat_text, what=f"{pod_dir}/cpu.stat")
    if "usage_usec" not in stat:
        raise CgroupFileError(f"{pod_dir}/cpu.stat: no usage_usec")
    cpu_max = _read(pod_dir / "cpu.max")
    cpu_p, io_p = _read(pod_dir / "cpu.pressure"), _read(pod_dir / "io.pressure")
    some = parse_pressure_some_total
    return CpuCounters(
        usage_us=stat["usage_usec"],
        nr_periods=stat.get("nr_periods"),
        nr_throttled=stat.get("nr_throttled"),
        throttled_us=stat.get("throttled_usec"),
        quota_cpus=None if cpu_max is None else parse_cpu_max(cpu_max),
        cpu_some_us=None if cpu_p is None else some(cpu_p, what=f"{pod_dir}/cpu.pressure"),
        io_some_us=None if io_p is None else some(io_p, what=f"{pod_dir}/io.pressure"),
    )


def read_v1(cpu_dir: Path, cpuacct_dir: Path) -> CpuCounters:
    """A cgroup v1 pod's counters, from its `cpu` and `cpuacct` directories."""
    usage = _read(cpuacct_dir / "cpuacct.usage")
    if usage is None:
        raise CgroupFileError(f"{cpuacct_dir}/cpuacct.usage: missing")
    try:
        usage_ns = int(usage.strip())
    except ValueError as e:
        raise CgroupFileError(f"{cpuacct_dir}/cpuacct.usage: {usage[:80]!r}") from e
    stat_text = _read(cpu_dir / "cpu.stat")
    stat = {} if stat_text is None else parse_flat_keyed(stat_text, what=f"{cpu_dir}/cpu.stat")
    quota, period = _read(cpu_dir / "cpu.cfs_quota_us"), _read(cpu_dir / "cpu.cfs_period_us")
    throttled_ns = stat.get("throttled_time")
    return CpuCounters(
        usage_us=usage_ns // 1000,
        nr_periods=stat.get("nr_periods"),
        nr_throttled=stat.get("nr_throttled"),
        throttled_us=None if throttled_ns is None else throttled_ns // 1000,
        quota_cpus=None if quota is None or period is None else parse_v1_quota(quota, period),
        cpu_some_us=None,
        io_some_us=None,
    )


class CgroupSignals:
    """Reads pods' cgroups under `root` and keeps each pod's previous reading; `read()`
    gives the signals since then. Errors of a pod are returned, not raised."""

    def __init__(self, root: Path = Path("/sys/fs/cgroup")) -> None:
        self.root = root
        self._v2: bool | None = None
        self._dirs: dict[str, str] = {}
        """Each pod's relative cgroup path, once found."""
        self._last: dict[str, tuple[int, CpuCounters]] = {}

    @property
    def v2(self) -> bool:
        if self._v2 is None:
            self._v2 = (self.root / "cgroup.controllers").exists()
        return self._v2

    def _v1_dirs(self) -> tuple[Path, Path]:
        for both in ("cpu,cpuacct", "cpuacct,cpu"):
            if (self.root / both).is_dir():
                return self.root / both, self.root / both
        return self.root / "cpu", self.root / "cpuacct"

    def _pod_dir(self, uid: str, base: Path) -> str | None:
        known = self._dirs.get(uid)
        if known is not None and (base / known).is_dir():
            return known
        for rel in pod_dir_names(uid):
            if (base / rel).is_dir():
                self._dirs[uid] = rel
                return rel
        return None

    def counters(self, uid: str) -> CpuCounters | None:
        """A pod's counters now; None when it has no cgroup here (gone, or another node's)."""
        if self.v2:
            rel = self._pod_dir(uid, self.root)
            return None if rel is None else read_v2(self.root / rel)
        cpu, cpuacct = self._v1_dirs()
        rel = self._pod_dir(uid, cpuacct)
        return None if rel is None else read_v1(cpu / rel, cpuacct / rel)

    def read(
        self, pod_uids: Iterable[str], *, now_ms: int
    ) -> tuple[list[PodSignal], list[CgroupFileError]]:
        """Signals of `pod_uids` since their previous reading (a pod seen for the first
        time has none yet), and the pods whose files failed. Pods not asked for are
        forgotten."""
        signals: list[PodSignal] = []
        errors: list[CgroupFileError] = []
        wanted = set(pod_uids)
        for uid in sorted(wanted):
            try:
                now = self.counters(uid)
            except CgroupFileError as e:
                errors.append(e)
                self._last.pop(uid, None)
                continue
            if now is None:
                self._last.pop(uid, None)
                continue
            previous = self._last.get(uid)
            self._last[uid] = (now_ms, now)
            if previous is not None:
                found = signal_between(uid, previous[1], now, start_ms=previous[0], end_ms=now_ms)
                if found is not None:
                    signals.append(found)
        for uid in set(self._last) - wanted:
            del self._last[uid]
            self._dirs.pop(uid, None)
        return signals, errors
