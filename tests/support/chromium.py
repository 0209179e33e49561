"""A page opened in a real headless Chromium (Debian's `chromium`), watched through the
DevTools protocol: every request the page made, what its console said (and what the
browser logged about it: a blocked load, a script error), its DOM after the load event,
and a screenshot. Missing, it skips the test locally and fails it under CI=true
(tests/support/backends.py).

The protocol runs over `--remote-debugging-pipe` (the browser reads commands on fd 3 and
writes replies and events on fd 4, NUL-separated JSON), so no port is opened and no client
library is needed. Requests are the page's own (`Network.requestWillBeSent` of its tab):
the browser's background traffic, which a proxy would also see, is not counted.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from tests.support.backends import unavailable

_FLAGS = ("--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars")
_TIMEOUT = 120.0  # seconds for the whole page; a loaded machine takes a few


def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("chromium is not installed (apt-get install chromium)")
    return found


@dataclass
class Loaded:
    dom: str  # the document as the browser holds it after the load event
    requests: list[str]  # every URL the page asked for, its own first
    console: list[str] = field(default_factory=list)  # console calls, script errors, browser log entries
    values: list[Any] = field(default_factory=list)  # what each expression given to `load` evaluated to


class _DevTools:
    """One browser process and its protocol pipe."""

    def __init__(self, profile: Path, log: BinaryIO) -> None:
        """`log` takes the browser's output: a file, not a pipe, so a chatty browser never
        blocks on it."""
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()

        def onto_3_and_4() -> None:  # in the child: above 10 first, so neither clobbers the other
            high_read = fcntl.fcntl(commands_read, fcntl.F_DUPFD, 10)
            high_write = fcntl.fcntl(replies_write, fcntl.F_DUPFD, 10)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)

        command = [browser(), *_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        self._log = log
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            close_fds=False,
            preexec_fn=onto_3_and_4,
        )
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self._deadline = time.monotonic() + _TIMEOUT

    def _message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = self._deadline - time.monotonic()
            ready, _, _ = select.select([self._replies], [], [], max(left, 0.0))
            assert ready, "chromium did not answer in time"
            chunk = os.read(self._replies, 1 << 20)
            assert chunk, "chromium closed its pipe: " + self._stderr()
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        request: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            request["sessionId"] = session
        os.write(self._commands, json.dumps(request).encode() + b"\0")
        while True:
            message = self._message()
            if message.get("id") == self._next_id:
                assert "error" not in message, (method, message["error"])
                return message["result"]
            self.events.append(message)

    def wait_for(self, method: str) -> None:
        while not any(event.get("method") == method for event in self.events):
            self.events.append(self._message())

    def _stderr(self) -> str:
        self.process.kill()
        self.process.wait()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except AssertionError:
            pass  # it may close the pipe before it answers
        try:
            self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            os.close(self._commands)
            os.close(self._replies)


def _said(event: dict[str, Any]) -> str | None:
    """A console call, an uncaught exception or a browser log entry, as one line."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.consoleAPICalled":
        words = [str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", [])]
        return f"console.{params.get('type')}: {' '.join(words)}"
    if method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        return f"exception: {details.get('exception', {}).get('description') or details.get('text')}"
    if method == "Log.entryAdded":
        entry = params.get("entry", {})
        return f"log.{entry.get('level')}: {entry.get('text')} {entry.get('url', '')}".rstrip()
    return None


def load(
    page: Path,
    profile: Path,
    screenshot: Path | None = None,
    width: int = 1100,
    height: int = 2400,
    evaluate: Sequence[str] = (),
) -> Loaded:
    """Open `page` from disk in a new tab and wait for its load event; with `screenshot`,
    write what a `width` x `height` window shows of its top there (PNG). Each expression of
    `evaluate` runs in the page after the load event (the DOM as the browser built it, which
    a serialisation read back by another parser may not show), its value in `values`."""
    with tempfile.TemporaryFile() as log:
        return _load(_DevTools(profile, log), page, screenshot, width, height, evaluate)


def _load(
    tools: _DevTools, page: Path, screenshot: Path | None, width: int, height: int, evaluate: Sequence[str]
) -> Loaded:
    try:
        target = tools.call("Target.createTarget", url="about:blank")["targetId"]
        session = tools.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            tools.call(f"{domain}.enable", session)
        tools.call(
            "Emulation.setDeviceMetricsOverride", session, width=width, height=height, deviceScaleFactor=1, mobile=False
        )
        tools.call("Page.navigate", session, url=page.as_uri())
        tools.wait_for("Page.loadEventFired")
        dom, *values = [
            tools.call("Runtime.evaluate", session, expression=expression, returnByValue=True)["result"].get("value")
            for expression in ("document.documentElement.outerHTML", *evaluate)
        ]
        if screenshot is not None:
            shot = tools.call("Page.captureScreenshot", session, format="png")
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        ours = [event for event in tools.events if event.get("sessionId") == session]
        requests = [
            event["params"]["request"]["url"] for event in ours if event.get("method") == "Network.requestWillBeSent"
        ]
        said = [line for line in map(_said, ours) if line is not None]
        return Loaded(dom, requests, said, values)
    finally:
        tools.close()
