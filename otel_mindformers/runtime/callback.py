"""`MonitorCallback`: the MindSpore Callback that turns training steps into telemetry.

Every step only reads clocks and the run's StepClock (core/clock.py: the one object the
step hooks touch); a sampled step adds one readback of its outputs (on `report_ranks`) and
one put on the pipeline's bounded queue, whose worker thread (pipeline.py) does the rest.
The cost model and its measurements: docs/performance.md.

The callback holds the configuration and the custom monitors, which outlive a run; what a
run owns lives in a `MonitorRun` (run.py) that exists only while the run does.
"""

from __future__ import annotations

import atexit
import os
import time
from typing import Any

from mindspore.train import Callback

from otel_mindformers.config import GradNorm, MonitorConfig, load_monitor_config
from otel_mindformers.core.clock import StepClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.paths import prepare_output_paths
from otel_mindformers.runtime.custom_monitors import BaseMonitor, MonitorCalls, build_monitor, load_monitor_class
from otel_mindformers.runtime.extract import LazyLearningRate, OutputReader, StepTensor
from otel_mindformers.runtime.parts import Providers
from otel_mindformers.runtime.run import MonitorRun
from otel_mindformers.runtime.training_loop import TrainingLoop
from otel_mindformers.telemetry import config_file
from otel_mindformers.telemetry.providers import CheckedExporters, check_own_exporters

_logger = get_logger(__name__)

# Bound once: inside Model.train every lookup the step hook makes is cold (docs/performance.md).
_perf_counter = time.perf_counter

_CUSTOM_HOOKS = ("on_train_begin", "on_train_step_end", "on_train_epoch_end", "on_train_end")


class MonitorCallback(Callback):
    """Monitoring driven by `monitor_config`: pass it to `Model.train` / `Model.fit`
    (`callbacks=[MonitorCallback(cfg)]`) or name it in a MindFormers YAML's `callbacks:`.

    What it records, on the first step, every `interval`-th and the last (the sampled steps),
    on the ranks `report_ranks` names (rank 0 by default; the others report hardware):
      - the training values `monitored_metrics` lists: loss, learning rate, global grad norm
        (`grad_monitor`), step time, samples / tokens per second, overflow and loss scale,
        goodput, MFU / TFLOPS and ETA (names/training.py; docs/telemetry.md);
      - a `mindformers.train.step` span per sampled step (in its own trace, linked to the
        run span), epoch and phase spans (start-up, compile, data wait, checkpoint, evaluation);
      - NPU / GPU / host readings with `device_monitor` (observable gauges, off the training
        thread), the job's attempts and goodput (`restarts`), per-rank section times
        (stragglers), alerts and early stop (`alert_config`), captures on demand;
    to each output of `output_type`: stdout, a JSON-lines file per rank, TensorBoard, OTLP,
    Prometheus. Every step costs two clock reads; a sampled step one readback and one put on
    a bounded queue (docs/performance.md).

    `config` is a MonitorConfig, a YAML path, a mapping, or None for the defaults. Other
    keyword arguments override `monitor_config` keys (`MonitorCallback(cfg, interval=5)`; a
    MindFormers YAML `callbacks:` entry passes its keys this way). Providers passed as keyword
    arguments (tests, the instrumentor) take precedence over the global ones, which take
    precedence over providers built from the config; with `OTEL_CONFIG_FILE` set (OTel's
    declarative configuration) the process's providers come from that file, configured here
    if nothing did before. A bad key, or a file that cannot be used, raises `ConfigError`
    here, before training. Read on: docs/configuration.md (every key), docs/telemetry.md (every
    name), docs/custom_monitors.md (the `BaseMonitor` hooks and their threads).
    """

    def __init__(
        self,
        config: Any = None,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        logger_provider: Any = None,
        **overrides: Any,
    ) -> None:
        super().__init__()
        self.config: MonitorConfig = load_monitor_config(config)
        if overrides:
            self.config = self.config.with_overrides(**overrides)
        self._providers = Providers(
            tracer_provider=tracer_provider, meter_provider=meter_provider, logger_provider=logger_provider,
            checked_exporters=None,
        )  # fmt: skip
        self._checked_exporters = CheckedExporters(None)  # the first run's, built by the check
        if tracer_provider is None and self.config.enable:
            # OTEL_CONFIG_FILE: the process's SDK from that file, now, before training (a
            # file that cannot be used raises its ConfigError here); telemetry/config_file.py.
            config_file.configure_for(self.config)
            self._checked_exporters = check_own_exporters(self.config.telemetry)
        monitor_cls = load_monitor_class(self.config)
        if monitor_cls is not None:
            # A custom monitor may open its files when it is built (the monitor_config article's opens
            # json_log_path): the output folders must exist by then.
            prepare_output_paths(self.config)
        self.custom_monitors: list[BaseMonitor] = [build_monitor(monitor_cls, self.config)] if monitor_cls else []
        self._run: MonitorRun | None = None
        self._pid = 0  # the process that started the run (on_train_begin)
        self._clock: Any = None
        self._monitor_calls = MonitorCalls(self.custom_monitors)
        self._lazy_lr: LazyLearningRate | None = None
        self._loss_view, self._lr_view = StepTensor(), StepTensor()  # what custom monitors read
        self._handles = OutputReader([], GradNorm.IF_RETURNED)
        # Model.train hands every hook of a run the same run_context and cb_params: the step
        # hook compares the context and reuses them (no method call on unsampled steps).
        self._run_context: Any = None
        self._cb_params: Any = None
        self._hot: StepClock | None = None  # the run's StepClock while it runs: all the step hooks read
        self.identity: Identity | None = None
        self.stop_reason: str | None = None

    @property
    def progress(self) -> Any:
        """The StepClock (`.step`, `.last_step_end`, `.phase`) of the current run, or of the
        last one once it ended; None before the first run."""
        return self._clock

    # --- lifecycle ---------------------------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if not self.config.enable or self._run is not None:
            return
        cb_params = run_context.original_args()
        providers: Providers = {**self._providers, "checked_exporters": self._checked_exporters.take()}
        self._run = run = MonitorRun.start(self.config, TrainingLoop.of_model_train(cb_params), providers)
        self._run_context, self._cb_params = run_context, cb_params
        self._clock = self._hot = run.clock
        self.identity, self.stop_reason = run.identity, None
        optimizer = run.loop.optimizer if self.custom_monitors else None
        self._lazy_lr = (
            LazyLearningRate(optimizer, run.inputs.reader.scheduled, cb_params) if optimizer is not None else None
        )
        for monitor in self.custom_monitors:
            monitor.alert_engine = run.alerts
        self._pid = os.getpid()  # the process whose run it is (a forked child inherits the exit handler)
        atexit.register(self._finish_at_exit)
        self._call_custom("on_train_begin", run_context)

    def on_train_epoch_begin(self, run_context: Any) -> None:
        if self._run is not None:
            self._run.begin_epoch(int(run_context.original_args().get("cur_epoch_num") or 0))

    def on_train_step_begin(self, run_context: Any) -> None:
        clock = self._hot
        if clock is None:
            return
        if clock.step >= clock.arm_after:  # before a sampled step the gradient-norm reader asked for
            clock.arm()
        # The data wait: a clock read and an addition (timing/timeline.py turns it into a phase).
        clock.step_begin = now = _perf_counter()
        clock.data_wait += now - clock.last_step_end

    def on_train_step_end(self, run_context: Any) -> None:
        clock = self._hot
        if clock is None:
            return
        now = _perf_counter()
        cb_params = self._cb_params if run_context is self._run_context else run_context.original_args()
        # Indexed, not `cb_params.cur_step_num`: that attribute goes through a failed lookup
        # and a Python __getattr__ (docs/performance.md, what the hot path stopped doing).
        step = cb_params["cur_step_num"] + clock.step_offset  # the job's step (job/resume.py)
        previous_end = clock.last_step_end
        clock.step, clock.last_step_end = step, now
        clock.finished[0] = step  # into the flight ring's shared memory: a kill cannot lose it (flight_recorder/)
        if step < clock.next_sample and not clock.wake:
            return
        # A sampled step, or one that custom monitors, a stop or a capture want (in this
        # frame: a call of its own would cost a sampled step a cold frame).
        run: MonitorRun = self._run  # type: ignore[assignment]  # set with self._hot
        # Cleared before reading what set it: a wake set from here on is seen at the next step.
        clock.wake = False
        if self.custom_monitors:  # they see every step end (the first one is always sampled)
            clock.wake = True
            self._feed_custom_monitors(cb_params, step)
            self._call_custom("on_train_step_end", run_context)
        if step >= clock.next_sample:
            run.sample(cb_params, step, previous_end, now)
        if run.stop_pending is not None:
            run.honour_stop(run_context)
            self.stop_reason = run.stop_reason
        captures = run.captures
        if captures.active:  # a profile capture starts or steps at this boundary
            captures.on_step_end(step)
            if captures.active:
                clock.wake = True

    def on_eval_begin(self, run_context: Any) -> None:
        if self._run is not None:  # Model.fit's validation; a Model.eval outside training is no phase
            self._run.timeline.begin_evaluation()

    def on_eval_end(self, run_context: Any) -> None:
        if self._run is not None:
            self._run.timeline.end_evaluation(run_context.original_args().get("eval_results"))

    def on_train_epoch_end(self, run_context: Any) -> None:
        if self._run is None:
            return
        self._call_custom("on_train_epoch_end", run_context)
        self._run.end_epoch()

    def on_train_end(self, run_context: Any) -> None:
        if self._run is None:
            return
        self._call_custom("on_train_end", run_context)
        self._finish(run_context.original_args(), error=None)

    # MindSpore enters callbacks as context managers: __exit__ sees a training exception,
    # which on_train_end never does. The exception itself propagates unchanged.
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._run is not None and exc is not None:
            self._finish(None, error=exc)

    # --- custom monitors ---------------------------------------------------------------------
    def _feed_custom_monitors(self, cb_params: Any, step: int) -> None:
        """The monitor_config article's custom monitor reads `train_loss` and `learning_rate` tensors; both
        cost nothing until read (the learning rate is evaluated on first read), and a one-element
        one reads back as a 0-d array, which `float()` takes under numpy 2 too (extract.py)."""
        handles = self._handles.split(cb_params.get("net_outputs"))
        if tm.LOSS in handles:
            cb_params.train_loss = self._loss_view.at(handles[tm.LOSS])
        lr: Any = None
        if tm.LEARNING_RATE in handles:
            lr = self._lr_view.at(handles[tm.LEARNING_RATE])
        elif self._lazy_lr is not None:
            lr = self._lazy_lr.at(max(0, step - 1))
        if lr is not None:
            cb_params.learning_rate = lr

    def _call_custom(self, hook: str, run_context: Any) -> None:
        self._monitor_calls.call(hook, run_context)

    # --- shutdown ----------------------------------------------------------------------------------
    def _finish(self, cb_params: Any, error: BaseException | None) -> None:
        run = self._run
        if run is None or os.getpid() != self._pid:
            # No run, or a forked child leaving (its exit handlers, Model.train's unwinding):
            # the run, its flight ring and its files are the parent's.
            return
        atexit.unregister(self._finish_at_exit)
        self._monitor_calls.report_failures()
        try:
            run.finish(cb_params, error)
        finally:
            self._run = self._run_context = self._cb_params = self._hot = None
        self.stop_reason = run.stop_reason

    def _finish_at_exit(self) -> None:
        if self._run is not None:
            self._finish(None, error=RuntimeError("the process exited before training ended"))


class OtelCallback(MonitorCallback):
    """`MonitorCallback` under the name MindFormers YAMLs use in `callbacks: - type: OtelCallback`."""


__all__ = ["MonitorCallback", "OtelCallback"]
