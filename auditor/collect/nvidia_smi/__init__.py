"""Reads `nvidia-smi --query-gpu ... --format=csv` logs into GPU records and samples.

This package owns the nvidia-smi CSV format: which columns it reads, how a header line is
recognised, what counts as a missing reading, how the node's local time becomes epoch
milliseconds UTC, and which lines are errors. It is a pure parser: no database, no clock.

The format, as `nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits] -l N` writes it:

* Cells are separated by commas and padded with spaces; nvidia-smi never quotes, so a cell is
  the text between two commas, stripped.
* A header line names the fields, with units in brackets (`memory.used [MiB]`); `nounits`
  drops the units from the values but not from the header. A line is a header when its first
  cell names a known field or any of its cells names a required one; the fields may come in
  any order, any superset of the required `timestamp`, `index`, `utilization.gpu`, `memory.used`.
  Every header cell must be a known `--query-gpu` property (`auditor/data/nvidia_smi_fields.txt`)
  unless `ignore_unknown_columns` is set. A repeated header is skipped; a different header
  (files concatenated) applies to the lines after it.
* Without a header (`noheader`) the columns must be exactly the four default ones, in this
  order: timestamp, index, utilization.gpu, memory.used.
* Values carry their unit (`38 %`, `575 MiB`, `28.16 W`) or not (`nounits`); a bracketed value
  (`[N/A]`, `[Not Supported]`, `[Unknown Error]`, ...) or `N/A` is a reading the driver could
  not make and becomes `None`, never 0. MIG-enabled GPUs report `utilization.gpu` as `[N/A]`.
* Timestamps are `YYYY/MM/DD HH:MM:SS.mmm` (milliseconds optional) in the node's local time,
  without a zone; they are read in `tz`. A local time that occurs twice (the hour a clock is
  set back) is read as its first occurrence, unless that would put it more than a minute
  before a time already read from the file and the second occurrence would not: a log runs
  forward, so it is then in the repeated hour.
* nvidia-smi ends every line with a newline, so a last line without one is an interrupted
  write: it is dropped when it has fewer cells than the header or its last cell does not
  parse. Anywhere else such a line is an error.

Its modules, in the order a line meets them: `reader` (the file, its chunks, the entry
points), `layout` (the header), `fast` (plain chunks, vectorised) or `rows` (one line at a
time, and the book of GPUs both share), `cells` (one cell), `clock` (local time to UTC),
`blocks` (what is yielded).
"""

from auditor.collect.nvidia_smi.blocks import SampleBlock
from auditor.collect.nvidia_smi.clock import EARLIEST_MS
from auditor.collect.nvidia_smi.layout import (
    CAPTURE_COMMAND,
    DEFAULT_FIELDS,
    REQUIRED_FIELDS,
    known_fields,
)
from auditor.collect.nvidia_smi.reader import (
    CHUNK_LINES,
    PROGRESS_EVERY_LINES,
    read_nvidia_smi,
    read_nvidia_smi_blocks,
)

__all__ = [
    "CAPTURE_COMMAND",
    "CHUNK_LINES",
    "DEFAULT_FIELDS",
    "EARLIEST_MS",
    "PROGRESS_EVERY_LINES",
    "REQUIRED_FIELDS",
    "SampleBlock",
    "known_fields",
    "read_nvidia_smi",
    "read_nvidia_smi_blocks",
]
