"""The one exception hierarchy: every foreseeable failure a user can cause or meet.

The CLI turns these into a one-line message and an exit code; nothing else reaches
a user as a traceback.
"""

from __future__ import annotations

MAX_SHOWN = 40
"""Characters of a bad value an error message echoes: a 10 MB cell must not make a 10 MB line."""


MAX_FIELD = 120
MAX_PATH = 100
MAX_LINE = 280
"""An error is one line a person reads (with `auditor: error: ` before it, under 300
characters): a path is shown by its last `MAX_PATH` characters, a field by its first
`MAX_FIELD`, and the message fills the rest of `MAX_LINE`."""


WORD_BACK = 40
"""How far back from the limit a message is cut at a space rather than inside a word."""


def cut_at_word(message: str, room: int) -> str:
    """`message` if it fits in `room` characters, else its start up to the last whole word
    that fits (within `WORD_BACK` of the limit; else wherever it fits) and `…`."""
    if len(message) <= room:
        return message
    head = message[: room - 1]
    space = head.rfind(" ")
    if space >= room - 1 - WORD_BACK and space > 0:
        head = head[:space].rstrip(" ,;:(")
    return f"{head}…"


def shown(value: object, keep: int = MAX_SHOWN) -> str:
    """`repr(value)` cut to `keep` characters (containers by their type alone)."""
    text = type(value).__name__ if isinstance(value, dict | list) else repr(value)
    return text if len(text) <= keep else f"{text[:keep]}… ({len(text)} characters)"


class AuditorError(Exception):
    """Base of every error the auditor raises on purpose."""

    exit_code = 1


class InputError(AuditorError):
    """Bad input: names the file, the line (1-based) and the field where known."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            path = self.file if len(self.file) <= MAX_PATH else f"…{self.file[-MAX_PATH:]}"
            where = path
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        field = f"field {shown(self.field, MAX_FIELD)}: " if self.field else ""
        room = max(MAX_LINE - len(where) - len(field), 40)
        return f"{where}{field}{cut_at_word(self.message, room)}"


class PodFieldError(InputError):
    """A field of a Kubernetes object that cannot be read. `value` is what the field held, so
    that a reader of a file can point at its line; `field` is relative to the object."""

    def __init__(self, message: str, *, field: str, value: object = None) -> None:
        super().__init__(message, field=field)
        self.value = value


class ConfigError(InputError):
    """A configuration file or option that cannot be used."""


class StoreError(AuditorError):
    """The database cannot be reached or is not at the expected schema."""

    exit_code = 3


class GpuConflictError(InputError):
    """A GPU UUID that the store (or the same input) already has on another node or as
    another model: one UUID is one physical card, and its past samples stay where they were
    taken, so the write is refused rather than moving them."""

    def __init__(
        self,
        *,
        uuid: str,
        field: str,
        stored: str,
        new: str,
        file: str | None = None,
        line: int | None = None,
    ) -> None:
        self.uuid = uuid
        self.conflict = field
        self.stored = stored
        self.new = new
        if field == "node":
            message = (
                f"GPU {uuid} is already recorded on node {stored!r}, not {new!r}; nothing was "
                "written: check --node (for Prometheus, --node-label). A GPU UUID is one "
                "physical card and its samples stay on the node that took them (README: 'A "
                "GPU on two nodes')"
            )
        elif field == "cluster":
            message = (
                f"GPU {uuid} is already recorded in cluster {stored!r}, not {new!r}; nothing "
                "was written: check --cluster (or `cluster` in the config). A GPU UUID is one "
                "physical card and its samples stay in the cluster that took them"
            )
        else:
            message = (
                f"GPU {uuid} is already recorded as {field} {stored!r}, not {new!r}; nothing "
                "was written: one GPU UUID is one physical card, so one of the two sources "
                "names the wrong card (README: 'A GPU on two nodes')"
            )
        super().__init__(message, file=file, line=line)
