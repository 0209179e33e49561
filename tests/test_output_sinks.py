"""The local outputs' sinks (otel_mindformers/outputs/) on real pipes and files, read back as
their users read them: a pipe's reader, TensorBoard's own reader."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal

import pytest

from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.outputs.jsonl import JsonLinesSink
from otel_mindformers.outputs.runs import stamp
from otel_mindformers.outputs.sink import SinkFanout
from otel_mindformers.outputs.stdout import StdoutSink
from otel_mindformers.outputs.tensorboard import TensorBoardSink, set_previous_run_aside
from tests.support.tensorboard_events import loss_steps


def _record(step: int) -> StepRecord:
    return StepRecord(step=step, epoch=1, rank=0, time_stamp=1733000000.0 + step, values={"loss": 2.5})


def test_each_batch_of_stdout_lines_reaches_a_pipe_at_once():
    """`python train.py | tee train.log`: stdout into a pipe is block-buffered, so without a
    flush a reader sees the step lines only when the buffer fills or the process ends."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    with open(write_fd, "w", buffering=8192) as stream, open(read_fd, "rb", buffering=0) as reader:
        StdoutSink(stream).write([_record(4), _record(8)])
        arrived = (reader.read(65536) or b"").decode()
    assert arrived.splitlines() == [
        "[otel_mindformers] rank 0 epoch 1 step 4 | loss 2.5000",
        "[otel_mindformers] rank 0 epoch 1 step 8 | loss 2.5000",
    ]


def test_a_previous_runs_event_files_go_into_a_folder_named_when_it_last_wrote(tmp_path):
    """outputs/tensorboard.py: the previous run's files move into `rank_0/<when it last
    wrote>/`; of two event files, the later one's time names the folder."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    logdir = tmp_path / "rank_0"
    for step, last_write in ((1, 1733000000), (2, 1733003600)):  # an hour apart
        sink = TensorBoardSink(logdir)
        sink.write([_record(step)])
        sink.close()
        (newest,) = [p for p in logdir.glob("events.out.tfevents.*") if p.stat().st_mtime > 1733000000 + 7200]
        os.utime(newest, (last_write, last_write))
    kept = set_previous_run_aside(logdir)
    assert kept == logdir / stamp(1733003600)
    assert not list(logdir.glob("events.out.tfevents.*"))
    multiplexer = EventMultiplexer().AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    assert {run: [e.step for e in multiplexer.Scalars(run, "loss")] for run in multiplexer.Runs()} == {
        f"rank_0/{kept.name}": [1, 2]
    }


def test_a_failing_output_is_said_once_tried_again_and_its_return_said_once(tmp_path, caplog):
    """outputs/sink.py: the JSON log's folder taken by a file fails every write (ENOTDIR) until
    it is given back; the first failure and the first return are said as they happen, a later
    failure once at the end, with the batches it cost."""
    logs = tmp_path / "logs"
    fanout = SinkFanout([JsonLinesSink(logs / "train_metric.json")])

    def take_the_folder() -> None:
        shutil.rmtree(logs)
        logs.write_text("")

    wrote = [fanout.write([_record(1)])]
    take_the_folder()
    wrote += [fanout.write([_record(2)]), fanout.write([_record(3)])]
    logs.unlink()
    wrote.append(fanout.write([_record(4)]))
    take_the_folder()
    wrote += [fanout.write([_record(5)]), fanout.write([_record(6), _record(7)])]
    fanout.close()
    assert wrote == [True, False, False, True, False, False]
    said = [r.getMessage() for r in caplog.records if "output 'json_file'" in r.getMessage()]
    assert len(said) == 3, said
    assert "failed: cannot write" in said[0] and "Not a directory" in said[0]
    assert "writes again from step 4 (the records of steps 2..3 are missing from it)" in said[1]
    assert "failed again after it first wrote again: 2 more batch(es) missing from it, the last up to step 7" in said[2]


class _ClosesBadly:
    """An output whose writes fail while `failing` is set and whose close always fails."""

    name = "closes_badly"

    def __init__(self) -> None:
        self.failing = False

    def write(self, records) -> None:
        if self.failing:
            raise OSError("No space left on device")

    def close(self) -> None:
        raise OSError("Bad file descriptor")


@pytest.mark.parametrize("back", [True, False], ids=["written again", "failing still"])
def test_an_output_failing_at_its_close_is_said_unless_its_failure_was(caplog, back):
    """Its failure at the close is news once the output wrote again; while it fails, its
    failure was said already."""
    sink = _ClosesBadly()
    fanout = SinkFanout([sink])
    sink.failing = True
    fanout.write([_record(1)])
    sink.failing = not back
    fanout.write([_record(2)])
    fanout.close()
    said = [r.getMessage() for r in caplog.records if "'closes_badly'" in r.getMessage()]
    assert ["failed at its close" in line for line in said] == ([False, False, True] if back else [False]), said


def _records(first: int, count: int, metrics: int = 1) -> list[StepRecord]:
    values = {"loss": 2.5, **{f"metric_{index}": 1.0 for index in range(metrics - 1)}}
    return [
        StepRecord(step=step, epoch=1, rank=0, time_stamp=1733000000.0 + step, values=values)
        for step in range(first, first + count)
    ]


@contextlib.contextmanager
def _file_size_limit(limit: int):
    """Writes past `limit` bytes of a file fail (EFBIG), as on a full disk; without privileges."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_tensorboard_file_that_failed_is_followed_by_a_new_one_and_a_new_one_that_fails_is_removed(tmp_path, caplog):
    """outputs/tensorboard.py: after a failed write the old file (which may end mid-event) is
    never appended to; the next batch starts a new file, and one that fails too is removed
    (a disk that stays full gathers no files); the next good batch's file is the last new one."""
    logdir = tmp_path / "rank_0"
    sink = TensorBoardSink(logdir)
    sink.write(_records(1, 100))  # large enough that the warnings' captured output fits under the limit
    (first,) = logdir.glob("events.out.tfevents.*")
    with _file_size_limit(first.stat().st_size):
        for batch in (_records(101, 200, metrics=8), _records(301, 200, metrics=8)):
            with pytest.raises(OSError, match="cannot write .*File too large"):
                sink.write(batch)
            assert list(logdir.glob("events.out.tfevents.*")) == [first]
    sink.write(_records(501, 1))
    sink.write(_records(502, 1))
    sink.close()
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2
    assert loss_steps(logdir) == [*range(1, 101), 501, 502]
    assert not [r for r in caplog.records if "was removed while the run wrote it" in r.getMessage()]


def test_a_tensorboard_file_removed_mid_run_is_followed_by_a_new_one_said_once(tmp_path, caplog):
    logdir = tmp_path / "rank_0"
    sink = TensorBoardSink(logdir)
    for step in (1, 2, 3):
        sink.write(_records(step, 1))
        (current,) = logdir.glob("events.out.tfevents.*")
        current.unlink()  # `rm` of the file, twice: the run writes on in a new one each time
    sink.write(_records(4, 1))
    sink.close()
    assert loss_steps(logdir) == [4]
    said = [r.getMessage() for r in caplog.records if "was removed while the run wrote it" in r.getMessage()]
    assert len(said) == 1, said


class _CutInAtRollOver(JsonLinesSink):
    """A JSON log whose roll-over finds another writer's line already in the new file: that
    writer reopened the path after the rename and wrote before this one locked the new file
    (two processes' timing, made certain here)."""

    cut_in = b""

    def _open(self) -> int:
        if self.cut_in and self.path.exists() is False:
            other = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(other, self.cut_in)
            os.close(other)
            self.cut_in = b""  # once
        return super()._open()


def test_a_roll_over_counts_what_another_writer_put_into_the_new_file(tmp_path):
    """outputs/jsonl.py: the new file's size after a roll-over is read, not taken as 0, so
    another writer's lines in it count toward max_bytes."""
    from otel_mindformers.config.schema import LogRotationConfig
    from otel_mindformers.outputs.jsonl import encode

    path = tmp_path / "train_metric.json"
    limit = 3 * len(encode(_record(1))) + 4  # three lines of one-digit steps, not four
    sink = _CutInAtRollOver(path, LogRotationConfig(max_bytes=limit, backup_count=10))
    sink.write([_record(step) for step in (1, 2, 3)])
    sink.cut_in = encode(_record(100))
    sink.write([_record(step) for step in (4, 5, 6, 7)])
    sink.close()
    files = sorted(tmp_path.glob("train_metric.json*"))
    assert all(file.stat().st_size <= limit for file in files), [file.stat().st_size for file in files]
    steps = sorted(json.loads(text)["step"] for file in files for text in file.read_text().splitlines())
    assert steps == [1, 2, 3, 4, 5, 6, 7, 100]


def test_the_json_log_is_written_again_under_its_folders_made_again(tmp_path):
    """`rm -rf out/` of a log at out/logs/train_metric.json: both folders are made again."""
    path = tmp_path / "out" / "logs" / "train_metric.json"
    sink = JsonLinesSink(path)
    sink.write([_record(1)])
    shutil.rmtree(tmp_path / "out")
    sink.write([_record(2)])
    sink.close()
    assert [json.loads(text)["step"] for text in path.read_text().splitlines()] == [2]
