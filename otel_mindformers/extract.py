"""Reading what a step produced: `net_outputs` and the optimizer → host values.

This is the only place that reads device tensors back to the host, and it runs on sampled
steps only. Shapes understood (environment.md):
- a scalar loss (`TrainOneStepCell`);
- `(loss, overflow, loss_scale)` (`TrainOneStepWithLossScaleCell`);
- `(loss, overflow, loss_scale, learning_rate, global_norm)` (MindFormers' `MFTrainOneStepCell`),
  and its 7-tuple with local norms appended.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from otel_mindformers import record as rec

_logger = logging.getLogger(__name__)

# Tuple length → positions of (loss, overflow, loss_scale, learning_rate, global_norm).
_LAYOUTS: dict[int, tuple[int | None, ...]] = {
    1: (0, None, None, None, None),
    3: (0, 1, 2, None, None),
    5: (0, 1, 2, 3, 4),
    7: (0, 1, 2, 3, 4),
}


def to_host(value: Any) -> float:
    """One device→host readback; the mean of a multi-element tensor (e.g. per-micro-batch loss)."""
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    array = np.asarray(value, dtype=np.float64)
    if array.size == 0:  # the mean of nothing would be NaN: a false non-finite alarm
        raise ValueError("the step output is an empty tensor")
    return float(array.mean()) if array.size != 1 else float(array.reshape(()))


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "asnumpy") or isinstance(value, (int, float, np.ndarray, np.generic))


def optimizer_of(cb_params: Any) -> Any:
    """MindSpore keeps the optimizer in cb_params; MindFormers leaves that None (environment.md)."""
    optimizer = cb_params.get("optimizer")
    if optimizer is None:
        network = cb_params.get("train_network")
        optimizer = getattr(network, "optimizer", None)
    return optimizer


def learning_rate_tensor(optimizer: Any, step_index: int) -> Any:
    """The learning rate used by the step with 0-based index `step_index`.

    `optimizer.get_lr()` at step end already returns the NEXT step's value (the global step
    was incremented by the update), so the schedule is evaluated at the step's own index.
    """
    from mindspore import Tensor, int32
    from mindspore.nn.learning_rate_schedule import LearningRateSchedule

    lr = optimizer.learning_rate
    if getattr(optimizer, "is_group_lr", False):
        lr = lr[0]  # the first parameter group stands for the run
    if isinstance(lr, LearningRateSchedule):
        return lr(Tensor(step_index, int32))
    if getattr(optimizer, "dynamic_lr", False):
        return lr[min(step_index, lr.shape[0] - 1)]
    return lr


class OutputReader:
    """Turns one step's outputs into StepRecord values, warning once about what is missing."""

    def __init__(self, monitored: list[str], grad_monitor: bool) -> None:
        self._wanted = set(monitored) & rec.DEVICE_METRICS
        if not grad_monitor:
            self._wanted.discard(rec.GRAD_NORM)
        self._warned: set[str] = set()

    @property
    def reads_anything(self) -> bool:
        return bool(self._wanted)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _logger.warning("otel_mindformers: " + message, *args)

    def split(self, net_outputs: Any) -> dict[str, Any]:
        """Device handles by name (no readback): loss, overflow, loss_scale, learning_rate, grad_norm."""
        if isinstance(net_outputs, (tuple, list)):
            layout = _LAYOUTS.get(len(net_outputs))
            if layout is None:
                self._warn_once(
                    "shape",
                    "unrecognised net_outputs: a %d-tuple; reading element 0 as the loss. "
                    "Known shapes: loss, (loss, overflow, scale), MindFormers' 5- and 7-tuples.",
                    len(net_outputs),
                )
                layout = _LAYOUTS[1]
            names = (rec.LOSS, rec.OVERFLOW, rec.LOSS_SCALE, rec.LEARNING_RATE, rec.GRAD_NORM)
            handles = {n: net_outputs[i] for n, i in zip(names, layout) if i is not None}
        else:
            handles = {rec.LOSS: net_outputs}
        if not all(_is_tensor(v) for v in handles.values()):
            bad = [n for n, v in handles.items() if not _is_tensor(v)]
            self._warn_once(
                "types", "net_outputs element(s) %s are not tensors or numbers; skipped", bad
            )
            handles = {n: v for n, v in handles.items() if _is_tensor(v)}
        return handles

    def read(self, cb_params: Any, step: int) -> dict[str, float | bool]:
        """Host values of the monitored metrics for the step that just ended."""
        handles = self.split(cb_params.get("net_outputs"))
        if rec.LEARNING_RATE in self._wanted and rec.LEARNING_RATE not in handles:
            optimizer = optimizer_of(cb_params)
            if optimizer is not None:
                handles[rec.LEARNING_RATE] = learning_rate_tensor(optimizer, step - 1)
        if rec.GRAD_NORM in self._wanted and rec.GRAD_NORM not in handles:
            self._warn_once(
                "grad_norm",
                "grad_monitor is on but the train network returns no global gradient norm, so "
                "grad_norm is not reported. Train with MindFormers' MFTrainOneStepCell (it returns "
                "(loss, overflow, scale, lr, global_norm)) or return the norm as the 5th output; "
                "or set grad_monitor: false.",
            )
        values: dict[str, float | bool] = {}
        for name in self._wanted & handles.keys():
            try:
                value = to_host(handles[name])
            except (TypeError, ValueError) as exc:
                self._warn_once(name, "cannot read %s from the step outputs: %s", name, exc)
                continue
            values[name] = bool(value) if name == rec.OVERFLOW and math.isfinite(value) else value
        return values
