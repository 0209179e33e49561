"""The run API (`otel_mindformers.start`, runtime/run_api.py) in real MindSpore custom loops,
quick-start shaped (tests/support/custom_loop.py): one PyNative, one under `mindspore.jit`.
One training per mode is shared by the tests that only read its outputs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import otel_mindformers
from tests.support import custom_loop
from tests.support.in_memory import Capture
from tests.support.jsonl import json_lines
from tests.support.tensorboard_events import loss_steps

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training

STEPS, INTERVAL = 12, 5
SAMPLED = [1, 5, 10, 12]  # the first, every 5th, the last


def _config(folder: Path, **more: Any) -> dict[str, Any]:
    return {
        "interval": INTERVAL,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": str(folder / "metrics.json"),
        "tensorboard_path": str(folder / "tb"),
        "monitored_metrics": ["loss", "learning_rate", "grad_norm", "train_per_step_time"],
        **more,
    }


class Trained:
    def __init__(self, folder: Path, capture: Capture, norms: dict[int, float], losses: dict[int, float]) -> None:
        self.folder, self.capture, self.norms, self.losses = folder, capture, norms, losses
        self.lines = {line["step"]: line for line in json_lines(folder / "metrics.json")}


@pytest.fixture(scope="module", params=["pynative", "jit"])
def trained(request, tmp_path_factory) -> Trained:
    folder = tmp_path_factory.mktemp(request.param)
    capture = Capture()
    loop = custom_loop.build(jit=request.param == "jit")
    norms: dict[int, float] = {}
    losses: dict[int, float] = {}
    with otel_mindformers.start(_config(folder), optimizer=loop.optimizer, batch_size=4, **capture.providers()) as run:
        for step, (x, y) in enumerate(custom_loop.Data(STEPS).batches(), start=1):
            with run.step(step):
                loss, grads = loop.train_step(x, y)
                run.log(loss=loss, grads=grads, loss_scale=loss * 0 + 1024, tokens_seen=step * 32)
            # What the monitor must report, computed here on the host.
            norms[step] = float(np.sqrt(sum(float((g.asnumpy() ** 2).sum()) for g in grads)))
            losses[step] = float(loss.asnumpy())
    return Trained(folder, capture, norms, losses)


def test_sampled_steps_reach_the_json_lines_with_loss_norm_lr_and_custom_scalars(trained):
    assert sorted(trained.lines) == SAMPLED
    for step in SAMPLED:
        line = trained.lines[step]
        assert line["loss"] == pytest.approx(trained.losses[step], rel=1e-5)
        assert line["learning_rate"] == pytest.approx(0.01)
        assert line["tokens_seen"] == step * 32
        assert line["train_per_step_time"] > 0
        assert "loss_scale" not in line  # logged, but not a monitored metric: not read back
    for step in (1, 5, 10):  # the global norm of what value_and_grad returned, on the device
        assert trained.lines[step]["grad_norm"] == pytest.approx(trained.norms[step], rel=1e-4)
    # The last step, sampled at the end though the cadence did not: its gradients were let go.
    assert "grad_norm" not in trained.lines[12]


def test_the_same_steps_reach_tensorboard_and_the_spans(trained):
    assert loss_steps(trained.folder / "tb" / "rank_0") == SAMPLED
    steps = trained.capture.finished("mindformers.train.step")
    assert sorted(span.attributes["training.step"] for span in steps) == SAMPLED
    (run_span,) = trained.capture.finished("mindformers.train")
    assert run_span.attributes["training.step"] == STEPS
    assert all(span.links[0].context.span_id == run_span.context.span_id for span in steps)


def test_a_loop_that_names_its_length_has_its_last_step_sampled_with_its_gradients(workdir):
    """The quick start's two epochs of three batches, `epochs` and `steps_per_epoch` given:
    the last step (6, off the interval's cadence) is sampled at its own end, its norm read."""
    loop = custom_loop.build()
    batches = list(custom_loop.Data(3).batches())
    norms: dict[int, float] = {}
    config = _config(workdir, interval=4, output_type=["json_file"])
    with otel_mindformers.start(config, optimizer=loop.optimizer, epochs=2, steps_per_epoch=3) as run:
        for epoch in range(2):
            for batch, (x, y) in enumerate(batches):
                step = epoch * 3 + batch + 1
                with run.step(step):
                    loss, grads = loop.train_step(x, y)
                    run.log(loss=loss, grads=grads)
                norms[step] = float(np.sqrt(sum(float((g.asnumpy() ** 2).sum()) for g in grads)))
    lines = json_lines(workdir / "metrics.json")
    assert [(line["step"], line["epoch"]) for line in lines] == [(1, 1), (4, 2), (6, 2)]
    for line in lines:
        assert line["grad_norm"] == pytest.approx(norms[line["step"]], rel=1e-4)


def _short_run(folder: Path, body, **config: Any) -> list[dict]:
    """Three steps of a real loop whose step body is `body(run, step, loss, grads)`."""
    loop = custom_loop.build()
    with otel_mindformers.start(_config(folder, **{"interval": 1, "output_type": ["json_file"], **config})) as run:
        for step, (x, y) in enumerate(custom_loop.Data(3).batches(), start=1):
            body(run, loop, step, x, y)
    return json_lines(folder / "metrics.json")


# The run API's own (a loaded machine's data wait may add the stragglers' input-bound warning).
_RUN_API_LOGGERS = {"otel_mindformers.runtime.run_api", "otel_mindformers.runtime.logged_values"}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name in _RUN_API_LOGGERS]


def test_log_outside_a_step_is_said_once_and_dropped(workdir, caplog):
    def body(run, loop, step, x, y):
        loss, grads = loop.train_step(x, y)
        run.log(loss=loss)  # outside
        with run.step(step):
            pass

    lines = _short_run(workdir, body)
    assert [line["step"] for line in lines] == [1, 2, 3] and all("loss" not in line for line in lines)
    assert _warnings(caplog) == [
        "otel_mindformers: run.log(...) was called outside `with run.step(step):`; its values are dropped"
    ]


def test_a_step_going_backwards_is_said_once_and_not_recorded(workdir, caplog):
    def body(run, loop, step, x, y):
        with run.step(1 if step == 3 else step):  # 1, 2, 1
            loss, grads = loop.train_step(x, y)
            run.log(loss=loss)

    lines = _short_run(workdir, body)
    assert [line["step"] for line in lines] == [1, 2]  # nothing recorded twice
    (said,) = _warnings(caplog)
    assert "run.step(1) follows step 2: a step number must grow (the job's step, counted across epochs" in said
    assert "step 1 is not recorded" in said


@pytest.mark.parametrize("shape", ["nested", "split"])
def test_a_step_entered_twice_says_how_it_was_entered(workdir, caplog, shape):
    """A helper that wraps `train_step` in `run.step` inside the loop's own (nested), or a
    step's work and its `log` in two blocks (split): each its own message, not "must grow"."""

    def body(run, loop, step, x, y):
        with run.step(step):
            if shape == "nested":
                with run.step(step):
                    loss, grads = loop.train_step(x, y)
                    run.log(loss=loss)
                return
            loss, grads = loop.train_step(x, y)
        with run.step(step):
            run.log(loss=loss)

    lines = _short_run(workdir, body)
    assert [line["step"] for line in lines] == [1, 2, 3]  # each step once
    assert all(("loss" in line) == (shape == "nested") for line in lines)
    said = [message for message in _warnings(caplog) if "run.step(1)" in message]
    assert said == [
        {
            "nested": "otel_mindformers: run.step(1) was entered inside another `with run.step(...)`: steps do not "
            "nest (one `with run.step(n):` around the whole step, its micro-batches included); the inner one "
            "counted step 1 and its data wait twice",
            "split": "otel_mindformers: run.step(1) again after step 1 ended: one `with run.step(n):` per step, "
            "around all of its work and its run.log; this block is not recorded",
        }[shape]
    ]


def test_steps_after_the_run_ended_are_said_once_and_not_recorded(workdir, caplog):
    """A loop that goes on past its `with otel_mindformers.start(...)` block (a second phase
    written below it): its steps are not recorded, and the first says why."""
    loop = custom_loop.build()
    batches = custom_loop.Data(4).batches()
    with otel_mindformers.start(_config(workdir, interval=1, output_type=["json_file"])) as run:
        for step in (1, 2):
            with run.step(step):
                loss, grads = loop.train_step(*next(batches))
                run.log(loss=loss)
    for step in (3, 4):
        with run.step(step):
            loss, grads = loop.train_step(*next(batches))
            run.log(loss=loss)
    assert [line["step"] for line in json_lines(workdir / "metrics.json")] == [1, 2]
    assert _warnings(caplog) == [
        "otel_mindformers: run.step(3) came after the run ended (run.end(), or the end of `with "
        "otel_mindformers.start(...) as run:`): it is not recorded, nor are the steps after it. Keep the whole loop "
        "inside the run"
    ]


def test_several_logs_in_a_step_add_up_and_a_value_given_again_replaces_the_first(workdir, caplog):
    def body(run, loop, step, x, y):
        with run.step(step):
            loss, grads = loop.train_step(x, y)
            run.log(loss=loss * 0, grads=grads, tokens_seen=-1.0)
            run.log(tokens_seen=step * 32.0)
            run.log(loss=loss, batch_seconds=0.5, grad_norm=0.25)  # given: not computed from `grads`

    lines = _short_run(workdir, body)
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert line["loss"] > 0 and line["grad_norm"] == 0.25, line
        assert line["tokens_seen"] == line["step"] * 32.0 and line["batch_seconds"] == 0.5, line
    assert _warnings(caplog) == []


def test_numpy_step_numbers_count_and_a_float_is_one_clear_type_error(workdir):
    def body(run, loop, step, x, y):
        with run.step(np.int64(step)):  # enumerate over a numpy range, as loops do
            loss, grads = loop.train_step(x, y)
            run.log(loss=loss)

    # Interval 2: step 3 ends on the unsampled path (the flight ring's store), then is the last.
    lines = _short_run(workdir, body, interval=2)
    assert [line["step"] for line in lines] == [1, 2, 3] and all("loss" in line for line in lines)
    # Past an int64 (the flight ring's): said once, not recorded, never a crash at the step's end.
    # The largest an int64 holds is recorded.
    with otel_mindformers.start(_config(workdir / "huge", output_type=["json_file"], interval=1)) as run:
        for step in (1, 2**64, 2**64 + 1, 2, 2**63 - 1):
            with run.step(step):
                pass
    assert [line["step"] for line in json_lines(workdir / "huge" / "metrics.json")] == [1, 2, 2**63 - 1]
    float_step = r"run.step\(step\) takes the step's number, an integer; got 1.0"
    with otel_mindformers.start(_config(workdir / "float", output_type=["json_file"])) as run:
        pytest.raises(TypeError, run.step, 1.0).match(float_step)


def test_a_non_scalar_loss_and_grads_that_are_no_tensors_are_said_once_each(workdir, caplog):
    def body(run, loop, step, x, y):
        with run.step(step):
            loss, grads = loop.train_step(x, y)
            run.log(loss=loss.broadcast_to((2, 2)), grads=[1.0, "g"])

    lines = _short_run(workdir, body)
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert all("loss" not in line and "grad_norm" not in line for line in lines)
    said = sorted(_warnings(caplog))
    assert len(said) == 2, said
    assert (
        "run.log(grads=...) takes the sequence of gradient tensors value_and_grad returns; got a list of 2" in said[0]
    )
    assert (
        "run.log(loss=...) takes a scalar (a one-element tensor or a number); got a tensor of shape (2, 2)" in said[1]
    )


def test_start_twice_is_refused_and_end_twice_is_said(workdir, caplog):
    run = otel_mindformers.start(_config(workdir, output_type=["json_file"]))
    try:
        with pytest.raises(ValueError, match=r"start\(\) was called while another run of this process is going"):
            otel_mindformers.start(_config(workdir))
    finally:
        run.end()
    run.end()
    said = [message for message in _warnings(caplog) if "run.end()" in message]  # it ran no step: said too
    assert said == ["otel_mindformers: run.end() was called again; the run had already ended"]
    otel_mindformers.start(_config(workdir, output_type=["json_file"])).end()  # after end(): a new run


def test_an_exception_in_the_loop_ends_the_run_with_the_crash_reason(workdir):
    capture = Capture()
    loop = custom_loop.build()
    run = otel_mindformers.start(_config(workdir), **capture.providers())
    with pytest.raises(RuntimeError, match="the data went away"), run:
        for step, (x, y) in enumerate(custom_loop.Data(3).batches(), start=1):
            with run.step(step):
                loss, grads = loop.train_step(x, y)
                run.log(loss=loss)
        raise RuntimeError("the data went away")
    (run_span,) = capture.finished("mindformers.train")
    assert run_span.status.description == "RuntimeError: the data went away"
    assert run_span.attributes["training.step"] == 3


def test_a_nonfinite_loss_stops_the_loop_at_that_step(workdir):
    config = {"alert_config": {"enable_alert": True, "stop_on_nonfinite": True}}
    with otel_mindformers.start(_config(workdir, interval=1, **config)) as run:
        last = custom_loop.train(run, steps=10, nan_at={4})
        assert run.should_stop and "non-finite loss" in run.stop_reason
    assert last == 4
    lines = json_lines(workdir / "metrics.json")
    assert lines[-1]["step"] == 4 and lines[-1]["nonfinite"] == ["loss", "grad_norm"]
