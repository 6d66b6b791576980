"""How a one-shot command asks the C allocator for memory: keep what it frees.

The classifier works on NumPy arrays of one to a few hundred megabytes, made and dropped by
the hundred in one command. glibc's malloc hands every allocation above 128 KiB (a
threshold it raises as such blocks are freed) straight to the kernel with `mmap`, and
gives freed memory at the top of the heap back; each new array then takes a page fault
per 4 KiB it touches, and under a hypervisor those faults cost more than the arithmetic
(the classification of one job's 113 thousand samples: 80-83 ms as glibc sets it, 47-50 ms
with freed memory kept). So `keep_freed_memory` serves arrays up to `MMAP_THRESHOLD` from the
heap and keeps up to `TRIM_THRESHOLD` of freed heap for the next ones.

Only for commands that end (audit, report, explain, whatif, imports): the peak is the same
(memory is reused, not added), but a service that ran once at its peak would keep that
memory for the rest of its life. The sampler and the pod watcher leave glibc as it is.
Nothing changes off glibc (macOS, musl), nor where the user tuned glibc's malloc already
(a `MALLOC_…_` variable or `glibc.malloc` in `GLIBC_TUNABLES`): theirs wins.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""mallopt's parameter numbers (glibc's malloc.h)."""

MMAP_THRESHOLD = 32 << 20
"""The largest block glibc serves from the heap on request (HEAP_MAX_SIZE / 2)."""
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Ask glibc to serve blocks up to `MMAP_THRESHOLD` from the heap and keep up to
    `TRIM_THRESHOLD` of it freed; True where it agreed. Setting either fixes both (glibc
    stops moving its own thresholds)."""
    if platform.libc_ver()[0] != "glibc" or _tuned_by_user(os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def _tuned_by_user(environ: Mapping[str, str]) -> bool:
    return any(k.startswith("MALLOC_") for k in environ) or "glibc.malloc." in environ.get(
        "GLIBC_TUNABLES", ""
    )
