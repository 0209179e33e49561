"""The capture triggers and machinery on their own: the spike score, co-spike and
throughput-drop rules, `alert_config.capture`'s checks, the request file and its watcher,
the disk bound, the notification's path, and the `capture` command's request and list."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from otel_mindformers.alerts import rules
from otel_mindformers.alerts.alert import Alert
from otel_mindformers.alerts.rules import NO_DATA, Finding
from otel_mindformers.captures import store as capture_store
from otel_mindformers.captures.controller import CaptureController
from otel_mindformers.cli import main as cli_main
from otel_mindformers.config import ConfigError, load_monitor_config
from otel_mindformers.core.clock import StepClock
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import capture_names as names
from tests.support.in_memory import Capture

pytestmark = pytest.mark.analysis


def rec(step, **values):
    return StepRecord(step=step, epoch=1, rank=0, time_stamp=0.0, values=values)


def noisy(n, level=1.0, wiggle=0.01):
    return [level + wiggle * ((i * 7) % 5 - 2) for i in range(n)]


# --- the spike score ---------------------------------------------------------------------------
def test_spike_score_rises_fires_once_stays_quiet_then_resolves():
    seen = []
    rule = rules.SpikeScoreRule(sigma=5.0, window=10, warmup=5, threshold=0.0, on_score=seen.append)
    losses = noisy(8) + [5.0] + noisy(3) + [5.0] + noisy(12)
    verdicts = [rule.check(rec(i + 1, loss=v)) for i, v in enumerate(losses)]
    fired = [i + 1 for i, v in enumerate(verdicts) if isinstance(v, Finding)]
    assert fired == [9]  # the first spike; the second comes while the score is still above 0
    assert verdicts[9] is NO_DATA and verdicts[12] is NO_DATA
    assert verdicts[-1] is None  # both spikes left the window: resolved
    # Two outliers among the 8 points judged so far (the score's window is not full yet).
    assert max(seen) == pytest.approx(2 / 8) and seen[-1] == 0.0
    assert verdicts[8].value == pytest.approx(1 / 4) and "1 of the last 4 sampled" in verdicts[8].detail


def test_spike_score_judges_nothing_before_warmup_nor_nan():
    rule = rules.SpikeScoreRule(sigma=3.0, window=10, warmup=5, threshold=0.0)
    assert [rule.check(rec(i, loss=v)) for i, v in enumerate([1.0, 9.0, 1.0])] == [None] * 3
    assert rule.check(rec(4, loss=float("nan"))) is NO_DATA
    assert rule.score is None


def test_a_falling_loss_is_no_spike():
    rule = rules.SpikeScoreRule(sigma=3.0, window=20, warmup=5, threshold=0.0)
    assert not any(isinstance(rule.check(rec(i, loss=10.0 / i)), Finding) for i in range(1, 60))


# --- co-spike ------------------------------------------------------------------------------------
def test_co_spike_needs_loss_and_grad_norm_together():
    rule = rules.CoSpikeRule(zscore=6.0, window=20, warmup=5, within=0)
    base = [rule.check(rec(i, loss=v, grad_norm=v)) for i, v in enumerate(noisy(8), 1)]
    assert all(v is None for v in base)
    assert rule.check(rec(9, loss=5.0, grad_norm=1.0)) is None  # the loss alone
    assert rule.check(rec(10, loss=1.0, grad_norm=5.0)) is None  # the grad norm alone, a step later
    both = rule.check(rec(11, loss=5.0, grad_norm=6.0))
    assert isinstance(both, Finding) and both.value == 5.0 and both.attributes["training.grad_norm"] == 6.0
    assert "loss and grad norm spiked together" in both.detail
    assert rule.check(rec(12, loss=float("nan"))) is NO_DATA  # neither value to judge


def test_co_spike_within_a_window_of_sampled_steps():
    rule = rules.CoSpikeRule(zscore=6.0, window=20, warmup=5, within=1)
    for i, v in enumerate(noisy(8), 1):
        rule.check(rec(i, loss=v, grad_norm=v))
    assert rule.check(rec(9, loss=5.0, grad_norm=1.0)) is None
    assert isinstance(rule.check(rec(10, loss=1.0, grad_norm=5.0)), Finding)


# --- throughput drop -------------------------------------------------------------------------------
def test_throughput_drop_against_the_runs_own_baseline():
    rule = rules.ThroughputDropRule("samples_per_second", drop=0.3, baseline=4, warmup=2)
    warm = [rule.check(rec(i, samples_per_second=v)) for i, v in enumerate([10, 20, 100, 102, 98, 100], 1)]
    assert warm == [None] * 6
    assert rule.check(rec(7, samples_per_second=75.0)) is None  # 25% down: within
    slow = rule.check(rec(8, samples_per_second=60.0))
    assert isinstance(slow, Finding) and slow.threshold == pytest.approx(70.0) and "40% below" in slow.detail
    assert rule.check(rec(9)) is NO_DATA


def test_build_rules_adds_the_new_rules_when_enabled():
    config = load_monitor_config(
        {
            "alert_config": {
                "loss_spike_score": {"enable": True},
                "co_spike": {"enable": True},
                "throughput_drop": {"enable": True, "metric": "mfu"},
            }
        }
    ).alert_config
    built = [r.name for r in rules.build_rules(config)]
    assert built[-3:] == [names.RULE_LOSS_SPIKE_SCORE, names.RULE_CO_SPIKE, names.RULE_THROUGHPUT_DROP]
    assert set(built) <= set(names.BUILTIN_RULES)
    assert names.RULE_LOSS_SPIKE_SCORE not in [r.name for r in rules.build_rules(load_monitor_config({}).alert_config)]


# --- config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"capture": {"rules": ["loss_spik"]}},
            r"capture\.rules: unknown value 'loss_spik' \(did you mean 'loss_spike'",
        ),
        ({"capture": {"kinds": ["trace"]}}, r"capture\.kinds: unknown value 'trace'"),
        ({"capture": {"profile_steps": 0}}, r"capture\.profile_steps: must be >= 1"),
        ({"capture": {"analysis": "later"}}, r"capture\.analysis: unknown value 'later'"),
        ({"capture": {"max_bytes": -1}}, r"capture\.max_bytes: must be >= 0"),
        ({"capture": {"path": " "}}, r"capture\.path: must name a path"),
        ({"throughput_drop": {"metric": "loss"}}, r"throughput_drop\.metric: unknown value 'loss'"),
        ({"throughput_drop": {"drop": 1.5}}, r"throughput_drop\.drop: must be <= 0\.99"),
        ({"loss_spike_score": {"threshold": 2}}, r"loss_spike_score\.threshold: must be <= 1\.0"),
    ],
)
def test_bad_capture_and_rule_keys_name_the_key(section, message):
    with pytest.raises(ConfigError, match=message):
        load_monitor_config({"alert_config": section})


def test_the_issues_yaml_shape_loads():
    capture = load_monitor_config(
        {
            "alert_config": {
                "capture": {
                    "rules": ["loss_spike", "step_time_regression"],
                    "kinds": ["profile", "stacks", "batch"],
                    "profile_steps": 5,
                    "cooldown_steps": 200,
                    "max_captures": 10,
                    "max_bytes": 2000000000,
                    "path": "./output/captures",
                }
            }
        }
    ).alert_config.capture
    assert capture.enabled and capture.max_bytes == 2_000_000_000 and capture.analysis == "async"
    assert not load_monitor_config({}).alert_config.capture.enabled


# --- the request file, the disk bound ------------------------------------------------------------------
def test_watcher_ignores_an_old_request_and_sees_each_new_one_once(tmp_path):
    old = capture_store.write_request(tmp_path, steps=5, ranks=None, kinds=["stacks"])
    watcher = capture_store.RequestWatcher(tmp_path)
    assert watcher.poll() == []  # there before the run: answered, or another run's
    os.utime(tmp_path / names.CONTROL_FILE, ns=(10**9, 10**9))  # touched (a copy, a sync): still old
    assert watcher.poll() == []
    new = capture_store.write_request(tmp_path, steps=3, ranks=[1], kinds=["profile"])
    assert new["id"] != old["id"]
    (seen,) = watcher.poll()
    assert seen == new and watcher.poll() == []
    assert capture_store.wanted_by(seen, 1) and not capture_store.wanted_by(seen, 0)
    (tmp_path / names.CONTROL_FILE).write_text("{not json")
    os.utime(tmp_path / names.CONTROL_FILE, ns=(1, 1))
    assert watcher.poll() == []


def test_a_request_is_taken_by_the_first_sampled_step_that_ended_after_it(tmp_path):
    """The pipeline's worker may handle an older step's record when the request appears
    (it takes records in batches): that record must not take it, the next one does."""
    config = load_monitor_config(
        {
            "alert_config": {
                "enable_alert": True,
                "capture": {"path": str(tmp_path), "on_demand": True, "kinds": ["batch"]},
            }
        }
    )
    providers = Capture().providers()
    telemetry = SimpleNamespace(
        logger=providers["logger_provider"].get_logger("t"), meter=providers["meter_provider"].get_meter("t")
    )
    controller = CaptureController.start(
        config.alert_config.capture, Identity(rank=0, world_size=1), telemetry, {}, StepClock()
    )
    request = capture_store.write_request(tmp_path, steps=2, ranks=None, kinds=["batch"])
    controller.on_sampled_step(4, None, ended_at=request["requested_at"] - 0.5)  # ended before the request
    assert capture_store.capture_folders(tmp_path / "rank_0") == []
    controller.on_sampled_step(5, None, ended_at=request["requested_at"] + 0.5)
    (folder,) = capture_store.capture_folders(tmp_path / "rank_0")
    assert json.loads((folder / names.MANIFEST_FILE).read_text())["step"] == 5
    controller.close()


def _controller(tmp_path, **capture):
    config = load_monitor_config(
        {"alert_config": {"enable_alert": True, "capture": {"path": str(tmp_path), **capture}}}
    )
    providers = Capture().providers()
    telemetry = SimpleNamespace(
        logger=providers["logger_provider"].get_logger("t"), meter=providers["meter_provider"].get_meter("t")
    )
    return CaptureController.start(
        config.alert_config.capture, Identity(rank=0, world_size=1), telemetry, {}, StepClock()
    )


def _manifests(tmp_path):
    return [
        json.loads((f / names.MANIFEST_FILE).read_text()) for f in capture_store.capture_folders(tmp_path / "rank_0")
    ]


def test_requests_written_back_to_back_all_reach_the_watcher_in_order(tmp_path):
    """A cancel and a new request written before a rank's next sampled step: the second
    replaced the first in the one-request file, so the cancel was lost (issue 46, item 12)."""
    watcher = capture_store.RequestWatcher(tmp_path)
    cancel = capture_store.write_request(tmp_path, ranks=None, cancel=True)
    stacks = capture_store.write_request(tmp_path, steps=2, ranks=[0], kinds=["stacks"])
    assert watcher.poll() == [cancel, stacks] and watcher.poll() == []
    for _ in range(capture_store.REQUESTS_KEPT + 3):  # the file keeps the last ones only
        capture_store.write_request(tmp_path, steps=2, ranks=[0], kinds=["batch"])
    body = json.loads((tmp_path / names.CONTROL_FILE).read_text())
    assert len(body["requests"]) == capture_store.REQUESTS_KEPT
    assert len(watcher.poll()) == capture_store.REQUESTS_KEPT


def test_a_cancel_and_the_request_after_it_are_both_served(tmp_path):
    """A profile of 1,000 steps in flight; a cancel and a stacks request arrive together. The
    profile stops at the training thread's next step end, the stacks are taken at the next
    sampled step, a request made before the cancel is dropped, and each is answered."""
    controller = _controller(tmp_path, on_demand=True)
    profile = capture_store.write_request(tmp_path, steps=1000, ranks=None, kinds=["profile"])
    controller.on_sampled_step(50, None, ended_at=profile["requested_at"] + 1)
    (waiting,) = _manifests(tmp_path)
    assert waiting["status"] == "waiting" and waiting["request_id"] == profile["id"]
    early = capture_store.write_request(tmp_path, steps=2, ranks=None, kinds=["batch"])
    cancel = capture_store.write_request(tmp_path, ranks=None, cancel=True)
    stacks = capture_store.write_request(tmp_path, steps=2, ranks=None, kinds=["stacks"])
    controller.on_sampled_step(100, None, ended_at=stacks["requested_at"] + 1)
    assert len(_manifests(tmp_path)) == 1, "a request was taken while the profile was in flight"
    controller.on_step_end(101)  # the training thread honours the cancel
    controller.on_sampled_step(150, None, ended_at=stacks["requested_at"] + 2)
    for thread in controller._finishers:
        thread.join(10)
    by_request = {m["request_id"]: m for m in _manifests(tmp_path)}
    assert by_request[profile["id"]]["status"] == "cancelled"
    assert by_request[profile["id"]]["reason"] == f"cancelled by request {cancel['id']}"
    assert by_request[stacks["id"]]["step"] == 150 and by_request[stacks["id"]]["kinds"] == ["stacks"]
    assert early["id"] not in by_request
    answers = {a["id"]: a for a in capture_store.read_answers(tmp_path)}
    assert answers[cancel["id"]]["answer"] == "cancelled" and answers[cancel["id"]]["step"] == 100
    assert answers[cancel["id"]]["folder"] == str(capture_store.capture_folders(tmp_path / "rank_0")[0])
    assert answers[early["id"]]["answer"] == f"dropped by cancel {cancel['id']}"
    assert stacks["id"] not in answers
    controller.close()


def test_capture_cancel_waits_for_and_prints_each_ranks_answer(tmp_path, capsys):
    """`--cancel` printed no confirmation: with `--wait` it prints what each rank did."""
    import threading

    controller = _controller(tmp_path, on_demand=True)
    done = threading.Event()

    def rank_0():  # the run's pipeline worker, on its sampled steps
        step = 0
        while not done.is_set() and not capture_store.read_answers(tmp_path):
            step += 1
            controller.on_sampled_step(step, None, ended_at=float("inf"))
            done.wait(0.02)

    worker = threading.Thread(target=rank_0, daemon=True)
    worker.start()
    try:
        assert cli_main(["capture", "--cancel", "--ranks", "0", "--wait", "20", str(tmp_path)]) == 0
    finally:
        done.set()
        worker.join(10)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("request ") and "rank 0 stop the capture in flight" in out[0]
    assert out[1].startswith("rank 0: step ") and out[1].endswith(": no capture in flight to cancel"), out
    controller.close()


def test_a_rule_that_fires_behind_the_training_thread_still_records_its_batch(tmp_path):
    """The worker evaluates rules a batch of records (up to 64) behind the training thread,
    which notes every sampled step's batch meanwhile: the fired step's note is still there
    (it was kept for the last 8 notes only, so a busy worker wrote a batch without inputs)."""
    import mindspore as ms
    import numpy as np

    config = load_monitor_config(
        {
            "alert_config": {
                "enable_alert": True,
                "capture": {"path": str(tmp_path), "rules": ["loss_spike"], "kinds": ["batch"], "batch_crc32": True},
            }
        }
    )
    providers = Capture().providers()
    telemetry = SimpleNamespace(
        logger=providers["logger_provider"].get_logger("t"), meter=providers["meter_provider"].get_meter("t")
    )
    controller = CaptureController.start(
        config.alert_config.capture, Identity(rank=0, world_size=1), telemetry, {}, StepClock()
    )
    for step in range(1, 41):  # the training thread, 35 sampled steps ahead of the worker
        batch = (ms.Tensor(np.full((4, 8), step, np.float32)), ms.Tensor(np.zeros((4, 1), np.float32)))
        controller.note_batch({"train_dataset_element": batch, "cur_epoch_num": 1}, step)
    for step in range(1, 5):  # the worker, catching up
        controller.on_sampled_step(step, None, ended_at=0.0)
    folder = Path(controller.on_alert("loss_spike", 5, None))
    batch = json.loads((folder / names.BATCH_FILE).read_text())
    assert batch["step"] == 5
    assert batch["inputs"] == [{"shape": [4, 8], "dtype": "Float32"}, {"shape": [4, 1], "dtype": "Float32"}]
    assert isinstance(batch["crc32_first_input"], int)
    controller.close()


def test_a_batch_of_a_sink_sized_epoch_is_placed_in_its_pass_over_the_dataset(tmp_path):
    """`Model.train(..., sink_size=4)` over a 10-batch dataset says `batch_num` 4, but the data
    runs on through the dataset (a device's sinks; on a CPU, whole epochs step by step): step 7
    is the dataset's 7th batch, samples 24..28, not the 3rd of a 4-step epoch."""
    import mindspore as ms
    import numpy as np
    from mindspore.dataset import GeneratorDataset

    config = load_monitor_config(
        {
            "alert_config": {
                "enable_alert": True,
                "capture": {"path": str(tmp_path), "rules": ["loss_spike"], "kinds": ["batch"]},
            }
        }
    )
    providers = Capture().providers()
    telemetry = SimpleNamespace(
        logger=providers["logger_provider"].get_logger("t"), meter=providers["meter_provider"].get_meter("t")
    )
    dataset = GeneratorDataset([(np.zeros(8, np.float32),)] * 40, column_names=["x"], shuffle=False).batch(4)
    cb_params = {"batch_num": 4, "dataset_sink_mode": False, "train_dataset": dataset}  # the CPU's at train begin
    controller = CaptureController.start(
        config.alert_config.capture, Identity(rank=0, world_size=1), telemetry, cb_params, StepClock()
    )
    controller.note_batch({"train_dataset_element": (ms.Tensor(np.zeros((4, 8), np.float32)),), "cur_epoch_num": 1}, 7)
    controller.on_sampled_step(7, None, ended_at=0.0)
    batch = json.loads((Path(controller.on_alert("loss_spike", 7, None)) / names.BATCH_FILE).read_text())
    assert (batch["epoch"], batch["step_in_epoch"], batch["sample_range_if_unshuffled"]) == (1, 7, [24, 28])
    controller.close()


@pytest.mark.parametrize(("step", "place"), [(1, (1, 1, [0, 4])), (10, (1, 10, [36, 40])), (13, (2, 3, [8, 12]))])
def test_a_steps_place_in_its_pass_over_a_dataset_of_ten_batches(step, place):
    """The last batch of a pass is its 10th, not the next pass's 0th; the pass after starts over."""
    from otel_mindformers.captures.controller import _step_only

    note = _step_only(step, {"dataset_size": 10, "batch_num": 4, "batch_size": 4})
    assert (note["epoch"], note["step_in_epoch"], note["sample_range_if_unshuffled"]) == place


def test_a_dataset_that_cannot_tell_its_size_places_a_step_in_mindspores_epoch():
    from otel_mindformers.captures.controller import _step_only

    note = _step_only(5, {"dataset_size": None, "batch_num": 4, "batch_size": 4})
    assert (note["epoch"], note["step_in_epoch"], note["sample_range_if_unshuffled"]) == (2, 1, [0, 4])


def _capture(rank_root, name, size):
    folder = rank_root / name
    folder.mkdir(parents=True)
    (folder / names.MANIFEST_FILE).write_text(json.dumps({"step": 1, "rank": 0, "time_stamp": 1.0}))
    (folder / "data").write_bytes(b"x" * size)
    return folder


def test_make_room_removes_the_oldest_until_the_rest_fit(tmp_path):
    folders = [_capture(tmp_path, f"2026120{i}T000000-step0000000{i}-loss_spike", 1000) for i in range(1, 5)]
    removed = capture_store.make_room(tmp_path, 2500)
    assert removed == folders[:2]
    assert capture_store.capture_folders(tmp_path) == folders[2:]
    assert capture_store.make_room(tmp_path, 0) == []


# --- the notification, the command ------------------------------------------------------------------------
def test_the_notification_carries_the_capture_path():
    alert = Alert("loss_spike", "warning", "firing", 15, "loss spiked", "job", 0, 1, "host", 0.0, 9.0, 3.0, "/c/x")
    assert alert.to_json_dict()["capture"] == "/c/x" and alert.text().endswith("capture: /c/x")
    plain = Alert("loss_spike", "warning", "firing", 15, "loss spiked", "job", 0, 1, "host", 0.0)
    assert "capture" not in plain.to_json_dict() and "capture" not in plain.text()


def test_capture_command_writes_a_request_and_lists(tmp_path, capsys):
    assert cli_main(["capture", "--steps", "4", "--ranks", "3,0", "--kinds", "profile,batch", str(tmp_path)]) == 0
    (request,) = json.loads((tmp_path / names.CONTROL_FILE).read_text())["requests"]
    assert (request["steps"], request["ranks"], request["kinds"]) == (4, [0, 3], ["profile", "batch"])
    assert f"request {request['id']}" in capsys.readouterr().out
    assert cli_main(["capture", "--list", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "captures: none\n"
    _capture(tmp_path / "rank_0", "20261201T000000-step00000001-loss_spike", 10)
    assert cli_main(["capture", "--list", "--format", "json", str(tmp_path)]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["step"] == 1 and listed["bytes"] > 10


def test_capture_cancel_writes_a_cancel_request_for_the_ranks_asked(tmp_path, capsys):
    assert cli_main(["capture", "--cancel", "--ranks", "1", str(tmp_path)]) == 0
    (request,) = json.loads((tmp_path / names.CONTROL_FILE).read_text())["requests"]
    assert (request["cancel"], request["ranks"]) == (True, [1]) and "steps" not in request
    assert capture_store.request_problem(request) is None
    assert f"request {request['id']}" in capsys.readouterr().out
    assert capture_store.request_problem({**request, "cancel": "yes"}) == "cancel: expected true or false, got 'yes'"


@pytest.mark.parametrize("argv", [["--ranks", "a"], ["--ranks", "-1"], ["--steps", "0"], ["--kinds", "trace"]])
def test_capture_command_refuses_bad_arguments(tmp_path, argv):
    with pytest.raises(SystemExit):
        cli_main(["capture", *argv, str(tmp_path)])
    assert not (tmp_path / names.CONTROL_FILE).exists()


def test_report_json_gains_a_captures_key(tmp_path):
    from otel_mindformers.captures.offline.capture_command import with_captures

    _capture(tmp_path / "rank_0", "20261201T000000-step00000007-loss_spike", 10)
    body = json.loads(with_captures('{"series": []}', str(tmp_path), "json"))
    assert body["series"] == [] and [c["step"] for c in body["captures"]] == [1]
    assert "## Captures" in with_captures("# report\n", str(tmp_path), "markdown")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"steps": "abc"}, "steps"),
        ({"steps": -5}, "steps"),
        ({"steps": 1_000_000}, "steps"),
        ({"steps": True}, "steps"),
        ({"ranks": 5}, "ranks"),
        ({"ranks": ["0"]}, "ranks"),
        ({"kinds": 5}, "kinds"),
        ({"kinds": ["profile", "everything"]}, "kinds"),
    ],
)
def test_a_request_with_a_mistyped_field_is_dropped_with_one_warning_naming_it(tmp_path, caplog, fields, named):
    watcher = capture_store.RequestWatcher(tmp_path)
    capture_store.write_json(tmp_path / names.CONTROL_FILE, {"id": "bad", **fields})
    with caplog.at_level("WARNING", logger="otel_mindformers"):
        assert watcher.poll() == []
        assert watcher.poll() == []  # once: the same file is not read again
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(tmp_path / names.CONTROL_FILE) in warning and f"{named}:" in warning
    capture_store.write_json(
        tmp_path / names.CONTROL_FILE, {"id": "good", "steps": 3, "ranks": [0], "kinds": ["stacks"]}
    )
    assert [request["id"] for request in watcher.poll()] == ["good"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--steps", "1000000"], "--steps"),
        (["--steps", "0"], "--steps"),
        (["--steps", "x"], "--steps"),
        (["--wait", "nan"], "--wait"),
        (["--wait", "inf"], "--wait"),
        (["--wait", "-1"], "--wait"),
    ],
)
def test_capture_refuses_a_step_count_or_wait_out_of_bounds(tmp_path, capsys, argv, named):
    with pytest.raises(SystemExit) as exited:
        cli_main(["capture", *argv, str(tmp_path)])
    assert exited.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / names.CONTROL_FILE).exists()


def test_capture_into_a_folder_no_run_made_says_so_and_writes_nothing(tmp_path, capsys):
    typo = tmp_path / "outptu" / "captures"
    assert cli_main(["capture", "--steps", "2", str(typo)]) == 1
    assert f"{typo} does not exist" in capsys.readouterr().err
    assert not typo.exists()


@pytest.mark.parametrize(
    "manifest",
    [[], "x", {"time_stamp": "yesterday"}, {"time_stamp": 1e300}, {"kinds": [1, 2]}, {"rank": "0"}],
    ids=["list", "string", "text-time", "huge-time", "int-kinds", "text-rank"],
)
def test_a_manifest_of_the_wrong_shape_is_listed_as_unreadable_beside_the_good_one(tmp_path, capsys, manifest):
    good = tmp_path / "rank_0" / "20260101T000000-step00000001-on_demand"
    bad = tmp_path / "rank_0" / "20260101T000001-step00000002-on_demand"
    for folder in (good, bad):
        folder.mkdir(parents=True)
    capture_store.write_json(
        good / names.MANIFEST_FILE,
        {"rank": 0, "step": 1, "time_stamp": 1767225600.0, "kinds": ["stacks"], "status": "done"},
    )
    (bad / names.MANIFEST_FILE).write_text(json.dumps(manifest))
    assert cli_main(["capture", "--list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "captures: 2" in out and str(good) in out
    assert f"unreadable manifest: {bad / names.MANIFEST_FILE}" in out
    assert cli_main(["capture", "--list", "--format", "json", str(tmp_path)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["status"] for m in listed] == ["unreadable", "done"] or [m["status"] for m in listed] == [
        "done",
        "unreadable",
    ]


def test_a_capture_whose_process_is_gone_mid_profile_is_listed_as_interrupted(tmp_path, capsys):
    """A capture still `waiting` for its profile, whose process on this host no longer runs
    (killed mid-profile), will never finish: it is shown as interrupted, not waiting."""
    import socket

    gone = tmp_path / "rank_0" / "20260101T000000-step00000010-on_demand"
    running = tmp_path / "rank_0" / "20260101T000001-step00000020-on_demand"
    for folder, pid in ((gone, 2**22 + 7), (running, os.getpid())):  # past pid_max: no such process
        folder.mkdir(parents=True)
        capture_store.write_json(
            folder / names.MANIFEST_FILE,
            {"rank": 0, "step": 10, "time_stamp": 1767225600.0, "kinds": ["profile"], "status": "waiting",
             "host": socket.gethostname(), "pid": pid},
        )  # fmt: skip
    assert cli_main(["capture", "--list", "--format", "json", str(tmp_path)]) == 0
    statuses = {Path(m["folder"]).name: m["status"] for m in json.loads(capsys.readouterr().out)}
    assert statuses == {gone.name: "interrupted", running.name: "waiting"}


@pytest.mark.slow  # MindSpore's profile parser, in a process of its own
def test_analysing_a_raw_profile_without_data_says_why_not_its_progress_bar(tmp_path, capsys):
    """A capture killed mid-profile leaves a raw folder the profiler never saved into:
    MindSpore's parser runs, prints its progress bar and writes no trace. The error says so."""
    folder = tmp_path / "rank_0" / "20260101T000000-step00000010-on_demand"
    raw = folder / "profile" / "r0_ascend_ms"
    raw.mkdir(parents=True)
    capture_store.write_json(
        folder / names.MANIFEST_FILE,
        {"rank": 0, "step": 10, "time_stamp": 1767225600.0, "kinds": ["profile"], "status": "raw"},
    )
    assert cli_main(["capture", "--analyse", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {raw}: MindSpore's parser found no profile data in it"), err
    assert "Parsing" not in err and "[WARNING]" not in err and len(err.splitlines()) == 1


@pytest.mark.slow  # a real training
def test_a_capture_check_that_raises_costs_no_step_its_span_or_its_line(tmp_path, monkeypatch, caplog):
    from tests.support.training import train

    def broken(self, step, span, time_stamp):
        raise RuntimeError("injected: the request check failed")

    monkeypatch.setattr(CaptureController, "on_sampled_step", broken)
    capture = Capture()
    config = {
        "interval": 1, "output_type": ["json_file"], "json_log_path": str(tmp_path / "m.json"),
        "alert_config": {"enable_alert": True, "capture": {"on_demand": True, "path": str(tmp_path / "captures")}},
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="otel_mindformers"):
        train([capture.callback(config)], steps=6)
    assert sorted(span.attributes["training.step"] for span in capture.finished("mindformers.train.step")) == list(
        range(1, 7)
    )
    assert [json.loads(line)["step"] for line in (tmp_path / "m.json").read_text().splitlines()] == list(range(1, 7))
    assert sum("checking for a capture request failed" in r.getMessage() for r in caplog.records) == 1
