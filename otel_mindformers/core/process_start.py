"""When a process began, in Unix seconds: where a run's start-up and the job's ledger both
count from (read one way, so the report's time table and the job's totals agree), and how
the ledger tells a dead attempt's pid from a live one (restarts/processes.py).

It is the kernel's start of the process. `exec` keeps a process, so a wrapper script that
sets up and then `exec`s Python is counted from the wrapper's start: neither the kernel nor
Python records when a process `exec`ed (docs/time.md says so, and how to leave a setup out).
"""

from __future__ import annotations

import os
import time

from otel_mindformers.config.extras import import_optional


def process_start(now: float | None = None) -> float:
    """This process's start, never after `now` (default: the current time); `now` where it
    cannot be read."""
    now = time.time() if now is None else now
    try:
        began = started_at()
    except ProcessLookupError:  # this process, dead: not while it runs this
        return now
    return now if began is None else min(began, now)


def started_at(pid: int | None = None) -> float | None:
    """When process `pid` (None: this one) began, in Unix seconds, never in the future; None
    when that cannot be read. ProcessLookupError when there is no such process, or only its
    zombie (dead, not yet reaped by its parent).

    From /proc's start time in clock ticks since boot against CLOCK_BOOTTIME, to ~10 ms:
    psutil's `create_time` adds that to the boot time in whole seconds, up to a second off,
    which would put a restarted process's start before its predecessor's last heartbeat.
    psutil where there is no /proc."""
    now = time.time()
    try:
        with open(f"/proc/{'self' if pid is None else pid}/stat", "rb") as stream:
            fields = stream.read().rsplit(b")", 1)[1].split()
        state, ticks = fields[0], int(fields[19])  # fields 3 and 22 (starttime), counted after the name's ")"
        # The two clocks read together.
        since_boot, current = time.clock_gettime(time.CLOCK_BOOTTIME), time.time()
        began = min(now, current - (since_boot - ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError, AttributeError):
        pass  # no such /proc entry (psutil tells whether the process exists), or no /proc
    else:
        if state in (b"Z", b"X"):  # a zombie, or dead
            raise ProcessLookupError(pid)
        return began
    psutil, _ = import_optional("psutil")  # MindSpore needs it
    if psutil is None:
        return None
    try:
        process = psutil.Process(pid)
        zombie = process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        began = min(process.create_time(), now)
    except psutil.NoSuchProcess:
        raise ProcessLookupError(pid) from None
    except (psutil.Error, OSError):
        return None
    if zombie:
        raise ProcessLookupError(pid)
    return began


__all__ = ["process_start", "started_at"]
