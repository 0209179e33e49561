"""One rank's stack dump, written by the real StackDumper in a fresh process while a thread
waits in a chosen function, so the dump holds that thread and nothing a test left behind.

    python -m tests.support.stack_dump_worker FOLDER RANK STEP {collective,data_loader}
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from otel_mindformers.hangs import dumps
from otel_mindformers.job.identity import Identity
from otel_mindformers.outputs import diagnosis_file as records


class _Progress:
    def __init__(self, step: int) -> None:
        self.step, self.last_step_end, self.phase = step, time.perf_counter(), "step"


class _NoLogger:
    def emit(self, **_record) -> None:
        pass


def hold_in_collective(started: threading.Event, done: threading.Event) -> None:
    started.set()
    done.wait(30)


def hold_in_data_loader(started: threading.Event, done: threading.Event) -> None:
    started.set()
    done.wait(30)


def main(folder: str, rank: str, step: str, target: str) -> None:
    started, done = threading.Event(), threading.Event()
    hold = {"collective": hold_in_collective, "data_loader": hold_in_data_loader}[target]
    thread = threading.Thread(target=hold, args=(started, done), name="worker")
    thread.start()
    started.wait(10)
    identity = Identity(rank=int(rank), world_size=4, host_name="node-a")
    path = records.diagnosis_path(Path(folder) / "m.json", int(rank))
    dumper = dumps.StackDumper(identity, _NoLogger(), _Progress(int(step)), path)
    try:
        dumper.dump("stall", idle_seconds=2.0)
    finally:
        done.set()
        thread.join()


if __name__ == "__main__":
    main(*sys.argv[1:])
