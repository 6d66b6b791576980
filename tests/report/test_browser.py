"""The HTML report and an explain page, opened in headless Chromium as a team lead would.

Chromium takes a screenshot (decoded here with zlib, no imaging library) and dumps the DOM
it built. Without Chromium the tests skip, except under CI (`CI` set), where they fail:
.ci/run installs Debian's `chromium`.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from auditor import jobs
from auditor.report.html import render_explain_html
from auditor.report.summary import GroupBy
from auditor.report.svg import COLOURS
from auditor.settings import Thresholds

WIDTH, HEIGHT = 1400, 2000


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install chromium); required under CI")


def _browse(page: Path, tmp: Path, *args: str) -> str:
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    cmd = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--force-color-profile=srgb", "--hide-scrollbars",
        f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", *args, page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def decode_png(data: bytes) -> np.ndarray:
    """8-bit RGB or RGBA, non-interlaced PNG → array (height, width, channels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8
    assert colour in (2, 6)
    assert interlace == 0
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(h):
        kind, row = raw[y * (stride + 1)], raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        f = np.frombuffer(row, dtype=np.uint8)
        if kind == 0:
            cur = f.copy()
        elif kind == 2:
            cur = f + prev
        elif kind == 1:
            cur = (np.cumsum(f.reshape(w, bpp).astype(np.int64), axis=0) % 256).astype(np.uint8)
            cur = cur.ravel()
        else:
            b, p = bytearray(row), prev.tobytes()
            for x in range(stride):
                a = b[x - bpp] if x >= bpp else 0
                c = p[x - bpp] if x >= bpp else 0
                if kind == 3:
                    b[x] = (b[x] + ((a + p[x]) >> 1)) & 0xFF
                    continue
                est = a + p[x] - c
                pa, pb, pc = abs(est - a), abs(est - p[x]), abs(est - c)
                pred = a if pa <= pb and pa <= pc else p[x] if pb <= pc else c
                b[x] = (b[x] + pred) & 0xFF
            cur = np.frombuffer(bytes(b), dtype=np.uint8)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)[:, :, :3]


def _colours(image: np.ndarray) -> set[str]:
    flat = image.reshape(-1, 3).astype(np.int64)
    codes = np.unique(flat[:, 0] << 16 | flat[:, 1] << 8 | flat[:, 2])
    return {f"#{int(c):06x}" for c in codes}


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("browser")
    jobs.demo(work, scenario="small", log=lambda _: None)
    url = f"sqlite:///{work / 'auditor.db'}"
    report = work / "report.html"
    report.write_text(
        jobs.build_report_html(
            url, start_ms=None, end_ms=None, by=GroupBy.TEAM, team=None, thresholds=Thresholds()
        ),
        encoding="utf-8",
    )
    explain = work / "explain.html"
    ex = jobs.explain(url, "vision/PyTorchJob/vit-h-pretrain", thresholds=Thresholds())
    explain.write_text(render_explain_html(ex), encoding="utf-8")
    return {"report": report, "explain": explain}


@pytest.mark.parametrize(
    ("name", "title", "texts", "colours"),
    [
        (
            "report",
            "GPU waste audit",
            ["GPU-hours by team", "Per-card utilisation", "Top offenders and next steps",
             "Job timelines", "reserved idle", "straggler wait", "vision"],
            ["busy", "reserved_idle", "compute_idle", "unallocated"],
        ),
        (
            "explain",
            "GPU timeline of vision/PyTorchJob/vit-h-pretrain",
            ["vit-h-pretrain-worker-0 rank 1", "startup", "checkpoint", "Next steps"],
            ["straggler_wait", "checkpoint", "startup"],
        ),
    ],
)  # fmt: skip
def test_page_renders_in_chromium(
    pages: dict[str, Path],
    tmp_path: Path,
    name: str,
    title: str,
    texts: list[str],
    colours: list[str],
) -> None:
    shot = tmp_path / f"{name}.png"
    _browse(pages[name], tmp_path, f"--screenshot={shot}")
    image = decode_png(shot.read_bytes())
    assert image.shape == (HEIGHT, WIDTH, 3)
    seen = _colours(image)
    assert len(seen) > 50  # text anti-aliasing, charts: anything but a blank page
    inked = np.any(image < 240, axis=2).mean()
    assert inked > 0.02, f"only {inked:.1%} of {shot} is drawn"
    # nothing is drawn right of the page's column (24 px margin + 1000 px): a wide table
    # scrolls inside it instead of running off the page
    beyond = np.any(image[:, 1040:] < 240, axis=2)
    assert not beyond.any(), (
        f"{name} draws past 1040 px at rows {np.flatnonzero(beyond.any(axis=1))[:5]}"
    )
    for category in colours:  # the legend swatches and bars carry the exact colours
        assert COLOURS[category] in seen, f"{category} colour missing from {shot}"
    dom = _browse(pages[name], tmp_path, "--dump-dom")
    assert f"<title>{title}" in dom
    for text in texts:
        assert text in dom
