"""A real headless Chromium (Debian's ``chromium``) driven through the DevTools protocol.

Opens a page with no network access beyond the file itself, collects every console error
and uncaught exception, evaluates JavaScript in the page, and takes screenshots.

Usage::

    with HeadlessChromium() as browser:
        page = browser.open(Path("report.html"))
        page.evaluate("document.title"), page.errors, page.screenshot(Path("shot.png"))
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
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
