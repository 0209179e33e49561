"""The local outputs' sinks (otel_mindformers/outputs/) on real pipes and files, read back as
their users read them: a pipe's reader, TensorBoard's own reader."""

from __future__ import annotations

import os
import shutil

import pytest

from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.outputs.jsonl import JsonLinesSink
from otel_mindformers.outputs.runs import stamp
from otel_mindformers.outputs.sink import SinkFanout
from otel_mindformers.outputs.stdout import StdoutSink
from otel_mindformers.outputs.tensorboard import TensorBoardSink, set_previous_run_aside


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
