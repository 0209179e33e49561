"""Run a device tool with a hard deadline and a bound on what it may write."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, TypeVar

from otel_mindformers.devices.source import SourceError

# What one tool call may write (stdout and stderr together). npu-smi's and hccn_tool's
# answers for a 16-chip node are tens of kilobytes; a tool that streams (a broken driver,
# `yes`) would otherwise grow the training process by gigabytes within one timeout, and the
# parse of a huge answer would compete with the training thread for the interpreter.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
_CHUNK = 64 * 1024

# The tool call in flight on each thread (by thread ident), so that the thread that owns a
# poll loop can be stopped out of a hung call: `kill_tool_of`.
_in_flight: dict[int, subprocess.Popen[bytes]] = {}
_in_flight_lock = threading.Lock()


def kill_tool_of(thread_ident: int | None) -> bool:
    """Kill the process group of the tool call that the thread `thread_ident` is waiting
    on, if any (its `run_tool` then raises at once); True when one was killed. For a run
    that ends while its poll thread waits on a hung tool: the poll thread is a daemon and
    dies with the process, and the tool's group, in its own session, would outlive both."""
    with _in_flight_lock:
        process = _in_flight.get(thread_ident) if thread_ident is not None else None
        if process is None or process.returncode is not None:
            return False
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group ended meanwhile
            return False
        return True


def run_tool(argv: Sequence[str], timeout: float, max_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """stdout of `argv`, or SourceError (not_found, timeout, exit_status, or parse when it
    writes more than `max_bytes`: the tool is killed at once and its output dropped).

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
    command = " ".join(argv)
    thread = threading.get_ident()
    with _in_flight_lock:
        _in_flight[thread] = process
    try:
        out, err = _read_bounded(process, time.monotonic() + timeout, max_bytes)
    except subprocess.TimeoutExpired:
        raise SourceError("timeout", f"{command} did not finish within {timeout:g} s") from None
    except OverflowError:
        raise SourceError("parse", f"{command} wrote more than {max_bytes} bytes; stopped it") from None
    finally:
        with _in_flight_lock:
            _in_flight.pop(thread, None)
        _stop(process)
    if process.returncode != 0:
        detail = _first_line(err) or _first_line(out) or "no output"
        raise SourceError("exit_status", f"{command} exited with status {process.returncode}: {detail}")
    return out.decode("utf-8", errors="replace")


def _pipes(process: subprocess.Popen[bytes]) -> list[IO[bytes]]:
    """The tool's stdout and stderr (both are there: `run_tool` opens them as pipes)."""
    return [pipe for pipe in (process.stdout, process.stderr) if pipe is not None]


def _read_bounded(process: subprocess.Popen[bytes], deadline: float, max_bytes: int) -> tuple[bytes, bytes]:
    """Both pipes to their end, at most `max_bytes` in all (OverflowError past it), and
    the exit, by `deadline` (TimeoutExpired past it)."""
    chunks: dict[int, list[bytes]] = {pipe.fileno(): [] for pipe in _pipes(process)}
    total = 0
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(process.args, 0)
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, _CHUNK)
                if not data:
                    selector.unregister(key.fd)
                    continue
                total += len(data)
                if total > max_bytes:
                    raise OverflowError
                chunks[key.fd].append(data)
    process.wait(max(0.0, deadline - time.monotonic()))
    out, err = (b"".join(parts) for parts in chunks.values())
    return out, err


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Kill the tool's process group if it is still running, close its pipes and reap it."""
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group ended meanwhile
            pass
    for pipe in _pipes(process):
        pipe.close()
    process.wait()


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
