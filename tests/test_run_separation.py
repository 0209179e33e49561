"""One run per file: a second run does not append to the first one's JSON log or event files.

A run that starts at step 0 sets the previous run's files aside under a name that says when
it last wrote; a resumed run (its step count starts past 0) writes on after it. The tests
train for real, with the article's custom monitor appending to the same JSON file, and read
the result with the article's own script, the analysis CLI's reader and TensorBoard's.
"""

from __future__ import annotations

import fcntl
import json
import os
import runpy
import signal
import socket
import time
from pathlib import Path

import pytest

from otel_mindformers import MonitorCallback
from otel_mindformers.outputs.jsonl_reader import read_logs
from tests.support import training
from tests.support.cli import cli, cli_output
from tests.support.jsonl import json_lines as lines
from tests.support.paths import EXAMPLES
from tests.support.permissions import obey_file_permissions
from tests.support.reliability_worker import finish, spawn
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def monitor(workdir: Path, **overrides) -> MonitorCallback:
    """The article's outputs at their default paths, with the article's custom monitor
    (which opens `json_log_path` in its constructor: the demo creates ./output first)."""
    (workdir / "output").mkdir(exist_ok=True)
    config = {
        "interval": 2,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": "./output/train_metric.json",
        "tensorboard_path": "./output/tensorboard_log",
        "custom_monitor_callback": "custom_monitor.CustomMetricMonitor",
        "alert_config": {"loss_threshold": 1e9},
        **overrides,
    }
    return MonitorCallback(config, source_dir=str(EXAMPLES))


def resume(callback: MonitorCallback, from_step: int, steps: int) -> None:
    """Train `steps` more steps counting on from `from_step`: MindSpore's own resume entry
    (`Model._train(initial_step=...)`, what `Model.train` calls after a failure repair)."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    model = training.build_model("tuple5")
    model._train(
        1, training.build_dataset(steps), callbacks=[callback], dataset_sink_mode=False, initial_step=from_step
    )


def ours(path: Path) -> list[int]:
    return [line["step"] for line in lines(path) if "rank" in line]


def tensorboard_steps(logdir: Path) -> dict[str, list[int]]:
    """What TensorBoard shows: each run (folder) under `logdir` and its loss steps."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    multiplexer = EventMultiplexer().AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    return {run: [event.step for event in multiplexer.Scalars(run, "loss")] for run in multiplexer.Runs()}


def test_a_second_run_sets_the_first_runs_log_aside(workdir):
    training.train([monitor(workdir)], steps=6, shape="tuple5")
    first_run = lines(workdir / "output" / "train_metric.json")
    training.train([monitor(workdir)], steps=8, shape="tuple5")

    current = workdir / "output" / "train_metric.json"
    (kept,) = sorted((workdir / "output").glob("train_metric.*.json"))
    assert lines(kept) == first_run, "the first run's lines, ours and the custom monitor's, kept whole"
    assert ours(current) == [1, 2, 4, 6, 8]
    custom = [line["step"] for line in lines(current) if "lr" in line]
    assert custom == list(range(1, 9)), "the custom monitor's lines of this run stay in this run's file"

    # The article's script, run as written in the working directory, sees one run.
    namespace = runpy.run_path(str(EXAMPLES / "analyze_loss.py"), run_name="__main__")
    assert (workdir / "loss_curve.png").stat().st_size > 0
    steps, losses = namespace["load_metric_log"]("./output/train_metric.json")
    assert steps == [1, 2, 4, 6, 8] and all(isinstance(loss, float) for loss in losses)

    # The analysis CLI's reader: one series per run, each labelled by its file.
    series = read_logs([workdir / "output"])
    assert sorted((s.label, [p.step for p in s.points]) for s in series) == [
        ("train_metric", [1, 2, 4, 6, 8]),
        (kept.stem, [1, 2, 4, 6]),
    ]


def test_report_of_the_folder_reads_its_latest_run_and_names_the_earlier_one(workdir):
    training.train([monitor(workdir, custom_monitor_callback=None)], steps=6, shape="tuple5")
    training.train([monitor(workdir, custom_monitor_callback=None)], steps=8, shape="tuple5")
    (kept,) = sorted((workdir / "output").glob("train_metric.*.json"))
    stamp = kept.name.split(".")[1]

    done = cli("report", "output", "--format", "json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(s["label"], s["last_step"]) for s in report["series"]] == [("rank 0", 8)]
    view = report["step_time_view"]
    assert view["stragglers"] == [] and view["slowest"] is None and report["holds_back"] is None, "one run"
    (note,) = done.stderr.strip().splitlines()
    assert f"left out the logs of 1 earlier run(s) set aside there ({stamp})" in note

    # Named, the files are read as given: both runs, each its own series.
    both = json.loads(cli_output("report", str(kept), "output/train_metric.json", "--format", "json", cwd=workdir))
    assert sorted(s["last_step"] for s in both["series"]) == [6, 8]

    # Each run's job is the one its lines name: the earlier one's ledger was kept with its log.
    earlier_job, current_job = (lines(path)[-1]["job"]["id"] for path in (kept, workdir / "output/train_metric.json"))
    assert earlier_job != current_job
    assert report["job"]["job_id"] == current_job
    alone = json.loads(cli_output("report", str(kept), "--format", "json", cwd=workdir))
    assert alone["job"]["job_id"] == earlier_job and alone["job"]["ledgers"][0].endswith(".ledger.job1")
    assert both["job"]["job_id"] == current_job, "two runs named: the current job, not the two merged"
    assert "job " + earlier_job + ": 1 attempt, 1 rank(s)" in cli_output("report", str(kept), cwd=workdir)


def test_a_third_run_keeps_both_earlier_runs_and_their_rotated_backups(workdir):
    rotation = {"log_rotation": {"max_bytes": 500, "backup_count": 10}, "interval": 1}
    for steps in (6, 7, 8):
        training.train([monitor(workdir, custom_monitor_callback=None, **rotation)], steps=steps, shape="tuple5")
    output = workdir / "output"
    kept = sorted(p for p in output.glob("train_metric.*.json"))
    assert len(kept) == 2
    runs = [[p.step for p in s.points] for s in read_logs([*kept, output / "train_metric.json"])]
    assert runs == [list(range(1, 7)), list(range(1, 8)), list(range(1, 9))]
    assert list(output.glob("train_metric.json.*")), "this run rolled over too"


def test_a_resumed_run_writes_on_after_the_previous_one(workdir):
    training.train([monitor(workdir, custom_monitor_callback=None)], steps=6, shape="tuple5")
    resume(monitor(workdir, custom_monitor_callback=None), from_step=6, steps=4)
    output = workdir / "output"
    assert not list(output.glob("train_metric.*.json")), "nothing set aside: the run goes on"
    assert ours(output / "train_metric.json") == [1, 2, 4, 6, 7, 8, 10]


def test_tensorboard_shows_each_run_once(workdir):
    training.train([monitor(workdir, custom_monitor_callback=None)], steps=6, shape="tuple5")
    training.train([monitor(workdir, custom_monitor_callback=None)], steps=8, shape="tuple5")
    shown = tensorboard_steps(workdir / "output" / "tensorboard_log")
    (earlier,) = [run for run in shown if run != "rank_0"]
    assert earlier.startswith("rank_0/")
    assert shown == {"rank_0": [1, 2, 4, 6, 8], earlier: [1, 2, 4, 6]}
    # Replayed from the JSON logs of both runs: the same runs, in the same layout.
    done = cli("replay", "output", "--tensorboard", "replayed", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert tensorboard_steps(workdir / "replayed") == shown


def test_tensorboard_hides_what_a_resumed_run_logs_again(workdir):
    # The first attempt logged steps 1..8; the run resumes from a checkpoint at step 4.
    training.train([monitor(workdir, custom_monitor_callback=None, interval=1)], steps=8, shape="tuple5")
    resume(monitor(workdir, custom_monitor_callback=None, interval=1), from_step=4, steps=6)
    shown = tensorboard_steps(workdir / "output" / "tensorboard_log")
    assert shown == {"rank_0": list(range(1, 11))}


def test_a_previous_log_that_cannot_be_copied_is_appended_to_with_one_warning(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train_metric.json").write_text('{"step": 1}\n')
    logs.chmod(0o555)  # the file stays writable, but no copy can be made beside it
    spec = {
        "config": {"interval": 1, "output_type": ["json_file"], "json_log_path": str(logs / "train_metric.json")},
        "steps": 2,
        "report": str(tmp_path / "report.json"),
        "log_level": "WARNING",
    }
    process = spawn(spec, tmp_path, preexec_fn=obey_file_permissions)
    try:
        _, stderr = process.communicate(timeout=240)
    finally:
        logs.chmod(0o755)
    assert process.returncode == 0, stderr[-3000:]
    warnings = [line for line in stderr.splitlines() if "aside" in line]
    assert len(warnings) == 1 and str(logs / "train_metric.json") in warnings[0] and "appends" in warnings[0]
    assert [line["step"] for line in lines(logs / "train_metric.json")] == [1, 1, 2]
    assert sorted(p.name for p in logs.iterdir()) == ["train_metric.json"], "no half copy left behind"


# --- the diagnosis file follows the same rule (issue 24 item 4) ------------------------------


def _cli(*args: str) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "otel_mindformers.cli", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _diagnosis_run(workdir: Path, *, nan_at: int | None, resume_from: int | None = None, steps: int = 6) -> None:
    from mindspore.train import Callback

    from otel_mindformers.hangs import dump_stacks

    class DumpAtStep2(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args()["cur_step_num"] == 2 + (resume_from or 0):
                dump_stacks("operator asked")

    callback = monitor(workdir, custom_monitor_callback=None, nonfinite_check="all_ranks")
    if resume_from is None:
        faults = training.Faults(nan_at={nan_at}) if nan_at else None
        training.train([callback, DumpAtStep2()], steps=steps, shape="tuple5", faults=faults)
    else:
        import mindspore as ms

        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_device("CPU")
        model = training.build_model("tuple5")
        model._train(
            1,
            training.build_dataset(4),
            callbacks=[callback, DumpAtStep2()],
            dataset_sink_mode=False,
            initial_step=resume_from,
        )


def test_a_clean_run_after_a_nan_run_is_not_blamed_for_it(workdir):
    _diagnosis_run(workdir, nan_at=3)
    output = workdir / "output"
    assert "first non-finite value at step 4" in _cli("report", str(output))
    _diagnosis_run(workdir, nan_at=None, steps=4)

    current = output / "diagnosis_rank_0.jsonl"
    (kept,) = output.glob("diagnosis_rank_0.*.jsonl")
    assert [r["kind"] for r in lines(kept)] == ["stacks", "nonfinite"]
    assert [r["kind"] for r in lines(current)] == ["stacks"]  # this run's own dump only
    assert "first non-finite" not in _cli("report", str(output))
    hang = json.loads(_cli("hang-report", str(output), "--format", "json"))
    assert hang["first_nonfinite"] is None
    # Its heartbeat is this run's last step, not the longer earlier run's.
    assert [(h["rank"], h["step"]) for h in hang["heartbeats"]] == [(0, 4)]
    # The kept file, named directly, is still read as what it is.
    assert json.loads(_cli("hang-report", str(kept), "--format", "json"))["first_nonfinite"]["step"] == 4


def test_a_resumed_run_appends_to_the_diagnosis_file(workdir):
    _diagnosis_run(workdir, nan_at=None)
    _diagnosis_run(workdir, nan_at=None, resume_from=6)
    output = workdir / "output"
    assert not list(output.glob("diagnosis_rank_0.*.jsonl"))
    assert [r["step"] for r in lines(output / "diagnosis_rank_0.jsonl")] == [2, 8]


# --- two runs overlapping in one folder (issue 42, item 6) -------------------------------------


def _overlapping(tmp_path: Path, job_id: str, steps: int, board: bool = False, heartbeat: float = 0.3, **extra) -> dict:
    """A run in tmp_path/out; with `board`, TensorBoard too (out/board). `heartbeat`: its
    ledger's heartbeat interval (a run unheard for three of them and a second is dead)."""
    out = tmp_path / "out"
    return {
        "config": {
            "interval": 5, "job_id": job_id, "output_type": ["json_file"] + (["tensorboard"] if board else []),
            "json_log_path": str(out / "train_metric.json"), "tensorboard_path": str(out / "board"),
            "restarts": {"heartbeat_interval": heartbeat},
        },
        "steps": steps, "report": str(tmp_path / f"{job_id}.json"), **extra,
    }  # fmt: skip


def _ledger(tmp_path: Path, name: str = "train_metric.job.rank_0.ledger") -> dict:
    return json.loads((tmp_path / "out" / name).read_text())


def test_a_run_started_beside_a_live_one_takes_none_of_its_files_and_writes_elsewhere(tmp_path):
    """Run B, another job, starts in run A's folder while A trains: none of A's files is set
    aside or written to (before, B set A's JSON log aside and both wrote their lines into the
    new one; earlier still, B also set A's ledger aside, recording A as stopped mid-run). B
    writes its files in a folder beside A's, and says so once; A trains on to its end."""
    out, at_20, b_done = tmp_path / "out", tmp_path / "a-at-20", tmp_path / "b-done"
    # A's heartbeat every 30 s: alive to B however long a loaded host keeps A's writer waiting.
    run_a = spawn(
        _overlapping(
            tmp_path,
            "exp-A",
            40,
            board=True,
            heartbeat=30.0,
            at={"20": [["touch", str(at_20)], ["await", str(b_done)]]},
        ),
        tmp_path,
    )
    try:
        wait_until(at_20.exists, "run A at step 20", run_a, timeout=180)
        run_b = spawn(_overlapping(tmp_path, "exp-B", 10, board=True), tmp_path)
        _, b_err = finish(run_b)
        b_done.touch()
        _, a_err = finish(run_a)
    finally:
        b_done.touch()
        finish(run_a)
    assert run_b.returncode == 0, b_err[-3000:]
    assert run_a.returncode == 0, a_err[-3000:]
    elsewhere = tmp_path / "out.exp-B"
    said = [line for line in b_err.splitlines() if "otel_mindformers" in line]
    assert said == [
        f"otel_mindformers: job 'exp-A' (pid {run_a.pid} on {socket.gethostname()}) is running and writing "
        f"{out / 'train_metric.job.rank_0.ledger'}: this run writes its files in {elsewhere} instead (two runs "
        "share this output folder; give each its own json_log_path)"
    ]
    # A's files are A's alone, whole: nothing set aside, no line of B's.
    assert sorted(p.name for p in out.iterdir()) == [
        "board", "train_metric.job.rank_0.ledger", "train_metric.job.rank_0.ledger.lock", "train_metric.json",
    ]  # fmt: skip
    a_lines = lines(out / "train_metric.json")
    assert {line["job"]["id"] for line in a_lines} == {"exp-A"}
    assert [line["step"] for line in a_lines] == [1] + list(range(5, 41, 5))
    assert tensorboard_steps(out / "board") == {"rank_0": [1] + list(range(5, 41, 5))}
    ledger_a = _ledger(tmp_path)
    assert (ledger_a["job_id"], [(a["outcome"], a["last_step"]) for a in ledger_a["attempts"]]) == (
        "exp-A", [("completed", 40)]
    )  # fmt: skip
    # B's, beside them.
    b_lines = lines(elsewhere / "train_metric.json")
    assert {line["job"]["id"] for line in b_lines} == {"exp-B"}
    assert [line["step"] for line in b_lines] == [1, 5, 10]
    assert tensorboard_steps(elsewhere / "board") == {"rank_0": [1, 5, 10]}
    ledger_b = json.loads((elsewhere / "train_metric.job.rank_0.ledger").read_text())
    assert (ledger_b["job_id"], [a["outcome"] for a in ledger_b["attempts"]]) == ("exp-B", ["completed"])


def test_a_frozen_run_whose_ledger_was_set_aside_writes_on_there(tmp_path):
    """Run A is frozen (SIGSTOP) long enough for its heartbeat to go stale; run B, a new job,
    sets A's ledger aside as a dead job's. A, thawed, completes in its set-aside ledger and
    leaves B's alone (it took the name back before: each overwrote the other)."""
    marker = tmp_path / "a-at-20"
    run_a = spawn(_overlapping(tmp_path, "exp-A", 30, at={"20": [["touch", str(marker)]]}), tmp_path)
    try:
        wait_until(marker.exists, "run A at step 20", run_a, timeout=180)
        _freeze_outside_the_ledger_lock(run_a, tmp_path / "out" / "train_metric.job.rank_0.ledger.lock")
        stale = lambda: time.time() - _ledger(tmp_path)["attempts"][-1]["last_heartbeat"] > 3 * 0.3 + 1.5  # noqa: E731
        wait_until(stale, "run A's heartbeat to go stale", timeout=60)
        run_b = spawn(_overlapping(tmp_path, "exp-B", 10), tmp_path)
        _, b_err = finish(run_b)
        assert run_b.returncode == 0, b_err[-3000:]
    finally:
        run_a.send_signal(signal.SIGCONT)
    _, a_err = finish(run_a)
    assert run_a.returncode == 0, a_err[-3000:]
    assert a_err.count("this run writes its ledger on in train_metric.job.rank_0.ledger.job1") == 1, a_err[-3000:]
    ledger_b, ledger_a = _ledger(tmp_path), _ledger(tmp_path, "train_metric.job.rank_0.ledger.job1")
    assert (ledger_b["job_id"], [a["outcome"] for a in ledger_b["attempts"]]) == ("exp-B", ["completed"])
    assert ledger_a["job_id"] == "exp-A"
    assert [(a["outcome"], a["last_step"]) for a in ledger_a["attempts"]] == [("completed", 30)]


def _freeze_outside_the_ledger_lock(process, lock_path: Path) -> None:
    """SIGSTOP `process` at a moment it does not hold the ledger's lock. Its heartbeat writer
    takes the lock every 0.3 s; frozen holding it, no other run can take the ledger at all (by
    design it then goes without one: restarts/ledger_file.py `locked`), not what is tested here."""
    tasks = Path(f"/proc/{process.pid}/task")
    while True:
        process.send_signal(signal.SIGSTOP)
        # Every thread stopped: none can take the lock after it is found free.
        wait_until(lambda: all(_state_of(task / "stat") == "T" for task in tasks.iterdir()), "the run to stop")
        if _lock_free(lock_path):
            return
        process.send_signal(signal.SIGCONT)  # frozen mid-write: let it finish, and stop it again
        wait_until(lambda: _lock_free(lock_path), "the run to release its ledger's lock")


def _lock_free(lock_path: Path) -> bool:
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases it


def _state_of(stat: Path) -> str:
    """A process's or thread's state letter from its /proc stat (T: stopped, Z: a zombie)."""
    return stat.read_text().rsplit(")", 1)[1].split()[0]


def _state(pid: int) -> str:
    """The process's state letter, read without reaping it."""
    return _state_of(Path(f"/proc/{pid}/stat"))


def test_a_run_started_at_once_after_a_killed_one_is_not_taken_for_it(tmp_path):
    """Run A (no job id) is SIGKILLed; its ledger still shows a fresh heartbeat (an interval
    of 60 s: fresh for 3 minutes). Run B, started at once in its folder from step 0, is a new
    job and takes the folder as a dead run's: before, it was refused the ledger ("job ...
    (pid N) is running") until A's heartbeat went stale. A is not reaped before B starts
    (its zombie holds the pid): a zombie is no live process either."""
    out = tmp_path / "out"
    config = {"interval": 5, "output_type": ["json_file"], "json_log_path": str(out / "train_metric.json")}
    run_a = spawn(
        {"config": {**config, "restarts": {"heartbeat_interval": 60}}, "steps": 40,
         "report": str(tmp_path / "a.json"), "at": {"12": [["die", "SIGKILL"]]}},
        tmp_path,
    )  # fmt: skip
    try:
        # Not wait_until(..., run_a): its poll() would reap the zombie.
        deadline = time.monotonic() + 180
        while _state(run_a.pid) != "Z":
            assert time.monotonic() < deadline, "run A did not die at step 12"
            time.sleep(0.05)
        dead_a = _ledger(tmp_path)["attempts"][-1]
        assert dead_a["pid"] == run_a.pid and dead_a["outcome"] is None
        run_b = spawn({"config": config, "steps": 10, "report": str(tmp_path / "b.json")}, tmp_path)
        _, b_err = finish(run_b)
    finally:
        finish(run_a)
    assert run_a.returncode == -signal.SIGKILL
    assert run_b.returncode == 0, b_err[-3000:]
    # Refused nothing (a note that A's unwritten records were recovered may come: A was killed).
    assert not [w for w in ("is running", "instead", "ledger") if w in b_err], b_err[-3000:]
    ledger_b, ledger_a = _ledger(tmp_path), _ledger(tmp_path, "train_metric.job.rank_0.ledger.job1")
    assert [(a["outcome"], a["last_step"]) for a in ledger_b["attempts"]] == [("completed", 10)]
    assert ledger_a["attempts"][-1]["attempt_id"] == dead_a["attempt_id"] and ledger_b["job_id"] != ledger_a["job_id"]
    assert [line["step"] for line in lines(out / "train_metric.json")] == [1, 5, 10]
    (kept,) = out.glob("train_metric.*.json")  # A's lines, set aside as a previous run's
    assert [line["step"] for line in lines(kept)][:2] == [1, 5]
