"""When a job hangs: a real 2-rank msrun job where rank 1 blocks in its data loader, read
back with `otel-mindformers hang-report` as a user would; and the report's grouping on
real dump files written by StackDumper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_mindformers.hangs.offline.hang_report import build_hang_report, ranks_text, render_text
from otel_mindformers.outputs import diagnosis_file as records
from tests.support import fault_log
from tests.support.instrumented import BIN, child_env, free_port
from tests.support.paths import REPO
from tests.support.waiting import wait_until

pytestmark = pytest.mark.analysis

STEPS, BLOCK_AT = 8, 4


def stack_records(path: Path) -> list[dict]:
    return [r for r in records.read(path) if r["kind"] == "stacks"] if path.exists() else []


def last_logged_step(path: Path) -> int | None:
    if not path.exists():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[-1]["step"] if lines else None


def release(fifo: Path) -> None:
    """Let the blocked rank go on: open the FIFO it reads (non-blocking: no reader, no wait)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # the rank is not reading (it failed earlier): nothing to release
        return
    os.close(fd)


@pytest.mark.slow
@pytest.mark.msrun_job
def test_hang_report_names_the_rank_that_stopped_and_its_stack(workdir):
    output, fifo, faults = workdir / "output", workdir / "release", workdir / "faults"
    os.mkfifo(fifo)
    job = subprocess.Popen(
        [
            str(BIN / "msrun"),
            "--worker_num=2",
            "--local_worker_num=2",
            f"--master_port={free_port()}",
            "--join=True",
            f"--log_dir={workdir / 'msrun_log'}",
            str(REPO / "tests" / "support" / "hang_worker.py"),
            "--steps",
            str(STEPS),
            "--block-rank",
            "1",
            "--block-at",
            str(BLOCK_AT),
            "--release",
            str(fifo),
            "--output",
            str(output),
        ],
        env=child_env(**{fault_log.ENV: str(faults)}),
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: last_logged_step(output / "train_metric_rank_0.json") == STEPS,
            "rank 0 finished",
            job,
            timeout=180.0,
            interval=0.1,
        )
        wait_until(
            lambda: (
                len([r for r in stack_records(output / "diagnosis_rank_1.jsonl") if r["step"] == BLOCK_AT - 1]) == 2
            ),
            "rank 1's two dumps at its blocked step",
            job,
            timeout=180.0,
            interval=0.1,
        )
        cli = [str(BIN / "otel-mindformers"), "hang-report", str(output)]
        text = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        as_json = subprocess.run([*cli, "--format", "json"], capture_output=True, text=True, timeout=60)
    finally:
        release(fifo)
        try:
            out, _ = job.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            job.kill()
            out, _ = job.communicate()
    # A worker killed by a signal (SIGSEGV at exit, once in CI) left its threads' stacks,
    # or only the exit mark when it died in native teardown after Python's exit handlers.
    assert job.returncode == 0, f"{out[-4000:]}\n{fault_log.read(faults)}"
    assert text.returncode == 0, text.stderr
    print(text.stdout)

    report = json.loads(as_json.stdout)
    beats = {b["rank"]: b for b in report["heartbeats"]}
    # Rank 0 ran to the end; rank 1 stopped after step 3, behind by 5 steps.
    assert (beats[0]["step"], beats[0]["behind_steps"]) == (STEPS, 0)
    assert (beats[1]["step"], beats[1]["behind_steps"]) == (BLOCK_AT - 1, STEPS - BLOCK_AT + 1)
    # Seconds between the two ranks' last steps: without a collective to hold them in step,
    # rank 0 may finish before rank 1 reaches step 3 on a loaded machine, so only its presence.
    assert isinstance(beats[1]["behind_seconds"], float) and beats[1]["source"] == "dump"
    assert report["behind"] == [1] and report["split_after_step"] == BLOCK_AT - 1
    (group,) = report["groups"]
    assert group["ranks"] == [1] and group["phases"] == ["data_wait"] and group["verdicts"] == ["stuck"]
    functions = [f["function"] for t in group["threads"] for f in t["frames"]]
    assert "wait_for_the_test_to_release_batch" in functions
    innermost = {i["thread"]: i for i in group["innermost"]}
    assert innermost["MainThread"]["function"] == "_get_next"  # the training thread waits for data
    assert innermost["MainThread"]["own_code"]["function"] == "train_blocking"
    assert any(i["function"] == "release" and i["file"].endswith("hang_worker.py") for i in innermost.values())
    assert report["ranks_without_dump"] == [0]

    assert "rank(s) 1 stopped first; the job split after step 3" in text.stdout
    assert "behind by 5 step(s)" in text.stdout
    assert "wait_for_the_test_to_release_batch" in text.stdout


# --- grouping, on dump files written by the real StackDumper --------------------------------


def dump_rank(folder: Path, rank: int, step: int, target: str) -> None:
    """Rank `rank`'s dump, made in a fresh process while a thread waits in `target`
    (threads other tests left in this process would join the dump)."""
    subprocess.run(
        [sys.executable, "-m", "tests.support.stack_dump_worker", str(folder), str(rank), str(step), target],
        cwd=REPO,
        check=True,
        timeout=120,
        env=child_env(),
    )


@pytest.mark.slow  # each dump is made in a child process
def test_ranks_with_identical_stacks_form_one_group_shown_once(tmp_path):
    # The dumping (main) thread is left out of its own dump; the worker thread's frames
    # tell the groups apart.
    for rank, step, target in (
        (0, 11, "collective"),
        (1, 11, "collective"),
        (2, 10, "data_loader"),
        (3, 11, "collective"),
    ):
        dump_rank(tmp_path, rank, step, target)
    report = build_hang_report([tmp_path])
    assert [(g.ranks, [(f.function, own.function) for _, f, own in g.innermost()]) for g in report.groups] == [
        ([2], [("wait", "hold_in_data_loader")]),
        ([0, 1, 3], [("wait", "hold_in_collective")]),
    ]
    assert [(b.rank, b.step, b.behind_steps) for b in report.heartbeats] == [
        (0, 11, 0),
        (1, 11, 0),
        (2, 10, 1),
        (3, 11, 0),
    ]
    text = render_text(report)
    assert "rank(s) 2 stopped first; the job split after step 10" in text
    assert "== group 2: rank(s) 0-1, 3" in text
    # Each distinct stack is printed once.
    assert text.count("in hold_in_collective") == 1 and text.count("in hold_in_data_loader") == 1


@pytest.mark.slow  # each dump is made in a child process
def test_the_latest_dump_of_a_rank_is_the_one_grouped(tmp_path):
    dump_rank(tmp_path, 0, 5, "data_loader")
    dump_rank(tmp_path, 0, 5, "collective")
    (group,) = build_hang_report([tmp_path]).groups
    assert [own.function for _, _, own in group.innermost()] == ["hold_in_collective"]


@pytest.mark.slow
def test_a_damaged_last_line_is_skipped_and_nothing_to_report_is_one_error(tmp_path):
    dump_rank(tmp_path, 0, 5, "collective")
    with (tmp_path / "diagnosis_rank_0.jsonl").open("a") as file:
        file.write('{"kind": "stacks", "rank": 0, "ti')  # a write cut by a kill
    assert [g.ranks for g in build_hang_report([tmp_path]).groups] == [[0]]
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run([str(BIN / "otel-mindformers"), "hang-report", str(empty)], capture_output=True, text=True)
    assert (
        result.returncode == 1
        and result.stderr.startswith("error: no stack dumps")
        and "Traceback" not in result.stderr
    )


@pytest.mark.slow
def test_a_path_that_does_not_exist_is_named_as_missing(tmp_path):
    """`hang-report output/ outptu/`: the typo was "no stack dumps ... under output/, outptu/"
    (or, beside a folder with dumps, silently nothing); it is named as `report` names it."""
    dump_rank(tmp_path, 0, 5, "collective")
    missing = tmp_path / "outptu"
    for inputs in ([missing], [tmp_path, missing]):
        result = subprocess.run(
            [str(BIN / "otel-mindformers"), "hang-report", *map(str, inputs)], capture_output=True, text=True
        )
        assert result.returncode == 1, result.stdout
        assert result.stderr.splitlines() == [f"error: {missing}: no such file or directory"]
    assert subprocess.run([str(BIN / "otel-mindformers"), "hang-report", str(tmp_path / "diag*")]).returncode == 0


@pytest.mark.parametrize("ranks, text", [([0, 1, 2, 5, 7, 8], "0-2, 5, 7-8"), ([3], "3"), ([], "")])
def test_ranks_are_shown_as_ranges(ranks, text):
    assert ranks_text(ranks) == text


def test_behind_seconds_is_how_long_before_the_leader_a_rank_last_finished_a_step(tmp_path):
    """From the dumps' `last_step_time` (when each rank last finished a step), not the dumps'
    own `time_stamp` (when the dump was taken, about the same on every rank), and positive
    for the rank that is behind."""
    for rank, step, last_step_time, dumped in ((0, 10, 1000.0, 2000.0), (1, 7, 940.0, 2003.0)):
        records.append(
            records.diagnosis_path(str(tmp_path / "train_metric.json"), rank),
            {
                "kind": records.KIND_STACKS, "time_stamp": dumped, "rank": rank, "world_size": 2, "host": "n",
                "pid": 1, "reason": "stall", "phase": "step", "step": step, "last_step_time": last_step_time,
                "idle_seconds": None, "verdict": None, "threads": [], "omitted_threads": 0,
            },
        )  # fmt: skip
    report = build_hang_report([tmp_path])
    leader, behind = report.heartbeats
    assert (leader.rank, leader.time_stamp, leader.behind_steps, leader.behind_seconds) == (0, 1000.0, 0, None)
    assert (behind.rank, behind.time_stamp, behind.behind_steps, behind.behind_seconds) == (1, 940.0, 3, 60.0)
    assert report.behind == [behind]


@pytest.mark.slow  # a real training
def test_the_first_nonfinite_step_comes_from_the_log_without_diagnosis_files(workdir):
    """With the default `nonfinite_check` no diagnosis file is written: the reporting rank's
    JSON log is the evidence, as `report` reads it."""
    from otel_mindformers import MonitorCallback
    from tests.support import training

    output = workdir / "output"
    config = {"interval": 1, "output_type": ["json_file"], "json_log_path": str(output / "train_metric.json")}
    training.train([MonitorCallback(config)], steps=6, faults=training.Faults(nan_at={3}))
    lines = [json.loads(line) for line in (output / "train_metric.json").read_text().splitlines()]
    first = next(line for line in lines if line.get("nonfinite"))
    assert not list(output.glob(records.FILE_PATTERN))
    found = build_hang_report([output]).first_nonfinite
    assert found is not None and found.step == first["step"]
    assert found.ranks == {0: sorted(first["nonfinite"])}


def test_this_packages_wrapper_is_not_the_users_own_code(tmp_path):
    """Under zero-code the training call runs through the instrumentor's wrapper: a checkout
    or editable install is outside site-packages, yet its frames are not the user's code."""
    import mindspore.dataset.engine.iterators as iterators

    import otel_mindformers.integration.instrumentor as instrumentor
    from otel_mindformers.hangs.stacks import Frame, ThreadStack

    script = tmp_path / "train.py"
    frames = (
        Frame(str(script), 33, "main", "trainer.train()"),
        Frame(instrumentor.__file__, 124, "_training_process", "return wrapped(*bound.args, **bound.kwargs)"),
        Frame(iterators.__file__, 521, "_get_next", "data = self._iterator.GetNextAsMap()"),
    )
    stack = ThreadStack("MainThread", 1, True, frames)
    assert stack.innermost_own_code() == frames[0]
    assert stack.own_code_tail() == ((frames[0],), 2)


def _frames(*functions: str) -> list[dict]:
    return [{"file": "/job/train.py", "line": 10 * i, "function": f, "source": ""} for i, f in enumerate(functions, 1)]


def _dump_record(rank: int, step: int, telemetry_frames: list[dict]) -> dict:
    """A stall dump as StackDumper writes it: the training thread waits in the same
    collective on every rank; the telemetry thread is wherever its export happens to be."""
    return {
        "kind": records.KIND_STACKS, "time_stamp": 2000.0, "rank": rank, "world_size": 4, "host": "n", "pid": 1,
        "reason": "stall", "phase": "step", "step": step, "last_step_time": 1000.0 + step, "idle_seconds": 60.0,
        "verdict": None, "omitted_threads": 0,
        "threads": [
            {"name": "MainThread", "ident": 1, "training": True, "omitted_frames": 0,
             "frames": _frames("main", "train", "all_reduce")},
            {"name": "otel-mindformers-pipeline", "ident": 2, "training": False, "omitted_frames": 0,
             "frames": telemetry_frames},
        ],
    }  # fmt: skip


def test_ranks_stuck_alike_are_one_group_wherever_their_telemetry_threads_are(tmp_path):
    """Three ranks dumped, stuck in the same collective at steps 7, 9 and 10 with their
    telemetry threads in different places; a fourth rank only logged its step 10."""
    telemetry = (_frames("run", "export"), _frames("run", "wait"), _frames("run", "export", "post"))
    for rank, step, frames in zip((0, 1, 2), (10, 7, 9), telemetry):
        path = records.diagnosis_path(str(tmp_path / "train_metric.json"), rank)
        records.append(path, _dump_record(rank, step, frames))
    line = {"time_stamp": 1010.0, "step": 10, "epoch": 1, "rank": 3, "loss": 2.0}
    (tmp_path / "train_metric_rank_3.json").write_text(json.dumps(line) + "\n")
    report = build_hang_report([tmp_path])
    (group,) = report.groups
    assert group.ranks == [0, 1, 2] and [t.name for t in group.threads] == ["MainThread"]
    assert report.ranks_without_dump == [3]
    text = render_text(report)
    assert "rank(s) 1-2 stopped first; the job split after step 7" in text
    assert "Ranks without a stack dump: 3" in text
