"""Mixed precision and gradient accumulation in real custom loops through the run API, in the
shapes docs/custom_loops.md tells users to write:

- MindSpore AMP (`mindspore.amp.DynamicLossScaler`, `all_finite`): a scale so large that the
  first steps' gradients overflow; `overflow` and `loss_scale` reach the records as the loop
  saw them, the overflow counter counts those steps, and the non-finite gradient norm of an
  overflowed step neither fires `nonfinite` nor stops the loop;
- gradient accumulation: one `run.step` per optimizer step around its micro-batches; the
  reported norm is that of the accumulated gradients the optimizer received.
"""

from __future__ import annotations

import math
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from mindspore.amp import DynamicLossScaler, all_finite

import otel_mindformers
from otel_mindformers.names import training as tm
from tests.support import custom_loop
from tests.support.in_memory import Capture
from tests.support.jsonl import json_lines
from tests.support.metrics import counter_values
from tests.support.training import _Regressor

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training

STEPS = 12


def _config(workdir, **more: Any) -> dict[str, Any]:
    return {
        "interval": 1,
        "output_type": ["json_file"],
        "json_log_path": str(workdir / "m.json"),
        "monitored_metrics": [tm.LOSS, tm.GRAD_NORM, tm.OVERFLOW, tm.LOSS_SCALE, tm.LEARNING_RATE],
        **more,
    }


def _host_norm(grads) -> float:
    return float(np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)))


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_amp_overflow_and_loss_scale_reach_the_records_and_an_overflow_is_no_anomaly(workdir, jit):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = _Regressor()
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(network.trainable_params(), learning_rate=0.01)
    # 2**127: the scaled gradients of the first steps overflow float32; each overflow halves it.
    scaler = DynamicLossScaler(scale_value=2.0**127, scale_factor=2, scale_window=1000)

    def forward(x, y):
        loss = loss_fn(network(x), y)
        return scaler.scale(loss), loss  # the scaled loss is differentiated, the plain one reported

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters, has_aux=True)

    def train_step(x, y):
        (_, loss), grads = grad_fn(x, y)
        grads = scaler.unscale(grads)
        finite = all_finite(grads)
        if finite:
            optimizer(grads)
        scaler.adjust(finite)
        return loss, grads, ops.logical_not(finite)

    step_fn = ms.jit(train_step) if jit else train_step
    capture = Capture()
    seen: dict[int, tuple[bool, float]] = {}
    config = _config(workdir, alert_config={"enable_alert": True})  # stop_on_nonfinite: True, the default
    with otel_mindformers.start(config, optimizer=optimizer, **capture.providers()) as run:
        for step, (x, y) in enumerate(custom_loop.Data(STEPS).batches(), start=1):
            with run.step(step):
                loss, grads, overflow = step_fn(x, y)
                run.log(loss=loss, grads=grads, overflow=overflow, loss_scale=scaler.scale_value)
            seen[step] = (bool(overflow.asnumpy()), float(scaler.scale_value.asnumpy()))
        assert not run.should_stop, run.stop_reason
    overflowed = [step for step, (flag, _) in seen.items() if flag]
    assert overflowed and overflowed != list(seen), "some steps overflow, not all"
    lines = {line["step"]: line for line in json_lines(workdir / "m.json")}
    assert sorted(lines) == list(range(1, STEPS + 1))
    for step, (flag, scale) in seen.items():
        line = lines[step]
        # The scale read at the step's end: after `adjust`, the one the next step uses.
        assert (line[tm.OVERFLOW], line[tm.LOSS_SCALE]) == (flag, pytest.approx(scale)), step
        assert line[tm.OVERFLOW] is flag, step  # a boolean, not the tensor's number
        assert math.isfinite(line[tm.LOSS])
        if flag:  # the unscaled gradients of an overflowed step: noted, and loss scaling at work
            assert (line[tm.GRAD_NORM], line["nonfinite"]) == (None, [tm.GRAD_NORM]), line
        else:
            assert line[tm.GRAD_NORM] > 0
    assert seen[STEPS][1] == 2.0**127 / 2 ** len(overflowed)
    overflow_steps = counter_values(capture.reader, tm.OVERFLOW_STEPS.name)
    assert sum(overflow_steps.values()) == len(overflowed)
    alerts = counter_values(capture.reader, "mindformers.alerts")
    assert not [key for key in alerts if ("training.alert.rule", "nonfinite") in key], alerts


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "jit"])
def test_gradient_accumulation_reports_the_norm_of_what_the_optimizer_receives(workdir, jit):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    micro_batches = 3
    network = _Regressor()
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(network.trainable_params(), learning_rate=0.01)

    def forward(x, y):
        return loss_fn(network(x), y) / micro_batches

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    micro_step = ms.jit(grad_fn) if jit else grad_fn
    received: dict[int, float] = {}
    losses: dict[int, float] = {}
    data = custom_loop.Data(STEPS * micro_batches).batches()
    with otel_mindformers.start(_config(workdir, interval=2), optimizer=optimizer, batch_size=4 * micro_batches) as run:
        for step in range(1, STEPS + 1):
            with run.step(step):  # one step per optimizer step, its micro-batches inside
                loss, accumulated = None, None
                for _ in range(micro_batches):
                    x, y = next(data)
                    micro_loss, grads = micro_step(x, y)
                    loss = micro_loss if loss is None else loss + micro_loss
                    accumulated = grads if accumulated is None else tuple(map(ops.add, accumulated, grads))
                optimizer(accumulated)
                run.log(loss=loss, grads=accumulated)
            received[step] = _host_norm(accumulated)
            losses[step] = float(loss.asnumpy())
    lines = {line["step"]: line for line in json_lines(workdir / "m.json")}
    assert sorted(lines) == [1, 2, 4, 6, 8, 10, 12]  # optimizer steps, not micro-batches
    for step in (1, 2, 4, 6, 8, 10):  # the last, sampled at the end, let its gradients go
        assert lines[step][tm.GRAD_NORM] == pytest.approx(received[step], rel=1e-4), step
    for step, line in lines.items():
        assert line[tm.LOSS] == pytest.approx(losses[step], rel=1e-5)
        assert line[tm.LEARNING_RATE] == pytest.approx(0.01)
