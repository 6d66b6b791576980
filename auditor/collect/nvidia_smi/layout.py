"""The header of an nvidia-smi CSV log: which fields it names, where each one this reader
uses sits in a line (`Layout`), and which lines are headers.

It owns the field names (the required and default ones, the equivalent columns a driver
may write for one reading, the `--query-gpu` properties of `auditor/data/nvidia_smi_fields.txt`)
and the errors of a header, or of a line whose cells do not match it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

from auditor.collect.nvidia_smi.cells import BadCell

REQUIRED_FIELDS: tuple[str, ...] = ("timestamp", "utilization.gpu", "memory.used")
"""Fields every file must have (a one-GPU log may have nothing else)."""
DEFAULT_FIELDS: tuple[str, ...] = ("timestamp", "index", "utilization.gpu", "memory.used")
"""The columns, in order, of a file without a header and without `--columns`."""
CAPTURE_COMMAND = (
    "nvidia-smi --query-gpu=timestamp,uuid,index,utilization.gpu,memory.used,memory.total "
    "--format=csv -l 5"
)
"""How to capture a log this reader takes, as error messages tell it."""

UUID = ("uuid", "gpu_uuid")
PCI = ("pci.bus_id",)
NAME = ("name", "gpu_name")
MEMORY_TOTAL = ("memory.total",)
POWER = (
    "power.draw",
    "power.draw.instant",
    "gpu.power.draw.instant",
    "power.draw.average",
    "gpu.power.draw.average",
)
SM_CLOCK = ("clocks.current.sm", "clocks.sm")
THROTTLE = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
TEMPERATURE = ("temperature.gpu",)

_UNIT_IN_HEADER = re.compile(r"\s*\[[^\]]*\]\Z")


@cache
def known_fields() -> frozenset[str]:
    """Every property name (and alias) `nvidia-smi --query-gpu` accepts, from the data file."""
    text = resources.files("auditor").joinpath("data/nvidia_smi_fields.txt").read_text("utf-8")
    lines = (line.strip() for line in text.splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each field this reader uses sits in a line, from a header or the default."""

    names: tuple[str, ...]
    timestamp: int
    index: int | None
    util: int
    memory_used: int
    uuid: tuple[int, ...]
    pci: tuple[int, ...]
    name: tuple[int, ...]
    memory_total: tuple[int, ...]
    power: tuple[int, ...]
    sm_clock: tuple[int, ...]
    throttle: tuple[int, ...]
    temperature: tuple[int, ...]

    @classmethod
    def of(cls, names: Sequence[str]) -> Layout:
        first: dict[str, int] = {}
        for column, name in enumerate(names):
            first.setdefault(name, column)

        def find(candidates: tuple[str, ...]) -> tuple[int, ...]:
            return tuple(first[n] for n in candidates if n in first)

        return cls(
            names=tuple(names),
            timestamp=first["timestamp"],
            index=first.get("index"),
            util=first["utilization.gpu"],
            memory_used=first["memory.used"],
            uuid=find(UUID),
            pci=find(PCI),
            name=find(NAME),
            memory_total=find(MEMORY_TOTAL),
            power=find(POWER),
            sm_clock=find(SM_CLOCK),
            throttle=find(THROTTLE),
            temperature=find(TEMPERATURE),
        )


DEFAULT_LAYOUT = Layout.of(DEFAULT_FIELDS)
"""The layout of a file without a header and without `--columns`."""


def header_name(cell: str) -> str:
    """The field a header cell names, without its unit: `memory.used [MiB]` → `memory.used`."""
    return _UNIT_IN_HEADER.sub("", cell) if cell.endswith("]") else cell


def is_header(cells: Sequence[str]) -> bool:
    """Whether a line is a header: its first cell names a known field, or any cell a
    default one."""
    if cells[0][:1].isdigit():
        return False  # field names start with a letter; a timestamp or index does not
    if header_name(cells[0]) in known_fields():
        return True
    return any(header_name(c) in DEFAULT_FIELDS for c in cells if c.startswith(DEFAULT_FIELDS))


def header_layout(cells: Sequence[str], *, ignore_unknown: bool) -> Layout:
    """The layout a header line declares; raises `BadCell` for unknown or missing fields."""
    names = [header_name(c) for c in cells]
    if not ignore_unknown:
        known = known_fields()
        for column, name in enumerate(names):
            if name not in known:
                raise BadCell(
                    column,
                    "unknown column: not an nvidia-smi --query-gpu property "
                    "(pass --ignore-unknown-columns to skip columns a newer driver added)",
                    field=name,
                )
    for required in REQUIRED_FIELDS:
        if required not in names:
            raise BadCell(
                -1,
                f"missing required column {required!r}: the file must have "
                f"{', '.join(REQUIRED_FIELDS)} ({CAPTURE_COMMAND})",
                field=required,
            )
    return Layout.of(names)


def cell_count_error(layout: Layout, found: int, *, from_option: bool = False) -> BadCell:
    """A line with too few or too many cells, naming the first missing field if any."""
    expected = len(layout.names)
    message = f"expected {expected} cells as in the header, found {found}"
    if from_option:
        message = f"expected {expected} cells as --columns says, found {found}"
    elif layout is DEFAULT_LAYOUT:
        message = (
            f"expected {expected} cells, found {found}; without a header line the columns "
            f"must be {', '.join(DEFAULT_FIELDS)}, or name them with --columns"
        )
    missing = layout.names[found] if found < expected else None
    return BadCell(-1, message, field=missing)
