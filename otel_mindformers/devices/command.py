"""Run a device tool with a hard deadline."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import TypeVar

from otel_mindformers.devices.base import SourceError


def run_tool(argv: Sequence[str], timeout: float) -> str:
    """stdout of `argv`, or SourceError (not_found, timeout, exit_status).

    The tool runs in its own process group and the whole group is killed at the deadline:
    killing only the direct child would leave a wrapper script's children holding the
    output pipe open, and reading it would then wait for them, past any timeout.
    """
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise SourceError("not_found", f"cannot run {argv[0]!r}: {exc.strerror}") from None
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group ended between the deadline and the kill
            pass
        process.communicate()
        raise SourceError("timeout", f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    if process.returncode != 0:
        detail = _first_line(err) or _first_line(out) or "no output"
        raise SourceError("exit_status", f"{' '.join(argv)} exited with status {process.returncode}: {detail}")
    return out.decode("utf-8", errors="replace")


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text.splitlines()[0][:200] if text else ""


T = TypeVar("T")


class Queries:
    """The optional queries of one poll: a failing one is set aside as a problem (the poll
    keeps its other readings), except a timeout or a missing tool, which fail the whole
    poll: a tool that hangs once hangs for the next query too (each would cost another
    timeout), and a missing one answers no query."""

    def __init__(self) -> None:
        self.problems: list[SourceError] = []

    def run(self, query: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except SourceError as exc:
            if exc.error_type in ("timeout", "not_found"):
                raise
            exc.query = query
            self.problems.append(exc)
            return None
