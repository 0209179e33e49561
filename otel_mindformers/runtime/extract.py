"""Reading what a step produced: `net_outputs` and the optimizer → host values.

This is the only place that reads device tensors back to the host, and it runs on sampled
steps only. Shapes understood:
- a scalar loss (`TrainOneStepCell`);
- `(loss, overflow, loss_scale)` (`TrainOneStepWithLossScaleCell`);
- `(loss, overflow, loss_scale, learning_rate, global_norm)` (MindFormers' `MFTrainOneStepCell`),
  and its 7-tuple with local norms appended.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from otel_mindformers.compat import mindspore_tensor
from otel_mindformers.config import GradNorm
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names import training as tm

_logger = get_logger(__name__)

# Tuple lengths whose layout is known: (loss,), (loss, overflow, loss_scale), and
# MindFormers' 5- and 7-tuples. Each holds a prefix of the table's output positions.
_KNOWN_LENGTHS = frozenset({1, 3, 5, 7})
# (metric key, position in the outputs tuple) for the table's rows read from the outputs.
_FROM_OUTPUTS: tuple[tuple[str, int], ...] = tuple(
    (row.key, row.output_position) for row in tm.TABLE if row.output_position is not None
)
_POSITIONS = dict(_FROM_OUTPUTS)


def to_host(value: Any) -> float:
    """One device→host readback; the mean of a multi-element tensor (e.g. per-micro-batch loss)."""
    if hasattr(value, "asnumpy"):
        if value.size == 1 and not value.has_init:
            # Tensor.item() syncs and reads the one element; asnumpy() also builds an
            # ndarray and checks numpy's version, several times slower inside Model.train
            # (docs/performance.md, the readback).
            return float(value.item())
        value = value.asnumpy()
    array = np.asarray(value, dtype=np.float64)
    if array.size == 0:  # the mean of nothing would be NaN: a false non-finite alarm
        raise ValueError("the step output is an empty tensor")
    return float(array.mean()) if array.size != 1 else float(array.reshape(()))


def _is_scalar_tensor(value: Any) -> bool:
    """A one-element value the read plan can read: a MindSpore tensor, read with `read_scalar`,
    the C method that `Tensor.item()` wraps in a Python frame (inside Model.train every frame
    is cold: docs/performance.md; compat/mindspore_tensor.py), or a rate a scheduler noted (`_Rate`)."""
    return (mindspore_tensor.readable(value) or value.__class__ is _Rate) and value.size == 1 and not value.has_init


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "asnumpy") or isinstance(value, (int, float, np.ndarray, np.generic))


def optimizer_of(cb_params: Any) -> Any:
    """MindSpore keeps the optimizer in cb_params; MindFormers leaves that None."""
    optimizer = cb_params.get("optimizer")
    if optimizer is None:
        network = cb_params.get("train_network")
        optimizer = getattr(network, "optimizer", None)
    return optimizer


class LearningRateSource:
    """Where an optimizer's learning rate comes from, resolved once per run (the optimizer
    is a Cell: each attribute read goes through its __getattr__, tens of microseconds on a
    sampled step): a schedule, a per-step list, or one Parameter.

    `tensor(step_index)` is the rate used by the step with 0-based index `step_index`:
    `optimizer.get_lr()` at step end already returns the NEXT step's value (the global step
    was incremented by the update), so the schedule is evaluated at the step's own index.

    That index is the optimizer's own: its `global_step` counts the updates it made (an
    overflowed step of a loss-scale cell makes none) and does not start again with
    `Model.train` (a second call in one process, `initial_epoch` without a loaded
    checkpoint), where the job's step does. It is read back with the rate, on the sampled
    step; `step_index` stands for it only for an optimizer without one.
    """

    __slots__ = ("tensor", "constant")

    def __init__(self, optimizer: Any, scheduled: ScheduledRate | None = None, cb_params: Any = None) -> None:
        from mindspore import Tensor, int32
        from mindspore.nn.learning_rate_schedule import LearningRateSchedule

        lr = optimizer.learning_rate
        self.constant: Any = None  # the Parameter itself when the rate is one (no call per read)
        if getattr(optimizer, "is_group_lr", False):
            lr = lr[0]  # the first parameter group stands for the run
        if isinstance(lr, LearningRateSchedule):
            index = _used_index(optimizer)
            self.tensor: Callable[[int], Any] = lambda step_index: lr(Tensor(index(step_index), int32))
        elif getattr(optimizer, "dynamic_lr", False):
            last = lr.shape[0] - 1
            index = _used_index(optimizer)
            self.tensor = lambda step_index: lr[min(index(step_index), last)]
        elif scheduled is not None and cb_params is not None:
            # A LearningRateScheduler listed before us has already set the next step's rate.
            self.tensor = lambda step_index: scheduled.used(cb_params, lr)
        else:
            self.tensor = lambda step_index: lr
            self.constant = lr


class _Rate:
    """A host float where a one-element tensor is read (`item`, `asnumpy`; the read plan
    takes its `value`)."""

    __slots__ = ("value",)
    size = 1
    has_init = False

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value

    def asnumpy(self) -> Any:
        return np.asarray(self.value, dtype=np.float32)


class ScheduledRate:
    """The rate MindSpore's `LearningRateScheduler` found in the optimizer at a step's end,
    before it set the next step's: the one that step used. Noted by wrapping the run's
    scheduler instances' `learning_rate_function` (`watch_lr_schedulers`), which is handed
    that rate and the step: no readback of our own."""

    __slots__ = ("step", "value")

    def __init__(self) -> None:
        self.step, self.value = -1, 0.0

    def used(self, cb_params: Any, parameter: Any) -> Any:
        """The noted rate when the scheduler ran at this step (listed before us), else the
        optimizer's Parameter (it has not changed it yet)."""
        if self.step == cb_params["cur_step_num"]:
            return _Rate(self.value)
        return parameter


def watch_lr_schedulers(callbacks: Any, reader: OutputReader) -> Callable[[], None]:
    """Note what the `LearningRateScheduler` instances among `callbacks` see (the run's,
    for its duration); returns the undo."""
    from mindspore.train.callback import LearningRateScheduler

    noted = ScheduledRate()
    watched: list[tuple[Any, Any]] = []
    for callback in callbacks or ():
        if isinstance(callback, LearningRateScheduler):
            original = callback.learning_rate_function

            def noting(lr: float, step: int, _original: Any = original) -> Any:
                noted.step, noted.value = step, float(lr)
                return _original(lr, step)

            callback.learning_rate_function = noting
            watched.append((callback, original))
    if watched:
        reader.scheduled = noted

    def undo() -> None:
        for callback, original in watched:
            callback.learning_rate_function = original

    return undo


def _used_index(optimizer: Any) -> Callable[[int], int]:
    """The 0-based index of the update that just ran: the optimizer's `global_step` (after
    the update) less one; the job's step index for an optimizer without one."""
    global_step = getattr(optimizer, "global_step", None)
    if global_step is None:
        return lambda step_index: step_index

    def index(step_index: int) -> int:
        try:
            return max(0, int(mindspore_tensor.read_scalar(global_step)) - 1)
        except Exception:  # not a readable one-element tensor: the job's step stands for it
            return step_index

    return index


# MindFormers' 7-tuple (`MFTrainOneStepCell(local_norm=True)`, or LocalNormTrainOneStepCell):
# (loss, overflow, scale, lr, global_norm, local_norm, size). `local_norm` holds each
# gradient's squared L2 norm in the order of the cell's `weights`; `size` their element
# counts, which the names already account for, so it is not read back.
LOCAL_NORM_POSITION = 5


def local_norm_squares(net_outputs: Any) -> np.ndarray | None:
    """The 7-tuple's per-parameter squared gradient norms: one readback, on a sampled step.
    None for any other shape."""
    if not isinstance(net_outputs, (tuple, list)) or len(net_outputs) != 7:
        return None
    value = net_outputs[LOCAL_NORM_POSITION]
    if not _is_tensor(value):
        return None
    return np.asarray(value.asnumpy() if hasattr(value, "asnumpy") else value, dtype=np.float64).reshape(-1)


def _overflow_flag(outputs: Any) -> bool | None:
    """The overflow flag of a loss-scale cell's outputs where it is not read for itself: a
    step that overflowed skipped its optimizer, its gradients were not finite."""
    if not isinstance(outputs, (tuple, list)) or len(outputs) <= _POSITIONS[tm.OVERFLOW]:
        return None
    try:
        return to_host(outputs[_POSITIONS[tm.OVERFLOW]]) != 0.0
    except Exception:  # not a flag: the probes' reading stands
        return None


class OutputReader:
    """Turns one step's outputs into StepRecord values, warning once about what is missing.

    Any value of any shape in any position is tolerated: what cannot be read is left out
    (one warning naming it), a NaN/Inf is kept as a float so it is counted as non-finite.
    `grad_norm` (`grad_monitor` resolved): MEASURED asks for the global norm (a warning when
    neither the outputs nor a probe give it), IF_RETURNED reads it when present, OFF never.
    """

    def __init__(self, monitored: list[str], grad_norm: GradNorm) -> None:
        self._wanted = set(monitored) & tm.READBACK_METRICS
        if grad_norm is GradNorm.OFF:
            self._wanted.discard(tm.GRAD_NORM)
        self._grad_norm_asked = grad_norm is GradNorm.MEASURED
        self.reads_anything = bool(self._wanted)
        self._warned: set[str] = set()
        self._learning_rate: LearningRateSource | None = None  # resolved at the first read
        self.scheduled: ScheduledRate | None = None  # a LearningRateScheduler's (watch_lr_schedulers)
        # The read plan (`_plan_for`): what the previous sampled step's outputs looked like
        # and where each wanted one-element tensor sits, so later reads skip the shape work.
        self._plan_type: type[Any] | None = None  # None: no plan
        self._plan_length = -1  # the tuple's length, -1 for a single tensor
        self._plan: tuple[tuple[str, int], ...] = ()
        self._plan_lr = False
        # The GradNormReader of the optimizers' probes, when grad_monitor put them there
        # (runtime/parts.py): read when the outputs carry no norm.
        self.grad_norm_probe: Any = None

    @property
    def wanted(self) -> frozenset[str]:
        """The metric keys this reader reads back (the run API reads the same from `run.log`)."""
        return frozenset(self._wanted)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _logger.warning("otel_mindformers: " + message, *args)

    def split(self, net_outputs: Any) -> dict[str, Any]:
        """Device handles by metric key (no readback), for the table's output positions."""
        if not isinstance(net_outputs, (tuple, list)):
            return {tm.LOSS: net_outputs} if _is_tensor(net_outputs) else {}
        length = len(net_outputs)
        if length not in _KNOWN_LENGTHS:
            self._warn_once(
                "shape",
                "unrecognised net_outputs: a %d-tuple; reading element 0 as the loss. "
                "Known shapes: loss, (loss, overflow, scale), MindFormers' 5- and 7-tuples.",
                length,
            )
            length = min(length, 1)
        handles = {key: net_outputs[position] for key, position in _FROM_OUTPUTS if position < length}
        unreadable = [key for key, value in handles.items() if not _is_tensor(value)]
        if unreadable:
            self._warn_once("types", "net_outputs element(s) %s are not tensors or numbers; skipped", unreadable)
            handles = {key: value for key, value in handles.items() if key not in unreadable}
        return handles

    def read(self, cb_params: Any, step: int) -> dict[str, float | bool]:
        """Host values of the monitored metrics for the step that just ended."""
        outputs = cb_params.get("net_outputs")
        if type(outputs) is self._plan_type and (self._plan_length < 0 or len(outputs) == self._plan_length):
            # The steady state: one `read_scalar` per wanted value (each a one-element tensor the
            # last time), nothing else, in this frame. Inside Model.train every line the
            # sampled step runs is cold after the compiled step (docs/performance.md).
            values: dict[str, float | bool] = {}
            try:
                if self._plan_length >= 0:
                    for name, position in self._plan:
                        values[name] = float(mindspore_tensor.read_scalar(outputs[position]))
                else:
                    for name, _ in self._plan:
                        values[name] = float(mindspore_tensor.read_scalar(outputs))
                if self._plan_lr:
                    lr: LearningRateSource = self._learning_rate  # type: ignore[assignment]  # _plan_lr: it was resolved
                    tensor = lr.constant if lr.constant is not None else lr.tensor(step - 1)
                    values[tm.LEARNING_RATE] = (
                        tensor.value if tensor.__class__ is _Rate else float(mindspore_tensor.read_scalar(tensor))
                    )
            except Exception:  # a value changed kind: the full path reads and warns
                self._plan_type = None
                return self._read_full(outputs, cb_params, step)
            overflow = values.get(tm.OVERFLOW)
            if overflow is not None and math.isfinite(overflow):
                values[tm.OVERFLOW] = overflow = bool(overflow)
            probes = self.grad_norm_probe
            if probes is not None:  # the outputs carry no norm (_read_full); in this frame
                if overflow is None and self._plan_length >= 0:
                    overflow = _overflow_flag(outputs)
                norm = probes.read(step, overflow is True)
                if norm is not None:
                    values[tm.GRAD_NORM] = norm
            return values
        return self._read_full(outputs, cb_params, step)

    def _read_probe(self, outputs: Any, values: dict[str, float | bool], step: int) -> None:
        """The norm the optimizers' probes wrote at this step (model_state/grad_norm_reader.py)."""
        overflow = values.get(tm.OVERFLOW)
        if overflow is None:
            overflow = _overflow_flag(outputs)
        norm = self.grad_norm_probe.read(step, overflow is True)
        if norm is not None:
            values[tm.GRAD_NORM] = norm

    def _read_full(self, outputs: Any, cb_params: Any, step: int) -> dict[str, float | bool]:
        handles = self.split(outputs)
        from_outputs = set(handles)
        if tm.LEARNING_RATE in self._wanted and tm.LEARNING_RATE not in handles:
            try:
                if self._learning_rate is None:
                    optimizer = optimizer_of(cb_params)
                    if optimizer is not None:
                        self._learning_rate = LearningRateSource(optimizer, self.scheduled, cb_params)
                if self._learning_rate is not None:
                    handles[tm.LEARNING_RATE] = self._learning_rate.tensor(step - 1)
            except Exception as exc:  # an exotic schedule: no lr, not a failed run
                self._warn_once(tm.LEARNING_RATE, "cannot evaluate the learning rate: %s", exc)
        if self._grad_norm_asked and tm.GRAD_NORM not in handles and self.grad_norm_probe is None:
            self._warn_once(
                "grad_norm",
                "grad_monitor is on but the train network returns no global gradient norm and its "
                "optimizers could not be measured, so grad_norm is not reported. Train with a cell "
                "that calls the mindspore.nn.Optimizer it holds (as nn.TrainOneStepCell does) or with "
                "MindFormers' MFTrainOneStepCell, or return the norm as the 5th output; or set "
                "grad_monitor: false.",
            )
        values: dict[str, float | bool] = {}
        for name in self._wanted & handles.keys():
            try:
                value = to_host(handles[name])
            except Exception as exc:  # any value of any shape: left out, never raised
                self._warn_once(name, "cannot read %s from the step outputs: %s", name, exc)
                continue
            values[name] = bool(value) if name == tm.OVERFLOW and math.isfinite(value) else value
        if self.grad_norm_probe is not None:
            if tm.GRAD_NORM in handles or tm.GRAD_NORM not in self._wanted:
                self.grad_norm_probe.set_aside()  # its end-of-run words are not about the norm reported
                self.grad_norm_probe = None  # the cell's own norm is the one reported (or none is)
            else:
                self._read_probe(outputs, values, step)
        self._plan_for(outputs, handles, from_outputs, values)
        return values

    def _plan_for(self, outputs: Any, handles: dict[str, Any], from_outputs: set[str], values: dict) -> None:
        """Plan the next reads when every wanted value was a one-element tensor, read."""
        self._plan_type = None
        wanted = self._wanted & handles.keys()
        if not all(name in values and _is_scalar_tensor(handles[name]) for name in wanted):
            return
        self._plan = tuple((name, _POSITIONS[name]) for name in wanted if name in from_outputs)
        self._plan_lr = tm.LEARNING_RATE in wanted and tm.LEARNING_RATE not in from_outputs
        self._plan_type = type(outputs)
        self._plan_length = len(outputs) if isinstance(outputs, (tuple, list)) else -1


class _ReadOnDemand:
    """A step's tensor as a custom monitor reads it: `.asnumpy()`, `float(...)`,
    `numpy.asarray(...)` or any Tensor attribute. A one-element tensor reads back as a 0-d
    array: numpy 2.4 no longer converts a `(1,)` array with `float()`, which the monitor_config
    article's monitor calls on `.asnumpy()`, and MindFormers' cells return the loss as `(1,)`."""

    __slots__ = ()

    def tensor(self) -> Any:
        raise NotImplementedError

    def asnumpy(self) -> Any:
        array = self.tensor().asnumpy()
        return array.reshape(()) if array.size == 1 else array

    def __float__(self) -> float:
        return to_host(self.tensor())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        # numpy 2 passes `copy` (and warns about an `__array__` without it); numpy 1 does not.
        array = np.asarray(self.asnumpy(), dtype=dtype)
        return array.copy() if copy else array

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tensor(), name)


class StepTensor(_ReadOnDemand):
    """One of the step's outputs for custom monitors (`cb_params.train_loss`, and
    `learning_rate` where the cell returns it). One object per run, re-pointed at each step
    (no allocation)."""

    __slots__ = ("_tensor",)

    def __init__(self) -> None:
        self._tensor: Any = None

    def at(self, tensor: Any) -> StepTensor:
        self._tensor = tensor
        return self

    def tensor(self) -> Any:
        return self._tensor


class LazyLearningRate(_ReadOnDemand):
    """The step's learning rate for custom monitors (`cb_params.learning_rate`), evaluated
    on the device only when read. One object per run, re-pointed at each step (no allocation)."""

    __slots__ = ("_optimizer", "_scheduled", "_cb_params", "_source", "_step_index", "_tensor")

    def __init__(self, optimizer: Any, scheduled: ScheduledRate | None = None, cb_params: Any = None) -> None:
        self._optimizer = optimizer
        # A LearningRateScheduler's notes (watch_lr_schedulers), as the sampled read has them.
        self._scheduled, self._cb_params = scheduled, cb_params
        self._source: LearningRateSource | None = None  # resolved at the first read
        self._step_index = 0
        self._tensor: Any = None

    def at(self, step_index: int) -> LazyLearningRate:
        self._step_index, self._tensor = step_index, None
        return self

    def tensor(self) -> Any:
        if self._tensor is None:
            if self._source is None:
                self._source = LearningRateSource(self._optimizer, self._scheduled, self._cb_params)
            self._tensor = self._source.tensor(self._step_index)
        return self._tensor
