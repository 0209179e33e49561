"""`log_rotation`: json_file rolls over between whole lines; TensorBoard keeps N event files."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otel_mindformers import MonitorCallback
from otel_mindformers.outputs.jsonl_reader import discover, read_logs
from tests.support import training
from tests.support.paths import EXAMPLES

pytestmark = pytest.mark.analysis

EXAMPLE = EXAMPLES / "analyze_loss.py"


def monitor(workdir: Path, **overrides) -> MonitorCallback:
    config = {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "output" / "train_metric.json"),
        **overrides,
    }
    return MonitorCallback(config)


def assert_whole_lines(paths) -> list[dict]:
    """Every file ends on a newline and every line is a JSON object: nothing split."""
    lines = []
    for path in paths:
        text = path.read_text()
        assert text.endswith("\n"), f"{path} ends mid-line"
        lines += [json.loads(line) for line in text.splitlines()]
    return lines


@pytest.mark.slow
def test_training_with_tiny_max_bytes_loses_and_splits_no_line(workdir):
    max_bytes = 400
    training.train(
        [monitor(workdir, log_rotation={"max_bytes": max_bytes, "backup_count": 100})], steps=20, shape="tuple5"
    )
    (log_set,) = discover([workdir / "output"])
    assert len(log_set.files) > 5, "max_bytes this small must have rolled over several times"
    lines = assert_whole_lines(log_set.files)
    assert [line["step"] for line in lines] == list(range(1, 21))  # interval 1: every step, in order
    for path in log_set.files:
        size, count = path.stat().st_size, len(path.read_text().splitlines())
        assert size <= max_bytes or count == 1, f"{path} holds {count} lines in {size} bytes"
    (series,) = read_logs([workdir / "output" / "train_metric.json"])
    assert [p.step for p in series.points] == list(range(1, 21))


@pytest.mark.slow
def test_backup_count_keeps_the_newest_files(workdir):
    training.train([monitor(workdir, log_rotation={"max_bytes": 400, "backup_count": 3})], steps=20, shape="tuple5")
    (log_set,) = discover([workdir / "output" / "train_metric.json"])
    assert [p.name for p in log_set.files] == [
        "train_metric.json.3",
        "train_metric.json.2",
        "train_metric.json.1",
        "train_metric.json",
    ]
    steps = [line["step"] for line in assert_whole_lines(log_set.files)]
    assert steps[-1] == 20 and steps == list(range(steps[0], 21))  # the oldest dropped, the rest contiguous


@pytest.mark.slow
def test_article_script_reads_the_current_file_of_a_rotated_set(workdir, monkeypatch):
    training.train([monitor(workdir, log_rotation={"max_bytes": 600, "backup_count": 20})], steps=12, shape="tuple5")
    current = workdir / "output" / "train_metric.json"
    expected = [(line["step"], line["loss"]) for line in assert_whole_lines([current])]
    namespace = runpy.run_path(str(EXAMPLE), run_name="__main__")  # the article's own code, in the workdir
    assert (workdir / "loss_curve.png").stat().st_size > 0
    steps, losses = namespace["load_metric_log"]("./output/train_metric.json")
    assert list(zip(steps, losses)) == expected


@pytest.mark.slow
def test_concurrent_writers_roll_over_without_losing_lines(tmp_path):
    # Two processes append to one file with rotation on: the lock and the reopen-after-
    # someone-else-rolled-it-over keep every line whole and present.
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from otel_mindformers.config import LogRotationConfig
        from otel_mindformers.outputs.jsonl import JsonLinesSink
        sink = JsonLinesSink(Path(sys.argv[1]), LogRotationConfig(max_bytes=2000, backup_count=1000))
        for i in range(400):
            sink.append([('{"writer": "%s", "i": %d, "pad": "%s"}\\n' % (sys.argv[2], i, "x" * (i % 50))).encode()])
        sink.close()
        """
    )
    path = tmp_path / "shared.json"
    writers = [subprocess.Popen([sys.executable, "-c", script, str(path), name]) for name in ("a", "b")]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    (log_set,) = discover([path])
    lines = assert_whole_lines(log_set.files)
    for name in ("a", "b"):
        assert [line["i"] for line in lines if line["writer"] == name] == list(range(400))
    assert all(p.stat().st_size <= 2000 for p in log_set.files)


@pytest.mark.slow
def test_tensorboard_keeps_a_bounded_number_of_event_files(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rotation = {"max_bytes": 800, "tensorboard_max_files": 2}
    tb_path = workdir / "tb"
    for _ in range(2):  # a restarted run starts a new event file too
        training.train(
            [monitor(workdir, output_type=["tensorboard"], tensorboard_path=str(tb_path), log_rotation=rotation)],
            steps=12,
            shape="tuple5",
        )
    rank_dir = tb_path / "rank_0"
    files = sorted(rank_dir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
    assert len(files) == 2
    newest = EventAccumulator(str(files[-1]))
    newest.Reload()
    assert newest.Scalars("loss")[-1].step == 12


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"max_bytes": -1}, "monitor_config.log_rotation.max_bytes: must be >= 0, got -1"),
        ({"backup_count": 0}, "monitor_config.log_rotation.backup_count: must be >= 1, got 0"),
        ({"max_byte": 10}, "monitor_config.log_rotation.max_byte: unknown key (did you mean 'max_bytes'?)"),
    ],
)
def test_log_rotation_config_errors_name_the_key(bad, message):
    from otel_mindformers.config import ConfigError, load_monitor_config

    with pytest.raises(ConfigError) as caught:
        load_monitor_config({"log_rotation": bad})
    assert str(caught.value) == message


def test_a_line_longer_than_max_bytes_gets_a_file_of_its_own(tmp_path):
    from otel_mindformers.config import LogRotationConfig
    from otel_mindformers.outputs.jsonl import JsonLinesSink

    path = tmp_path / "m.json"
    sink = JsonLinesSink(path, LogRotationConfig(max_bytes=10, backup_count=5))
    for i in range(3):
        sink.append([json.dumps({"step": i, "pad": "x" * 40}).encode() + b"\n"])
    sink.close()
    (log_set,) = discover([path])
    assert [[line["step"] for line in assert_whole_lines([p])] for p in log_set.files] == [[0], [1], [2]]


def test_a_batch_of_lines_rolls_over_between_whole_lines(tmp_path):
    """The pipeline hands a batch of records at once: the file still rolls over between them."""
    from otel_mindformers.config import LogRotationConfig
    from otel_mindformers.outputs.jsonl import JsonLinesSink

    path = tmp_path / "m.json"
    sink = JsonLinesSink(path, LogRotationConfig(max_bytes=100, backup_count=10))
    sink.append([json.dumps({"step": i, "pad": "x" * 20}).encode() + b"\n" for i in range(7)])
    sink.close()
    (log_set,) = discover([path])
    assert [[line["step"] for line in assert_whole_lines([p])] for p in log_set.files] == [[0, 1], [2, 3], [4, 5], [6]]
    assert all(p.stat().st_size <= 100 for p in log_set.files)


def test_lines_that_fill_max_bytes_exactly_stay_in_one_file(tmp_path):
    """The file rolls over before a line would pass max_bytes (docs/analysis.md): lines that
    reach it exactly stay together."""
    from otel_mindformers.config import LogRotationConfig
    from otel_mindformers.outputs.jsonl import JsonLinesSink

    path = tmp_path / "m.json"
    lines = [json.dumps({"step": i, "pad": "x" * 27}).encode() + b"\n" for i in range(4)]
    assert {len(line) for line in lines} == {50}
    sink = JsonLinesSink(path, LogRotationConfig(max_bytes=100, backup_count=10))
    for line in lines:
        sink.append([line])
    sink.close()
    (log_set,) = discover([path])
    assert [[line["step"] for line in assert_whole_lines([p])] for p in log_set.files] == [[0, 1], [2, 3]]
    assert [p.stat().st_size for p in log_set.files] == [100, 100]


@pytest.mark.slow
def test_a_short_write_of_a_batch_keeps_its_whole_lines(tmp_path):
    """A disk that fills in the middle of a batch: the lines that made it stay, the partial one goes."""
    script = textwrap.dedent(
        """
        import json, resource, signal, sys
        from pathlib import Path
        from otel_mindformers.outputs.jsonl import JsonLinesSink

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
        sink = JsonLinesSink(Path(sys.argv[1]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))
        try:
            sink.append([json.dumps({"step": i, "pad": "x" * 7}).encode() + b"\\n" for i in range(5)])
        except OSError as exc:
            print(exc.errno)
        """
    )
    path = tmp_path / "m.json"
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "28", "the short write is reported as a full disk"
    # 30-byte lines under a 100-byte limit: three whole lines fit, the fourth was cut.
    assert [line["step"] for line in assert_whole_lines([path])] == [0, 1, 2]


def test_tensorboard_rolls_over_past_max_bytes_and_prunes(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from otel_mindformers.config import LogRotationConfig
    from otel_mindformers.core.step_record import StepRecord
    from otel_mindformers.outputs.tensorboard import TensorBoardSink

    sink = TensorBoardSink(tmp_path, LogRotationConfig(max_bytes=300, tensorboard_max_files=3))
    for step in range(1, 41):
        # is_last makes the sink flush every record, so sizes are on disk when checked.
        sink.write(
            [
                StepRecord(
                    step=step,
                    epoch=1,
                    rank=0,
                    time_stamp=1000.0 + step,
                    values={"loss": 1.0 / step, "learning_rate": 0.1},
                    is_last=True,
                )
            ]
        )
    sink.close()
    files = sorted(tmp_path.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
    assert len(files) == 3
    steps = []
    for path in files:
        events = EventAccumulator(str(path))
        events.Reload()
        steps += [e.step for e in events.Scalars("loss")]
    assert steps == list(range(steps[0], 41)) and steps[0] > 1  # the newest, contiguous; the oldest pruned
