"""The row parser: the cells of one data line as a GPU and a sample, under a layout.

It owns which GPU a line is about (`identity`: `uuid`, else `NODE/pci.bus_id`, else
`NODE/index`, else the one GPU `NODE/0`) and the book of the GPUs a file has shown
(`Cards`): one record object per set of GPU facts, and one UUID being one card, with
one index and one model, throughout a file. The fast path (`fast.py`) shares the book.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import tzinfo

from auditor.collect.nvidia_smi.cells import (
    BadCell,
    first_hex,
    first_number,
    first_text,
    gpu_index,
    number,
)
from auditor.collect.nvidia_smi.clock import LocalClock
from auditor.collect.nvidia_smi.layout import Layout
from auditor.errors import shown
from auditor.model import GpuRecord, GpuSample

Fact = tuple[str, int | None, str | None, float | None]
"""What a line says of its GPU: UUID, index, model and total memory."""
Checkpoint = tuple[dict[str, tuple[int, int | None, str | None]], dict[str, int] | None]
"""The book's cards and the caller's `gpu_lines`, as `Cards.checkpoint` saw them."""


def identity(
    cells: Sequence[str], layout: Layout, index: int | None, *, node: str
) -> tuple[str, int | None]:
    """The GPU's UUID and index: `uuid`, else `NODE/pci.bus_id`, else `NODE/index`; a log
    with none of those columns is a one-GPU log, index 0."""
    uuid = first_text(cells, layout.uuid)
    if uuid is not None:
        return uuid, index
    bus = first_text(cells, layout.pci)
    if bus is not None:
        return f"{node}/{bus}", index
    if index is not None:
        return f"{node}/{index}", index
    if layout.index is None and not layout.uuid and not layout.pci:
        return f"{node}/0", 0
    column = layout.index if layout.index is not None else (layout.uuid or layout.pci)[0]
    raise BadCell(column, "no uuid, pci.bus_id or index: cannot tell which GPU this is")


class Cards:
    """The GPUs of one file: a record per set of facts, and per UUID its first line,
    index and model. `gpu_lines`, when given, is filled in with each UUID's first line."""

    def __init__(self, *, node: str, gpu_lines: dict[str, int] | None) -> None:
        self.node = node
        self._records: dict[Fact, GpuRecord] = {}
        self._cards: dict[str, tuple[int, int | None, str | None]] = {}
        """Per UUID: the line it first appears on, its index and model (once known)."""
        self.gpu_lines = gpu_lines

    def known(self, fact: Fact) -> GpuRecord | None:
        """The record of facts already admitted (while it is cached), else None."""
        return self._records.get(fact)

    def admit(self, fact: Fact, *, line: int, layout: Layout) -> GpuRecord:
        """The record of new facts, seen first on `line`; `BadCell` when they contradict
        what the file said of the same UUID before."""
        uuid, index, model, _ = fact
        self._check_card(uuid, index, model, line=line, layout=layout)
        return self._record(fact)

    def checkpoint(self) -> Checkpoint:
        """What `roll_back` returns to: the cards and `gpu_lines` as they are now."""
        return dict(self._cards), None if self.gpu_lines is None else dict(self.gpu_lines)

    def roll_back(self, to: Checkpoint) -> None:
        """Forget the cards admitted since `to` (the fast path gave a chunk up)."""
        cards, lines = to
        self._cards = cards
        if self.gpu_lines is not None and lines is not None:
            self.gpu_lines.clear()
            self.gpu_lines.update(lines)

    def _check_card(
        self, uuid: str, index: int | None, model: str | None, *, line: int, layout: Layout
    ) -> None:
        """One UUID is one card: it keeps its index and model throughout a file."""
        known = self._cards.get(uuid)
        if known is None:
            self._cards[uuid] = (line, index, model)
            if self.gpu_lines is not None:
                self.gpu_lines[uuid] = line
            return
        first_line, first_index, first_model = known
        clash = f"one UUID is one card (are two nodes' logs in one file?); GPU {uuid}"
        if index is not None and first_index is not None and index != first_index:
            raise BadCell(
                layout.index if layout.index is not None else -1,
                f"{clash} is index {index} here, index {first_index} on line {first_line}",
            )
        if model is not None and first_model is not None and model != first_model:
            raise BadCell(
                layout.name[0], f"{clash} is {model!r} here, {first_model!r} on line {first_line}"
            )
        if (first_index is None and index is not None) or (first_model is None and model):
            self._cards[uuid] = (
                first_line,
                first_index if index is None else index,
                first_model or model,
            )

    def _record(self, key: Fact) -> GpuRecord:
        """The same record object for the same GPU facts: a log repeats them every row."""
        uuid, index, model, memory_total = key
        record = self._records.get(key)
        if record is None:
            if len(self._records) >= 4096:
                self._records.clear()
            record = GpuRecord(
                uuid=uuid, node=self.node, index=index, model=model, memory_total_mib=memory_total
            )
            self._records[key] = record
        return record


class RowParser:
    """Turns the cells of one data line into a GPU and a sample, under a layout."""

    def __init__(
        self,
        *,
        node: str,
        tz: tzinfo,
        gpu_lines: dict[str, int] | None,
        not_after_ms: int | None = None,
    ) -> None:
        self.node = node
        self.clock = LocalClock(tz, not_after_ms=not_after_ms)
        self.cards = Cards(node=node, gpu_lines=gpu_lines)

    def sample(
        self, cells: Sequence[str], layout: Layout, *, line: int
    ) -> tuple[GpuRecord, GpuSample]:
        ts_ms = self.clock.epoch_ms(cells, layout.timestamp)
        index = gpu_index(cells, layout.index)
        util = number(cells, layout.util, unit="%")
        if util is not None and not 0 <= util <= 100:
            raise BadCell(
                layout.util, f"utilization must be 0-100 %, found {shown(cells[layout.util])}"
            )
        memory_total = first_number(cells, layout.memory_total, unit="MiB")
        memory_used = first_number(cells, (layout.memory_used,), unit="MiB")
        if memory_used is not None and memory_total is not None and memory_used > memory_total:
            raise BadCell(
                layout.memory_used,
                f"memory.used {memory_used:g} MiB is above memory.total {memory_total:g} MiB",
            )
        uuid, index = identity(cells, layout, index, node=self.node)
        temperature = None
        if layout.temperature:
            temperature = number(cells, layout.temperature[0], unit="C")
        sample = GpuSample(
            gpu_uuid=uuid,
            ts_ms=ts_ms,
            util=util,
            memory_used_mib=memory_used,
            memory_total_mib=memory_total,
            power_w=first_number(cells, layout.power, unit="W"),
            sm_clock_mhz=first_number(cells, layout.sm_clock, unit="MHz"),
            throttle_reasons=first_hex(cells, layout.throttle),
            temperature_c=temperature,
        )
        model = first_text(cells, layout.name)
        key = (uuid, index, model, memory_total)
        record = self.cards.known(key)
        if record is None:
            record = self.cards.admit(key, line=line, layout=layout)
        return record, sample
