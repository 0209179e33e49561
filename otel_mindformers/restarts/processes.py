"""The processes the ledger names: whether an attempt's is gone (when one began: core/process_start.py).

An attempt's heartbeat says it lived a few seconds ago; on its own host, the process table
says whether it lives now. A run started right after a killed one (same folder) would
otherwise take the dead attempt for a live one until its heartbeat went stale
(3 intervals + 1 s: 16 s by default).
"""

from __future__ import annotations

import socket
from typing import Any

from otel_mindformers.core.process_start import started_at

# A start read from /proc is good to a clock tick (10 ms); psutil's to a second. A process
# that began this much after the attempt's recorded start is another one with its pid.
_START_SLACK_SECONDS = 1.0


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


__all__ = ["process_gone"]
