"""The NVML adapter: the only module that imports `pynvml`. Reads every GPU and MIG instance.

`NvmlReader.read()` returns one `Reading`: GPU records, one `GpuSample` per GPU, and the
devices that failed this time. Utilisation comes from the driver's buffered samples
(`nvmlDeviceGetSamples`), averaged over the time since the previous read, so a 5 s period
is covered rather than aliased by one point; where the buffer is not supported the point
reading (`nvmlDeviceGetUtilizationRates`) stands in. A sample is stamped with the start of
the time it averages (the previous read), so it covers exactly that time (SPEC §3).

SM activity comes from GPM (Hopper and later): a GPM sample per card each read, and the SM
utilisation between it and the previous read's (so the first read of a card has none); a
card without GPM support has `None`.

A field NVML does not support, or fails to read, is `None`, never 0. A device that says it
uses more memory than it has is a problem of that pass (logged and counted by the sampler,
its reading skipped), a MIG instance alone, its siblings kept. A MIG-enabled card is
reported as its MIG instances (GPUs of their own, NVML has no utilisation for them: `None`),
not as the parent, whose capacity they share; each names its profile (`1g.10gb`), read from
the instance's name as NVML gives it ("NVIDIA A100-SXM4-40GB MIG 1g.5gb").

Per-process utilisation (optional, SPEC §7): with a proc root given, each whole card's
`nvmlDeviceGetProcessUtilization` samples since the last read are averaged per process,
each process is put in its pod through `/proc/<pid>/cgroup` (`auditor.agents.sample.cgroups`),
and summed per pod: one `TenantSample` per pod and card, stamped like the card's sample.
Processes outside pods are left out. It needs the host's PID namespace (`hostPID: true`).
The pods of every process running on a card (busy or not) are listed too, for the sampler
to read their cgroups.

Card signals (SPEC §10), per whole card, each `None` where NVML cannot give it (counted,
never fatal): PCIe throughput (`nvmlDeviceGetPcieThroughput` TX + RX, KB/s) as bytes/s;
the link's bandwidth from its current generation and width (one direction); NVLink data
bytes/s from the per-link `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX` counters (KiB) between
two reads. A MIG instance has none (the parent's traffic is not its own).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from auditor.agents.sample.cgroups import PodsOfProcesses
from auditor.errors import AuditorError
from auditor.model import CardSignal, GpuRecord, GpuSample, TenantSample, Window

MIB = 1 << 20
GT_PER_LANE = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
"""PCIe transfer rate per lane by generation (GT/s)."""
NVLINK_FIELDS = (
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
)
NVLINK_MAX_LINKS = 18
"""Links asked for (18 on Hopper); a link the card lacks answers NOT_SUPPORTED."""


def pcie_link_bytes_s(generation: int | None, width: int | None) -> float | None:
    """A PCIe link's bandwidth in bytes/s, one direction: GT/s per lane times the lanes,
    less the line code (8b/10b up to gen 2, 128b/130b after); None where unknown."""
    if generation is None or width is None or generation not in GT_PER_LANE or width <= 0:
        return None
    code = 8 / 10 if generation <= 2 else 128 / 130
    return GT_PER_LANE[generation] * 1e9 * code * width / 8


class DriverError(AuditorError):
    """NVML cannot be used at all (library missing, driver not loaded): the sampler exits."""

    exit_code = 4


class ImpossibleReading(Exception):
    """A reading no card can make (more memory used than it has): the device is skipped
    this pass, as a problem, rather than stored."""


@dataclass(frozen=True, slots=True)
class DeviceProblem:
    """A device that could not be read this time (GPU is lost, an NVML error)."""

    index: int
    uuid: str | None
    error: str


@dataclass(frozen=True, slots=True)
class Reading:
    """What one pass over the node's devices saw, at `taken_ms`. Samples are stamped with
    the start of the time they average."""

    taken_ms: int
    gpus: tuple[GpuRecord, ...]
    samples: tuple[GpuSample, ...]
    problems: tuple[DeviceProblem, ...]
    tenants: tuple[TenantSample, ...] = ()
    """Per-pod utilisation of whole cards (only with per-process utilisation on)."""
    unattributed: int = 0
    """Processes using a card this pass that are in no pod (or gone before looked up)."""
    card_signals: tuple[CardSignal, ...] = ()
    """Whole cards' PCIe and NVLink traffic (SPEC §10)."""
    card_pods: tuple[str, ...] = ()
    """Pods with a process running on a card (with a proc root): whose cgroups to read."""
    unsupported_signals: int = 0
    """Card signals NVML could not give this pass (one per card and signal)."""


def _optional(call: Callable[..., Any], *args: Any) -> Any:
    """The value, or None where NVML cannot give it (not supported, or any error)."""
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


_MIG_PROFILE = re.compile(r"(?:^|\s)(?:MIG\s+)?((?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:\+me)?)\s*$")


def mig_profile(name: str | None) -> str | None:
    """The profile at the end of a MIG instance's NVML name ("... MIG 1g.10gb" -> "1g.10gb",
    "... MIG 1c.3g.40gb" -> "1c.3g.40gb"); None when it names none."""
    m = _MIG_PROFILE.search(name or "")
    return m.group(1) if m else None


class NvmlReader:
    """Reads the node's devices through NVML. `open()` first; `close()` when done."""

    def __init__(
        self,
        *,
        node: str,
        period_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        proc_root: Path | None = None,
    ) -> None:
        """`proc_root`: the host's `/proc`, to read per-process utilisation; None: off."""
        self.node = node
        self.period_s = period_s
        self._clock = clock
        self._last_read_ms: int | None = None
        self._last_seen_us: dict[str, int] = {}
        self._last_proc_us: dict[str, int] = {}
        self._no_buffer: set[str] = set()
        self._pods = None if proc_root is None else PodsOfProcesses(proc_root)
        self._unattributed = 0
        self._gpm: dict[str, Any] = {}
        """Per card with GPM support: its GPM sample of the previous read (None: none yet)."""
        self._no_gpm: set[str] = set()
        self._nvlink: dict[str, tuple[int, int]] = {}
        """Per card: (ms, KiB) of its NVLink data counters (tx + rx) at the previous read."""
        self._no_nvlink: set[str] = set()
        self._unsupported = 0

    def open(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise DriverError(f"cannot initialise NVML: {e}") from e

    def close(self) -> None:
        for sample in self._gpm.values():
            if sample is not None:
                _optional(pynvml.nvmlGpmSampleFree, sample)
        self._gpm.clear()
        _optional(pynvml.nvmlShutdown)

    def read(self) -> Reading:
        """One pass over every device; a failing device is a problem, not a failed pass."""
        now_ms = int(self._clock() * 1000)
        start_ms = (
            self._last_read_ms
            if self._last_read_ms is not None
            else now_ms - int(self.period_s * 1000)
        )
        self._last_read_ms = now_ms
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as e:
            raise DriverError(f"NVML cannot count devices: {e}") from e
        gpus: list[GpuRecord] = []
        samples: list[GpuSample] = []
        problems: list[DeviceProblem] = []
        tenants: list[TenantSample] = []
        cards: list[CardSignal] = []
        card_pods: set[str] = set()
        self._unattributed = 0
        self._unsupported = 0
        for index in range(count):
            uuid: str | None = None
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                migs = self._mig_handles(handle)
                if migs:
                    for mig in migs:
                        try:
                            self._read_device(
                                mig,
                                index=None,
                                parent=uuid,
                                window=Window(start_ms, now_ms),
                                out=(gpus, samples),
                            )
                        except ImpossibleReading as e:  # this instance only
                            mig_uuid = _optional(pynvml.nvmlDeviceGetUUID, mig)
                            problems.append(
                                DeviceProblem(
                                    index, None if mig_uuid is None else _text(mig_uuid), str(e)
                                )
                            )
                            continue
                        if self._pods is not None:
                            card_pods |= self._running_pods(mig)
                else:
                    self._read_device(
                        handle,
                        index=index,
                        parent=None,
                        window=Window(start_ms, now_ms),
                        out=(gpus, samples),
                    )
                    cards.append(self._card_signal(handle, uuid, start_ms, now_ms))
                    if self._pods is not None:
                        tenants += self._tenants(handle, uuid, start_ms)
                        card_pods |= self._running_pods(handle)
            except (pynvml.NVMLError, ImpossibleReading) as e:
                problems.append(DeviceProblem(index, uuid, str(e)))
        return Reading(
            now_ms,
            tuple(gpus),
            tuple(samples),
            tuple(problems),
            tuple(tenants),
            self._unattributed,
            tuple(cards),
            tuple(sorted(card_pods)),
            self._unsupported,
        )

    def _running_pods(self, handle: Any) -> set[str]:
        """The pods of the processes running on a device (idle ones too: a process holding
        a context is listed, whether it computes or not)."""
        assert self._pods is not None
        found = _optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        pods = {self._pods.pod_of(int(p.pid)) for p in found}
        return {p for p in pods if p is not None}

    def _card_signal(self, handle: Any, uuid: str, start_ms: int, now_ms: int) -> CardSignal:
        """A whole card's PCIe throughput (TX + RX, KB/s as NVML gives it), its link's
        bandwidth and its NVLink traffic since the previous read; each None (and counted)
        where NVML cannot give it."""
        tx = _optional(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = _optional(pynvml.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        pcie = None if tx is None or rx is None else (float(tx) + float(rx)) * 1000.0
        link = pcie_link_bytes_s(
            _optional(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            _optional(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
        )
        nvlink = self._nvlink_bytes_s(handle, uuid, now_ms)
        self._unsupported += sum(v is None for v in (pcie, link)) + (uuid in self._no_nvlink)
        return CardSignal(uuid, start_ms, pcie, link, nvlink)

    def _nvlink_bytes_s(self, handle: Any, uuid: str, now_ms: int) -> float | None:
        """NVLink data bytes/s (TX + RX, all links) since the previous read, from the
        per-link data counters (KiB); None on the first read, or where not supported."""
        if uuid in self._no_nvlink:
            return None
        ids = [(f, link) for link in range(NVLINK_MAX_LINKS) for f in NVLINK_FIELDS]
        values = _optional(pynvml.nvmlDeviceGetFieldValues, handle, ids)
        read = [v for v in values or () if v.nvmlReturn == pynvml.NVML_SUCCESS]
        if not read:
            self._no_nvlink.add(uuid)  # no NVLink (PCIe card), or no counters: not asked again
            return None
        kib = sum(int(v.value.ullVal) for v in read)
        previous = self._nvlink.get(uuid)
        self._nvlink[uuid] = (now_ms, kib)
        if previous is None or now_ms <= previous[0] or kib < previous[1]:
            return None
        return (kib - previous[1]) * 1024.0 / ((now_ms - previous[0]) / 1000.0)

    def _tenants(self, handle: Any, uuid: str, stamp_ms: int) -> list[TenantSample]:
        """Per-pod utilisation of a whole card since the last read: each process's samples
        averaged, summed per pod (percent of the card, at most 100)."""
        assert self._pods is not None
        since_us = self._last_proc_us.get(uuid, stamp_ms * 1000)
        try:
            found = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError:
            return []  # no process ran since (NOT_FOUND), or not supported
        per_pid: dict[int, list[float]] = {}
        newest = since_us
        for p in found:
            if p.timeStamp > since_us:
                per_pid.setdefault(int(p.pid), []).append(float(p.smUtil))
                newest = max(newest, int(p.timeStamp))
        self._last_proc_us[uuid] = newest
        per_pod: dict[str, float] = {}
        for pid, values in per_pid.items():
            pod = self._pods.pod_of(pid)
            if pod is None:
                self._unattributed += 1
                continue
            per_pod[pod] = per_pod.get(pod, 0.0) + sum(values) / len(values)
        return [
            TenantSample(uuid, pod, stamp_ms, min(100.0, util))
            for pod, util in sorted(per_pod.items())
        ]

    def _mig_handles(self, handle: Any) -> list[Any]:
        count = _optional(pynvml.nvmlDeviceGetMaxMigDeviceCount, handle)
        if not count:
            return []
        found = []
        for i in range(count):
            mig = _optional(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if mig is not None:
                found.append(mig)
        return found

    def _read_device(
        self,
        handle: Any,
        *,
        index: int | None,
        parent: str | None,
        window: Window,
        out: tuple[list[GpuRecord], list[GpuSample]],
    ) -> None:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        util = self._utilisation(handle, uuid, window)  # first: a lost GPU raises here
        name = _optional(pynvml.nvmlDeviceGetName, handle)
        memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
        total = None if memory is None else memory.total / MIB
        if memory is not None and memory.used > memory.total:
            raise ImpossibleReading(
                f"memory used {memory.used / MIB:g} MiB is above its total {total:g} MiB: "
                "reading skipped"
            )
        power_mw = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
        throttle = _optional(_throttle_reasons, handle)
        clock = _optional(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
        temp = _optional(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        model = None if name is None else _text(name)
        sm_active = self._sm_active(handle, uuid) if parent is None else None
        out[0].append(
            GpuRecord(
                uuid,
                self.node,
                index,
                model,
                total,
                parent,
                util_source="nvml",
                mig_profile=mig_profile(model) if parent is not None else None,
            )
        )
        out[1].append(
            GpuSample(
                gpu_uuid=uuid,
                ts_ms=window[0],
                util=util,
                memory_used_mib=None if memory is None else memory.used / MIB,
                memory_total_mib=total,
                power_w=None if power_mw is None else power_mw / 1000.0,
                sm_clock_mhz=None if clock is None else float(clock),
                throttle_reasons=None if throttle is None else f"0x{throttle:016x}",
                temperature_c=None if temp is None else float(temp),
                sm_active=sm_active,
            )
        )

    def _sm_active(self, handle: Any, uuid: str) -> float | None:
        """GPM SM utilisation (0-1) since the previous read; None without GPM or a previous
        sample, or where the metric cannot be read."""
        if uuid in self._no_gpm:
            return None
        if uuid not in self._gpm:
            support = _optional(pynvml.nvmlGpmQueryDeviceSupport, handle)
            if support is None or not support.isSupportedDevice:
                self._no_gpm.add(uuid)
                return None
            self._gpm[uuid] = None
        previous = self._gpm[uuid]
        sample = _optional(pynvml.nvmlGpmSampleAlloc)
        if sample is None or _optional(pynvml.nvmlGpmSampleGet, handle, sample) is None:
            if sample is not None:
                _optional(pynvml.nvmlGpmSampleFree, sample)
            return None
        self._gpm[uuid] = sample
        if previous is None:
            return None
        try:
            get = pynvml.c_nvmlGpmMetricsGet_t()
            get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = 1
            get.sample1, get.sample2 = previous, sample
            get.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
            pynvml.nvmlGpmMetricsGet(get)
        except pynvml.NVMLError:
            return None
        finally:
            _optional(pynvml.nvmlGpmSampleFree, previous)
        metric = get.metrics[0]
        if metric.nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        return min(1.0, max(0.0, float(metric.value) / 100.0))

    def _utilisation(self, handle: Any, uuid: str, window: Window) -> float | None:
        """Mean of the buffered samples since the last one seen; else the point reading."""
        if uuid not in self._no_buffer:
            since_us = self._last_seen_us.get(uuid, window[0] * 1000)
            try:
                _, buffered = pynvml.nvmlDeviceGetSamples(
                    handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since_us
                )
            except pynvml.NVMLError_NotSupported:
                self._no_buffer.add(uuid)
            except pynvml.NVMLError_GpuIsLost:
                raise
            except pynvml.NVMLError:
                pass  # nothing new in the buffer (NOT_FOUND) or a passing error: point reading
            else:
                until_us = window[1] * 1000
                fresh = [s for s in buffered if since_us < s.timeStamp <= until_us]
                if fresh:
                    self._last_seen_us[uuid] = max(s.timeStamp for s in fresh)
                    return sum(float(s.sampleValue.uiVal) for s in fresh) / len(fresh)
        try:
            return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError:
            return None


def _throttle_reasons(handle: Any) -> int:
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except pynvml.NVMLError_FunctionNotFound:
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
