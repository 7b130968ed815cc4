"""The status page (tests/unit/test_status_page.py serves it) loaded in headless Chromium (Debian's
package, installed by scripts/install-services.sh): a screenshot whose pixels are checked and the DOM
Chromium built. A browser process per test: e2e, not unit."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from lakemirror.daemon.http import ControlServer
from tests.unit.test_status_page import Tables, served  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (Debian package chromium: run scripts/install-services.sh)")


# -- in Chromium --------------------------------------------------------------------------------------

def chromium(*args: str) -> subprocess.CompletedProcess[bytes]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="lakemirror-chromium-") as profile:
        return subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}", *args],
            capture_output=True, timeout=120, cwd=profile, env={"HOME": profile, "PATH": "/usr/bin:/bin"})


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced truecolour PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            if kind == 1:
                line[x] = (line[x] + a) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + b) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def colours(data: bytes) -> dict[bytes, int]:
    width, _, rows = png_pixels(data)
    bpp = len(rows[0]) // width
    counts: dict[bytes, int] = {}
    for row in rows:
        for i in range(0, len(row), bpp):
            px = row[i:i + 3]
            counts[px] = counts.get(px, 0) + 1
    return counts


@needs_chromium
def test_chromium_renders_the_page_with_its_tables_sparklines_and_badges(
        served: tuple[ControlServer, Tables], tmp_path: Path) -> None:
    server, _ = served
    shot = tmp_path / "page.png"
    done = chromium(f"--screenshot={shot}", "--window-size=1200,800", server.url + "/")
    assert shot.is_file(), done.stderr.decode(errors="replace")[-2000:]
    data = shot.read_bytes()
    assert len(data) > 10_000, len(data)
    width, height, _ = png_pixels(data)
    assert (width, height) == (1200, 800)
    seen = colours(data)
    white = seen.get(b"\xff\xff\xff", 0)
    assert white < 0.97 * width * height, "the page rendered (nearly) blank"
    for name, rgb in (("running badge", b"\xda\xfb\xe1"), ("paused badge", b"\xff\xf8\xc5"),
                      ("failed badge", b"\xff\xeb\xe9"), ("table header", b"\xf6\xf8\xfa")):
        assert seen.get(rgb, 0) > 50, f"no {name} colour #{rgb.hex()} in the screenshot"
    blue = sum(n for px, n in seen.items() if px[2] > 150 and px[0] < 120 and px[1] < 170)
    assert blue > 30, "no sparkline strokes"

    blank = tmp_path / "blank.png"
    chromium(f"--screenshot={blank}", "--window-size=1200,800", "about:blank")
    assert colours(blank.read_bytes()).get(b"\xff\xff\xff", 0) == width * height  # what "blank" looks like


@needs_chromium
def test_chromium_builds_the_dom_with_every_row_and_the_error_as_text(served: tuple[ControlServer, Tables]) -> None:
    server, _ = served
    done = chromium("--dump-dom", "--virtual-time-budget=2000", server.url + "/")
    dom = done.stdout.decode()
    assert "<tbody>" in dom, done.stderr.decode(errors="replace")[-2000:]
    rows = re.findall(r'<tr data-table="([^"]*)">', dom)
    assert rows == ["orders", "customers", "events &lt;b&gt;"]
    assert "&lt;script&gt;alert(\"x\")&lt;/script&gt; &amp; failed at" in dom  # text, not an element
    assert "hunter2" not in dom and '<script>alert("x")' not in dom
    assert dom.count("<polyline") == 2
    assert 'id="token"' in dom and json.dumps("Pause")[1:-1] in dom
    # The buttons that fit each state: pause a running table, resume a paused or failed one, resync any.
    buttons = re.findall(r'<button data-verb="(\w+)" data-table="([^"]*)">', dom)
    assert buttons == [("pause", "orders"), ("resync", "orders"), ("resume", "customers"), ("resync", "customers"),
                       ("resume", "events &lt;b&gt;"), ("resync", "events &lt;b&gt;")]
    # Versions behind and the applied version beside the lag; each sparkline on a scale (peak, 0).
    assert ">Versions behind</th>" in dom and ">Applied version</th>" in dom
    assert '<td class="num behind">1</td><td class="num applied">7</td>' in dom
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', dom)
    assert len(ticks) == 4 and ticks[1::2] == ["0", "0"] and all(t.endswith("s") for t in ticks[::2]), ticks
