"""Where an output file goes: a local path, or an object-store URL through fsspec.

Both are written whole or not at all, so that a reader (finance's import, node-exporter's
textfile collector, a mail job) never sees half a file:

- a local path (or `file://`) through a temporary file beside it, then a rename;
- `s3://`, `gs://` and `az://` (or `abfs://`) through obstore's fsspec filesystem
  (the `object-store` extra: one Rust library for the three clouds, with no dependency that
  clashes with the Kubernetes client's, as botocore's python-dateutil bound does), in one
  `pipe_file` call: one PUT of the whole body, never a partial object.

Credentials, region and endpoint come from the environment as each cloud's SDK names them
(`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL`, web identity tokens;
`GOOGLE_APPLICATION_CREDENTIALS` or the metadata server; `AZURE_STORAGE_ACCOUNT_NAME` with a
key, or workload identity), never from the auditor's own configuration. A filesystem is
made afresh for every write, so a long-lived process picks up rotated credentials.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from auditor.errors import InputError, StoreError

OBJECT_STORES = frozenset({"s3", "s3a", "gs", "az", "abfs", "abfss"})
"""URL schemes written to an object store."""


def scheme_of(target: str) -> str | None:
    """The URL scheme of `target` (lower case), or None for a plain path."""
    head, sep, _ = target.partition("://")
    if not sep or not head.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return None
    return head.lower()


MACHINE_FAULTS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.ENOMEM}
)
"""Failures of the machine rather than of the path given (exit 3, docs/faults.md): a full
disk or quota, an I/O error, a read-only filesystem. A missing folder or a permission is
the path's (exit 2)."""


def write_local(path: Path, data: bytes) -> None:
    """Write via a temporary file beside `path` and a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        reason = e.strerror or type(e).__name__
        if e.errno in MACHINE_FAULTS:
            raise StoreError(f"{path}: cannot write: {reason}") from e
        raise InputError(f"cannot write: {reason}", file=str(path)) from e


def check_target(target: str) -> None:
    """Refuse a URL scheme that cannot be written, before any work is done for it."""
    scheme = scheme_of(target)
    if scheme is not None and scheme != "file" and scheme not in OBJECT_STORES:
        known = ", ".join(f"{s}://" for s in ("s3", "gs", "az"))
        raise InputError(
            f"cannot write to {scheme}:// URLs: give a local path or {known}", field="--out"
        )


def write_output(target: str, data: bytes) -> None:
    """Write `data` whole to a local path or an object-store URL (see the module's text)."""
    check_target(target)
    scheme = scheme_of(target)
    if scheme is None:
        write_local(Path(target), data)
        return
    if scheme == "file":
        write_local(Path(target.partition("://")[2]), data)
        return
    try:
        from obstore.fsspec import FsspecStore
    except ImportError as e:
        raise InputError(
            f"{scheme}:// needs obstore: pip install 'gpu-waste-auditor[object-store]'",
            field="--out",
        ) from e
    # typed per protocol literal in obstore's stubs; `scheme` is one of OBJECT_STORES
    make: Callable[..., Any] = FsspecStore
    try:
        fs = make(scheme, skip_instance_cache=True)
        fs.pipe_file(target, data)
    except Exception as e:  # each SDK has its own errors (botocore's, google's, azure's)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot write: {reason}", file=target) from e
