"""The run API: the door into a monitored run for a training loop of its own (a custom loop).

    run = otel_mindformers.start("train_config.yaml", optimizer=optimizer)
    for step, (x, y) in enumerate(dataset.create_tuple_iterator(), start=1):
        with run.step(step):                 # the step's clock and span; between steps: data wait
            loss, grads = train_step(x, y)
            run.log(loss=loss, grads=grads)  # references only, unless the step is sampled
        if run.should_stop:
            break
    run.end()                                # also at exit, and on an exception (`with ... as run:`)

The same run as MonitorCallback's (runtime/run.py: one MonitorRun, its parts started by
runtime/assembly.py from a TrainingLoop), the same hot path on the same StepClock: a step's
begin and end read one clock each; a sampled step reads back what `log` was given
(runtime/logged_values.py) and hands one SampledStep to the pipeline. docs/custom_loops.md
says what each feature does through this door.
"""

from __future__ import annotations

import atexit
import math
import numbers
import operator
import os
import sys
import time
from typing import Any

from otel_mindformers.config import GradNorm, MonitorConfig, load_monitor_config
from otel_mindformers.core.clock import StepClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.outputs.paths import prepare_output_paths
from otel_mindformers.runtime.custom_monitors import BaseMonitor, MonitorCalls, build_monitor, load_monitor_class
from otel_mindformers.runtime.extract import LazyLearningRate, StepTensor
from otel_mindformers.runtime.logged_values import LoggedReader
from otel_mindformers.runtime.parts import Providers
from otel_mindformers.runtime.run import MonitorRun
from otel_mindformers.runtime.training_loop import TrainingLoop, batch_size_of
from otel_mindformers.telemetry import config_file

_logger = get_logger(__name__)

_perf_counter = time.perf_counter  # bound once: the step's two clock reads
_index = operator.index
_LARGEST_STEP = 2**63 - 1  # the flight ring keeps the step in an int64
_LOGGED_FIELDS = ("loss", "grads", "grad_norm", "lr", "overflow", "loss_scale")  # `log`'s named values, in order

_active: Run | None = None  # the process's one run (start twice: a ValueError)


class StepView(dict):  # MindSpore's cb_params is an untyped dict too
    """The run API's `cb_params`: the keys MonitorRun and custom monitors read (`cur_step_num`,
    `net_outputs`: what `log` was given, `train_loss`, `learning_rate`, ...), also as attributes
    (`cb_params.train_loss`, as MindSpore's `_InternalCallbackParam` has them)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class LoopRunContext:
    """What custom monitors' hooks are handed (MindSpore's `run_context` shape):
    `original_args()` is the StepView, `request_stop()` sets `run.should_stop`."""

    def __init__(self, view: StepView) -> None:
        self._view = view
        self.stop_requested = False

    def original_args(self) -> StepView:
        return self._view

    def request_stop(self) -> None:
        self.stop_requested = True


class Step(StepClock):
    """`with run.step(n):`, and the run's StepClock (core/clock.py) itself: the step's begin and
    end touch this one object (after a PyNative step every other object is a cache miss,
    docs/performance.md). One per run, re-pointed at each step: no allocation. Its attributes
    `loss` ... `scalars` are what `run.log` was given in this step (runtime/logged_values.py
    `Logged`). Not monitoring (`enable: False`, or after `end()`): `next_sample` 0 sends every
    step end to the run, which drops it."""

    __slots__ = (
        "_owner", "number", "open", "loss", "grads", "grad_norm", "lr", "overflow", "loss_scale", "scalars",
        "logged_at",
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self._owner: Run = None  # type: ignore[assignment]  # the Run it is made for sets itself
        self.number = 0
        self.open = False
        self.loss = self.grads = self.grad_norm = self.lr = self.overflow = self.loss_scale = None
        self.scalars: dict[str, Any] | None = None
        self.logged_at = -1

    def __enter__(self) -> Step:
        self.open = True
        # The last step's values let go while the loop's own variables still hold them: its
        # next `train_step` frees them, as it would without us. Freed in `log` instead, a
        # PyNative tensor would make the monitor wait for the device queue (docs/performance.md).
        self.loss = self.grad_norm = self.lr = self.overflow = self.loss_scale = self.scalars = None
        # The data wait: a clock read and an addition, as the callback's step begin.
        self.step_begin = now = _perf_counter()
        self.data_wait += now - self.last_step_end
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        now = _perf_counter()
        self.open = False
        step = self.number
        if self.step < step < self.next_sample and exc is None and not self.wake:  # an unsampled step
            self.step, self.last_step_end = step, now
            self.finished[0] = step  # into the flight ring's shared memory (flight_recorder/)
            self.grads = None  # the gradients' memory is the training's again
            return
        self._owner._step_end(step, now, exc)


class Run:
    """A monitored custom-loop run; `otel_mindformers.start(...)` makes it. Use `step`, `log`,
    `should_stop`, `checkpoint_saved` and `end` (or `with ... as run:`)."""

    # Slots: `run.log` reads its step scope from this object itself, no instance dict.
    __slots__ = (
        "config", "_view", "_scope", "_run_context", "_monitors", "_loss_view", "_lr_view", "_lazy_lr", "_warned",
        "_first_step", "_pid", "_ended", "_run",
    )  # fmt: skip

    def __init__(
        self, config: MonitorConfig, loop: TrainingLoop, scope: Step, providers: Providers, monitors: list[BaseMonitor]
    ) -> None:
        self.config = config
        self._view: StepView = loop.step_view  # type: ignore[assignment]  # start() builds a StepView
        self._scope = scope
        scope._owner = self
        self._view["net_outputs"] = self._scope  # what a sampled step reads (LoggedReader)
        self._run_context = LoopRunContext(self._view)
        self._monitors = MonitorCalls(monitors)
        self._loss_view, self._lr_view = StepTensor(), StepTensor()  # what custom monitors read
        # The optimizer's rate for custom monitors, evaluated only when one reads it.
        self._lazy_lr = LazyLearningRate(loop.optimizer) if monitors and loop.optimizer is not None else None
        self._warned: set[str] = set()
        self._first_step = loop.first_step  # the job's step before this run's first
        self._pid = os.getpid()  # the process whose run it is (a forked child inherits the object)
        self._ended = False
        self._run: MonitorRun | None = None
        self._scope.next_sample = 0  # no run (yet): every step end is the run's to drop
        if config.enable:
            optimizer = loop.optimizer
            self._run = run = MonitorRun.start(config, loop, providers, clock=self._scope)
            # Per-parameter gradient norms where MindFormers' key for them asks (model state),
            # named by the optimizer's parameters: without one, none (said once, at start).
            per_parameter = bool(config.mindformers_native.get("local_norm_format"))
            if per_parameter and optimizer is None:
                per_parameter = False
                self._warn_once(
                    "local_norm", "local_norm_format asks for per-parameter gradient norms; the optimizer's "
                    "parameters name them: give otel_mindformers.start(optimizer=...), none are reported",
                )  # fmt: skip
            run.read_with(
                lambda wanted, local: LoggedReader(
                    wanted,
                    optimizer,
                    custom_scalars=not local,
                    per_parameter=per_parameter and not local,
                    step_now=lambda: scope.step,  # the step a sampled step's reader reads
                    grad_norm_asked=config.grad_norm is GradNorm.MEASURED and not local,
                )
            )
            for monitor in monitors:
                monitor.alert_engine = run.alerts

    # --- the loop's calls ----------------------------------------------------------------------
    def step(self, step: int) -> Step:
        """The context of training step `step` (the job's step, counted from 1; a resumed
        loop goes on from its checkpoint's). Its begin and end are the step's clock."""
        scope = self._scope
        try:
            scope.number = _index(step)  # an integer of any kind (numpy's too), as the flight ring stores it
        except (TypeError, ValueError):  # ValueError: a MindSpore tensor that holds no integer
            raise TypeError(f"run.step(step) takes the step's number, an integer; got {step!r}") from None
        return scope

    def log(
        self,
        loss: Any = None,
        grads: Any = None,
        grad_norm: Any = None,
        lr: Any = None,
        overflow: Any = None,
        loss_scale: Any = None,
        **scalars: Any,
    ) -> None:
        """What this step produced, as it comes (tensors or numbers): kept by reference, read
        back on sampled steps only. `grads`: the gradients `value_and_grad` returns (their
        global norm is computed on the device on sampled steps, unless `grad_norm` is given);
        `lr`: else the optimizer's, read on sampled steps; `overflow` / `loss_scale`: MindSpore
        AMP's (`all_finite`, `DynamicLossScaler.scale_value`); any other keyword: a custom
        scalar, written to the local outputs under its name. Called again in the same step, it
        adds to what the step logged (a value given again replaces the earlier one)."""
        scope = self._scope
        if not scope.open or scope.logged_at == scope.number:  # outside a step, or again in this one
            self._log_again(loss, grads, grad_norm, lr, overflow, loss_scale, scalars)
            return
        scope.loss, scope.grads, scope.grad_norm, scope.lr = loss, grads, grad_norm, lr
        scope.overflow, scope.loss_scale, scope.scalars, scope.logged_at = overflow, loss_scale, scalars, scope.number

    def _log_again(self, *given: Any) -> None:
        """`log` outside a step (dropped, said once), or a second `log` in a step: what it
        gives is added to the first call's values."""
        scope = self._scope
        if not scope.open:
            self._warn_once("log", "run.log(...) was called outside `with run.step(step):`; its values are dropped")
            return
        *named, scalars = given
        for field, value in zip(_LOGGED_FIELDS, named, strict=True):
            if value is not None:
                setattr(scope, field, value)
        if scalars:
            scope.scalars = {**scope.scalars, **scalars} if scope.scalars else scalars

    @property
    def should_stop(self) -> bool:
        """True once the monitor asks the loop to stop (an alert with `stop`, `stop_on_nonfinite`,
        a custom monitor's `request_stop`): break out of the loop, then `end()`."""
        return self._run_context.stop_requested

    @property
    def stop_reason(self) -> str | None:
        run = self._run
        return run.stop_reason if run is not None else None

    def checkpoint_saved(self, step: int | None = None, seconds: float = 0.0) -> None:
        """A checkpoint of job step `step` (default: the last finished step) was saved, taking
        `seconds`: a later attempt counts its lost steps from it (docs/restarts.md)."""
        run = self._run
        if run is None:
            return
        if step is None:
            if self._scope.step == 0:
                self._warn_once(
                    "checkpoint", "run.checkpoint_saved() was called before any step of this run finished: give "
                    "the step the checkpoint holds (checkpoint_saved(step=...)); nothing is recorded",
                )  # fmt: skip
                return
            step = self._scope.step
        try:
            held, took = _whole_number(step), float(seconds)
        except (TypeError, ValueError):
            self._warn_once(
                "checkpoint_args", "run.checkpoint_saved(step=%r, seconds=%r) takes an int step and a number of "
                "seconds: this checkpoint is not recorded", step, seconds,
            )  # fmt: skip
            return
        run.checkpoint_saved(held, took)

    def end(self, error: BaseException | None = None) -> None:
        """End the run: its last step sampled, every output flushed and closed. `error`: the
        exception that ended training (the crash reason). Called at exit if not before."""
        if self._ended:
            self._warn_once("end", "run.end() was called again; the run had already ended")
            return
        self._finish(error)

    # --- with otel_mindformers.start(...) as run: ---------------------------------------------
    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._ended:
            self._finish(exc)

    # --- inside -----------------------------------------------------------------------------------
    def _step_end(self, step: int, now: float, exc: Any) -> None:
        """A step end that is not a plain unsampled one: sampled, one that custom monitors,
        a stop or a capture want, a failed step, a step number that did not grow, or no run."""
        scope = self._scope
        run = self._run
        if run is None or exc is not None:  # no run, or the step failed: it did not finish
            scope.grads = None
            if self._ended and exc is None:  # a loop going on past `end()` (or its `with` block)
                self._warn_once(
                    "after_end", "run.step(%d) came after the run ended (run.end(), or the end of `with "
                    "otel_mindformers.start(...) as run:`): it is not recorded, nor are the steps after it. Keep "
                    "the whole loop inside the run", step,
                )  # fmt: skip
            return
        if step <= scope.step:
            self._backwards(step, scope.step)
            scope.grads = None
            return
        if step > _LARGEST_STEP:
            self._warn_once(
                "largest", "run.step(%d) is past the largest step a run records (2**63 - 1): it is not recorded", step
            )
            scope.grads = None
            return
        previous_end = scope.last_step_end
        scope.step, scope.last_step_end = step, now
        scope.finished[0] = step
        self._view["cur_step_num"] = step
        # Cleared before reading what set it: a wake set from here on is seen at the next step.
        scope.wake = False
        if self._monitors.monitors:  # they see every step end
            scope.wake = True
            self._feed_custom_monitors()
            self._monitors.call("on_train_step_end", self._run_context)
        if step >= scope.next_sample:
            view = self._view
            # The loop names no epochs: the step's, so the flight ring keeps what the line says
            # (`_name_epoch`, inline: a frame less on every sampled step).
            view["cur_epoch_num"] = (step - 1) // view["batch_num"] + 1 if view["batch_num"] else 1
            run.sample(view, step, previous_end, now)
        if run.stop_pending is not None:
            run.honour_stop(self._run_context)
        captures = run.captures
        if captures.active:  # a profile capture starts or steps at this boundary
            captures.on_step_end(step)
            if captures.active:
                scope.wake = True
        scope.grads = None

    def _name_epoch(self, step: int) -> None:
        """The loop names no epochs: step `step`'s (the last step, sampled at the end when the
        cadence did not sample it, would keep the epoch of the step sampled before it)."""
        view = self._view
        view["cur_epoch_num"] = (step - 1) // view["batch_num"] + 1 if view["batch_num"] else 1

    def _feed_custom_monitors(self) -> None:
        scope, view = self._scope, self._view
        if scope.loss is not None:
            view["train_loss"] = self._loss_view.at(scope.loss)
        if scope.lr is not None:
            view["learning_rate"] = self._lr_view.at(scope.lr)
        elif self._lazy_lr is not None:
            view["learning_rate"] = self._lazy_lr.at(max(0, scope.number - 1))

    def _backwards(self, step: int, last: int) -> None:
        scope = self._scope
        if step == last:
            if scope.step_begin < scope.last_step_end:
                # Entered before the last step ended: a `with run.step(n)` inside another one.
                self._warn_once(
                    "nested", "run.step(%d) was entered inside another `with run.step(...)`: steps do not nest "
                    "(one `with run.step(n):` around the whole step, its micro-batches included); the inner one "
                    "counted step %d and its data wait twice", step, step,
                )  # fmt: skip
                return
            self._warn_once(
                "repeated", "run.step(%d) again after step %d ended: one `with run.step(n):` per step, around all "
                "of its work and its run.log; this block is not recorded", step, step,
            )  # fmt: skip
            return
        if step < 1:
            self._warn_once(
                "below_one", "run.step(%d): step numbers count from 1 (the job's step: enumerate(..., start=1)); "
                "step %d is not recorded", step, step,
            )  # fmt: skip
            return
        # The quick start's loop counts its batches again in each epoch: say what to count.
        self._warn_once(
            "backwards", "run.step(%d) follows step %d: a step number must grow (the job's step, counted across "
            "epochs: epoch * steps_per_epoch + batch + 1, and on from start(initial_step=...) after a resume); "
            "step %d is not recorded (the first of these is said, the others are dropped too)", step, last, step,
        )  # fmt: skip

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _logger.warning("otel_mindformers: " + message, *args)

    def _finish(self, error: BaseException | None) -> None:
        global _active
        self._ended = True
        if os.getpid() != self._pid:  # a forked child leaving (its exit, a `with` it unwinds): not its run
            return
        atexit.unregister(self._at_exit)
        if _active is self:
            _active = None
        run, self._run = self._run, None
        self._scope.next_sample = 0  # steps after the end: dropped
        if run is None:
            return
        if error is None and self._scope.step == self._first_step:
            # `run.step(n)` called without `with` times nothing: the run would end empty, unsaid.
            self._warn_once(
                "no_steps", "the run ended and no step of it finished: is each step inside `with run.step(n):`?"
            )  # fmt: skip
        self._monitors.call("on_train_end", self._run_context)
        self._monitors.report_failures()
        self._name_epoch(self._scope.step)
        run.finish(self._view if error is None else None, error)

    def _at_exit(self) -> None:
        if not self._ended:
            # An uncaught exception's, where the interpreter kept it; else the script ran to its
            # end without `end()`: its loop is over, and the run ends as `end()` ends it.
            self._finish(_uncaught_exception())


def _uncaught_exception() -> BaseException | None:
    """The exception that ended the program, where the interpreter kept it (`sys.last_value`):
    one whose traceback starts at the program's top (its `__main__`, or runpy running it). A C
    extension that printed an error it had handled leaves one there too, raised deep inside
    (MindSpore 2.10 prints numpy's ImportError so at its first operation): not the end."""
    error = getattr(sys, "last_value", None)
    traceback = getattr(error, "__traceback__", None)
    if traceback is None:
        return None
    return error if traceback.tb_frame.f_globals.get("__name__") in ("__main__", "runpy") else None


def _whole_number(value: Any) -> int:
    """An int of any integer type (numpy's too), or a whole float; TypeError or ValueError else."""
    try:
        return _index(value)
    except TypeError:
        whole = float(value) if isinstance(value, numbers.Real) else math.nan
        if whole.is_integer():
            return int(whole)
        raise


def start(
    config: Any = None,
    *,
    optimizer: Any = None,
    network: Any = None,
    dataset: Any = None,
    batch_size: int | None = None,
    epochs: int = 0,
    steps_per_epoch: int = 0,
    initial_step: int = 0,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    logger_provider: Any = None,
    **overrides: Any,
) -> Run:
    """Start monitoring a custom training loop; returns the `Run` its steps go through.

    `config`: what MonitorCallback takes (a YAML path, a mapping, a MonitorConfig), or None:
    the defaults (`otel_mindformers.start` reads `OTEL_PYTHON_MINDFORMERS_CONFIG` first); keyword overrides of
    `monitor_config` keys as MonitorCallback's. `optimizer`: the learning rate (when `log` is
    given none) and what needs the optimizer; `network`: the model (MFU's model config);
    `dataset` or `batch_size`: samples per step; `epochs` × `steps_per_epoch`: the run's
    length (ETA); `initial_step`: the steps done before this run (a resumed loop's checkpoint
    step). A bad key raises ConfigError, a second `start()` while a run is going ValueError,
    both before training."""
    global _active
    if _active is not None:
        raise ValueError(
            "otel_mindformers.start() was called while another run of this process is going: end() it first "
            "(or use `with otel_mindformers.start(...) as run:`)"
        )
    counts = {"initial_step": initial_step, "epochs": epochs, "steps_per_epoch": steps_per_epoch}
    if batch_size is not None:
        counts["batch_size"] = batch_size
    for name, value in counts.items():  # numpy's integers too: what the outputs store is an int
        try:
            counts[name] = _whole_number(value)
        except (TypeError, ValueError):
            raise TypeError(f"otel_mindformers.start({name}={value!r}): takes an int") from None
        if counts[name] < 0:
            raise ValueError(f"otel_mindformers.start({name}={value!r}): takes an int >= 0")
    initial_step, epochs, steps_per_epoch = counts["initial_step"], counts["epochs"], counts["steps_per_epoch"]
    batch_size = counts.get("batch_size")
    monitor_config = load_monitor_config(config)
    if overrides:
        monitor_config = monitor_config.with_overrides(**overrides)
    if tracer_provider is None and monitor_config.enable:
        config_file.configure_for(monitor_config)  # OTEL_CONFIG_FILE, as MonitorCallback does
    monitor_cls = load_monitor_class(monitor_config)
    if monitor_cls is not None:
        prepare_output_paths(monitor_config)  # a custom monitor may open its files when built
    monitors = [build_monitor(monitor_cls, monitor_config)] if monitor_cls else []
    view = StepView(
        cur_step_num=initial_step, cur_epoch_num=None, epoch_num=epochs, batch_num=steps_per_epoch,
        optimizer=optimizer, network=network, train_network=None, train_dataset=dataset,
    )  # fmt: skip
    scope = Step()
    loop = TrainingLoop(
        network=network, train_network=None, optimizer=optimizer, dataset=dataset,
        batch_size=batch_size if batch_size is not None else batch_size_of(dataset), epochs=epochs,
        steps_per_epoch=steps_per_epoch, steps_done=initial_step, step_offset=0, callbacks=(), step_view=view,
        checkpoint_step=lambda: scope.step,  # the last finished step: a save between steps holds it
        last_step=epochs * steps_per_epoch,  # named: sampled with its gradients, not by end()
    )  # fmt: skip
    providers = Providers(
        tracer_provider=tracer_provider, meter_provider=meter_provider, logger_provider=logger_provider,
        checked_exporters=None,  # built once, as the run starts
    )  # fmt: skip
    run = Run(monitor_config, loop, scope, providers, monitors)
    _active = run
    atexit.register(run._at_exit)
    run._monitors.call("on_train_begin", run._run_context)
    return run


__all__ = ["Run", "Step", "start"]
