"""`otel-mindformers` as users run it: `python -m otel_mindformers.cli ARGS` in a child process
that imports this checkout, its output captured as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import pythonpath_with_repo


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 180.0
) -> subprocess.CompletedProcess:
    """The finished command; `env` adds to (and wins over) this process's environment."""
    environ = {**os.environ, "PYTHONPATH": pythonpath_with_repo(os.environ.get("PYTHONPATH")), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "otel_mindformers.cli", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_output(*args: str, **kwargs) -> str:
    """The command's stdout; it must exit 0."""
    done = cli(*args, **kwargs)
    assert done.returncode == 0, done.stderr
    return done.stdout
