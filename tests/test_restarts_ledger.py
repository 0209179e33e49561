"""The job ledger and the attempt arithmetic without a training: several processes writing
one ledger at once, the job id and restart count from launchers, the timeline's sums and
the no-progress count."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_mindformers.config import load_monitor_config
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.process_start import started_at
from otel_mindformers.job.identity import Identity, detect_identity, launcher_restart_count
from otel_mindformers.outputs.runs import folder_beside, paths_in
from otel_mindformers.restarts.attempt_tracker import AttemptTracker, _set_aside
from otel_mindformers.restarts.goodput import as_finished, is_alive, job_timeline, no_progress_streak
from otel_mindformers.restarts.ledger_file import MAX_LEDGER_BYTES, ledger_path, new_ledger, read_ledger, update_ledger
from otel_mindformers.restarts.offline.attempts_plot import attempts_figure
from otel_mindformers.restarts.processes import process_gone
from otel_mindformers.restarts.run_attempt import JobGauges, begin_attempt
from otel_mindformers.telemetry.observables import RunObservables


def _append_entries(path: str, writer: int, count: int) -> None:
    """One process adding `count` entries of its own, each in a read-modify-write."""
    from pathlib import Path

    for index in range(count):

        def change(data, index=index):
            data = data or new_ledger("job")
            data["attempts"].append({"attempt": writer * 1000 + index, "attempt_id": f"{writer}-{index}"})
            return data

        update_ledger(Path(path), change)


@pytest.mark.slow  # four writer processes
def test_several_writers_at_once_lose_no_entry(tmp_path):
    path = ledger_path(str(tmp_path / "train_metric.json"), 0)
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=_append_entries, args=(str(path), w, 25)) for w in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
        assert process.exitcode == 0
    data = read_ledger(path)
    assert sorted(a["attempt_id"] for a in data["attempts"]) == sorted(f"{w}-{i}" for w in range(4) for i in range(25))
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


def test_ranks_keep_separate_ledgers_beside_the_json_log():
    assert ledger_path("out/train_metric.json", 0).name == "train_metric.job.rank_0.ledger"
    assert ledger_path("out/train_metric.json", 7).name == "train_metric.job.rank_7.ledger"


@pytest.mark.parametrize(
    ("env", "job_id", "launcher", "restarts"),
    [
        ({"TORCHELASTIC_RUN_ID": "te-1", "TORCHELASTIC_RESTART_COUNT": "2"}, "te-1", "torchelastic", 2),
        ({"SLURM_JOB_ID": "77", "SLURM_PROCID": "0"}, "77", "slurm", None),
        ({"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}, "77", "slurm", 1),
        ({"MINDX_TASK_ID": "uid-9", "OTEL_MINDFORMERS_ATTEMPT": "3"}, "uid-9", "mindcluster", 3),
        ({"MS_WORKER_NUM": "2", "MS_ROLE": "MS_WORKER"}, None, "msrun", None),
    ],
)
def test_job_id_and_restart_count_from_the_launcher(env, job_id, launcher, restarts):
    identity = detect_identity(env)
    assert (identity.job_id, identity.launcher, launcher_restart_count(env)) == (job_id, launcher, restarts)


def _entry(attempt, start, first_begin, first_end, last_time, resume, last, end=None, outcome=None, **extra):
    return {
        "attempt": attempt, "attempt_id": str(attempt), "process_start": start, "first_step_begin": first_begin,
        "first_step_end": first_end, "last_step_time": last_time, "last_heartbeat": last_time + 0.5,
        "resume_step": resume, "last_step": last, "end": end, "outcome": outcome,
        "checkpoint_save_seconds": 1.0, "checkpoint_load_seconds": extra.get("load", 0.0),
        "durable_step": extra.get("durable", resume), "data_wait_seconds": extra.get("data_wait", 0.0),
    }  # fmt: skip


def test_the_timeline_by_hand():
    # Attempt 1: starts at 0, first step 10..12, steps 2..14 in the next 13 s (1 s of it
    # saving), killed; heard last at 25.5. Attempt 2 starts at 30 from step
    # 20 (a 2 s checkpoint load), first step 40..41, step 30 at 50, completes at 51.
    entries = [
        _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed", durable=10),
        _entry(2, 30.0, 40.0, 41.0, 50.0, 10, 20, end=51.0, outcome="completed", load=2.0),
    ]
    timeline = job_timeline(entries)
    first, second = timeline["attempts"]
    assert first["lost_steps"] == 4 and second["lost_steps"] == 0
    # 13 s of steps after the first, 1 s saving: 12 s over 13 steps; 4 lost.
    assert first["seconds"]["lost_progress"] == pytest.approx(4 * 12 / 13)
    assert first["seconds"]["productive"] == pytest.approx(12 - 4 * 12 / 13)
    assert second["downtime"] == pytest.approx(
        {"total": 41.0 - 25.5, "no_process": 30.0 - 25.5, "startup": 8.0, "checkpoint_load": 2.0, "compile": 1.0}
    )
    totals = timeline["totals"]
    assert totals["wall_seconds"] == 51.0
    assert sum(totals["seconds"].values()) == pytest.approx(51.0)
    assert totals["goodput"] == pytest.approx((12 - 4 * 12 / 13 + 8.0) / 51.0)


def test_only_the_last_attempt_has_steps_at_risk():
    # Attempt 1's steps past its step-10 checkpoint were computed again by attempt 2: lost,
    # not at risk. Attempt 2, killed at step 26 past its step-20 checkpoint, has 6 at risk.
    entries = [
        _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed", durable=10),
        _entry(2, 30.0, 40.0, 41.0, 50.0, 10, 26, outcome="killed", durable=20),
    ]
    first, second = job_timeline(entries)["attempts"]
    assert (first["lost_steps"], first["at_risk_steps"]) == (4, 0)
    assert (second["lost_steps"], second["at_risk_steps"]) == (0, 6)


def test_times_recorded_past_what_the_attempt_spans_leave_no_category_negative():
    # Attempt 1 was killed while loading its checkpoint: 5 s of load recorded, its last
    # heartbeat 3 s after it started. Attempt 2 counted a 14 s evaluation after its last
    # step (13 s of steps, 1 s of them saving) with its between-step time.
    killed = {
        **_entry(1, 0.0, None, None, 0.0, 0, 0, outcome="killed", load=5.0),
        "last_step_time": None,
        "last_heartbeat": 3.0,
    }
    completed = {**_entry(2, 10.0, 20.0, 22.0, 35.0, 0, 14, end=50.0, outcome="completed"), "evaluation_seconds": 14.0}
    timeline = job_timeline([killed, completed])
    first, second = (row["seconds"] for row in timeline["attempts"])
    assert (first["checkpoint_load"], first["startup"]) == (3.0, 0.0)
    assert (second["evaluation"], second["user_phases"], second["data_wait"]) == (12.0, 0.0, 0.0)
    totals = timeline["totals"]
    assert min(totals["seconds"].values()) >= 0.0
    assert sum(totals["seconds"].values()) == pytest.approx(totals["wall_seconds"]) == pytest.approx(50.0)


@pytest.mark.parametrize("gap", [0.5, -0.5])
def test_a_process_start_within_its_rounding_of_the_previous_end_is_no_clock_set_back(gap):
    entries = [
        _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed"),
        _entry(2, 25.5 + gap, 40.0, 41.0, 50.0, 10, 20, end=51.0, outcome="completed"),
    ]
    assert job_timeline(entries)["totals"]["clock_set_back_seconds"] is None


def test_a_killed_attempt_ends_no_earlier_than_its_last_sampled_step():
    # Its ledger heard step 20 at 100 s; its flight ring kept step 25, sampled at 103 s.
    entry = _entry(1, 0.0, 10.0, 12.0, 100.0, 0, 20, outcome="killed")
    finished = as_finished(entry, 25, 103.0)
    assert (finished["last_step"], finished["last_step_time"], finished["last_heartbeat"]) == (25, 103.0, 103.0)
    assert as_finished(entry, 25, 90.0)["last_step_time"] == 100.0  # a sample older than the heartbeat's step
    assert as_finished(entry, 18, 103.0) is entry  # the ledger was further on


def test_the_wait_for_data_is_badput_and_lost_steps_are_their_compute():
    # The first attempt of the test above, 2.6 s of its 13 s of steps waiting for data.
    entries = [
        _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed", durable=10, data_wait=2.6),
        _entry(2, 30.0, 40.0, 41.0, 50.0, 10, 20, end=51.0, outcome="completed", load=2.0),
    ]
    timeline = job_timeline(entries)
    first = timeline["attempts"][0]["seconds"]
    compute_per_step = (13 - 1 - 2.6) / 13
    assert first["data_wait"] == pytest.approx(2.6)
    assert first["lost_progress"] == pytest.approx(4 * compute_per_step)
    assert first["productive"] == pytest.approx(13 - 1 - 2.6 - 4 * compute_per_step)
    totals = timeline["totals"]
    assert totals["badput_types"]["data_wait"] == "DATA_LOADING_SYNC"
    assert sum(totals["seconds"].values()) == pytest.approx(51.0)
    assert totals["goodput"] == pytest.approx((first["productive"] + 8.0) / 51.0)


def _evaluating_attempts() -> list[dict]:
    """The attempts of the timeline test above, the first one's 13 s of steps with 3 s of
    evaluation, 0.5 s in a user's phase and 2.6 s waiting for data."""
    entries = [
        _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed", durable=10, data_wait=2.6),
        _entry(2, 30.0, 40.0, 41.0, 50.0, 10, 20, end=51.0, outcome="completed", load=2.0),
    ]
    entries[0].update(evaluation_seconds=3.0, user_phase_seconds=0.5)
    return entries


def test_evaluations_and_user_phases_between_the_steps_are_badput_as_for_the_run():
    timeline = job_timeline(_evaluating_attempts())
    first = timeline["attempts"][0]["seconds"]
    compute_per_step = (13 - 1 - 3.0 - 0.5 - 2.6) / 13
    assert (first["evaluation"], first["user_phases"]) == (3.0, 0.5)
    assert first["lost_progress"] == pytest.approx(4 * compute_per_step)
    assert first["productive"] == pytest.approx(13 * compute_per_step - 4 * compute_per_step)
    totals = timeline["totals"]
    assert totals["badput_types"]["evaluation"] == totals["badput_types"]["user_phases"] == "CUSTOM_BADPUT_EVENTS"
    assert sum(totals["seconds"].values()) == pytest.approx(51.0)
    assert totals["goodput"] == pytest.approx((first["productive"] + 8.0) / 51.0)


def test_a_ledger_written_before_evaluations_were_recorded_keeps_them_in_productive():
    # An entry without `evaluation_seconds` / `user_phase_seconds` (an older ledger): read
    # as before, its evaluations in its steps' time.
    entry = _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, end=26.0, outcome="completed", data_wait=2.6)
    assert "evaluation_seconds" not in entry and "user_phase_seconds" not in entry
    timeline = job_timeline([entry])
    seconds = timeline["attempts"][0]["seconds"]
    assert (seconds["evaluation"], seconds["user_phases"]) == (0.0, 0.0)
    assert seconds["productive"] == pytest.approx(13 - 1 - 2.6)
    assert sum(timeline["totals"]["seconds"].values()) == pytest.approx(26.0)


def test_a_wait_known_up_to_an_earlier_step_is_carried_at_its_rate_to_the_last():
    # The worker's last record was step 9 of the 14 the clock saw: the queued ones never came.
    (entry,) = [_entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed", data_wait=1.8)]
    entry["data_wait_step"] = 9
    seconds = job_timeline([entry])["attempts"][0]["seconds"]
    assert seconds["data_wait"] == pytest.approx(1.8 * 14 / 9)


@pytest.mark.parametrize(
    ("ends", "streak"),
    [
        ([("crashed", 7), ("crashed", 7), ("crashed", 7)], 3),
        ([("crashed", 7), ("crashed", 12)], 1),
        ([("crashed", 7), ("killed", 5), ("crashed", 7)], 3),
        ([("crashed", 7), ("completed", 7), ("crashed", 7)], 1),
        ([("crashed", 7), ("crashed", 7), (None, 3)], 2),  # the running attempt does not reset it
    ],
)
def test_no_progress_counts_attempts_stuck_at_the_furthest_step(ends, streak):
    assert no_progress_streak([{"outcome": o, "last_step": s} for o, s in ends]) == streak


def test_a_killed_attempt_ends_at_its_last_heartbeat():
    entries = [_entry(1, 0.0, 1.0, 2.0, 5.0, 0, 5)]
    row = job_timeline(entries, now=time.time() + 100)["attempts"][0]
    assert row["outcome"] == "killed" and row["end"] == 5.5
    assert json.dumps(job_timeline(entries))  # JSON-ready


def test_the_jobs_totals_come_from_a_rank_that_saw_every_attempt(tmp_path):
    """A job resumed on more ranks: rank 1 joined at attempt 2 and waited longer for its
    data, yet its clocks miss attempt 1 and the downtime; the totals are rank 0's."""
    from otel_mindformers.restarts.offline.attempts_report import job_report

    killed = _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed", durable=10)
    second = {"resume": 10, "last": 20, "end": 51.0, "outcome": "completed"}
    ledgers = {
        0: [killed, _entry(2, 30.0, 40.0, 41.0, 50.0, data_wait=1.0, **second)],
        1: [_entry(2, 30.0, 40.0, 41.0, 50.0, data_wait=3.0, **second)],
    }
    json_log = str(tmp_path / "train_metric.json")
    for rank, attempts in ledgers.items():
        ledger_path(json_log, rank).write_text(json.dumps({**new_ledger("job"), "attempts": attempts}))
    job = job_report([str(tmp_path)], now=100.0)
    assert [(row["attempt"], row["ranks"]) for row in job["attempts"]] == [(1, [0]), (2, [0, 1])]
    assert job["totals"]["rank"] == 0
    assert job["totals"]["wall_seconds"] == 51.0


def test_each_attempts_downtime_is_from_the_clocks_that_give_the_totals(tmp_path):
    """Two nodes: rank 1's node died at 25 s, rank 0 waited in its all-reduce until the
    scheduler gave up at 40 s; rank 1 waited longer for its data, so its clocks give the
    totals. The row's downtime before attempt 2 is rank 1's too: one restart, one number."""
    from otel_mindformers.restarts.offline.attempts_report import job_report, render_job

    second = {"end": 71.0, "outcome": "completed"}
    ledgers = {
        0: [_entry(1, 0.0, 10.0, 12.0, 40.0, 0, 14, outcome="killed", durable=10),
            _entry(2, 50.0, 60.0, 61.0, 70.0, 10, 20, **second)],
        1: [_entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed", durable=10, data_wait=2.0),
            _entry(2, 50.0, 60.0, 61.0, 70.0, 10, 20, data_wait=2.0, **second)],
    }  # fmt: skip
    json_log = str(tmp_path / "train_metric.json")
    for rank, attempts in ledgers.items():
        ledger_path(json_log, rank).write_text(json.dumps({**new_ledger("job"), "attempts": attempts}))
    job = job_report([str(tmp_path)], now=100.0)
    assert job["totals"]["rank"] == 1
    assert job["attempts"][1]["downtime"]["total"] == pytest.approx(61.0 - 25.5)
    assert job["totals"]["downtime_seconds"] == pytest.approx(61.0 - 25.5)
    assert "35.5 s" in render_job(job).splitlines()[3]


def test_an_attempt_of_several_ranks_got_as_far_as_its_furthest_rank(tmp_path):
    """msrun tore rank 0 down before its step 23 was recorded, after rank 1 (which died)
    finished it: the attempt, and the job, reached step 23, with 13 steps at risk."""
    from otel_mindformers.restarts.offline.attempts_report import job_report

    killed = {"end": 26.0, "outcome": "killed", "durable": 10}
    ledgers = {
        0: _entry(1, 0.0, 10.0, 12.0, 24.0, 0, 22, **killed),
        1: _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 23, **killed),
    }
    json_log = str(tmp_path / "train_metric.json")
    for rank, entry in ledgers.items():
        ledger_path(json_log, rank).write_text(json.dumps({**new_ledger("job"), "attempts": [entry]}))
    job = job_report([str(tmp_path)], now=100.0)
    (attempt,) = job["attempts"]
    assert attempt["ranks"] == [0, 1]
    assert (attempt["last_step"], attempt["steps"], attempt["at_risk_steps"]) == (23, 23, 13)
    assert job["totals"]["furthest_step"] == 23
    # Attempt 2 resumed from the checkpoint at step 10: attempt 1 lost its furthest rank's 13 steps.
    for rank, entry in ledgers.items():
        second = _entry(2, 30.0, 40.0, 41.0, 50.0, 10, 30, end=51.0, outcome="completed")
        ledger_path(json_log, rank).write_text(json.dumps({**new_ledger("job"), "attempts": [entry, second]}))
    job = job_report([str(tmp_path)], now=100.0)
    assert job["attempts"][0]["lost_steps"] == job["totals"]["lost_steps"] == 13


def test_the_jobs_furthest_step_is_its_furthest_attempts_not_its_last(tmp_path):
    """Attempt 2 resumed from the checkpoint at step 10 and crashed at step 15: the job got
    as far as attempt 1's step 23."""
    from otel_mindformers.restarts.offline.attempts_report import job_report

    entries = [
        _entry(1, 0.0, 10.0, 12.0, 24.0, 0, 23, end=26.0, outcome="killed", durable=10),
        _entry(2, 30.0, 40.0, 41.0, 45.0, 10, 15, end=46.0, outcome="crashed"),
    ]
    path = ledger_path(str(tmp_path / "train_metric.json"), 0)
    path.write_text(json.dumps({**new_ledger("job"), "attempts": entries}))
    assert job_report([str(tmp_path)], now=100.0)["totals"]["furthest_step"] == 23


def test_report_over_two_nodes_folders_with_their_own_job_ids_names_the_ledger_it_left_out(tmp_path, capsys):
    """Two msrun nodes, each writing in its own folder with no launcher's job id, mint two
    local ids (the folder's hash): `report node0/ node1/` reads one job and names the other
    node's ledger it left out, with how to join them, instead of dropping it silently."""
    from otel_mindformers.cli import main as cli_main
    from otel_mindformers.restarts.offline.attempts_report import job_report, render_job

    folders = {rank: tmp_path / f"node{rank}" / "output" for rank in (0, 1)}
    for rank, folder in folders.items():
        path = ledger_path(str(folder / "train_metric.json"), rank)
        path.parent.mkdir(parents=True)
        entry = _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, end=26.0, outcome="completed")
        path.write_text(json.dumps({**new_ledger(f"local-node{rank}-1"), "attempts": [entry]}))
    job = job_report([str(folders[0]), str(folders[1])], now=100.0)
    assert job["job_id"] == "local-node0-1" and job["ranks"] == [0]
    other = str(ledger_path(str(folders[1] / "train_metric.json"), 1))
    assert job["left_out"] == [{"ledger": other, "job_id": "local-node1-1"}]
    for fmt in ("text", "markdown"):
        assert f"left out, another job's: {other} (job local-node1-1)" in render_job(job, fmt)
        assert "the same OTEL_MINDFORMERS_JOB_ID" in render_job(job, fmt)
    alone = job_report([str(folders[0])], now=100.0)
    assert alone["left_out"] == []
    for fmt in ("text", "markdown"):
        assert "left out" not in render_job(alone, fmt) and "OTEL_MINDFORMERS_JOB_ID" not in render_job(alone, fmt)
    # `plot --attempts` and `report --html` over the same folders say it too.
    for rank, folder in folders.items():
        lines = [{"time_stamp": 10.0 + step, "step": step, "rank": rank, "loss": 1.0} for step in range(1, 15)]
        (folder / f"train_metric_rank_{rank}.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    capsys.readouterr()
    assert cli_main(["plot", "--attempts", str(folders[0]), str(folders[1]), "-o", str(tmp_path / "a.png")]) == 0
    assert f"left out, another job's: {other} (job local-node1-1)" in capsys.readouterr().out
    page = tmp_path / "run.html"
    assert cli_main(["report", str(folders[0]), str(folders[1]), "--html", str(page)]) == 0
    assert f"left out, another job's: {other} (job local-node1-1)" in page.read_text()


def test_an_earlier_jobs_ledger_set_aside_is_not_named_as_left_out(tmp_path):
    """`report out/train_metric*.json` over this job's log and an earlier one's set aside: the
    earlier job's ledger (`.job1`) is left out as a matter of course, not as another node's."""
    from otel_mindformers.restarts.offline.attempts_report import job_report, render_job

    live = ledger_path(str(tmp_path / "train_metric.json"), 0)
    entry = _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, end=26.0, outcome="completed")
    live.with_name(live.name + ".job1").write_text(json.dumps({**new_ledger("earlier"), "attempts": [entry]}))
    live.write_text(json.dumps({**new_ledger("this"), "attempts": [entry]}))
    earlier_log = tmp_path / "train_metric.20261105-101530.json"
    earlier_log.write_text(json.dumps({"step": 14, "time_stamp": 25.0, "job": {"id": "earlier"}}) + "\n")
    (tmp_path / "train_metric.json").write_text(
        json.dumps({"step": 14, "time_stamp": 25.0, "job": {"id": "this"}}) + "\n"
    )
    job = job_report([str(earlier_log), str(tmp_path / "train_metric.json")], now=100.0)
    assert job["job_id"] == "this" and job["left_out"] == []
    assert "left out" not in render_job(job)


# The error a rank's collective raised when the other node of a 2-node msrun job died (MindSpore
# 2.9 on CPU, recorded in a walk; the file paths shortened).
ALLREDUCE_FAILED = """
----------------------------------------------------
- Kernel error:
----------------------------------------------------
Launch kernel failed: Default/AllReduce-op0

----------------------------------------------------
- The Function Call Stack: (For framework developers)
----------------------------------------------------
In file mindspore/nn/wrap/grad_reducer.py:385~386, 23~91/            new_grad = self.map_(ops.partial(reduce_opt,/

----------------------------------------------------
- C++ Call Stack: (For framework developers)
----------------------------------------------------
mindspore/ccsrc/backend/ms_backend/runtime/actors/base/kernel_actor.cc:995 OnMemoryAllocFinish
"""


def test_a_crash_reason_is_one_line_of_the_message_without_mindspores_call_stacks(tmp_path):
    """The reason the ledger, the run span and the notice carry is the message's one line; a
    ledger that holds a multi-line reason (written before) still gives one table row."""
    from otel_mindformers.core.run_part import outcome_of_error
    from otel_mindformers.restarts.offline.attempts_report import job_report, render_job

    reason = "RuntimeError: - Kernel error: Launch kernel failed: Default/AllReduce-op0"
    assert outcome_of_error(RuntimeError(ALLREDUCE_FAILED)) == ("crashed", reason)
    assert outcome_of_error(RuntimeError("x" * 1000))[1] == "RuntimeError: " + "x" * 285 + "…"
    assert outcome_of_error(RuntimeError("x" * 286))[1] == "RuntimeError: " + "x" * 286  # 300: whole
    # A message with the C++ stack only (no Python one before it) stops there too.
    cpp_only = (
        "Launch kernel failed\n- C++ Call Stack: (For framework developers)\nkernel_actor.cc:995 OnMemoryAllocFinish"
    )
    assert outcome_of_error(RuntimeError(cpp_only))[1] == "RuntimeError: Launch kernel failed"
    crashed = _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, end=26.0, outcome="crashed")
    path = ledger_path(str(tmp_path / "train_metric.json"), 0)
    path.write_text(
        json.dumps({**new_ledger("job"), "attempts": [{**crashed, "reason": f"RuntimeError: {ALLREDUCE_FAILED}"}]})
    )
    for fmt in ("text", "markdown"):
        (row,) = [
            line for line in render_job(job_report([str(tmp_path)], now=100.0), fmt).splitlines() if "crashed" in line
        ]
        assert f"crashed ({reason})" in row


@pytest.mark.parametrize(
    ("crash_end", "outcome", "reason"),
    [
        # Two nodes: rank 1's died at 25 s; rank 0's all-reduce failed when the scheduler gave up.
        (60.0, "killed", "rank 1 was killed; 34 s later rank 0 crashed: RuntimeError: - Kernel error: Launch kernel"),
        # One msrun: rank 0 crashed, msrun tore rank 1 down at once (heard last a heartbeat before).
        (26.0, "crashed", "on rank 0: RuntimeError: - Kernel error: Launch kernel"),
        # Within rank 1's heartbeat interval (5 s) and msrun's teardown (1 s) of its last word (25.5).
        (31.0, "crashed", "on rank 0: RuntimeError: - Kernel error: Launch kernel"),
        (32.0, "killed", "rank 1 was killed; 6 s later rank 0 crashed: RuntimeError: - Kernel error: Launch kernel"),
    ],
)
def test_an_attempt_that_lost_a_rank_before_another_crashed_was_killed_by_that_loss(
    tmp_path, crash_end, outcome, reason
):
    """The report names the rank gone first, not the peer whose collective failed after it."""
    from otel_mindformers.restarts.offline.attempts_report import job_report, render_job

    failed = "RuntimeError: - Kernel error: Launch kernel failed: Default/AllReduce-op0"  # as a run writes it
    ledgers = {
        0: {**_entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, end=crash_end, outcome="crashed"), "reason": failed},
        1: {**_entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed"), "reason": "no end record, inferred"},
    }
    json_log = str(tmp_path / "train_metric.json")
    for rank, entry in ledgers.items():
        entry["heartbeat_interval"] = 5.0
        ledger_path(json_log, rank).write_text(json.dumps({**new_ledger("job"), "attempts": [entry]}))
    job = job_report([str(tmp_path)], now=100.0)
    (attempt,) = job["attempts"]
    assert attempt["outcome"] == outcome and attempt["reason"].startswith(reason)
    assert f"{outcome} ({reason}" in render_job(job)


def test_the_rank_gone_first_is_named_of_several_and_a_rank_that_completed_is_none(tmp_path):
    """Ranks 1 and 2 were killed before rank 0 crashed: the earlier, rank 2, is named. Rank 3
    completed earlier still: it was not lost, so it is not the cause."""
    from otel_mindformers.restarts.offline.attempts_report import job_report

    failed = "RuntimeError: - Kernel error: Launch kernel failed: Default/AllReduce-op0"
    ledgers = {
        0: {**_entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, end=60.0, outcome="crashed"), "reason": failed},
        1: _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed"),
        2: _entry(1, 0.0, 10.0, 12.0, 20.0, 0, 14, outcome="killed"),
    }
    json_log = str(tmp_path / "train_metric.json")
    for rank, entry in ledgers.items():
        ledger_path(json_log, rank).write_text(json.dumps({**new_ledger("job"), "attempts": [entry]}))
    (attempt,) = job_report([str(tmp_path)], now=100.0)["attempts"]
    assert attempt["reason"].startswith("rank 2 was killed; 40 s later rank 0 crashed:"), attempt["reason"]
    for rank in (1, 2):
        ledger_path(json_log, rank).unlink()
    completed = _entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, end=26.0, outcome="completed")
    ledger_path(json_log, 3).write_text(json.dumps({**new_ledger("job"), "attempts": [completed]}))
    (attempt,) = job_report([str(tmp_path)], now=100.0)["attempts"]
    assert (attempt["outcome"], attempt["reason"]) == ("crashed", f"on rank 0: {failed}")


def test_a_killed_attempts_inferred_reason_is_not_shown_in_the_table(tmp_path):
    """A rank's "no end record" is the report's inference, said by the outcome already."""
    from otel_mindformers.restarts.offline.attempts_report import job_report, render_job

    killed = {**_entry(1, 0.0, 10.0, 12.0, 25.0, 0, 14, outcome="killed"), "reason": "no end record, inferred"}
    ledger_path(str(tmp_path / "train_metric.json"), 0).write_text(
        json.dumps({**new_ledger("job"), "attempts": [killed]})
    )
    for fmt in ("text", "markdown"):
        (row,) = [
            line for line in render_job(job_report([str(tmp_path)], now=100.0), fmt).splitlines() if "killed" in line
        ]
        assert "killed (" not in row and "no end record" not in row, row


def test_an_attempts_process_is_gone_when_its_pid_is_free_or_reused_on_this_host():
    """On its own host an attempt's heartbeat is not the last word: the process table is."""
    here, began = socket.gethostname(), started_at()
    assert began is not None and began <= time.time()
    assert not process_gone({"pid": os.getpid(), "host": here, "process_start": began})
    # A later run in the same process records its own start, after the process's.
    assert not process_gone({"pid": os.getpid(), "host": here, "process_start": began + 30})
    # The process with that pid began a minute after the attempt's did: the pid was reused.
    assert process_gone({"pid": os.getpid(), "host": here, "process_start": began - 60})
    free = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it
    assert process_gone({"pid": free, "host": here, "process_start": began})
    # Another host's process cannot be looked up: its heartbeat says.
    assert not process_gone({"pid": free, "host": f"not-{here}", "process_start": began})


# --- a run beside a live run of another job: it writes elsewhere ----------------------------


def test_a_run_beside_a_live_one_moves_every_path_into_one_folder_beside_the_logs():
    moved = folder_beside("/data/run/out/train_metric.json", "exp-B")
    assert moved == Path("/data/run/out.exp-B")
    # The TensorBoard folder keeps its place below the log's folder, or goes in by its name.
    assert paths_in(moved, "/data/run/out/train_metric.json", "/data/run/out/logs/board") == (
        "/data/run/out.exp-B/train_metric.json", "/data/run/out.exp-B/logs/board"
    )  # fmt: skip
    assert paths_in(moved, "/data/run/out/train_metric.json", "/data/board") == (
        "/data/run/out.exp-B/train_metric.json", "/data/run/out.exp-B/board"
    )  # fmt: skip


def _live_ledger(json_log_path: Path, job_id: str) -> Path:
    """A ledger whose last attempt is another job's and alive: this test's parent process,
    its heartbeat fresh."""
    parent = os.getppid()
    entry = {
        "attempt": 1, "attempt_id": "live", "pid": parent, "host": socket.gethostname(),
        "process_start": started_at(parent), "last_heartbeat": time.time(), "heartbeat_interval": 60.0,
        "outcome": None,
    }  # fmt: skip
    path = ledger_path(str(json_log_path), 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**new_ledger(job_id), "attempts": [entry]}))
    return path


def _begin_beside(settings: dict, caplog) -> tuple:
    """begin_attempt for a run from step 0; (tracker, config it goes on with, its warnings)."""
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        tracker, config = begin_attempt(load_monitor_config(settings), Identity(), 0, StepClock(), WallClock(), [])
    tracker.end("completed", None, 0)
    return tracker, config, [r.getMessage() for r in caplog.records]


def test_a_run_without_a_job_id_beside_a_live_one_writes_in_a_folder_named_after_its_pid(tmp_path, caplog):
    out = tmp_path / "out"
    live = _live_ledger(out / "train_metric.json", "exp-A")
    before = live.read_bytes()
    settings = {"json_log_path": str(out / "train_metric.json"), "tensorboard_path": str(tmp_path / "board")}
    tracker, config, warnings = _begin_beside(settings, caplog)
    elsewhere = tmp_path / f"out.pid{os.getpid()}"
    assert (config.json_log_path, config.tensorboard_path) == (
        str(elsewhere / "train_metric.json"), str(elsewhere / "board")
    )  # fmt: skip
    assert tracker.path == elsewhere / "train_metric.job.rank_0.ledger" and tracker.path.exists()
    assert live.read_bytes() == before
    assert [w for w in warnings if "instead" in w] == warnings and len(warnings) == 1
    assert f"is running and writing {live}: this run writes its files in {elsewhere} instead" in warnings[0]


@pytest.mark.parametrize("beside", ["a live run's", "a file"])
def test_a_folder_beside_that_cannot_be_used_sends_the_run_to_a_new_temporary_folder(tmp_path, caplog, beside):
    """The job id names the folder beside (made safe for a file name); a live run there too
    (another job's) is not taken over either, and a file of that name is no folder."""
    _live_ledger(tmp_path / "out" / "train_metric.json", "exp-A")
    if beside == "a file":
        (tmp_path / "out.exp_B_1").write_text("not a folder")
    else:
        _live_ledger(tmp_path / "out.exp_B_1" / "train_metric.json", "exp-C")
    settings = {
        "json_log_path": str(tmp_path / "out" / "train_metric.json"),
        "tensorboard_path": str(tmp_path / "out" / "logs" / "board"), "job_id": "exp/B 1",
    }  # fmt: skip
    tracker, config, warnings = _begin_beside(settings, caplog)
    folder = Path(config.json_log_path).parent
    try:
        assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("otel_mindformers.exp_B_1.")
        assert config.tensorboard_path == str(folder / "logs" / "board")
        assert tracker.path.parent == folder and tracker.job_id == "exp/B 1"
        assert len(warnings) == 1 and f"this run writes its files in {folder} instead" in warnings[0]
    finally:
        shutil.rmtree(folder)


# --- what the attempt arithmetic promises (issue 51) ------------------------------------------


def test_the_jobs_goodput_is_absent_not_zero_until_an_attempt_timed_its_steps():
    """Attempt 1 was killed before its first step; attempt 2 has finished one step (no time
    between two steps yet): no productive time to divide, so no goodput, not a 0.0 that dips
    every dashboard as an attempt starts. Ten steps later it is the productive share."""
    killed = {
        "attempt": 1, "attempt_id": "a", "process_start": 100.0, "train_begin": 101.0, "resume_step": 0,
        "last_step": 0, "last_heartbeat": 130.0, "heartbeat_interval": 5.0, "outcome": "killed",
    }  # fmt: skip
    running = {
        "attempt": 2, "attempt_id": "b", "process_start": 140.0, "train_begin": 141.0, "resume_step": 0,
        "first_step_begin": 150.0, "first_step_end": 152.0, "last_step": 1, "last_step_time": 152.0,
        "last_heartbeat": 153.0, "heartbeat_interval": 5.0, "outcome": None,
    }  # fmt: skip
    assert job_timeline([killed], now=135.0)["totals"]["goodput"] is None
    assert job_timeline([killed, running], now=155.0, live_attempt_id="b")["totals"]["goodput"] is None
    later = {**running, "last_step": 11, "last_step_time": 162.0, "last_heartbeat": 163.0}
    totals = job_timeline([killed, later], now=170.0, live_attempt_id="b")["totals"]
    # Productive: steps 2..11, 10 s. Wall: 100..130, 130..140 without a process, 140..170.
    assert totals["wall_seconds"] == pytest.approx(70.0)
    assert totals["goodput"] == pytest.approx(10.0 / 70.0)


def _tracker(tmp_path: Path, clock: StepClock, wall: WallClock | None = None) -> AttemptTracker:
    """An attempt whose process began 10 s ago."""
    return AttemptTracker.begin(
        path=ledger_path(str(tmp_path / "train_metric.json"), 0), job_id="job", continues=False, rank=0,
        resume_step=0, process_start=time.time() - 10, checkpoint_load_seconds=0.0, clock=clock,
        wall_clock=wall or WallClock(), heartbeat_interval=60.0,
    )  # fmt: skip


def test_a_new_attempt_writes_no_goodput_in_its_line_and_reports_no_gauge_point(tmp_path):
    reader = InMemoryMetricReader()
    observables = RunObservables(MeterProvider(metric_readers=[reader]).get_meter("test"))
    clock, wall = StepClock(), WallClock()
    tracker = _tracker(tmp_path, clock, wall)
    JobGauges(observables, tracker, {"training.rank": 0})

    def reported() -> dict[str, float]:
        data = reader.get_metrics_data()
        return {
            metric.name: point.value
            for resource in data.resource_metrics for scope in resource.scope_metrics for metric in scope.metrics
            for point in metric.data.data_points
        }  # fmt: skip

    assert tracker.line_fields() == {"id": "job", "attempt": 1}
    assert reported() == {"mindformers.job.attempt": 1, "mindformers.job.no_progress_attempts": 0}
    # Steps 2..5 timed (4 s of the 10 since the process began): the job's goodput is known,
    # in the line and as a point.
    now = time.perf_counter()
    tracker.first_step(now - 6.0, now - 5.0)
    clock.step, clock.last_step_end = 5, now - 1.0
    tracker.end("completed", None, 5)
    goodput = tracker.job_goodput
    assert goodput == pytest.approx(0.4, abs=0.05)
    assert tracker.line_fields() == {"id": "job", "attempt": 1, "goodput": round(goodput, 6)}
    assert reported()["mindformers.job.goodput"] == goodput
    observables.close()


def test_evaluations_and_user_phases_before_the_first_step_stay_start_up(tmp_path):
    """The run's records carry its phase totals since it began: the first one's (the
    attempt's first step) are start-up's, the ledger holds what came after."""
    clock = StepClock()
    tracker = _tracker(tmp_path, clock)
    tracker.note_phases(1.5, 0.25)  # the first step's record: before it, a 1.5 s evaluation
    tracker.note_phases(4.0, 0.75)  # a later record
    tracker.end("completed", None, 0)
    (entry,) = read_ledger(tracker.path)["attempts"]
    assert (entry["evaluation_seconds"], entry["user_phase_seconds"]) == (2.5, 0.5)


def test_an_attempts_end_never_lowers_its_last_step_with_a_stale_one(tmp_path):
    """The run's end hands over the step it knows; the clock may be further (the pipeline
    lags it): the ledger keeps the furthest."""
    clock = StepClock()
    tracker = _tracker(tmp_path, clock)
    clock.step, clock.last_step_end = 20, time.perf_counter()
    tracker.end("crashed", "RuntimeError: boom", 5)
    (entry,) = read_ledger(tracker.path)["attempts"]
    assert (entry["last_step"], entry["outcome"]) == (20, "crashed")
    # A later step handed over than the clock's is kept too.
    later = _tracker(tmp_path / "later", StepClock())
    later.end("completed", None, 7)
    assert read_ledger(later.path)["attempts"][-1]["last_step"] == 7


def test_a_ledger_past_the_size_limit_is_kept_aside_never_read(tmp_path, caplog):
    path = ledger_path(str(tmp_path / "train_metric.json"), 0)
    body = json.dumps(new_ledger("job")).encode()
    path.write_bytes(body + b" " * (MAX_LEDGER_BYTES - len(body)))  # at the limit: JSON with trailing blanks
    assert read_ledger(path)["job_id"] == "job"
    path.write_bytes(body + b" " * (MAX_LEDGER_BYTES - len(body) + 1))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert read_ledger(path) is None
    assert not path.exists() and path.with_name(path.name + ".corrupt").stat().st_size == MAX_LEDGER_BYTES + 1
    assert len(caplog.records) == 1 and "corrupt or truncated" in caplog.records[0].getMessage()


def test_an_attempt_is_alive_while_its_heartbeat_is_within_three_intervals_and_a_second():
    """Three missed heartbeats (and a second of slack for the write) before a run is taken
    for dead: a loaded machine delays a beat, never two more."""
    entry = {"attempt": 1, "last_heartbeat": 1000.0, "heartbeat_interval": 5.0, "outcome": None}
    assert is_alive(entry, now=1000.0 + 15.9)
    assert not is_alive(entry, now=1000.0 + 16.1)
    assert not is_alive({**entry, "end": 1001.0}, now=1002.0)  # ended: never alive
    assert not is_alive({**entry, "outcome": "completed"}, now=1002.0)
    assert is_alive({k: v for k, v in entry.items() if k != "heartbeat_interval"}, now=1015.9)  # 5 s by default


def test_an_attempt_loses_at_most_the_steps_it_did():
    """Attempt 3 resumes from an older checkpoint (step 50) than attempt 2 started from
    (100): attempt 2 computed 20 steps, and loses those 20, not the 70 between 50 and its
    last step (steps 51..100 were attempt 1's)."""

    def attempt(number: int, resume: int, last: int, start: float) -> dict:
        return {
            "attempt": number, "attempt_id": str(number), "process_start": start, "resume_step": resume,
            "first_step_begin": start + 1, "first_step_end": start + 2, "last_step": last,
            "last_step_time": start + 2 + (last - resume - 1), "last_heartbeat": start + 3 + (last - resume),
            "outcome": "killed",
        }  # fmt: skip

    rows = job_timeline([attempt(1, 0, 100, 0.0), attempt(2, 100, 120, 200.0), attempt(3, 50, 60, 300.0)])["attempts"]
    assert [row["lost_steps"] for row in rows] == [0, 20, 0]
    assert rows[1]["seconds"]["lost_progress"] == pytest.approx(19.0)  # all of its timed steps, at 1 s each


def test_a_ledger_gone_before_it_is_set_aside_is_not_counted_as_a_job(tmp_path):
    """A run of another job found a ledger to set aside, and another process moved it first:
    the jobs set aside so far are the files there, and the next job's local id follows them."""
    path = ledger_path(str(tmp_path / "train_metric.json"), 0)
    path.with_name(path.name + ".job1").write_text("{}")
    assert _set_aside(path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name + ".job1"]


def test_each_attempts_bar_in_the_attempts_figure_reaches_its_end():
    # The attempts of the evaluation test above: every category (productive, the wait for
    # data, evaluations, user phases, saves, lost steps) is drawn, so a bar spans its attempt.
    timeline = job_timeline(_evaluating_attempts())
    job = {**timeline, "job_id": "j", "attempts": [{**row, "ranks": [0]} for row in timeline["attempts"]]}
    (axes,) = attempts_figure(job).axes
    origin = min(row["start"] for row in job["attempts"])
    for index, row in enumerate(job["attempts"]):
        y = len(job["attempts"]) - index
        bars = [bar for bar in axes.patches if bar.get_y() < y < bar.get_y() + bar.get_height() and bar.get_fill()]
        drawn = [bar for bar in bars if bar.get_facecolor() != (1.0, 1.0, 1.0, 1.0)]  # not the hatched downtime
        assert min(bar.get_x() for bar in drawn) == pytest.approx(row["start"] - origin)
        assert max(bar.get_x() + bar.get_width() for bar in drawn) == pytest.approx(row["end"] - origin)
