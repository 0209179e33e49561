"""The processes the ledger names: when one began, and whether an attempt's is gone.

An attempt's heartbeat says it lived a few seconds ago; on its own host, the process table
says whether it lives now. A run started right after a killed one (same folder) would
otherwise take the dead attempt for a live one until its heartbeat went stale
(3 intervals + 1 s: 16 s by default).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import psutil

# A start read from /proc is good to a clock tick (10 ms); psutil's to a second. A process
# that began this much after the attempt's recorded start is another one with its pid.
_START_SLACK_SECONDS = 1.0


def started_at(pid: int | None = None) -> float | None:
    """When process `pid` (None: this one) began, in Unix seconds; None when that cannot be
    read. ProcessLookupError when there is no such process, or only its zombie (dead, not
    yet reaped by its parent).

    From /proc's start time in clock ticks since boot against CLOCK_BOOTTIME, to ~10 ms:
    psutil's `create_time` adds that to the boot time in whole seconds, up to a second off,
    which would put a restarted process's start before its predecessor's last heartbeat."""
    now = time.time()
    try:
        with open(f"/proc/{'self' if pid is None else pid}/stat", "rb") as stream:
            fields = stream.read().rsplit(b")", 1)[1].split()
        state, ticks = fields[0], int(fields[19])  # fields 3 and 22 (starttime), counted after the name's ")"
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        began = min(now, now - (since_boot - ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError, AttributeError):
        pass  # no such /proc entry (psutil tells whether the process exists), or no /proc
    else:
        if state in (b"Z", b"X"):  # a zombie, or dead
            raise ProcessLookupError(pid)
        return began
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


def process_gone(entry: dict[str, Any]) -> bool:
    """Whether the attempt's process is known to have ended: it ran on this host, and no
    process has its pid now, or only its zombie, or one that began after it did (the pid
    reused). False where it cannot be told (another host: its heartbeat says)."""
    pid = entry.get("pid")
    if entry.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        began = started_at(pid)
    except ProcessLookupError:
        return True
    recorded = entry.get("process_start")
    return began is not None and isinstance(recorded, (int, float)) and began > recorded + _START_SLACK_SECONDS


__all__ = ["process_gone", "started_at"]
