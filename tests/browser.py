"""Headless Chromium for tests, driven over the DevTools protocol (websocket-client).

Opens a page as a person would (real layout, real JavaScript, real fetches), reads
the DOM with ``js(...)``, clicks and types through the page's own elements, and
takes screenshots. Debian's ``chromium`` package is installed by the test bootstrap
(``NEED_CHROMIUM=1`` in tests/run.sh).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, url: str, width: int = 1400, height: int = 1000):
        import websocket  # websocket-client

        exe = chromium_path()
        if exe is None:
            raise BrowserError("chromium not found (tests/run.sh installs Debian's chromium package)")
        self.profile = tempfile.mkdtemp(prefix="capturer-chromium-")
        args = [exe, "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-dev-shm-usage", "--disable-extensions", "--disable-background-networking",
                "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.log = open(Path(self.profile) / "chromium.log", "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise BrowserError(f"chromium did not start: {(Path(self.profile) / 'chromium.log').read_text()[-2000:]}")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        if not pages:
            self.close()
            raise BrowserError("chromium has no page target")
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self._id = 0
        self.console: list[str] = []  # JavaScript exceptions, console errors, CSP violations
        self.network: list[str] = []  # failed loads
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.call("Log.enable")  # the browser's own complaints (CSP violations, failed loads)
        # a Content-Security-Policy refusal also as a console error, with what was blocked
        self.call("Page.addScriptToEvaluateOnNewDocument", source=(
            "document.addEventListener('securitypolicyviolation', function (e) {"
            " console.error('CSP violation: ' + e.violatedDirective + ' blocked ' + e.blockedURI); });"))
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        self.goto(url)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        my = self._id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if msg.get("method") == "Runtime.exceptionThrown":
                d = msg["params"]["exceptionDetails"]
                self.console.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif msg.get("method") == "Log.entryAdded" and msg["params"]["entry"].get("level") == "error":
                e = msg["params"]["entry"]
                line = f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}"
                (self.network if e.get("source") == "network" else self.console).append(line)
            elif msg.get("method") == "Runtime.consoleAPICalled" and msg["params"].get("type") == "error":
                self.console.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                                 for a in msg["params"].get("args", [])))

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression!r}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r.get("result", {}).get("value")

    def wait(self, expression: str, timeout: float = 30.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.js(expression)
            except BrowserError as exc:
                last = exc
            if last and not isinstance(last, BrowserError):
                return last
            time.sleep(0.25)
        raise AssertionError(f"page: {what or expression} not true within {timeout:g}s (last: {last!r}); "
                             f"console: {self.console[-5:]}")

    def text(self, selector: str) -> str:
        return str(self.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent || ''"))

    def click(self, selector: str, hold: float = 0.3) -> None:
        """A real mouse click at the element's centre: press, ``hold`` seconds, release
        (a page that redraws the element in between loses the click, as for a person)."""
        box = self.js(f"(function(){{var e=document.querySelector({json.dumps(selector)}); if(!e||e.disabled) return null; "
                      "e.scrollIntoView({block: 'center'}); var r=e.getBoundingClientRect(); "
                      "return [r.left + r.width / 2, r.top + r.height / 2];})()")
        if not box:
            raise AssertionError(f"page: no enabled {selector} to click")
        x, y = box
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
        time.sleep(hold)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x, y=y, button="left", clickCount=1)

    def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type ``text`` as key presses (input events fire as for a person)."""
        self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", text=text)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                ws.close()
            except Exception:
                pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
