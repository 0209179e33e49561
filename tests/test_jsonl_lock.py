"""The JSON sink's lock: writers in separate processes share one file that rolls over.

With a small `log_rotation.max_bytes`, every few lines some writer renames the file to a
backup while the others are appending. Only the lock (flock, re-checked against the inode
the path names) keeps every line whole and in exactly one file; without it, concurrent
rollovers replace each other's backups and lines are lost.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from otel_mindformers.config import LogRotationConfig
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.outputs.jsonl import JsonLinesSink

WRITERS = 6
LINES = 60


def _write(path: str, rank: int, start: multiprocessing.Event) -> None:
    sink = JsonLinesSink(Path(path), LogRotationConfig(max_bytes=400, backup_count=1_000))
    start.wait()
    for step in range(1, LINES + 1):
        sink.write([StepRecord(step=step, epoch=1, rank=rank, time_stamp=1.0, values={"loss": 0.5})])
    sink.close()


@pytest.mark.slow
def test_concurrent_writers_with_rollover_lose_and_split_no_line(tmp_path):
    path = tmp_path / "shared.json"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    writers = [context.Process(target=_write, args=(str(path), rank, start)) for rank in range(WRITERS)]
    for writer in writers:
        writer.start()
    start.set()
    for writer in writers:
        writer.join(timeout=300)
        assert writer.exitcode == 0
    files = sorted(tmp_path.glob("shared.json*"))
    assert len(files) > 50, "the file rolled over many times while all writers were appending"
    seen = [json.loads(line) for file in files for line in file.read_text().splitlines()]
    assert sorted((line["rank"], line["step"]) for line in seen) == [
        (rank, step) for rank in range(WRITERS) for step in range(1, LINES + 1)
    ]
