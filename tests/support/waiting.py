"""Waiting for an event another thread or process brings about, instead of sleeping."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object],
    what: str = "the condition",
    process: subprocess.Popen | None = None,
    timeout: float = 30.0,
    interval: float = 0.02,
) -> bool:
    """True as soon as `predicate()` holds; fail naming `what` at the timeout, or as soon as
    `process` (the one expected to bring it about) has exited."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process exited ({process.returncode}) before: {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(interval)
    return True
