"""The JSON sink's lock: writers in separate processes share one file that rolls over, and
a writer frozen while it holds the lock costs a run its `json_file`, never its training.

With a small `log_rotation.max_bytes`, every few lines some writer renames the file to a
backup while the others are appending. Only the lock (flock, re-checked against the inode
the path names) keeps every line whole and in exactly one file; without it, concurrent
rollovers replace each other's backups and lines are lost.
"""

from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from otel_mindformers.config import LogRotationConfig, OutputsConfig
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.flight_recorder.recovery import take_tail
from otel_mindformers.job.identity import Identity
from otel_mindformers.outputs import build_sinks
from otel_mindformers.outputs.jsonl import JsonLinesSink
from otel_mindformers.restarts.ledger_file import ledger_path
from tests.support.reliability_worker import finish, spawn
from tests.support.waiting import wait_until

WRITERS = 6
LINES = 60


def _write(path: str, rank: int, start: multiprocessing.Barrier) -> None:
    sink = JsonLinesSink(Path(path), LogRotationConfig(max_bytes=400, backup_count=1_000))
    # Every writer opens the log before any appends: an open waits 1 s for the lock, and a
    # roll-over shifting a hundred backups holds it longer than that on a loaded machine.
    start.wait()
    for step in range(1, LINES + 1):
        sink.write([StepRecord(step=step, epoch=1, rank=rank, time_stamp=1.0, values={"loss": 0.5})])
    sink.close()


@pytest.mark.slow
def test_concurrent_writers_with_rollover_lose_and_split_no_line(tmp_path):
    path = tmp_path / "shared.json"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WRITERS + 1)
    writers = [context.Process(target=_write, args=(str(path), rank, start)) for rank in range(WRITERS)]
    for writer in writers:
        writer.start()
    start.wait(timeout=300)
    for writer in writers:
        writer.join(timeout=300)
        assert writer.exitcode == 0
    files = sorted(tmp_path.glob("shared.json*"))
    assert len(files) > 50, "the file rolled over many times while all writers were appending"
    seen = [json.loads(line) for file in files for line in file.read_text().splitlines()]
    assert sorted((line["rank"], line["step"]) for line in seen) == [
        (rank, step) for rank in range(WRITERS) for step in range(1, LINES + 1)
    ]


# --- a writer frozen while it held the log's lock (issue 46, item 5) ---------------------------


@pytest.mark.parametrize("first_step", [0, 7], ids=["a new run", "a resumed run"])
def test_a_held_log_lock_turns_json_file_off_with_one_warning_after_a_bounded_wait(tmp_path, caplog, first_step):
    """The lock is held by another open file of the log (flock is per open file, so this
    process stands in for a frozen writer): the outputs start without `json_file`, say so
    once, and leave the file as it is: no set-aside, no cut, no ConfigError."""
    log = tmp_path / "train_metric.json"
    log.write_bytes(b'{"step": 1}\n{"step": 2, "loss"')
    holder = os.open(log, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    config = OutputsConfig(["stdout", "json_file"], str(log), str(tmp_path / "board"), LogRotationConfig())
    try:
        with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
            sinks = build_sinks(config, Identity(), reports_training=True, first_step=first_step)
    finally:
        os.close(holder)
    assert [sink.name for sink in sinks] == ["stdout"]
    assert [r.getMessage() for r in caplog.records] == [
        "otel_mindformers: the json_file output (monitor_config.output_type) is off for this run: "
        f"{log} is held by another process for more than 1 s (a frozen or suspended earlier writer?)"
    ]
    assert log.read_bytes() == b'{"step": 1}\n{"step": 2, "loss"'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_metric.json"]


FROZEN_WRITER = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
fcntl.flock(fd, fcntl.LOCK_EX)  # as JsonLinesSink.append holds it
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # frozen mid-write: a suspended job, a hung mount
"""


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("WARNING:otel_mindformers")]


@pytest.mark.slow  # real trainings: one killed, the next one beside a frozen writer
@pytest.mark.mindspore_api
def test_a_log_lock_held_by_a_frozen_writer_turns_json_file_off_and_keeps_the_dead_runs_ring(tmp_path):
    """Attempt 1 is killed with records its outputs had not written (they wait in its flight
    ring); a writer of its log is frozen holding the log's lock. Attempt 2 waits a bounded
    time for that lock (before, it waited for as long as the writer stayed frozen, in the
    ring's recovery and again in its sink: for ever), then trains to its end without
    `json_file`, with one warning, and leaves the ring for a later reader."""
    log = tmp_path / "out" / "train_metric.json"
    config = {
        "interval": 1, "job_id": "frozen-log", "output_type": ["json_file"], "json_log_path": str(log),
        "stragglers": {"signal": False},  # a loaded host's data wait: the input-bound warning, not this test's
    }  # fmt: skip
    killed = spawn(
        {"config": config, "steps": 200, "graph": True, "report": str(tmp_path / "1.json"), "at": {"23": [["die", "SIGKILL"]]}},
        tmp_path,
    )  # fmt: skip
    finish(killed)
    assert killed.returncode == -signal.SIGKILL
    (ring,) = tmp_path.glob("out/*.flight")
    tail = take_tail(ring)
    unwritten = [slot.step for slot in tail.slots]
    tail.release()
    assert unwritten and unwritten[-1] == 23, "the test needs records the killed run had not written"
    logged = log.read_bytes()

    writer = subprocess.Popen([sys.executable, "-c", FROZEN_WRITER, str(log)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "locked"
        wait_until(lambda: _state(writer.pid) == "T", "the writer to stop", writer)
        attempt = spawn(
            {"config": config, "steps": 5, "report": str(tmp_path / "2.json"), "log_level": "WARNING"}, tmp_path
        )
        _, err = finish(attempt)
        assert _state(writer.pid) == "T", "the writer was frozen for the whole of attempt 2"
    finally:
        writer.kill()
        writer.wait()
    assert attempt.returncode == 0, err[-3000:]
    about_the_log = [w for w in _warnings(err) if "joining job" not in w]  # the same job id again from step 0
    assert about_the_log == [
        f"WARNING:otel_mindformers.outputs:otel_mindformers: the json_file output (monitor_config.output_type) is "
        f"off for this run: {log} is held by another process for more than 1 s (a frozen or suspended earlier writer?)"
    ]
    assert json.loads((tmp_path / "2.json").read_text())["error"] is None
    assert log.read_bytes() == logged, "nothing written, set aside or cut under a lock another process holds"
    tail = take_tail(ring)  # kept, its tail unrecovered: the next reader recovers it
    assert [slot.step for slot in tail.slots] == unwritten
    tail.release()
    ledger = json.loads(ledger_path(str(log), 0).read_text())
    assert [(a["attempt"], a["outcome"], a["last_step"]) for a in ledger["attempts"]] == [
        (1, "killed", 23), (2, "completed", 5)
    ]  # fmt: skip


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
