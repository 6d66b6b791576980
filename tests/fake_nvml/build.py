"""Build the fake NVML library (libnvidia-ml.c next to this file) with gcc, and script it.

`build(out_dir)` compiles `libnvidia-ml.so.1` into `out_dir` with the driver's soname, so
`pynvml`'s `CDLL("libnvidia-ml.so.1")` finds it: in a subprocess through LD_LIBRARY_PATH,
in the test process because glibc answers a dlopen by soname with an already-loaded library
(`load_in_process`). `write_script` writes the device script the library reads.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("libnvidia-ml.c")
LIBRARY = "libnvidia-ml.so.1"
SCRIPT_ENV = "FAKE_NVML_SCRIPT"

Fields = Mapping[str, object]


_built: dict[Path, Path] = {}


def build(out_dir: Path) -> Path:
    """Compile the fake library into `out_dir` (once per process); returns its path."""
    if out_dir in _built:
        return _built[out_dir]
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("no C compiler (gcc) on PATH to build the fake NVML library")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIBRARY
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            f"-Wl,-soname,{LIBRARY}",
            "-o",
            str(target),
            str(SOURCE),
        ],
        check=True,
        capture_output=True,
    )
    _built[out_dir] = target
    return target


def load_in_process(library: Path) -> None:
    """Load the fake so that pynvml's dlopen of the soname finds it in this process."""
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)


def _line(kind: str, fields: Fields) -> str:
    parts = [kind]
    for key, value in fields.items():
        text = str(value).replace(" ", "+")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def render_script(
    devices: Sequence[Fields],
    *,
    samples: Mapping[int, Sequence[tuple[int, int]]] | None = None,
    migs: Mapping[int, Sequence[Fields]] | None = None,
    init_fail: int | None = None,
    procs: Mapping[int, Sequence[Fields]] | None = None,
) -> str:
    """The script text: devices in index order, their (ts_us, value) samples, MIGs and
    process utilisation samples (pid, sm, ts_us)."""
    lines = [] if init_fail is None else [f"init fail={init_fail}"]
    for i, dev in enumerate(devices):
        lines.append(_line("device", dev))
        for ts_us, value in (samples or {}).get(i, ()):
            lines.append(f"sample ts_us={ts_us} value={value}")
        for mig in (migs or {}).get(i, ()):
            lines.append(_line("mig", mig))
        for proc in (procs or {}).get(i, ()):
            lines.append(_line("proc", proc))
    return "\n".join(lines) + "\n"


def write_script(path: Path, text: str) -> None:
    """Replace the script atomically; the library re-reads it on its next call."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake library, built once per session and loaded into the test process. Without
    a C compiler the tests skip (and fail under CI, where gcc must be installed)."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        if os.environ.get("CI"):
            pytest.fail("gcc is required under CI to build the fake NVML library", pytrace=False)
        pytest.skip("no C compiler (gcc) to build the fake NVML library")
    library = build(tmp_path_factory.getbasetemp() / "fake_nvml")
    load_in_process(library)
    return library
