"""A page opened in a real headless Chromium (Debian's `chromium`): the DOM after its
scripts ran, what its console said, and a screenshot. Missing, it skips the test locally
and fails it under CI=true (tests/support/backends.py)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.backends import unavailable

_FLAGS = ("--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars")


def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("chromium is not installed (apt-get install chromium)")
    return found


@dataclass
class Loaded:
    dom: str  # the document as the browser holds it after the load event
    console: list[str]  # what the page wrote to its console, or the browser logged about it


def load(page: Path, profile: Path) -> Loaded:
    """Open `page` from disk and dump its DOM; the browser logs console messages (and
    blocked loads) to stderr, one `CONSOLE` line each."""
    command = [
        browser(), *_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
        "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return Loaded(done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line])


def screenshot(page: Path, image: Path, profile: Path, size: tuple[int, int] = (1100, 2400)) -> Path:
    command = [
        browser(), *_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
        f"--screenshot={image}", page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and image.exists(), done.stderr[-3000:]
    return image
