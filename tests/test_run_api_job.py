"""The job-level features through the run API, each in a real MindSpore custom loop
(tests/support/custom_loop.py, PyNative): phases, goodput and MFU, the sections stragglers
read (data wait between `run.step` blocks), device gauges and log correlation share one
training; a stalled loop and the captures have a training each."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mindspore as ms
import numpy as np
import pytest

import otel_mindformers
from otel_mindformers.captures import store as capture_store
from otel_mindformers.names import capture_names, semconv
from otel_mindformers.names import model_state as specs
from otel_mindformers.names import straggler_names as sections
from otel_mindformers.names import training as tm
from otel_mindformers.restarts.offline.attempts_report import job_report
from tests.support import custom_loop
from tests.support.capture_trace import manifest, ops_by_step, wait_for_trace
from tests.support.cli import cli_output
from tests.support.in_memory import Capture
from tests.support.jsonl import json_lines

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training

SCRIPT_LOGGER = "custom_loop_script"
STEPS, INTERVAL = 20, 5
DATA_SLEEP = 0.02  # each batch after the first: the loop waits for its data
SAVE_AT, EVAL_AT, EVAL_SECONDS = 10, 15, 0.05
PEAK_TFLOPS = 1.0
# A transformer's config on the network, as a MindFormers model carries it: MFU's FLOPs per
# token and the tokens per sample (seq_length) come from it.
MODEL_CONFIG = SimpleNamespace(num_layers=2, hidden_size=32, num_heads=2, vocab_size=64, seq_length=16)


def _slow_data(steps: int) -> Iterator[tuple[Any, Any]]:
    for index, batch in enumerate(custom_loop.Data(steps).batches()):
        if index:
            time.sleep(DATA_SLEEP)
        yield batch


class Trained:
    def __init__(self, folder: Path, capture: Capture, norms: dict[str, float], gaps: dict[int, float]) -> None:
        self.folder, self.capture, self.norms = folder, capture, norms
        # Before each step: from the end of the last step's body to the start of this one's,
        # on the loop's clock (what the monitor calls data wait and phases lies inside it).
        self.gaps = gaps
        self.lines = {line["step"]: line for line in json_lines(folder / "metrics.json")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Iterator[Trained]:
    folder = tmp_path_factory.mktemp("run_api_job")
    capture = Capture()
    loop = custom_loop.build()
    loop.network.config = MODEL_CONFIG
    script_log = logging.getLogger(SCRIPT_LOGGER)
    script_log.setLevel(logging.INFO)
    config = {
        "interval": INTERVAL,
        "output_type": ["json_file"],
        "json_log_path": str(folder / "metrics.json"),
        "peak_tflops": PEAK_TFLOPS,
        "device_monitor": True,
        "logs": {"enable": True, "level": "WARNING"},
        "local_norm_format": "log",  # MindFormers' keys: per-parameter gradient norms,
        "target": ["body.2."],  # and the parameters with series of their own
    }
    norms: dict[str, float] = {}  # the last step's gradients' norms, by parameter, on the host
    gaps: dict[int, float] = {}
    body_end = None

    try:
        with otel_mindformers.start(
            config, optimizer=loop.optimizer, network=loop.network, batch_size=custom_loop.BATCH, **capture.providers()
        ) as run:
            for step, (x, y) in enumerate(_slow_data(STEPS), start=1):
                with run.step(step):
                    if body_end is not None:
                        gaps[step] = time.perf_counter() - body_end
                    loss, grads = loop.train_step(x, y)
                    run.log(loss=loss, grads=grads)
                    script_log.warning("step %d trained", step, extra={"loop_step": step})
                    body_end = time.perf_counter()
                if step == STEPS:
                    names = [p.name for p in loop.optimizer.parameters]
                    norms = {n: float(np.sqrt((g.asnumpy() ** 2).sum())) for n, g in zip(names, grads, strict=True)}
                if step == SAVE_AT:
                    with otel_mindformers.phase("checkpoint.save"):
                        ms.save_checkpoint(loop.network, str(folder / "loop.ckpt"))
                if step == EVAL_AT:
                    with otel_mindformers.phase("eval"):
                        time.sleep(EVAL_SECONDS)  # an evaluation of the loop's own, between steps
        yield Trained(folder, capture, norms, gaps)
    finally:
        script_log.setLevel(logging.NOTSET)


# --- phases, goodput, MFU ---------------------------------------------------------------------
def test_phases_between_steps_are_timed_apart_from_the_steps_and_the_data_wait(trained):
    last = trained.lines[STEPS]["time"]
    assert last["checkpoint.save"] > 0 and last["user.eval"] >= EVAL_SECONDS
    # The window of each phase names it in its sections; the eval is not data wait.
    assert trained.lines[EVAL_AT]["sections"][sections.SECTION_CHECKPOINT] > 0
    window = trained.lines[STEPS]["sections"]
    assert window[sections.SECTION_OTHER] >= EVAL_SECONDS
    # At most the loop's gaps before the window's steps less the eval's sleep (a data wait
    # that held the eval would pass it by EVAL_SECONDS); the host's pace sets the gaps.
    gaps = sum(trained.gaps[step] for step in range(STEPS - int(window["steps"]) + 1, STEPS + 1))
    assert window[sections.SECTION_DATA_WAIT] <= gaps - EVAL_SECONDS, (window, gaps)
    spans = {span.name for span in trained.capture.finished()}
    assert {"mindformers.phase.checkpoint.save", "mindformers.phase.eval"} <= spans, spans
    # The job's goodput charges the loop's own phase as the run's does (restarts/goodput.py).
    job = job_report([trained.folder])["totals"]["seconds"]
    assert job["user_phases"] == pytest.approx(last["user.eval"], abs=1e-6)
    assert job["evaluation"] == 0.0


def test_goodput_and_mfu_come_from_the_loops_clock_and_the_networks_config(trained):
    for step, line in trained.lines.items():
        assert 0 < line[tm.GOODPUT] < 1, step
        # Tokens per sample from the network's config, MFU from TFLOPS and the peak.
        assert line[tm.TOKENS_PER_SECOND] == pytest.approx(line[tm.SAMPLES_PER_SECOND] * MODEL_CONFIG.seq_length)
        assert line[tm.TFLOPS] > 0 and line[tm.MFU] == pytest.approx(line[tm.TFLOPS] / PEAK_TFLOPS)


# --- stragglers' sections ---------------------------------------------------------------------
def test_the_time_between_run_step_blocks_is_the_windows_data_wait(trained):
    for step in (10, 15, 20):
        window = trained.lines[step]["sections"]
        assert window["steps"] == INTERVAL
        assert window[sections.SECTION_DATA_WAIT] >= INTERVAL * DATA_SLEEP * 0.9, (step, window)
        assert window[sections.SECTION_IN_STEP] > 0
        assert sum(v for k, v in window.items() if k not in ("window", "steps")) == pytest.approx(
            window["window"], rel=1e-3
        )
    report = json.loads(cli_output("report", str(trained.folder), "--json"))
    assert report["job"]["totals"]["seconds"]["data_wait"] >= (STEPS - 1) * DATA_SLEEP * 0.9


# --- device gauges --------------------------------------------------------------------------------
def test_host_gauges_are_read_off_the_training_thread(trained):
    points = trained.capture.points()
    (rss,) = points[semconv.PROCESS_MEMORY_USAGE]
    assert rss.value > 0 and rss.attributes[semconv.ATTR_RANK] == 0
    assert trained.lines[STEPS]["host_rss_mb"] > 0


# --- model state ------------------------------------------------------------------------------------
def test_per_parameter_gradient_norms_come_from_the_logged_grads_named_by_the_optimizer(trained):
    """Sampled on the last step: the squared norms come from the same graph as the global
    norm, the names from the optimizer's parameters."""
    state = trained.lines[STEPS]["model_state"][specs.GRAD_NORM]
    selected = {name: norm for name, norm in trained.norms.items() if name.startswith("body.2.")}
    assert state["parameter"] == pytest.approx(selected, rel=1e-4)
    largest = max(trained.norms, key=trained.norms.__getitem__)
    assert state["max"]["parameter"] == largest
    assert state["max"]["value"] == pytest.approx(trained.norms[largest], rel=1e-4)
    total = float(np.sqrt(sum(norm * norm for norm in trained.norms.values())))
    assert sum(v * v for v in state["kind"].values()) ** 0.5 == pytest.approx(total, rel=1e-4)
    assert trained.lines[STEPS][tm.GRAD_NORM] == pytest.approx(total, rel=1e-4)


# --- log correlation --------------------------------------------------------------------------------
def test_records_logged_in_a_step_carry_its_step_and_its_spans_ids(trained):
    records = {
        r.log_record.attributes["loop_step"]: r.log_record
        for r in trained.capture.logs.get_finished_logs()
        if r.instrumentation_scope.name == SCRIPT_LOGGER
    }
    assert sorted(records) == list(range(1, STEPS + 1))
    step_spans = {s.attributes[semconv.ATTR_STEP]: s for s in trained.capture.finished(semconv.SPAN_STEP)}
    for step, record in records.items():
        assert record.attributes[semconv.ATTR_RANK] == 0
        assert record.attributes[semconv.ATTR_STEP] == step - 1  # the last finished step
        if step == 1 or step % INTERVAL == 0:  # sampled: the ids of the span the worker made later
            context = step_spans[step].get_span_context()
            assert (record.trace_id, record.span_id) == (context.trace_id, context.span_id), step
        else:
            assert record.span_id == 0, step


# --- hangs ----------------------------------------------------------------------------------------------
STALL_AT, STALL_TIMEOUT = 6, 1.0


def wait_in_a_stuck_collective(released: threading.Event) -> None:
    """What a rank whose all-reduce never returns looks like to the stack dump."""
    released.wait(60)


def test_a_stalled_custom_loop_is_dumped_by_the_watchdog_and_named_stuck(workdir):
    second_dump = threading.Event()

    class SecondDump(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if f"(stall_second_threshold, step {STALL_AT - 1})" in record.getMessage():  # not an earlier stall's
                second_dump.set()

    handler = SecondDump()
    logging.getLogger("otel_mindformers").addHandler(handler)
    capture = Capture()
    config = {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "metrics.json"),
        "alert_config": {"enable_alert": True, "stall_timeout": STALL_TIMEOUT},
    }
    try:
        loop = custom_loop.build()
        with otel_mindformers.start(config, optimizer=loop.optimizer, **capture.providers()) as run:
            for step, (x, y) in enumerate(custom_loop.Data(10).batches(), start=1):
                with run.step(step):
                    loss, grads = loop.train_step(x, y)
                    if step == STALL_AT:
                        wait_in_a_stuck_collective(second_dump)
                    run.log(loss=loss, grads=grads)
    finally:
        logging.getLogger("otel_mindformers").removeHandler(handler)
    assert second_dump.is_set()
    assert [line["step"] for line in json_lines(workdir / "metrics.json")] == list(range(1, 11))
    # The stuck step's dumps (a loaded host may stall an earlier step past the timeout too).
    dumps = [d for d in json_lines(workdir / "diagnosis_rank_0.jsonl") if d["step"] == STALL_AT - 1]
    assert [(d["reason"], d["step"], d["verdict"]) for d in dumps] == [
        ("stall", STALL_AT - 1, None),
        ("stall_second_threshold", STALL_AT - 1, "stuck"),
    ]
    for dump in dumps:
        assert dump["phase"] == "step" and dump["idle_seconds"] >= STALL_TIMEOUT
        training = dump["threads"][0]
        assert training["name"] == "MainThread" and training["training"]
        assert "wait_in_a_stuck_collective" in [f["function"] for f in training["frames"]]
    stacks = [
        r
        for r in capture.log_records()
        if r.event_name == "mindformers.stacks" and r.attributes["training.step"] == STALL_AT - 1
    ]
    assert [r.attributes["training.stacks.reason"] for r in stacks] == ["stall", "stall_second_threshold"]


# --- captures ---------------------------------------------------------------------------------------------
SPIKE, PROFILE_STEPS, ASK_AT, ASKED_STEPS = 15, 3, 25, 2


def _spiking_data(steps: int) -> Iterator[tuple[Any, Any]]:
    for step, (x, y) in enumerate(custom_loop.Data(steps).batches(), start=1):
        yield (x * 6.0, y * 6.0) if step == SPIKE else (x, y)


def test_a_loss_spike_and_an_on_demand_request_profile_whole_steps(workdir):
    root = workdir / "captures"
    config = {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "metrics.json"),
        "alert_config": {
            "enable_alert": True,
            "stall_timeout": None,
            "alert_interval": 1,
            "loss_spike": {"warmup": 5},
            "step_time_regression": {"enable": False},
            "capture": {
                "path": str(root),
                "rules": ["loss_spike"],
                "profile_steps": PROFILE_STEPS,
                "on_demand": True,
                "cooldown_steps": 1,
            },  # fmt: skip
        },
    }
    loop = custom_loop.build(lr=0.003)
    with otel_mindformers.start(config, optimizer=loop.optimizer) as run:
        # Room after the request: the profile starts where the training thread meets the
        # worker's set-up, up to ~10 one-millisecond steps later on a loaded host.
        for step, (x, y) in enumerate(_spiking_data(100), start=1):
            with run.step(step):
                loss, grads = loop.train_step(x, y)
                run.log(loss=loss, grads=grads)
            if step == ASK_AT:  # what an operator types while the job runs
                cli_output("capture", "--steps", str(ASKED_STEPS), "--kinds", "profile,stacks", str(root))
    spiked, asked = capture_store.capture_folders(root / "rank_0")
    for folder, trigger, after, steps in (
        (spiked, "loss_spike", SPIKE, PROFILE_STEPS),
        (asked, capture_names.TRIGGER_ON_DEMAND, ASK_AT, ASKED_STEPS),
    ):
        info = manifest(folder)
        assert info["trigger"] == trigger and info["step"] >= after, info
        # Whole steps, from a step boundary: the profile's windows are the loop's steps.
        first, last = info["first_step"], info["last_step"]
        assert first > after and last - first + 1 == steps, info
        assert [w[0] for w in info["step_windows_ns"]] == list(range(first, last + 1))
        by_step, _ = ops_by_step(wait_for_trace(folder), info["step_windows_ns"])
        assert all(by_step.values()) and any("MatMul" in name for name in by_step[first]), by_step
    assert "(training thread)" in (asked / capture_names.STACKS_FILE).read_text()
