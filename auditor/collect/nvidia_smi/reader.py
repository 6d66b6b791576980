"""The nvidia-smi reader's entry points: a log file read as (GPU, sample) pairs
(`read_nvidia_smi`) or column blocks (`read_nvidia_smi_blocks`), streamed in chunks.

It owns the file: its encoding (UTF-8, or UTF-16 after a byte-order mark), the chunks, the
progress callback, what reading has found so far (`_State`: layout, header, line number,
counts), which lines are headers, blank or cut short, and the `InputError` with file, line
and field that a bad cell becomes. Each chunk goes to the fast path (`fast.py`) when its
lines are plain, else to the row parser (`rows.py`).
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, tzinfo
from pathlib import Path

from auditor.collect.nvidia_smi.blocks import SampleBlock, pairs_block
from auditor.collect.nvidia_smi.cells import BadCell
from auditor.collect.nvidia_smi.fast import Slow, fast_block
from auditor.collect.nvidia_smi.layout import (
    CAPTURE_COMMAND,
    DEFAULT_LAYOUT,
    cell_count_error,
    header_layout,
    header_name,
    is_header,
)
from auditor.collect.nvidia_smi.rows import RowParser
from auditor.errors import InputError
from auditor.model import GpuRecord, GpuSample

PROGRESS_EVERY_LINES = 10_000
"""How often, in lines, `on_progress` is told how many bytes have been read."""


def _encoding(raw: io.BufferedReader) -> str:
    """UTF-8, or UTF-16 when a byte-order mark says so (PowerShell 5 redirects write it)."""
    head = raw.peek(4)[:4]
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    return "utf-8-sig"


CHUNK_LINES = PROGRESS_EVERY_LINES
"""Lines read and parsed at a time (the first chunk is shorter: it holds the header)."""
_FIRST_CHUNK_LINES = 64


def read_nvidia_smi(
    path: Path,
    *,
    node: str,
    tz: tzinfo = UTC,
    ignore_unknown_columns: bool = False,
    on_progress: Callable[[int], None] | None = None,
    gpu_lines: dict[str, int] | None = None,
    not_after_ms: int | None = None,
    columns: Sequence[str] | None = None,
) -> Iterator[tuple[GpuRecord, GpuSample]]:
    """Yield one (GPU, sample) per data row of an nvidia-smi CSV log, streaming the file.

    `node` names the machine the log came from; a GPU is identified by its `uuid`, else
    `NODE/pci.bus_id`, else `NODE/index`; a log with none of those columns is one GPU,
    `NODE/0`. `tz` is the node's time zone (nvidia-smi writes local time without one).
    `columns` are the fields of a file without a header (the list given to `--query-gpu`);
    without it such a file must have the default four. `on_progress` receives the number
    of bytes read so far every `PROGRESS_EVERY_LINES` lines and at the end. Duplicate rows
    are yielded as they come. `gpu_lines`, if given, is filled in with the line where each
    GPU first appears (for errors found later, such as the store's conflict check). One GPU
    UUID showing two indexes or two models is an error on the line of the second. A time
    before 2000 or after `not_after_ms` (the caller's "now", with a margin) is refused: a
    node whose clock was reset writes 1970, and one such sample would stretch every audit
    of all data over decades. So is a local time that does not exist in `tz` (the hour
    skipped in spring).

    Raises `InputError` naming the file, line and field for bad input, including a file that
    cannot be read, holds no sample, or is not a CSV at all (nvidia-smi's table or `-q`
    output). Being a generator, it opens the file and raises only as it is iterated: a
    caller that must not act on part of a bad file (an import is one transaction) consumes
    it inside that transaction.
    """
    for block in read_nvidia_smi_blocks(
        path,
        node=node,
        tz=tz,
        ignore_unknown_columns=ignore_unknown_columns,
        on_progress=on_progress,
        gpu_lines=gpu_lines,
        not_after_ms=not_after_ms,
        columns=columns,
    ):
        yield from block.pairs()


def read_nvidia_smi_blocks(
    path: Path,
    *,
    node: str,
    tz: tzinfo = UTC,
    ignore_unknown_columns: bool = False,
    on_progress: Callable[[int], None] | None = None,
    gpu_lines: dict[str, int] | None = None,
    not_after_ms: int | None = None,
    columns: Sequence[str] | None = None,
) -> Iterator[SampleBlock]:
    """`read_nvidia_smi`, a block of lines at a time, column by column (same arguments).

    Each chunk of lines is parsed vectorised when it is plain (the lines nvidia-smi writes:
    ASCII, one space after each comma, units where the header says, the header repeated
    as it was); anything else, including any bad cell, is read by the row parser from the
    same state, which gives the same values or the one-line error with its line and field.
    """
    file = str(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as e:
        raise InputError(f"cannot read the file: {e.strerror or e}", file=file) from e
    with raw:
        state = _State(
            file=file,
            reader=RowParser(node=node, tz=tz, gpu_lines=gpu_lines, not_after_ms=not_after_ms),
            ignore_unknown=ignore_unknown_columns,
        )
        if columns is not None:
            try:
                state.layout = header_layout(list(columns), ignore_unknown=ignore_unknown_columns)
            except BadCell as bad:
                raise InputError(bad.message, field=bad.field or "--columns") from None
            state.from_option = True
        if _encoding(raw) == "utf-16":
            text = io.TextIOWrapper(raw, encoding="utf-16", errors="replace", newline="")
            while lines := list(itertools.islice(text, CHUNK_LINES)):
                block = state.slow(lines)
                if on_progress is not None:
                    on_progress(raw.tell())
                if block is not None:
                    yield block
        else:
            if raw.peek(3)[:3] == b"\xef\xbb\xbf":
                raw.read(3)
            size = _FIRST_CHUNK_LINES
            read = 0
            while chunk := list(itertools.islice(raw, size)):
                read += len(chunk)
                size = CHUNK_LINES - read % CHUNK_LINES
                block = state.chunk(b"".join(chunk), len(chunk))
                if on_progress is not None and read % PROGRESS_EVERY_LINES == 0:
                    on_progress(raw.tell())
                if block is not None:
                    yield block
        if on_progress is not None:
            on_progress(raw.tell())
    if state.samples == 0:
        if state.dropped is not None:
            raise state.dropped
        raise InputError("no samples: the file has no data rows", file=file)


_NOT_CSV = re.compile(
    r"(\+-|\||=+|<\?xml|<nvidia_smi_log)|.*NVSMI LOG"
    r"|[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ \d\d:\d\d:\d\d \d{4}\s*\Z"
    r"|[A-Za-z][\w .()/-]*? +: "
)
"""The first line of nvidia-smi's table (its date line or a frame), of `-q` or `-q -x`."""


class _State:
    """What reading a file has found so far: the layout, the clock, the cards, the counts."""

    def __init__(self, *, file: str, reader: RowParser, ignore_unknown: bool) -> None:
        self.file = file
        self.reader = reader
        self.ignore_unknown = ignore_unknown
        self.layout = DEFAULT_LAYOUT
        self.from_option = False
        self.header: bytes | None = None
        """The header line as the file writes it, for the fast path to skip its repeats."""
        self.line_no = 0
        self.samples = 0
        self.dropped: InputError | None = None
        self.content = False
        """Whether a non-blank line has been seen (the first one may show a table)."""

    def chunk(self, data: bytes, count: int) -> SampleBlock | None:
        """The block of `count` complete or final lines; fast when the lines are plain."""
        if self.content and data.endswith(b"\n"):
            fast = _fast_block(self, data)
            if fast is not None:
                self.line_no += count
                self.samples += len(fast)
                return fast
        text = data.decode("utf-8", errors="replace")
        return self.slow(io.StringIO(text, newline=""))

    def slow(self, lines: Iterable[str]) -> SampleBlock | None:
        """The row parser over lines; raises the `InputError` of the first bad one."""
        layout = self.layout
        reader = self.reader
        pairs: list[tuple[GpuRecord, GpuSample]] = []
        for line in lines:
            self.line_no += 1
            line_no = self.line_no
            if "\ufffd" in line:
                raise InputError("not text: bytes that are not UTF-8", file=self.file, line=line_no)
            complete = line.endswith(("\n", "\r"))
            body = line.rstrip("\r\n")
            if not body.strip():
                continue
            if not self.content:
                self.content = True
                if _NOT_CSV.match(body.lstrip()):
                    raise InputError(
                        "not a CSV: this looks like nvidia-smi's table or -q output; capture "
                        f"a CSV log with {CAPTURE_COMMAND}",
                        file=self.file,
                        line=line_no,
                    )
            cells = [c.strip() for c in body.split(",")]
            try:
                if is_header(cells):
                    if not complete:
                        continue  # a header cut short adds nothing
                    if [header_name(c) for c in cells] != list(layout.names):
                        layout = header_layout(cells, ignore_unknown=self.ignore_unknown)
                        self.layout = layout
                        self.from_option = False
                    self.header = body.encode() if body.isascii() else None
                    continue
                if len(cells) != len(layout.names):
                    if not complete and len(cells) < len(layout.names):
                        continue  # an interrupted last write
                    raise cell_count_error(layout, len(cells), from_option=self.from_option)
                pairs.append(reader.sample(cells, layout, line=line_no))
            except BadCell as bad:
                field = bad.field
                if field is None and 0 <= bad.column < len(layout.names):
                    field = layout.names[bad.column]
                error = InputError(bad.message, file=self.file, line=line_no, field=field)
                if not complete and bad.column == len(layout.names) - 1:
                    self.dropped = error  # the last cell of an interrupted last write
                    continue
                raise error from None
        self.samples += len(pairs)
        return pairs_block(pairs) if pairs else None


def _fast_block(state: _State, data: bytes) -> SampleBlock | None:
    """The chunk `data` parsed by the fast path from the reader's state, or None (and no
    state changed) to leave it to the row parser."""
    try:
        return fast_block(
            data,
            layout=state.layout,
            header=state.header,
            first_line=state.line_no + 1,
            clock=state.reader.clock,
            cards=state.reader.cards,
        )
    except Slow:
        return None
