"""Captures end to end in real MindSpore training (docs/captures.md): a loss spike at a known
step fires the rules, a profile of the next steps lands under the capture path with the
step span's event and the notification naming it; the cooldown, the disk bound, a capture
path that cannot be written and a MindSpore without its profiler; the on-demand request
under a real 2-rank msrun job."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import pytest
from mindspore.train import Callback

from otel_mindformers.captures import store as capture_store
from otel_mindformers.cli import main as cli_main
from otel_mindformers.compat import releases
from otel_mindformers.names import capture_names as names
from otel_mindformers.runtime.callback import MonitorCallback
from tests.support.capture_trace import manifest, ops_by_step, wait_for_trace
from tests.support.in_memory import Capture
from tests.support.instrumented import BIN, REPO, child_env, free_port
from tests.support.permissions import obey_file_permissions
from tests.support.training import BATCH, FEATURES, Faults, train
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

SPIKE = 15
PROFILE_STEPS = 3


class Run:
    """A MonitorCallback on in-memory SDK pipelines with captures under `workdir/captures`."""

    def __init__(self, workdir, alert_section, capture_section, interval=1):
        self.json_path = workdir / "train_metric.json"
        self.captures = workdir / "captures"
        self.telemetry = Capture()
        self.callback = MonitorCallback(
            {
                "interval": interval,
                "grad_monitor": False,
                "output_type": ["json_file"],
                "json_log_path": str(self.json_path),
                "alert_config": {
                    "enable_alert": True,
                    "stall_timeout": None,
                    **alert_section,
                    "capture": {"path": str(self.captures), **capture_section},
                },
            },
            **self.telemetry.providers(),
        )

    def lines(self):
        return [json.loads(line) for line in self.json_path.read_text().splitlines()]

    def folders(self):
        return capture_store.capture_folders(self.captures / "rank_0")

    def step_span(self, step):
        for span in self.telemetry.finished("mindformers.train.step"):
            if span.attributes.get("training.step") == step:
                return span
        raise AssertionError(f"no step span {step}")

    def points(self, name):
        return {tuple(sorted(p.attributes.items())): p.value for p in self.telemetry.points().get(name, [])}


def test_loss_spike_profiles_the_next_steps_and_names_the_capture_everywhere(workdir, capsys):
    with WebhookReceiver() as receiver:
        run = Run(
            workdir,
            {
                "alert_interval": 1,
                "loss_spike": {"warmup": 5},
                "loss_spike_score": {"enable": True, "warmup": 5, "sigma": 5},
                "step_time_regression": {"enable": False},
                "notifiers": [{"type": "webhook", "url": receiver.url()}],
            },
            {
                "rules": ["loss_spike"],
                "profile_steps": PROFILE_STEPS,
                "cooldown_steps": 100,
                "batch_crc32": True,
            },
        )
        # A second spike 5 steps later: inside the cooldown, so no second capture.
        train([run.callback], steps=40, faults=Faults(spike_at={SPIKE: 6.0, SPIKE + 5: 6.0}), lr=0.003)
        firing = [r.body for r in receiver.requests if r.body["status"] == "firing"]

    # The spike score rose, and its rule fired once (the second spike kept it above 0).
    score_alerts = [b for b in firing if b["rule"] == "loss_spike_score"]
    assert [b["step"] for b in score_alerts] == [SPIKE]
    assert list(run.points(names.LOSS_SPIKE_SCORE.name).values())[-1] > 0
    spikes = [b for b in firing if b["rule"] == "loss_spike"]
    assert [b["step"] for b in spikes][:2] == [SPIKE, SPIKE + 5]

    # One capture, for the first spike; the notification carries its folder.
    folders = run.folders()
    assert len(folders) == 1, folders
    folder = folders[0]
    assert spikes[0]["capture"] == str(folder) and "capture" not in spikes[1]
    info = manifest(folder)
    assert (info["trigger"], info["step"], sorted(info["kinds"])) == ("loss_spike", SPIKE, sorted(names.KINDS))

    # The profile covers the PROFILE_STEPS steps after the boundary where it started.
    first, last = info["first_step"], info["last_step"]
    assert first > SPIKE and last - first + 1 == PROFILE_STEPS
    assert [w[0] for w in info["step_windows_ns"]] == list(range(first, last + 1))
    by_step, outside = ops_by_step(wait_for_trace(folder), info["step_windows_ns"])
    counts = {step: len(ops) for step, ops in by_step.items()}
    assert all(counts.values()), counts
    assert len(set(counts.values())) == 1, f"every step runs the same operators: {counts}"
    assert any("MatMul" in name for name in by_step[first])
    assert outside <= counts[first], outside  # what ran between start() and the first step

    # The batch: the spike's step, epoch, place in the epoch, shapes and the CRC of its input.
    batch = json.loads((folder / names.BATCH_FILE).read_text())
    assert (batch["step"], batch["epoch"], batch["step_in_epoch"]) == (SPIKE, 1, SPIKE)
    assert batch["inputs"] == [{"shape": [4, 8], "dtype": "Float32"}, {"shape": [4, 1], "dtype": "Float32"}]
    assert isinstance(batch["crc32_first_input"], int)
    assert batch["sample_range_if_unshuffled"] == [(SPIKE - 1) * 4, SPIKE * 4]
    assert "(training thread)" in (folder / names.STACKS_FILE).read_text()

    # The step span: the capture's event, and the alert event naming it too.
    events = [(e.name, dict(e.attributes)) for e in run.step_span(SPIKE).events]
    (capture_event,) = [a for name, a in events if name == names.EVENT_CAPTURE]
    assert capture_event[names.ATTR_CAPTURE_PATH] == str(folder)
    assert capture_event[names.ATTR_CAPTURE_TRIGGER] == "loss_spike"
    (alert_event,) = [a for name, a in events if a.get("training.alert.rule") == "loss_spike"]
    assert alert_event[names.ATTR_CAPTURE_PATH] == str(folder)
    records = [r for r in run.telemetry.log_records() if r.event_name == names.EVENT_CAPTURE]
    assert len(records) == 1 and str(folder) in records[0].body
    taken = run.points(names.CAPTURES.name)
    assert {
        dict(k)[names.ATTR_CAPTURE_KIND] for k, v in taken.items() if ("training.capture.outcome", "taken") in k
    } == set(names.KINDS)
    assert any(("training.capture.outcome", "skipped") in k for k in taken)  # the cooldown's

    # `capture --list` and `report --captures` show it.
    assert cli_main(["capture", "--list", str(run.captures)]) == 0
    assert cli_main(["report", str(run.json_path), "--captures", str(run.captures)]) == 0
    out = capsys.readouterr().out
    assert out.count(str(folder)) == 2 and f"{first}-{last}" in out

    # The longest step around the capture, for docs/captures.md (measured, not asserted).
    times = {line["step"]: line["train_per_step_time"] for line in run.lines()}
    around = {s: round(times[s], 1) for s in range(first - 1, last + 2)}
    others = [t for s, t in times.items() if s > 5 and not first - 1 <= s <= last + 1 and s not in (SPIKE, SPIKE + 5)]
    with capsys.disabled():
        print(f"\nstep times (ms) around the capture {around}; median elsewhere {statistics.median(others):.1f}")


def test_captures_past_max_bytes_remove_the_oldest(workdir):
    """Every sampled step's loss spike triggers (cooldown 0); the folder holds ~2 captures."""
    run = Run(
        workdir,
        {"alert_interval": 1, "loss_threshold": 0.0, "loss_spike": {"enable": False}},
        {"rules": ["loss_threshold"], "kinds": ["stacks", "batch"], "cooldown_steps": 0, "max_bytes": 1},
    )
    train([run.callback], steps=6)
    folders = run.folders()
    # Each capture makes room first: the older ones are gone, the last one stays.
    assert len(folders) == 1 and manifest(folders[0])["step"] == 6


def test_max_captures_bounds_a_run(workdir):
    run = Run(
        workdir,
        {"alert_interval": 1, "loss_threshold": 0.0, "loss_spike": {"enable": False}},
        {"rules": ["all"], "kinds": ["batch"], "cooldown_steps": 0, "max_captures": 2},
    )
    train([run.callback], steps=6)
    assert [manifest(f)["step"] for f in run.folders()] == [1, 2]


def test_a_rule_firing_exactly_cooldown_steps_after_a_capture_is_captured(workdir):
    """`cooldown_steps: 3`: the rule fires on every step; captures at 1, 4, 7, 10 (a step
    exactly 3 after the last capture is allowed, as docs/captures.md says)."""
    run = Run(
        workdir,
        {"alert_interval": 1, "loss_threshold": 0.0, "loss_spike": {"enable": False}},
        {"rules": ["loss_threshold"], "kinds": ["batch"], "cooldown_steps": 3, "max_captures": 100},
    )
    train([run.callback], steps=10)
    assert [manifest(f)["step"] for f in run.folders()] == [1, 4, 7, 10]


def test_on_demand_captures_neither_count_toward_max_captures_nor_restart_the_cooldown(workdir):
    """A person's captures (asked at steps 2 and 7) around two rule-triggered ones (cooldown
    4, at most 2): the rule still captures at 1 and 5, and the person's second capture, past
    `max_captures`, is not refused."""
    run = Run(
        workdir,
        {"alert_interval": 1, "loss_threshold": 0.0, "loss_spike": {"enable": False}},
        {"rules": ["loss_threshold"], "kinds": ["batch"], "cooldown_steps": 4, "max_captures": 2, "on_demand": True},
    )
    asked = {step: {"steps": 1, "kinds": ["stacks"]} for step in (2, 7)}
    train([run.callback, Requests(run.captures, asked)], steps=12)
    taken = [manifest(f) for f in run.folders()]
    assert [m["step"] for m in taken if m["trigger"] == "loss_threshold"] == [1, 5], taken
    # Taken by the first sampled step that ended after the request (the same step, where the
    # request's time stamp and the step's end fall in one clock tick).
    on_demand = [m["step"] for m in taken if m["trigger"] == names.TRIGGER_ON_DEMAND]
    assert len(on_demand) == 2 and on_demand[0] in (2, 3) and on_demand[1] in (7, 8), taken


def _child(workdir, capture_path, *flags, writable=True, alerts=None, capture=None):
    config = {
        "interval": 1,
        "grad_monitor": False,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "train_metric.json"),
        "alert_config": {
            "enable_alert": True,
            "stall_timeout": None,
            "loss_spike": {"warmup": 5},
            "step_time_regression": {"enable": False},
            **(alerts or {}),
            "capture": {"rules": ["loss_spike"], "profile_steps": 2, "path": str(capture_path), **(capture or {})},
        },
    }
    path = workdir / "config.json"
    path.write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "support" / "capture_train.py"), str(path), *flags],
        env=child_env(),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=None if writable else obey_file_permissions,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_unwritable_capture_path_warns_once_and_the_rule_still_alerts(workdir):
    captures = workdir / "captures"
    captures.mkdir()
    captures.chmod(0o555)
    try:
        # Every step's loss is over the threshold, and there is no cooldown: 30 attempts.
        result = _child(
            workdir,
            captures,
            writable=False,
            alerts={"alert_interval": 1, "loss_threshold": 0.0},
            capture={"rules": ["loss_spike", "loss_threshold"], "cooldown_steps": 0, "max_captures": 100},
        )
    finally:
        captures.chmod(0o755)
    assert result["lines"] == 30 and [SPIKE, "loss_spike"] in result["fired"]
    assert sum(rule == "loss_threshold" for _, rule in result["fired"]) == 30
    about = [w for w in result["warnings"] if "capture" in w and "cannot write" in w]
    assert len(about) == 1, result["warnings"]
    assert not list(captures.iterdir())


def test_missing_profiler_warns_once_and_other_kinds_are_still_captured(workdir):
    captures = workdir / "captures"
    result = _child(workdir, captures, "--no-profiler")
    assert result["lines"] == 30 and [SPIKE, "loss_spike"] in result["fired"]
    about = [
        w for w in result["warnings"] if w.startswith(("otel_mindformers: profile", "otel_mindformers: the profiler"))
    ]
    # One warning naming the feature, the installed release and the name that is not there.
    assert len(about) == 1, result["warnings"]
    assert about[0].startswith("otel_mindformers: profile captures are off: mindspore.profiler is unavailable"), about
    assert f"({releases.release(releases.MINDSPORE)}: mindspore.profiler:profile is not there" in about[0], about
    (folder,) = capture_store.capture_folders(captures / "rank_0")
    assert sorted(manifest(folder)["kinds"]) == ["batch", "stacks"]
    assert not (folder / names.PROFILE_DIR).exists()


@pytest.mark.msrun_job
def test_on_demand_capture_under_msrun_only_on_the_rank_asked(workdir, capsys):
    captures = workdir / "captures"
    config = workdir / "monitor.yaml"
    config.write_text(
        "monitor_config:\n  interval: 2\n  grad_monitor: false\n  output_type: [json_file]\n"
        f"  json_log_path: {workdir / 'train_metric.json'}\n"
        "  alert_config:\n    capture:\n      on_demand: true\n"
        f"      path: {captures}\n"
    )
    env = child_env(MASTER_PORT=str(free_port()))
    stop_file = workdir / "stop"  # the job runs until the captures are answered, not for a guessed time
    job = subprocess.Popen(
        [
            str(BIN / "msrun"),
            "--worker_num=2",
            "--local_worker_num=2",
            f"--master_port={env['MASTER_PORT']}",
            "--join=True",
            f"--log_dir={workdir / 'msrun_log'}",
            str(REPO / "tests" / "support" / "capture_worker.py"),
            str(config),
            "--steps",
            "4000",
            "--stop-file",
            str(stop_file),
        ],
        env=env,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        logs = [workdir / f"train_metric_rank_{rank}.json" for rank in (0, 1)]
        deadline = time.monotonic() + 300
        while not all(p.exists() and p.stat().st_size for p in logs):
            assert job.poll() is None and time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.2)
        assert cli_main(["capture", "--steps", "3", "--ranks", "1", str(captures), "--wait", "120"]) == 0
        answer = capsys.readouterr().out
        # Every rank (no --ranks): the wait ends when both have answered, while the job runs on.
        assert cli_main(["capture", "--kinds", "stacks", str(captures), "--wait", "300"]) == 0
        assert job.poll() is None, "the wait for every rank outlasted the job"
        every = capsys.readouterr().out
        stop_file.touch()
        output, _ = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, output[-3000:]
    assert "rank 1: step" in answer
    assert "rank 0: step" in every and "rank 1: step" in every
    (only,) = capture_store.capture_folders(captures / "rank_0")  # the first request was not rank 0's
    assert manifest(only)["requested_kinds"] == ["stacks"]
    (folder, _) = capture_store.capture_folders(captures / "rank_1")
    info = manifest(folder)
    assert info["trigger"] == names.TRIGGER_ON_DEMAND and info["request_id"] and info["rank"] == 1
    by_step, _ = ops_by_step(wait_for_trace(folder), info["step_windows_ns"])
    assert len(by_step) == 3 and all(by_step.values())
    worker_log = (workdir / "msrun_log" / "worker_1.log").read_text()
    assert f"picked up capture request {info['request_id']}" in worker_log
    assert f"picked up capture request {info['request_id']}" not in (workdir / "msrun_log" / "worker_0.log").read_text()
    assert "(stacks)" in worker_log, "a request without a profile names no profile steps"
    # The finished profile was stopped: MindSpore does not warn at exit that it may be incomplete.
    assert "at the end of the program" not in worker_log
    assert os.path.exists(captures / names.CONTROL_FILE)


def test_a_wait_that_no_rank_answers_fails_naming_the_folder(tmp_path, capsys):
    folder = tmp_path / "no_job_here"
    folder.mkdir()  # a run watched it once (a folder that never existed is refused at once)
    assert cli_main(["capture", "--kinds", "stacks", str(folder), "--wait", "0.3"]) == 1
    err = capsys.readouterr().err
    assert (
        f"no answer within 0.3 s from any rank (is a run with alert_config.capture.on_demand: true writing its captures under {folder}?)"
        in err
    )


def test_deferred_analysis_leaves_raw_data_that_the_command_analyses(workdir, capsys):
    run = Run(
        workdir,
        {"alert_interval": 1, "loss_threshold": 0.0, "loss_spike": {"enable": False}},
        {"rules": ["loss_threshold"], "kinds": ["profile"], "profile_steps": 2, "analysis": "deferred"},
    )
    # Held until the worker took the rule's capture: eight short steps may end before it does.
    train([run.callback, HeldUntil(2, run.folders, "the capture's request taken")], steps=8)
    (folder,) = run.folders()
    wait_until(lambda: manifest(folder)["status"] not in ("taken", "waiting"), "the profile's end")
    info = manifest(folder)
    assert info["status"] == "raw" and not list(folder.glob("profile/*/ASCEND_PROFILER_OUTPUT"))
    # Named as docs/captures.md names it: relative to the working directory (the run's).
    relative = os.path.relpath(run.captures, workdir)
    assert cli_main(["capture", "--analyse", relative]) == 0
    assert f"analysed {relative}{os.sep}" in capsys.readouterr().out
    assert not (workdir / "data").exists(), "MindSpore's parser wrote a folder of its own beside them"
    by_step, _ = ops_by_step(wait_for_trace(folder, timeout=1), info["step_windows_ns"])
    assert sorted(by_step) == [info["first_step"], info["first_step"] + 1] and all(by_step.values())
    # The timeline PNG of docs/captures.md, from the analysed trace.
    assert cli_main(["capture", "--plot", str(workdir / "trace.png"), str(run.captures)]) == 0
    assert (workdir / "trace.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert cli_main(["capture", "--list", "--format", "json", str(run.captures)]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["status"] == "analysed"  # the command's trace, seen by the listing


def test_a_profile_a_rule_asks_for_starts_at_the_next_step_end_not_the_next_sampled_one(workdir):
    run = Run(
        workdir,
        {"alert_interval": 1, "loss_threshold": 0.0, "loss_spike": {"enable": False}},
        {"rules": ["loss_threshold"], "kinds": ["profile"], "profile_steps": 2, "analysis": "deferred"},
        interval=5000,  # after step 1, the next sampled step would be past the end of the run
    )
    train([run.callback], steps=300)
    # (The run's last step, sampled at train end, fires the rule again: a capture too late to start.)
    (info,) = [manifest(folder) for folder in run.folders() if manifest(folder)["step"] == 1]
    assert info["status"] == "raw", info
    assert 1 < info["first_step"] < 299


def test_graph_mode_profile_holds_the_compiled_graphs_operators(workdir):
    import mindspore as ms

    run = Run(
        workdir,
        {"alert_interval": 1, "loss_threshold": 0.0, "loss_spike": {"enable": False}},
        {"rules": ["loss_threshold"], "kinds": ["profile"], "profile_steps": 2},
    )
    # Graph-mode steps take a millisecond: on a loaded host all eight could end before the
    # worker fired the rule for step 1, leaving the profile no steps ("incomplete", no trace).
    taken = HeldUntil(2, run.folders, "the capture's request taken")
    train([run.callback, taken], steps=8, mode=ms.GRAPH_MODE)
    (folder,) = run.folders()
    # Its finishing thread writes the manifest once the profile's steps are done.
    wait_until(lambda: manifest(folder)["status"] not in ("taken", "waiting"), "the profile's end")
    info = manifest(folder)
    assert info["status"] in ("analysing", "analysed"), info
    by_step, _ = ops_by_step(wait_for_trace(folder), info["step_windows_ns"])
    assert len(by_step) == 2 and all(by_step.values())
    # GRAPH mode names operators by their place in the network.
    assert any("MatMul" in name and "/" in name for ops in by_step.values() for name in ops)


class RequestAt(Callback):
    """Asks for an on-demand capture from inside the job, at the end of `step`."""

    def __init__(self, root, step, ranks):
        self.root, self.step, self.ranks = root, step, ranks

    def on_train_step_end(self, run_context):
        if run_context.original_args()["cur_step_num"] == self.step:
            capture_store.write_request(self.root, steps=2, ranks=self.ranks, kinds=["profile", "batch"])


def test_on_demand_request_is_taken_at_the_next_sampled_step_and_recorded_on_its_span(workdir):
    """The second request (for rank 3) comes one step after the first, before the worker,
    which takes records in batches, has read the first: it used to replace the first in the
    one-request file, and rank 0 took nothing (the matrix row's "no capture folder")."""
    run = Run(workdir, {"loss_spike": {"enable": False}}, {"on_demand": True, "rules": []})
    train([run.callback, RequestAt(run.captures, 5, [0]), RequestAt(run.captures, 6, [3])], steps=20)
    (folder,) = run.folders()  # the second request was for rank 3 only
    info = manifest(folder)
    assert info["trigger"] == names.TRIGGER_ON_DEMAND and 5 <= info["step"] <= 7, info
    assert sorted(info["kinds"]) == ["batch", "profile"] and info["last_step"] - info["first_step"] == 1
    # The batch of the step that took it, noted by the training thread (not the step alone).
    batch = json.loads((folder / names.BATCH_FILE).read_text())
    assert batch["step"] == info["step"] and batch["inputs"][0]["shape"] == [BATCH, FEATURES], batch
    (event,) = [e for e in run.step_span(info["step"]).events if e.name == names.EVENT_CAPTURE]
    assert event.attributes[names.ATTR_CAPTURE_PATH] == str(folder)
    assert event.attributes[names.ATTR_CAPTURE_TRIGGER] == names.TRIGGER_ON_DEMAND


class Requests(Callback):
    """Writes on-demand requests from inside the job: step -> `write_request`'s arguments."""

    def __init__(self, root, at):
        self.root, self.at = root, at

    def on_train_step_end(self, run_context):
        requests = self.at.get(run_context.original_args()["cur_step_num"], [])
        for request in [requests] if isinstance(requests, dict) else requests:
            capture_store.write_request(self.root, ranks=None, **request)


class AnsweredBy(Callback):
    """Holds the training thread at `step` until the rank answered a request (the worker
    is asynchronous): what the test asserts next happens after the answer, not by luck."""

    def __init__(self, root, step):
        self.root, self.step = root, step

    def on_train_step_end(self, run_context):
        if run_context.original_args()["cur_step_num"] == self.step:
            wait_until(lambda: capture_store.read_answers(self.root), "the rank's answer to the cancel")


class HeldUntil(Callback):
    """Holds the training thread at the end of `step` until `condition()` (the worker is
    asynchronous and may take a request a few sampled steps' records late on a loaded machine)."""

    def __init__(self, step, condition, what):
        self.step, self.condition, self.what = step, condition, what

    def on_train_step_end(self, run_context):
        if run_context.original_args()["cur_step_num"] == self.step:
            wait_until(self.condition, self.what)


def test_capture_cancel_then_a_new_request_at_once_both_are_served(workdir):
    """Interval 50: a profile of 1,000 steps (a typo of 10) runs from step 50; at step 60 a
    cancel and, at once, a new request. The new request used to replace the cancel in the
    one-request file before a sampled step read it: the profile went on and the request was
    never answered (issue 46, item 12). Now both are queued: the profile stops, keeps the
    steps it took and says who cancelled it; the stacks are taken at a later sampled step."""
    run = Run(workdir, {"loss_spike": {"enable": False}}, {"on_demand": True, "rules": []}, interval=50)
    at = {3: [{"steps": 1000, "kinds": ["profile"]}], 60: [{"cancel": True}, {"steps": 2, "kinds": ["stacks"]}]}
    # The profile's request taken (its folder made) before the cancel comes, as a user would see it.
    taken = HeldUntil(55, run.folders, "the profile's request taken")
    train([run.callback, taken, Requests(run.captures, at), AnsweredBy(run.captures, 110)], steps=200)
    profiled, stacks = run.folders()
    info = manifest(profiled)
    (cancel,) = capture_store.read_answers(run.captures)
    assert info["status"] == "cancelled" and info["reason"] == f"cancelled by request {cancel['id']}", info
    assert (cancel["answer"], cancel["folder"], cancel["step"]) == ("cancelled", str(profiled), 100)
    assert 50 < info["first_step"] <= info["last_step"] <= 110, info
    assert manifest(stacks)["kinds"] == ["stacks"] and manifest(stacks)["step"] in (150, 200), manifest(stacks)


class RemoveThenAsk(Callback):
    """At `removed`, someone deletes the capture folder of the live run; at `asks`, once the
    run has made it again, a person asks for stacks with the command."""

    def __init__(self, root, removed, asks):
        self.root, self.removed, self.asks, self.said = root, removed, asks, None

    def on_train_step_end(self, run_context):
        step = run_context.original_args()["cur_step_num"]
        if step == self.removed:
            shutil.rmtree(self.root)
        elif step == self.asks:
            wait_until(self.root.is_dir, "the run to make its capture folder again")
            self.said = cli_main(["capture", "--kinds", "stacks", str(self.root)])


def test_a_live_runs_deleted_capture_folder_is_made_again_and_requests_reach_it(workdir):
    """`capture` refuses a folder that does not exist (a typo); after a cleaner removed a
    live run's folder it refused that run too, which still watched it (issue 46, item 21)."""
    run = Run(workdir, {"loss_spike": {"enable": False}}, {"on_demand": True, "rules": []})
    person = RemoveThenAsk(run.captures, 4, 8)
    train([run.callback, person], steps=20)
    assert person.said == 0
    (folder,) = run.folders()
    info = manifest(folder)
    assert info["trigger"] == names.TRIGGER_ON_DEMAND and info["kinds"] == ["stacks"] and info["step"] >= 8, info


class Grow(Callback):
    """From `step` on, once the profile records (the worker takes a request a few records late
    on a loaded machine), adds `size` bytes to its folder, once, as a device profiler's raw data
    grows there while it records (the CPU profiler writes only when it stops)."""

    def __init__(self, root, step, size):
        self.root, self.step, self.size, self.grown = root, step, size, False

    def on_train_step_end(self, run_context):
        if self.grown or run_context.original_args()["cur_step_num"] < self.step:
            return
        recording = [f / "profile" for f in capture_store.capture_folders(self.root / "rank_0")]
        if recording and recording[0].is_dir():
            (recording[0] / "raw.data").write_bytes(bytes(self.size))
            self.grown = True


def test_a_profile_whose_folder_passes_max_bytes_stops(workdir):
    """`max_bytes` bounded the captures only before a new one started: a long profile filled
    the disk past it. It stops once its folder is over, and says why."""
    run = Run(workdir, {"loss_spike": {"enable": False}}, {"on_demand": True, "rules": [], "max_bytes": 100_000})
    requests = Requests(run.captures, {3: {"steps": 1000, "kinds": ["profile"]}})
    train([run.callback, requests, Grow(run.captures, 8, 200_000), SlowSteps(set(range(4, 40)), 0.1)], steps=40)
    (folder,) = run.folders()
    info = manifest(folder)
    assert info["status"] == "stopped" and "passed max_bytes" in info["reason"], info
    assert 8 <= info["last_step"] < 40, info


class SlowSteps(Callback):
    def __init__(self, steps, seconds):
        self.steps, self.seconds = steps, seconds

    def on_train_step_begin(self, run_context):
        if run_context.original_args()["cur_step_num"] in self.steps:
            time.sleep(self.seconds)


def test_throughput_drop_fires_against_the_runs_baseline_in_real_training(workdir):
    run = Run(
        workdir,
        {
            "loss_spike": {"enable": False},
            "step_time_regression": {"enable": False},
            "throughput_drop": {"enable": True, "drop": 0.8, "baseline": 5, "warmup": 3},
        },
        {"rules": ["throughput_drop"], "kinds": ["batch"]},
    )
    # Steps 20-22 take 2 s more (a slow device, a straggler): far below a fifth of the baseline's
    # samples per second, while this shared machine's noise stays above it.
    train([run.callback, SlowSteps({20, 21, 22}, 2.0)], steps=26)
    fired = [line["step"] for line in run.lines() if "throughput_drop" in line.get("alerts", [])]
    # This shared machine's own hiccups can cross the limit too: the slowed steps must.
    assert {20, 21, 22} <= set(fired), fired
    assert [manifest(f)["step"] for f in run.folders()] == fired[:1]  # then the cooldown
