"""Every analysis command on the logs of a real two-rank MindSpore training run."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from otel_mindformers import MonitorCallback
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from tests.support import training
from tests.support.cli import cli, cli_output
from tests.support.plot_pixels import count, load, panels
from tests.support.training import Faults

STEPS = 16
NAN_STEP = STEPS  # the last step: a NaN loss poisons every later step's weights


pytestmark = [pytest.mark.slow, pytest.mark.analysis]  # real training runs


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """`output/` of a two-rank run: rank 0 reports training metrics (and a NaN loss on its
    last step), rank 1 only its step times, as the article's rank policy has it. Rotation is
    on, so the readers go through rotated sets too."""
    root = tmp_path_factory.mktemp("run")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("RANK_SIZE", "2")
        for rank in (0, 1):
            patch.setenv("RANK_ID", str(rank))
            callback = MonitorCallback(
                {
                    "interval": 2,
                    "output_type": ["json_file"],
                    "json_log_path": str(root / "output" / "train_metric.json"),
                    "log_rotation": {"max_bytes": 1200, "backup_count": 50},
                }
            )
            training.train(
                [callback], steps=STEPS, shape="tuple5", faults=Faults(nan_at={NAN_STEP}) if rank == 0 else None
            )
    return root / "output"


def logged(run: Path, rank: int) -> list[dict]:
    """The rank's lines, oldest first, read with nothing but json and the documented names."""
    current = run / f"train_metric_rank_{rank}.json"
    backups = sorted(run.glob(f"{current.name}.*"), key=lambda p: int(p.suffix[1:]), reverse=True)
    return [json.loads(line) for path in [*backups, current] for line in path.read_text().splitlines()]


def test_the_run_rotated_and_logged_what_the_tests_rely_on(run):
    assert list(run.glob("train_metric_rank_0.json.*")), "rotation was expected to roll rank 0's file"
    rank0 = logged(run, 0)
    assert [line["step"] for line in rank0] == [1, *range(2, STEPS + 1, 2)]
    assert rank0[-1]["loss"] is None and sorted(rank0[-1]["nonfinite"]) == ["grad_norm", "loss"]
    assert "loss" not in logged(run, 1)[0]


def test_report_of_the_real_run(run):
    done = cli("report", str(run), "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rank0, rank1 = report["series"]
    assert (rank0["label"], rank1["label"]) == ("rank 0", "rank 1")
    lines = logged(run, 0)
    losses = [line["loss"] for line in lines if line["loss"] is not None]
    assert rank0["records"] == len(lines) and rank1["records"] == len(logged(run, 1))
    assert (rank0["first_loss"], rank0["last_loss"], rank0["min_loss"]) == (losses[0], losses[-1], min(losses))
    assert rank0["nonfinite_steps"] == [NAN_STEP]
    assert rank0["overflow_steps"] == [line["step"] for line in lines if line.get("overflow")]
    assert rank1["first_loss"] is None
    assert rank0["gaps"] == [] and rank0["restarts"] == [] and rank0["stride"] == 2
    assert all(s["step_time_median_ms"] > 0 for s in report["series"])
    assert report["step_time_view"]["slowest"] in ("rank 0", "rank 1")
    text = cli("report", str(run)).stdout
    assert f"rank 0: non-finite values at steps {NAN_STEP}" in text


def test_report_says_the_last_loss_is_not_the_runs_last(run):
    """Rank 0's loss is NaN on its last step: the "last" loss shown is the one before, and
    the report says so (it once read as if the run had ended on that finite value)."""
    lines = logged(run, 0)
    assert lines[-1]["loss"] is None and "loss" in lines[-1]["nonfinite"]
    finite = [line for line in lines if line["loss"] is not None]
    report = json.loads(cli_output("report", str(run), "--format", "json"))
    assert (report["last_loss"], report["loss_nonfinite_since"]) == (finite[-1]["loss"], NAN_STEP)
    assert report["series"][0]["loss_nonfinite_since"] == NAN_STEP
    assert report["series"][1]["loss_nonfinite_since"] is None  # rank 1 logs no loss
    (row,) = [line for line in cli_output("report", str(run)).splitlines() if line.strip().startswith("loss ")]
    assert f"(last finite; non-finite from step {NAN_STEP} to the end)" in row, row


def test_a_nan_rotated_out_of_the_log_is_an_upper_bound_not_the_first_step(run, tmp_path, monkeypatch):
    """A real run whose loss goes NaN at step 3 and stays so, with rotation keeping one
    backup: the NaN's line is gone, the oldest line kept is already non-finite. `report` and
    `hang-report` said "first non-finite value at step <that line>", as if it had started
    there; they say "at or before" it. With the whole log (the module's run) they do not."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK_ID", "0")
    monkeypatch.setenv("RANK_SIZE", "1")
    output = tmp_path / "output"
    callback = MonitorCallback(
        {
            "interval": 1,
            "output_type": ["json_file"],
            "json_log_path": str(output / "train_metric.json"),
            "log_rotation": {"max_bytes": 2000, "backup_count": 1},
        }
    )
    training.train([callback], steps=20, faults=Faults(nan_at={3}))
    kept = [
        json.loads(line)
        for name in ("train_metric.json.1", "train_metric.json")
        for line in (output / name).read_text().splitlines()
    ]
    oldest = kept[0]["step"]
    assert oldest > 3 and kept[0]["loss"] is None, "the NaN's own line was meant to be rotated away"
    assert not (output / "train_metric.json.2").exists()
    said = f"first non-finite value at or before step {oldest} (the oldest line its log kept, non-finite already)"
    assert said in cli_output("report", str(output))
    assert said in cli_output("hang-report", str(output))
    found = json.loads(cli_output("hang-report", str(output), "--format", "json"))["first_nonfinite"]
    assert (found["step"], found["at_or_before"]) == (oldest, True)
    whole = json.loads(cli_output("hang-report", str(run), "--format", "json"))["first_nonfinite"]
    assert whole["step"] == NAN_STEP and "at_or_before" not in whole
    assert f"first non-finite value at step {NAN_STEP}: rank 0" in cli_output("report", str(run))


def test_plot_of_the_real_run(run, tmp_path):
    done = cli("plot", str(run), "-o", str(tmp_path / "run.png"), "--smooth", "0.5")
    assert done.returncode == 0, done.stderr
    pixels = load(tmp_path / "run.png")
    assert pixels.shape == (1000, 1600, 3)
    regions = panels(pixels)
    for metric, region in regions.items():
        assert count(region, "C0") > 100, f"rank 0 missing from the {metric} panel"
    assert count(regions["train_per_step_time"], "C1") > 100, "rank 1's step time missing"
    assert count(regions["loss"], "red", tolerance=40) > 50, "the NaN step is not marked"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_replay_into_a_real_otlp_receiver(run, otlp_receiver, protocol):
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    done = cli("replay", str(run), "--endpoint", endpoint, "--protocol", protocol, "--run-id", "job-42")
    assert done.returncode == 0, done.stderr
    steps = otlp_receiver.spans(semconv.SPAN_STEP)
    for rank in (0, 1):
        lines = logged(run, rank)
        spans = sorted(
            (s for s in steps if s.resource[semconv.ATTR_RANK] == rank), key=lambda s: s.attributes[semconv.ATTR_STEP]
        )
        assert [s.attributes[semconv.ATTR_STEP] for s in spans] == [line["step"] for line in lines]
        for span, line in zip(spans, lines):
            assert span.end_time_unix_nano / 1e9 == pytest.approx(line["time_stamp"], abs=1e-6)
            assert (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6 == pytest.approx(
                line["train_per_step_time"], abs=1e-3
            )
            # The job and attempt the run's lines carry, not the run id: the live data's.
            assert (span.resource[semconv.ATTR_JOB_ID], span.resource[job_names.ATTR_ATTEMPT]) == (
                line["job"]["id"], line["job"]["attempt"]
            )  # fmt: skip
            assert span.status_code == (2 if "nonfinite" in line else 0)
    (run_span,) = [s for s in otlp_receiver.spans(semconv.SPAN_RUN) if s.resource[semconv.ATTR_RANK] == 0]
    assert all(s.links == [(run_span.trace_id, run_span.span_id)] for s in steps if s.resource[semconv.ATTR_RANK] == 0)
    loss = sorted(otlp_receiver.points(tm.instrument_name(tm.LOSS)), key=lambda p: p.time_unix_nano)
    finite = [line for line in logged(run, 0) if line["loss"] is not None]
    assert [p.value for p in loss] == pytest.approx([line["loss"] for line in finite])
    assert [p.time_unix_nano / 1e9 for p in loss] == pytest.approx([line["time_stamp"] for line in finite], abs=1e-6)
    assert all(p.attributes == {semconv.ATTR_RANK: 0} for p in loss)


def test_replaying_twice_sends_the_same_ids(run, otlp_receiver):
    def ids() -> list[tuple[str, str]]:
        return sorted((s.trace_id, s.span_id) for s in otlp_receiver.spans())

    assert cli("replay", str(run), "--endpoint", otlp_receiver.grpc_endpoint).returncode == 0
    first = ids()
    assert cli("replay", str(run), "--endpoint", otlp_receiver.grpc_endpoint).returncode == 0
    both = ids()
    assert len(set(first)) == len(first) > 0  # distinct within one replay
    assert both == sorted(first * 2)  # and the very same again


def test_replay_into_tensorboard_keeps_steps_and_wall_times(run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for _ in range(2):  # a second replay replaces the first, it does not add to it
        done = cli("replay", str(run), "--tensorboard", str(tmp_path / "tb"))
        assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        files = list((tmp_path / "tb" / f"rank_{rank}").iterdir())
        assert len(files) == 1
        events = EventAccumulator(str(files[0]))
        events.Reload()
        times = events.Scalars("train_per_step_time")
        lines = logged(run, rank)
        assert [(e.step, e.wall_time) for e in times] == [
            (line["step"], pytest.approx(line["time_stamp"], abs=1e-3)) for line in lines
        ]
    loss = EventAccumulator(str(tmp_path / "tb" / "rank_0")).Reload().Scalars("loss")
    assert [e.step for e in loss] == [line["step"] for line in logged(run, 0)]


def test_replay_to_a_closed_port_is_one_error_line(run):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = cli("replay", str(run), "--endpoint", f"http://127.0.0.1:{port}", "--timeout", "1")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: sending the spans of rank 0")
    assert "Traceback" not in done.stderr


# A file the commands cannot draw a single step from: a rank killed before its first line was
# whole, an empty file, a file that is not a training log. It once read as a series of 0
# records: `report` printed an empty table and "Findings: none", `plot` an empty PNG, and a
# text file was "a truncated last line", all with exit status 0.
NOT_A_LOG = {
    "empty": ("", "no step records (the file is empty)"),
    "cut_short": ('{"time_stamp": 1796219363.42, "step": 1, "ep', "no step records (its only line, 1, is cut short"),
    "text": ("hello world\n", "no step records (not a JSON-lines log: line 1 is not JSON: 'hello world')"),
    "other_json": (
        '{"name": "llama"}\n[1, 2]\n',
        'no step records (2 line(s), none with a "step": not a training log)',
    ),
}


@pytest.mark.parametrize("command", ["report", "plot", "replay"])
@pytest.mark.parametrize("kind", list(NOT_A_LOG))
def test_a_file_with_no_step_record_is_one_error_line(tmp_path, command, kind):
    text, problem = NOT_A_LOG[kind]
    log = tmp_path / "train_metric.json"
    log.write_text(text)
    extra = {"report": [], "plot": ["-o", str(tmp_path / "x.png")], "replay": ["--tensorboard", str(tmp_path / "tb")]}
    done = cli(command, str(log), *extra[command])
    assert done.returncode == 1, done.stdout
    (line,) = done.stderr.splitlines()  # one line, no traceback, no "truncated last line" note
    assert line.startswith(f"error: {log}: {problem}"), line
    assert done.stdout == ""
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "tb").exists()


def test_a_rank_killed_before_its_first_line_is_named_beside_the_others(run, tmp_path):
    """A folder of the real run plus rank 2's empty file: the report goes on with the ranks
    that logged, and one line names the file that holds no step."""
    output = tmp_path / "output"
    shutil.copytree(run, output)
    (output / "train_metric_rank_2.json").write_text("")
    done = cli("report", str(output), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert [s["records"] for s in json.loads(done.stdout)["series"]] == [
        len(logged(run, 0)),
        len(logged(run, 1)),
        0,
    ]
    named = [line for line in done.stderr.splitlines() if "train_metric_rank_2.json" in line]
    assert named == [f"otel_mindformers: {output / 'train_metric_rank_2.json'}: no step records (the file is empty)"]
