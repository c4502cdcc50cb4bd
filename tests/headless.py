"""Headless Chromium driven over the DevTools protocol on a pipe: load a page, measure it, screenshot it.

`--remote-debugging-pipe` makes Chromium read commands from fd 3 and answer on fd 4, each message
JSON ended by a NUL byte: no websocket library, no driver, nothing but the standard library.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

# Chromium as root in a sandbox, with nothing that phones home (this machine has no network).
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]  # fmt: skip


class Browser:
    """One Chromium over a pipe; `page()` opens a tab and sends it commands."""

    def __init__(self, process: subprocess.Popen[bytes], to_browser: int, from_browser: int, log: Path) -> None:
        self.process = process
        self.log = log  # Chromium's stderr, quoted when it stops answering
        self._out = to_browser
        self._in = from_browser
        self._buffer = b""
        self._next_id = 0

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:  # fmt: skip
        """A command's result (events that arrive meanwhile are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        try:
            os.write(self._out, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise RuntimeError(f"chromium is gone; its stderr ends:\n{self.log.read_text()[-3000:]}") from None
        return self._wait(lambda m: m.get("id") == self._next_id, timeout)["result"]  # type: ignore[no-any-return]

    def wait_event(self, method: str, session: str, timeout: float = 60) -> dict[str, Any]:
        return self._wait(lambda m: m.get("method") == method and m.get("sessionId") == session, timeout)

    def _wait(self, wanted: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "error" in message and message.get("id") == self._next_id:
                    raise RuntimeError(f"chromium: {message['error']}")
                if wanted(message):
                    return message  # type: ignore[no-any-return]
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe; its stderr ends:\n{self.log.read_text()[-3000:]}")
            self._buffer += chunk

    @contextmanager
    def page(self, url: str, width: int, height: int) -> Iterator[Page]:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        try:
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)  # fmt: skip
            self.send("Page.enable", session=session)
            self.send("Page.navigate", {"url": url}, session)
            self.wait_event("Page.loadEventFired", session)
            yield Page(self, session)
        finally:
            self.send("Target.closeTarget", {"targetId": target})


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value (JSON-able)."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                   self.session)  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            width, height = self.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
            )
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        data = self.browser.send("Page.captureScreenshot", params, self.session)["data"]
        path.write_bytes(base64.b64decode(data))


def chromium_binary() -> str:
    binary = shutil.which("chromium")
    assert binary, "Debian's chromium is not installed (make test installs it)"
    return binary


@contextmanager
def chromium() -> Iterator[Browser]:
    """Chromium headless, driven over fds 3 (commands in) and 4 (answers out)."""
    to_chrome_read, to_chrome_write = os.pipe()
    from_chrome_read, from_chrome_write = os.pipe()

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        log = Path(profile) / "stderr.log"
        # The shell hands the pipe ends over as fds 3 and 4, where Chromium looks for them. bash, not sh:
        # Debian's dash refuses redirections from fds above 9, which a long test session reaches.
        command = " ".join(shlex.quote(a) for a in [chromium_binary(), *CHROMIUM_FLAGS, "--remote-debugging-pipe",
                                                     f"--user-data-dir={profile}"])  # fmt: skip
        with log.open("wb") as stderr:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command} 3<&{to_chrome_read} 4>&{from_chrome_write}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                pass_fds=(to_chrome_read, from_chrome_write), start_new_session=True,
            )  # fmt: skip
        os.close(to_chrome_read)
        os.close(from_chrome_write)
        browser = Browser(process, to_chrome_write, from_chrome_read, log)
        try:
            yield browser
        finally:
            # Debian's `chromium` is a wrapper script that does not exec the browser: close the browser
            # itself, then end what is left of the session this started (the wrapper and its children).
            with suppress(OSError, RuntimeError, TimeoutError):
                browser.send("Browser.close", timeout=10)
            os.close(to_chrome_write)
            os.close(from_chrome_read)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
