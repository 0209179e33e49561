"""What a worker process leaves behind when a fatal signal (SIGSEGV at exit, say) kills it.

A worker script calls `enable()` first, before it imports MindSpore, when the test set
`FAULT_LOG_DIR` in its environment. Then, in `FAULT_LOG_DIR/faulthandler_<worker>.log`:
- `faulthandler` writes every thread's Python stack if SIGSEGV, SIGFPE, SIGABRT, SIGBUS or
  SIGILL kills the process while the interpreter runs, module teardown included (MindSpore's
  `init()` and data pipeline leave the handler in place);
- the line `EXIT_MARK` is written by the last of the Python exit handlers (registered
  before MindSpore's, it runs after them).

So a log with the mark and no stack means the process died after Python finished its exit
handlers, in native teardown (C++ destructors), where no Python code of ours runs. The test
puts `read(folder)` in its failure message: a crash seen once in CI shows where it happened.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
from pathlib import Path
from typing import TextIO

ENV = "FAULT_LOG_DIR"
EXIT_MARK = "every Python exit handler has run"
_PREFIX = "faulthandler_"
_files: list[TextIO] = []  # faulthandler writes to the file's descriptor: keep it open


def enable() -> Path | None:
    """Arm the log in `$FAULT_LOG_DIR` (nothing when unset); the log's path."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / f"{_PREFIX}{_worker_name()}.log"
    file = path.open("w", buffering=1)
    _files.append(file)
    faulthandler.enable(file=file, all_threads=True)
    atexit.register(file.write, f"{EXIT_MARK}\n")
    return path


def _worker_name() -> str:
    """msrun's name for the process: `scheduler`, or `worker_<MS_NODE_ID>` (its rank here)."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return "scheduler"
    node = os.environ.get("MS_NODE_ID")
    return f"worker_{node}" if node is not None else f"pid_{os.getpid()}"


def read(folder: str | os.PathLike[str]) -> str:
    """Every log in `folder`, each under its file name ("" when there is none)."""
    parts = [
        f"--- {path.name} ---\n{path.read_text(errors='replace').strip() or '(empty)'}"
        for path in sorted(Path(folder).glob(f"{_PREFIX}*.log"))
    ]
    return "\n".join(parts)
