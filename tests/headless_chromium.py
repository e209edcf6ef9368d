"""A real headless Chromium (Debian's ``chromium``) driven through the DevTools protocol.

Opens a page with no network access beyond the file itself, collects every console error
and uncaught exception, evaluates JavaScript in the page, and takes screenshots: of the page,
or of one plotly chart's plot area, decoded (:func:`decode_png`, no imaging package) so a
test can count what a chart drew (:meth:`Page.drawn_pixels`).

Usage::

    with HeadlessChromium() as browser:
        page = browser.open(Path("report.html"))
        page.evaluate("document.title"), page.errors, page.screenshot(Path("shot.png"))
        page.drawn_pixels("fig-step-time")     # > 0: the chart drew its data
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run",
          "--disable-default-apps", "--disable-extensions", "--hide-scrollbars",
          "--remote-debugging-port=0", "--remote-allow-origins=*"]


def chromium_binary() -> str | None:
    """The chromium executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    """One tab, through its DevTools websocket."""

    def __init__(self, ws_url: str) -> None:
        import websocket  # websocket-client (dev extra)

        self._ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self._next = 0
        self.errors: list[str] = []
        self.console: list[str] = []
        self.requests: list[str] = []
        self._events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None,
             timeout_seconds: float = 60.0) -> dict[str, Any]:
        """Call a DevTools method and return its result (events seen meanwhile are kept)."""
        self._next += 1
        msg_id = self._next
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)
        raise TimeoutError(method)

    def _event(self, msg: dict[str, Any]) -> None:
        method = msg.get("method", "")
        p = msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.errors.append(f"exception: {d.get('text')} "
                               f"{d.get('exception', {}).get('description', '')}")
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            self.console.append(f"{p.get('type')}: {text}")
            if p.get("type") in ("error", "assert"):
                self.errors.append(f"console.{p.get('type')}: {text}")
        elif method == "Log.entryAdded":
            entry = p.get("entry", {})
            if entry.get("level") == "error":
                self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            self.requests.append(p.get("request", {}).get("url", ""))
        self._events.append(msg)

    def wait_event(self, method: str, timeout_seconds: float = 60.0) -> dict[str, Any]:
        """Wait for the next event called ``method``."""
        for i, msg in enumerate(self._events):
            if msg.get("method") == method:
                return self._events.pop(i)
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            msg = json.loads(self._ws.recv())
            self._event(msg)
            if msg.get("method") == method:
                self._events.remove(msg)
                return msg
        raise TimeoutError(method)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = self.send("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"evaluate failed: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def screenshot(self, path: Path, width: int = 1280, height: int | None = None) -> Path:
        """A PNG of the page (the whole page when ``height`` is None)."""
        if height is None:
            height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        time.sleep(0.5)  # let plotly's responsive layout settle at the new size
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport":
                                                    False})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def screenshot_png(self, clip: dict[str, float], scale: float = 0.5) -> bytes:
        """PNG bytes of a page region (CSS pixels from the top of the document)."""
        shot = self.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True, "clip": {**clip, "scale": scale}})
        return base64.b64decode(shot["data"])

    def drawn_pixels(self, div_id: str, scale: float = 0.5) -> int:
        """Pixels of a plotly chart's plot area that its data series drew.

        Two screenshots of the plot area, with the series shown and with them hidden (axis
        ranges frozen; reference lines, ``meta: 'reference'``, stay): the pixels that differ
        are the data's. An empty chart, or one whose series drew nothing, gives 0.
        """
        clip = self.evaluate(_PLOT_AREA_JS % json.dumps(div_id))
        shown = decode_png(self.screenshot_png(clip, scale))
        self.evaluate(_HIDE_DATA_JS % json.dumps(div_id))
        hidden = decode_png(self.screenshot_png(clip, scale))
        self.evaluate(f"Plotly.restyle({json.dumps(div_id)}, {{visible: true}}).then(() => true)")
        return changed_pixels(shown, hidden)

    def close(self) -> None:
        """Close the websocket."""
        try:
            self._ws.close()
        except Exception:
            pass


class HeadlessChromium:
    """A headless Chromium process with a fresh profile, killed on exit."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or chromium_binary()
        if self.binary is None:
            raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
        self._profile = tempfile.mkdtemp(prefix="otel-train-chromium-")
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> HeadlessChromium:
        self._proc = subprocess.Popen(
            [self.binary, *_FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if port_file.exists() and port_file.read_text().strip():
                self.port = int(port_file.read_text().splitlines()[0])
                break
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._proc.returncode}")
            time.sleep(0.1)
        else:
            raise TimeoutError("chromium did not open its DevTools port")
        return self

    def open(self, path: Path, settle_seconds: float = 1.0) -> Page:
        """Load ``path`` in a tab with console/exception capture on; return the tab."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            targets = [t for t in json.load(r) if t.get("type") == "page"]
        page = Page(targets[0]["webSocketDebuggerUrl"])
        for domain in ("Runtime", "Log", "Page", "Network"):
            page.send(f"{domain}.enable")
        page.send("Page.navigate", {"url": path.resolve().as_uri()})
        page.wait_event("Page.loadEventFired", 120)
        time.sleep(settle_seconds)  # plotly draws on load; give late errors a chance to show
        page.evaluate("1")  # drains the events that arrived meanwhile
        return page

    def __exit__(self, *exc: Any) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        shutil.rmtree(self._profile, ignore_errors=True)


# The plot area (inside the axes) of a plotly chart, in document coordinates.
_PLOT_AREA_JS = """(() => {
  const gd = document.getElementById(%s);
  gd.scrollIntoView();
  const r = gd.getBoundingClientRect(), size = gd._fullLayout._size;
  return {x: r.left + window.scrollX + size.l, y: r.top + window.scrollY + size.t,
          width: size.w, height: size.h};
})()"""

# Freezes every axis at its range, then hides the data series (the legend keeps its size).
_HIDE_DATA_JS = """(async () => {
  const gd = document.getElementById(%s);
  const frozen = {};
  Object.keys(gd._fullLayout).filter(k => /^[xy]axis[0-9]*$/.test(k)).forEach(k => {
    frozen[k + '.range'] = gd._fullLayout[k].range.slice();
    frozen[k + '.autorange'] = false;
  });
  await Plotly.relayout(gd, frozen);
  const data = gd.data.map((t, i) => t.meta === 'reference' ? -1 : i).filter(i => i >= 0);
  await Plotly.restyle(gd, {visible: 'legendonly'}, data);
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  return data.length;
})()"""


def decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, pixels) of an 8-bit RGB/RGBA PNG, not interlaced."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, []
    width = height = bpp = 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            if body[8] != 8 or body[9] not in (2, 6) or body[12] != 0:
                raise ValueError("only 8-bit RGB/RGBA, non-interlaced PNGs")
            bpp = 3 if body[9] == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw, stride = zlib.decompress(b"".join(idat)), width * bpp
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = bytearray(raw[start + 1:start + 1 + stride])
        _unfilter(raw[start], line, prev, bpp)
        out += line
        prev = line
    return width, height, bpp, bytes(out)


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    """Undo one scanline's PNG filter in place."""
    if kind == 1:
        for x in range(bpp, len(line)):
            line[x] = (line[x] + line[x - bpp]) & 255
    elif kind == 2:
        line[:] = bytes((a + b) & 255 for a, b in zip(line, prev))
    elif kind == 3:
        for x in range(len(line)):
            left = line[x - bpp] if x >= bpp else 0
            line[x] = (line[x] + ((left + prev[x]) >> 1)) & 255
    elif kind == 4:
        for x in range(len(line)):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[x] = (line[x] + pred) & 255


def changed_pixels(a: tuple[int, int, int, bytes], b: tuple[int, int, int, bytes],
                   tolerance: int = 16) -> int:
    """Pixels whose colour differs by more than ``tolerance`` in a channel (same size)."""
    (w, h, bpp, pa), (w2, h2, bpp2, pb) = a, b
    if (w, h, bpp) != (w2, h2, bpp2):
        raise ValueError(f"different sizes: {w}x{h} and {w2}x{h2}")
    return sum(1 for i in range(0, len(pa), bpp)
               if any(abs(pa[i + c] - pb[i + c]) > tolerance for c in range(3)))
