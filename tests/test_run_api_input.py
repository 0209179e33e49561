"""The run API given what users give it (docs/custom_loops.md, "Bad input"), in real MindSpore
custom loops (tests/support/custom_loop.py): step numbers of numpy's and float types, custom
scalars named like the record's own keys, numpy integers to `start()` and
`checkpoint_saved()`, and a `run.log` inside a `mindspore.jit` step. Each is said once (or
refused before training), the loop goes on, the outputs stay alive and nothing is recorded
twice or under a wrong step."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import otel_mindformers
from tests.support import custom_loop
from tests.support.jsonl import json_lines
from tests.support.tensorboard_events import loss_steps

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training


def _config(folder: Path, **more: Any) -> dict[str, Any]:
    return {
        "interval": 1,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": str(folder / "metrics.json"),
        "tensorboard_path": str(folder / "tb"),
        **more,
    }


# The run API's own (a loaded machine's data wait may add the stragglers' input-bound warning).
_RUN_API_LOGGERS = {"otel_mindformers.runtime.run_api", "otel_mindformers.runtime.logged_values"}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name in _RUN_API_LOGGERS]


def _train(run: Any, numbers: list[Any], log: Any = None) -> None:
    """One real step per entry of `numbers`, each given to `run.step` as it is."""
    loop = custom_loop.build()
    for number, (x, y) in zip(numbers, custom_loop.Data(len(numbers)).batches(), strict=True):
        with run.step(number):
            loss, grads = loop.train_step(x, y)
            (log or (lambda run, loss, grads: run.log(loss=loss, grads=grads)))(run, loss, grads)


def test_integer_step_numbers_of_any_type_count_and_no_other_reaches_the_outputs(workdir, caplog):
    import mindspore as ms

    numbers = [np.int64(1), np.int32(2), ms.Tensor(3), 0, np.int64(4)]
    with otel_mindformers.start(_config(workdir)) as run:
        _train(run, numbers)
        for wrong in (ms.Tensor(5.0), 5.5, "5"):  # one TypeError naming it, before the step runs
            pytest.raises(TypeError, run.step, wrong).match(r"run.step\(step\) takes the step's number, an integer")
        _train(run, [5])
    lines = json_lines(workdir / "metrics.json")
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]  # every output alive, each step once
    assert all(type(line["step"]) is int and line["loss"] > 0 for line in lines)
    assert loss_steps(workdir / "tb" / "rank_0") == [1, 2, 3, 4, 5]
    assert _warnings(caplog) == [
        "otel_mindformers: run.step(0): step numbers count from 1 (the job's step: enumerate(..., start=1)); "
        "step 0 is not recorded",
    ]


def test_custom_scalars_named_like_the_records_own_keys_are_left_out_once(workdir, caplog):
    def log(run: Any, loss: Any, grads: Any) -> None:
        run.log(loss=loss, **{"step": 99.0, "time": 1.0, "learning_rate": 0.5, "tokens seen": 7.0})

    with otel_mindformers.start(_config(workdir)) as run:
        _train(run, [1, 2, 3], log)
    lines = json_lines(workdir / "metrics.json")
    assert [line["step"] for line in lines] == [1, 2, 3]
    # No optimizer given, no `lr`: no learning rate at all, not the custom scalar's 0.5.
    assert all(isinstance(line["time"], dict) and "learning_rate" not in line for line in lines)
    assert all(line["tokens seen"] == 7.0 for line in lines)
    said = sorted(message for message in _warnings(caplog) if "is a name the monitor records itself" in message)
    assert said == [
        "otel_mindformers: run.log(learning_rate=...): 'learning_rate' is a name the monitor records itself: the "
        "custom scalar is left out (the learning rate is run.log(lr=...))",
        "otel_mindformers: run.log(step=...): 'step' is a name the monitor records itself: the custom scalar is "
        "left out (give the custom scalar another name)",
        "otel_mindformers: run.log(time=...): 'time' is a name the monitor records itself: the custom scalar is "
        "left out (give the custom scalar another name)",
    ]


def test_checkpoint_saved_before_any_step_is_said_once_and_not_recorded(workdir, caplog):
    with otel_mindformers.start(_config(workdir)) as run:
        run.checkpoint_saved()
        run.checkpoint_saved()
        _train(run, [1, 2])
    (attempt,) = json.loads((workdir / "metrics.job.rank_0.ledger").read_text())["attempts"]
    assert (attempt["durable_step"], attempt["last_step"]) == (0, 2)
    assert _warnings(caplog) == [
        "otel_mindformers: run.checkpoint_saved() was called before any step of this run finished: give the step "
        "the checkpoint holds (checkpoint_saved(step=...)); nothing is recorded"
    ]


def test_start_and_checkpoint_saved_take_numpy_integers(workdir, caplog):
    run = otel_mindformers.start(
        _config(workdir, interval=5), initial_step=np.int64(20), batch_size=np.int64(4), epochs=np.int64(2),
        steps_per_epoch=np.int64(25),
    )  # fmt: skip
    with run:
        _train(run, list(range(21, 27)))
        run.checkpoint_saved(np.int64(25), np.float32(0.5))
    lines = json_lines(workdir / "metrics.json")
    assert [line["step"] for line in lines] == [21, 25, 26]
    assert [line["epoch"] for line in lines] == [1, 1, 2]  # the loop names none: step 25 ends epoch 1
    assert all(line["samples_per_second"] > 0 for line in lines)
    (attempt,) = json.loads((workdir / "metrics.job.rank_0.ledger").read_text())["attempts"]
    assert (attempt["resume_step"], attempt["durable_step"], attempt["outcome"]) == (20, 25, "completed")
    assert attempt["checkpoint_save_seconds"] == pytest.approx(0.5)
    assert not _warnings(caplog)


@pytest.mark.parametrize(
    ("argument", "value", "error"),
    [("initial_step", 2.5, TypeError), ("batch_size", "4", TypeError), ("steps_per_epoch", -1, ValueError)],
)
def test_start_refuses_counts_that_are_no_whole_numbers_before_training(workdir, argument, value, error):
    with pytest.raises(error, match=rf"otel_mindformers.start\({argument}={value!r}\): takes an int"):
        otel_mindformers.start(_config(workdir), **{argument: value})
    otel_mindformers.start(_config(workdir)).end()  # nothing was left started


def test_run_log_inside_a_jit_step_is_said_once(workdir, caplog):
    """MindSpore's quick start with `run.log` moved into the compiled step: it runs while the
    step compiles (step 1), never again; the sampled steps after it say so, once."""
    import mindspore as ms

    loop = custom_loop.build()
    with otel_mindformers.start(_config(workdir, interval=2)) as run:

        @ms.jit
        def train_step(x: Any, y: Any) -> Any:
            loss, grads = loop.grad_fn(x, y)
            loop.optimizer(grads)
            run.log(loss=loss)
            return loss

        for step, (x, y) in enumerate(custom_loop.Data(6).batches(), start=1):
            with run.step(step):
                train_step(x, y)
    lines = json_lines(workdir / "metrics.json")
    assert [line["step"] for line in lines] == [1, 2, 4, 6]
    assert [step for step, line in enumerate(lines) if "loss" in line] == [0]
    assert _warnings(caplog) == [
        "otel_mindformers: step 2 was sampled but run.log(...) was not called in it (last in step 1): it is "
        "recorded without its values. A run.log inside a mindspore.jit function runs only while the function "
        "compiles: call it after the compiled step, with what the step returns"
    ]


def test_steps_never_entered_with_with_are_said_at_the_end(workdir, caplog):
    """`run.step(n)` called as a function (no `with`): nothing is timed; the end says why."""
    loop = custom_loop.build()
    with otel_mindformers.start(_config(workdir), initial_step=10) as run:  # a resumed loop's too
        for step, (x, y) in enumerate(custom_loop.Data(3).batches(), start=11):
            run.step(step)
            loop.train_step(x, y)
    assert json_lines(workdir / "metrics.json") == []
    assert _warnings(caplog) == [
        "otel_mindformers: the run ended and no step of it finished: is each step inside `with run.step(n):`?"
    ]


def test_values_that_are_no_scalars_are_left_out_once_each_not_averaged_or_parsed(workdir, caplog):
    def log(run: Any, loss: Any, grads: Any) -> None:
        run.log(
            loss=np.array([1.0, 3.0]), lr="0.1", tokens=[5.0], zero_d=np.array(2.0), one=np.array([[3.0]]),
            flag=np.bool_(True), count=np.int64(7),
        )  # fmt: skip

    with otel_mindformers.start(_config(workdir)) as run:
        _train(run, [1, 2, 3], log)
    lines = json_lines(workdir / "metrics.json")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert "loss" not in line and "learning_rate" not in line and "tokens" not in line
        assert (line["zero_d"], line["one"], line["flag"], line["count"]) == (2.0, 3.0, 1.0, 7.0)
    assert sorted(_warnings(caplog)) == [
        "otel_mindformers: run.log(loss=...) takes a scalar (a one-element tensor or a number); got a ndarray of "
        "shape (2,): loss is left out of the records",
        "otel_mindformers: run.log(lr=...) takes a scalar (a one-element tensor or a number); got a str ('0.1'): "
        "learning_rate is left out of the records",
        "otel_mindformers: run.log(tokens=...) takes a scalar (a one-element tensor or a number); got a list "
        "([5.0]): tokens is left out of the records",
    ]


def test_grad_monitor_on_in_a_loop_that_logs_no_gradients_is_said_once(workdir, caplog):
    """The quick start's `train_step` returns the loss alone: `grad_monitor: True` cannot be
    met, said once (as the callback says it of a train cell without a norm). A loop that logs
    its gradients is not told, though its last step, sampled by `end()`, has none left."""
    with otel_mindformers.start(_config(workdir / "loss_only", grad_monitor=True)) as run:
        _train(run, [1, 2, 3], lambda run, loss, grads: run.log(loss=loss))
    assert [("grad_norm" in line, "loss" in line) for line in json_lines(workdir / "loss_only" / "metrics.json")] == [
        (False, True)
    ] * 3
    assert _warnings(caplog) == [
        "otel_mindformers: grad_monitor is on but run.log(...) got neither grads= nor grad_norm= (step 1): "
        "grad_norm is not reported. Return the gradients from the train step and log them "
        "(run.log(loss=loss, grads=grads)), or log grad_norm=...; or set grad_monitor: false"
    ]
    caplog.clear()
    with otel_mindformers.start(_config(workdir / "with_grads", grad_monitor=True, interval=2)) as run:
        _train(run, [1, 2, 3])
    lines = json_lines(workdir / "with_grads" / "metrics.json")
    assert [(line["step"], "grad_norm" in line) for line in lines] == [(1, True), (2, True), (3, False)]
    assert _warnings(caplog) == []


def test_the_quick_starts_loss_and_logits_pair_logged_as_the_loss_says_how_to_take_the_loss(workdir, caplog):
    """MindSpore's quick start: `forward` returns `(loss, logits)`, `value_and_grad(...,
    has_aux=True)`; a loop that unpacks `loss, grads = grad_fn(x, y)` logs the pair."""
    import mindspore as ms

    loop = custom_loop.build()

    def forward(x: Any, y: Any) -> Any:
        logits = loop.network(x)
        return ((logits - y) ** 2).mean(), logits

    grad_fn = ms.value_and_grad(forward, None, loop.optimizer.parameters, has_aux=True)
    with otel_mindformers.start(_config(workdir), optimizer=loop.optimizer) as run:
        for step, (x, y) in enumerate(custom_loop.Data(2).batches(), start=1):
            with run.step(step):
                loss, grads = grad_fn(x, y)  # `loss` is (loss, logits)
                loop.optimizer(grads)
                run.log(loss=loss, grads=grads)
    lines = json_lines(workdir / "metrics.json")
    assert [(line["step"], "loss" in line, line["grad_norm"] > 0) for line in lines] == [
        (1, False, True),
        (2, False, True),
    ]
    (said,) = _warnings(caplog)
    assert said.startswith(
        "otel_mindformers: run.log(loss=...) takes a scalar (a one-element tensor or a number); got a tuple"
    )
    assert said.endswith(
        "loss is left out of the records. value_and_grad(..., has_aux=True) returns ((loss, aux), grads): log the "
        "loss alone ((loss, _), grads = grad_fn(...))"
    )


@pytest.mark.parametrize("whose", ["the optimizer's", "another"])
def test_a_learning_rate_schedule_given_as_lr_is_its_rate_at_each_step(workdir, caplog, whose):
    """`run.log(lr=optimizer.learning_rate)`: with a schedule that is a LearningRateSchedule
    cell, not a number; its rate at the step is recorded, as the optimizer's own would be."""
    from mindspore import nn

    def schedule(first: float) -> Any:
        return nn.PolynomialDecayLR(first, first / 10, 8, 1.0)

    loop = custom_loop.build(lr=schedule(0.01))
    # Another: not the optimizer's rates, and given, it wins over them.
    given, first = (loop.optimizer.learning_rate, 0.01) if whose == "the optimizer's" else (schedule(0.02), 0.02)
    with otel_mindformers.start(_config(workdir), optimizer=loop.optimizer) as run:
        for step, (x, y) in enumerate(custom_loop.Data(4).batches(), start=1):
            with run.step(step):
                loss, grads = loop.train_step(x, y)
                run.log(loss=loss, lr=given)
    rates = [line["learning_rate"] for line in json_lines(workdir / "metrics.json")]
    assert rates == pytest.approx([first * (1 - 0.9 * index / 8) for index in range(4)], rel=1e-5)
    assert not _warnings(caplog)


def test_per_parameter_norms_asked_without_an_optimizer_to_name_them_are_said_once_at_start(workdir, caplog):
    """`local_norm_format` (MindFormers' key) without `start(optimizer=...)`: the gradients have
    no names, so no per-parameter norms; said before training, and the global norm is kept."""
    with otel_mindformers.start(_config(workdir, local_norm_format="log")) as run:
        assert _warnings(caplog) == [
            "otel_mindformers: local_norm_format asks for per-parameter gradient norms; the optimizer's parameters "
            "name them: give otel_mindformers.start(optimizer=...), none are reported"
        ]
        _train(run, [1, 2])
    lines = json_lines(workdir / "metrics.json")
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["grad_norm"] > 0 and "model_state" not in line for line in lines)
    assert len(_warnings(caplog)) == 1
