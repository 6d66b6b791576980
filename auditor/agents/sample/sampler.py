"""The node sampler's loop, over Protocols: a device reader, a holder source, a sink.

Every `period_s` it reads the node's GPUs and who holds them, and appends the pass to the
on-disk buffer (bounded in bytes; a full disk drops the oldest passes, counted, and never
stops the loop); every `flush_every_s` it writes the buffered passes, oldest first and in
batches, to the sink. A store outage leaves passes in the buffer (bounded, oldest dropped
and counted) until the store is back. A failing device or pod-resources call is counted and
the pass goes on; a GPU the store has on another node (or as another model) is skipped,
warned about once and counted, the other cards going on; with a cgroup root, each pass
also reads the cgroup signals of the pods whose processes use the cards (SPEC §10), a pod
whose files fail being logged, counted and skipped; only NVML failing as a whole
(`DriverError`) ends the loop, so that the DaemonSet restarts the sampler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from auditor.agents.sample.buffer import BufferStorageError, DiskBuffer
from auditor.agents.sample.metrics import SamplerMetrics
from auditor.agents.sample.podresources import DeviceHolder, normalise_device_id
from auditor.agents.sample.streaks import IdleStreaks
from auditor.errors import AuditorError
from auditor.model import (
    Batch,
    GpuConflict,
    GpuRecord,
    GpuSample,
    Holding,
    PodSignal,
    TenantSample,
    Written,
)
from auditor.settings import SAMPLE_FLUSH_EVERY_S, SAMPLE_PERIOD_S

log = logging.getLogger(__name__)


class NodeReading(Protocol):
    """One pass over the node's devices (`auditor.agents.sample.nvml.Reading` is one)."""

    @property
    def taken_ms(self) -> int: ...
    @property
    def gpus(self) -> Sequence[GpuRecord]: ...
    @property
    def samples(self) -> Sequence[GpuSample]: ...
    @property
    def problems(self) -> Sequence[object]: ...


class Reader(Protocol):
    """Reads the node's devices (the NVML reader, or a fake)."""

    def read(self) -> NodeReading: ...


class PodCgroups(Protocol):
    """Reads pods' cgroup signals since the last pass
    (`auditor.agents.sample.cgroup_signals.CgroupSignals` is one)."""

    def read(
        self, pod_uids: Iterable[str], *, now_ms: int
    ) -> tuple[Sequence[PodSignal], Sequence[Exception]]: ...


class HolderSource(Protocol):
    """Says which pod containers hold which devices (pod-resources, or a fake)."""

    def list_gpu_holders(self) -> Sequence[DeviceHolder]: ...


class Sink(Protocol):
    """Stores batches (`auditor.store.sample_sink.StoreSink` is one); says which holdings
    wait for their pod and which GPUs were refused, and whether an error it raised was the
    store refusing the data (then the passes are written alone) rather than being down."""

    def write(self, batches: Sequence[Batch], *, pending: Sequence[Holding]) -> Written: ...

    def is_refusal(self, error: BaseException) -> bool: ...


def holdings(reading: NodeReading, holders: Sequence[DeviceHolder]) -> tuple[Holding, ...]:
    """Holder device IDs (UUIDs, or GPU indexes) as holdings of the GPUs read. Under
    time-slicing a pod holds replicas of a card (`GPU-…::j`): their number is its
    `replicas` there (SPEC §7)."""
    by_uuid = {g.uuid for g in reading.gpus}
    by_index = {str(g.index): g.uuid for g in reading.gpus if g.index is not None}
    replicas: dict[tuple[str, str, str], set[str]] = {}
    for h in holders:
        device = normalise_device_id(h.device_id)
        uuid = device if device in by_uuid else by_index.get(device)
        if uuid is None:
            continue  # a device this reader did not see (lost this pass)
        ids = replicas.setdefault((h.namespace, h.pod, uuid), set())
        if "::" in h.device_id:
            ids.add(h.device_id)
    t = reading.taken_ms
    return tuple(
        Holding(ns, pod, uuid, t, t, len(ids) or None) for (ns, pod, uuid), ids in replicas.items()
    )


@dataclass(frozen=True)
class SamplerSettings:
    period_s: float = SAMPLE_PERIOD_S
    """Seconds between passes over the devices."""
    flush_every_s: float = SAMPLE_FLUSH_EVERY_S
    """Seconds between writes to the store (passes are batched in between)."""
    flush_batches: int = 720
    """Most passes written in one transaction."""
    holding_ttl_s: float = 3600.0
    """A holding whose pod the store does not know after this long is dropped and counted."""


class Sampler:
    """Runs passes and flushes; `run()` loops until `stop` is set (or `max_passes`)."""

    def __init__(
        self,
        *,
        reader: Reader,
        holders: HolderSource | None,
        sink: Sink,
        buffer: DiskBuffer,
        metrics: SamplerMetrics,
        settings: SamplerSettings = SamplerSettings(),
        clock: Callable[[], float] = time.time,
        streaks: IdleStreaks | None = None,
        cgroups: PodCgroups | None = None,
    ) -> None:
        self.reader = reader
        self.holders = holders
        self.sink = sink
        self.buffer = buffer
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        self.streaks = streaks
        """Exports each held card's idle streak on /metrics (None: not exported)."""
        self.cgroups = cgroups
        """Reads the GPU pods' cgroup signals each pass (None: not read)."""
        self.stop = threading.Event()
        self._flushing = threading.Lock()
        self._conflicting: set[str] = set()
        """GPUs refused by the store (another node or model), each warned about once."""

    def sample_once(self) -> NodeReading:
        """One pass: read, map, append to the buffer."""
        started = time.perf_counter()
        reading = self.reader.read()
        held: tuple[Holding, ...] = ()
        mapped = self.holders is not None
        if self.holders is not None:
            try:
                held = holdings(reading, self.holders.list_gpu_holders())
            except AuditorError as e:
                self.metrics.mapping_errors.inc()
                log.warning("%s", e)
                mapped = False
        for problem in reading.problems:
            log.warning("device unreadable: %s", problem)
        tenants = tuple(getattr(reading, "tenants", ()))  # a reader may read none
        self.metrics.tenant_samples.inc(len(tenants))
        self.metrics.unattributed_processes.inc(getattr(reading, "unattributed", 0))
        cards = tuple(getattr(reading, "card_signals", ()))
        self.metrics.card_signals.inc(len(cards))
        self.metrics.unsupported_card_signals.inc(getattr(reading, "unsupported_signals", 0))
        pod_signals = self._pod_signals(reading, tenants)
        batch = Batch(
            tuple(reading.gpus), tuple(reading.samples), held, tenants, pod_signals, cards
        )
        if self.streaks is not None and mapped:  # a failed mapping keeps the streaks as they were
            self.streaks.update(taken_ms=reading.taken_ms, samples=reading.samples, held=held)
        dropped = self.buffer.push(batch)
        self.metrics.passed(
            gpus=len(batch.gpus),
            problems=len(reading.problems),
            dropped=dropped,
            buffered=len(self.buffer),
            at=self.clock(),
            seconds=time.perf_counter() - started,
        )
        return reading

    def _pod_signals(
        self, reading: NodeReading, tenants: Sequence[TenantSample]
    ) -> tuple[PodSignal, ...]:
        """The cgroup signals of the pods on the node's cards (their processes' pods); a
        pod whose files fail is logged, counted and skipped."""
        if self.cgroups is None:
            return ()
        pods = {t.pod_uid for t in tenants} | set(getattr(reading, "card_pods", ()))
        try:
            found, errors = self.cgroups.read(pods, now_ms=reading.taken_ms)
        except Exception as e:  # never the pass: a broken tree is counted
            self.metrics.cgroup_errors.inc(len(pods))
            log.warning("cgroup signals unreadable: %s", e)
            return ()
        for error in errors:
            log.warning("cgroup signal skipped: %s", error)
        self.metrics.cgroup_errors.inc(len(errors))
        self.metrics.pod_signals.inc(len(found))
        return tuple(found)

    def flush(self) -> bool:
        """Write buffered passes, oldest first, until empty or the store fails."""
        with self._flushing:
            return self._flush()

    def _flush(self) -> bool:
        try:
            return self._flush_buffered()
        except BufferStorageError as e:  # stored batches are written again next time: harmless
            log.warning("%s", e)
            return False

    def _flush_buffered(self) -> bool:
        while True:
            items = self.buffer.oldest(self.settings.flush_batches)
            pending = self.buffer.unresolved()
            if not items and not pending:
                return True
            try:
                written = self.sink.write([b for _, b in items], pending=pending)
            except Exception as e:
                if not self.sink.is_refusal(e):  # the store is down or busy: keep the passes
                    self.metrics.store_errors.inc()
                    log.warning("store write failed, %d passes kept: %s", len(self.buffer), e)
                    return False
                written = self._write_alone(items, pending, e)
            self._refused(written)
            left = written.unresolved
            now_ms = int(self.clock() * 1000)
            keep_after = now_ms - int(self.settings.holding_ttl_s * 1000)
            upto = items[-1][0] if items else 0
            dropped = self.buffer.stored(upto_seq=upto, unresolved=left, keep_after_ms=keep_after)
            self.metrics.stored(
                samples=sum(len(b.samples) for _, b in items),
                holdings_dropped=dropped,
                unresolved=len(self.buffer.unresolved()),
                buffered=len(self.buffer),
            )
            if len(items) < self.settings.flush_batches:
                return True

    def _write_alone(
        self, items: Sequence[tuple[int, Batch]], pending: Sequence[Holding], error: Exception
    ) -> Written:
        """The store refused these passes for their data: write each alone, and drop (and
        count) those it refuses again, rather than retrying them forever. Holdings still
        waiting for their pod go with the first pass; if they are what is refused, they are
        dropped. A store that goes down meanwhile raises, and the passes stay buffered."""
        log.warning("the store refused a write for its data, writing passes one by one: %s", error)
        unresolved: list[Holding] = []
        conflicts: list[GpuConflict] = []
        skipped = 0
        for seq, batch in items:
            for attempt in (pending, ()) if pending else ((),):
                try:
                    written = self.sink.write([batch], pending=attempt)
                except Exception as e:
                    if not self.sink.is_refusal(e):
                        raise
                    if attempt:  # perhaps it was the holdings: try the pass alone
                        self.metrics.dropped_holdings.inc(len(pending))
                        pending = ()
                        continue
                    self.metrics.refused_passes.inc()
                    log.warning("dropping a pass the store refuses (pass %d): %s", seq, e)
                    break
                unresolved += written.unresolved
                conflicts += written.conflicts
                skipped += written.skipped_samples
                pending = ()
                break
        return Written(unresolved, tuple(conflicts), skipped)

    def _refused(self, written: Written) -> None:
        """Count the samples of GPUs the store has elsewhere; warn once per card."""
        self.metrics.conflict_samples.inc(written.skipped_samples)
        for c in written.conflicts:
            if c.uuid not in self._conflicting:
                self._conflicting.add(c.uuid)
                log.warning(
                    "GPU %s is recorded on the store with %s %r, this node reads %r: its "
                    "samples are skipped (a GPU UUID is one card; see README 'A GPU on two "
                    "nodes')",
                    c.uuid,
                    c.field,
                    c.stored,
                    c.new,
                )
        self.metrics.conflicting_gpus.set(len(self._conflicting))

    def run(self, *, max_passes: int | None = None) -> None:
        """Pass every period, on the period's grid (no drift), until `stop` is set or after
        `max_passes`; a flusher thread stores the buffer meanwhile, so a slow or unreachable
        store never delays a pass. Flushes once more at the end."""
        flusher = threading.Thread(target=self._flush_loop, name="sampler-flush", daemon=True)
        flusher.start()
        passes = 0
        period = self.settings.period_s
        next_at = self.clock()
        try:
            while not self.stop.is_set():
                self.sample_once()
                passes += 1
                if max_passes is not None and passes >= max_passes:
                    break
                next_at += period
                now = self.clock()
                if next_at < now:  # fell behind: skip to the next slot of the grid
                    next_at = now + period - (now - next_at) % period
                self.stop.wait(max(0.0, next_at - now))
        finally:
            self.stop.set()
            flusher.join()
            self.flush()

    def _flush_loop(self) -> None:
        while not self.stop.wait(self.settings.flush_every_s):
            self.flush()
