"""What a value may be to be stored: integer ranges, text lengths, characters. Pure, no I/O.

The schema (`auditor.store.schema`) takes its column lengths from here, and the readers
fit what they derive from user-controlled strings (a team from a 300-character annotation,
a job from a label) to them before a record is built, so that every record a reader returns
can be written. What cannot be fitted (an integer out of range, a UID too long) is refused
by the reader for that one object.

Two characters can never be stored whatever the column: NUL (PostgreSQL text refuses it)
and a lone UTF-16 surrogate (JSON `"\\ud800"` decodes to one; neither SQLite nor PostgreSQL
can encode it as UTF-8). `clean_text` replaces both with U+FFFD.
"""

from __future__ import annotations

import hashlib
import re

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

NAME_MAX = 253
"""A Kubernetes object name, namespace, node name; a team."""
UID_MAX = 64
KIND_MAX = 64
WORKLOAD_MAX = 32
JOB_MAX = 512
GANG_MAX = 600
RESOURCE_MAX = 128
PHASE_MAX = 32
VERSION_MAX = 64
GPU_UUID_MAX = 128
GPU_MODEL_MAX = 128
THROTTLE_MAX = 64
UTIL_SOURCE_MAX = 64
"""The metric or reader a GPU's utilisation came from (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`, `nvml`)."""
SHARE_TEXT_MAX = 32
"""A pod's share kind (`runai-reservation`) or a MIG profile (`1c.3g.40gb`)."""
METRIC_MAX = 200
"""A Prometheus metric name an output or latency was read from (`vllm:generation_tokens_total`)."""
UNIT_MAX = 64
REASON_MAX = 64
"""A scheduler's condition reason (`Unschedulable`, `SchedulingGated`)."""
SOURCE_MAX = 1000
"""Where an import read from, as its ledger records it: a file's path, a Prometheus URL."""
MESSAGE_MAX = 300
"""A scheduler's message as stored (cut with an ellipsis beyond)."""
"""An output unit: `tokens`, `requests`, `samples`, `steps`."""

MAX_GPUS_PER_POD = 100_000
"""More GPU units than any node has, even counted as gpu-milli or time-slicing replicas; a
pod asking for more holds nothing a scheduler could place, and is refused as unreadable."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` with NUL and lone surrogates replaced by U+FFFD; the same object when clean."""
    return _UNSTORABLE.sub("\ufffd", text) if _UNSTORABLE.search(text) else text


def is_clean(text: str) -> bool:
    return _UNSTORABLE.search(text) is None


def fit_text(text: str, limit: int) -> str:
    """`text` cleaned and, when longer than `limit` characters, cut to fit with a marker and
    a short digest of the whole, so two long names that share a prefix stay apart."""
    text = clean_text(text)
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    tail = f"…{digest}"
    return text[: limit - len(tail)] + tail


def in_int32(value: int) -> bool:
    return INT32_MIN <= value <= INT32_MAX
