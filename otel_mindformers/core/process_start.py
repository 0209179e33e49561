"""When this process began, in Unix seconds: where a run's start-up and the job's ledger
both count from, read one way so the report's time table and the job's totals agree.

It is the kernel's start of the process. `exec` keeps a process, so a wrapper script that
sets up and then `exec`s Python is counted from the wrapper's start: neither the kernel nor
Python records when a process `exec`ed (docs/time.md says so, and how to leave a setup out).
"""

from __future__ import annotations

import os
import time

from otel_mindformers.config.extras import import_optional


def process_start(now: float | None = None) -> float:
    """The process's start, never after `now` (default: the current time).

    From /proc's start time in clock ticks since boot against CLOCK_BOOTTIME, to ~10 ms:
    psutil's `create_time` adds that to the boot time in whole seconds, up to a second off,
    which would put a restarted process's start before its predecessor's last heartbeat.
    psutil where there is no /proc; `now` where neither tells."""
    now = time.time() if now is None else now
    try:
        with open("/proc/self/stat", "rb") as stream:
            fields = stream.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, counted after the ")" of the name
        # The two clocks read together: `now` may be a moment ago.
        since_boot, current = time.clock_gettime(time.CLOCK_BOOTTIME), time.time()
        return min(now, current - (since_boot - ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    psutil, _ = import_optional("psutil")  # MindSpore needs it
    if psutil is None:
        return now
    try:
        return min(psutil.Process().create_time(), now)
    except (psutil.Error, OSError):
        return now


__all__ = ["process_start"]
