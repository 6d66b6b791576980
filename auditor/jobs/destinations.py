"""Where an output file goes: a local path, or an object-store URL through fsspec.

Both are written whole or not at all, so that a reader (finance's import, node-exporter's
textfile collector, a mail job) never sees half a file:

- a local path (or `file://`) through a temporary file beside it, then a rename;
- `s3://`, `gs://` (`gcs://`) and `az://` (`abfs://`) through fsspec's filesystem for the
  scheme (s3fs, gcsfs, adlfs: the `object-store` extra), in one `pipe_file` call: the body
  is sent as one PUT (s3fs and gcsfs for anything this size; a multipart or block upload
  of a larger body is also only visible once committed), never a partial object.

Credentials, region and endpoint come from the environment as each SDK reads them
(`AWS_*` and `~/.aws`, Google's application default credentials, `AZURE_STORAGE_*`), never
from the auditor's own configuration. A filesystem is made afresh for every write, so a
long-lived process picks up rotated credentials.
"""

from __future__ import annotations

import os
from pathlib import Path

from auditor.errors import InputError

OBJECT_STORES: dict[str, str] = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}
"""URL schemes written through fsspec -> the package that provides each."""


def scheme_of(target: str) -> str | None:
    """The URL scheme of `target` (lower case), or None for a plain path."""
    head, sep, _ = target.partition("://")
    if not sep or not head.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return None
    return head.lower()


def write_local(path: Path, data: bytes) -> None:
    """Write via a temporary file beside `path` and a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write: {e.strerror}", file=str(path)) from e


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
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(target, skip_instance_cache=True)
    except ImportError as e:
        raise InputError(
            f"{scheme}:// needs {OBJECT_STORES[scheme]}: "
            "pip install 'gpu-waste-auditor[object-store]'",
            field="--out",
        ) from e
    try:
        fs.pipe_file(path, data)
    except Exception as e:  # each SDK has its own errors (botocore's, google's, azure's)
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot write: {reason}", file=target) from e
