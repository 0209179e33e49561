"""`MonitorCallback`: the MindSpore Callback that turns training steps into telemetry.

Cost model:
- every step: `on_train_step_end` reads the clock, stores the step number, compares it with
  the next sampled step and returns — no device readback, no allocation, no I/O;
- sampled steps (every `interval`-th step, plus the first and the last): one readback of the
  step's outputs, a step span, the instruments, alert rules, and one record put on the
  writer thread's queue.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, Status, StatusCode

from mindspore.train import Callback

from otel_mindformers import record as rec
from otel_mindformers import semconv
from otel_mindformers.config import MonitorConfig, load_monitor_config
from otel_mindformers.extract import OutputReader, learning_rate_tensor, optimizer_of
from otel_mindformers.identity import Identity, detect_identity
from otel_mindformers.monitor import BaseMonitor, load_monitor_class
from otel_mindformers.outputs import BackgroundDispatcher, build_sinks
from otel_mindformers.record import StepRecord
from otel_mindformers.telemetry.instruments import TrainingInstruments
from otel_mindformers.telemetry.lazy_span import LazySpan
from otel_mindformers.telemetry.providers import Telemetry, build_telemetry

_logger = logging.getLogger(__name__)


class StepClock:
    """Progress shared with the stall watchdog: written every step, read off-thread."""

    __slots__ = ("step", "last_step_end")

    def __init__(self) -> None:
        self.step = 0
        self.last_step_end = time.perf_counter()  # the hot path's one clock


def launcher_context() -> otel_context.Context:
    """W3C trace context handed down by the launcher in TRACEPARENT/TRACESTATE/BAGGAGE
    (the OTel environment-carrier convention; msrun passes its environment to workers)."""
    carrier = {
        header: os.environ[var]
        for header, var in (("traceparent", "TRACEPARENT"), ("tracestate", "TRACESTATE"), ("baggage", "BAGGAGE"))
        if var in os.environ
    }
    return propagate.extract(carrier)


class MonitorCallback(Callback):
    """Monitoring driven by `monitor_config`.

    `config` is a MonitorConfig, a YAML path, a mapping, or None for the defaults. Other
    keyword arguments override `monitor_config` keys (`MonitorCallback(cfg, interval=5)`; a
    MindFormers YAML `callbacks:` entry passes its keys this way). Providers passed as keyword
    arguments (tests, the instrumentor) take precedence over the global ones, which take
    precedence over providers built from the config.
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
            self.config = load_monitor_config({**dataclasses.asdict(self.config), **overrides})
        self._providers = {
            "tracer_provider": tracer_provider,
            "meter_provider": meter_provider,
            "logger_provider": logger_provider,
        }
        monitor_cls = load_monitor_class(self.config)
        self.custom_monitors: list[BaseMonitor] = [monitor_cls(self.config)] if monitor_cls else []
        self.progress = StepClock()
        self.identity: Identity | None = None
        self.stop_reason: str | None = None
        self._running = False

    # --- lifecycle ---------------------------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if not self.config.enable or self._running:
            return
        cb_params = run_context.original_args()
        config = self.config
        self.identity = identity = detect_identity()
        self._reports_training = config.reports_training_metrics(identity.rank)
        self._telemetry: Telemetry = build_telemetry(config, identity, **self._providers)
        self._instruments = TrainingInstruments(self._telemetry.meter, identity.point_attributes())
        self._reader = OutputReader(
            config.monitored_metrics if self._reports_training else [], config.grad_monitor
        )
        self._dispatcher = BackgroundDispatcher(build_sinks(config, identity, self._reports_training))
        self._devices = self._start_devices()

        self._interval = config.interval
        self._epoch_steps = int(cb_params.get("batch_num") or 0)
        self._last_step = int(cb_params.get("epoch_num") or 0) * self._epoch_steps
        first_step = int(cb_params.get("cur_step_num") or 0)
        self._next_sample = first_step + 1  # the first step is always sampled
        self._batch_size, self._tokens_per_sample = self._batch_geometry(cb_params)
        self._wants_time = rec.STEP_TIME in config.monitored_metrics
        self._wants_throughput = {rec.SAMPLES_PER_SECOND, rec.TOKENS_PER_SECOND} & set(
            config.monitored_metrics
        )

        # One clock for the hot path; wall time derived from it only on sampled steps.
        self._perf0, self._wall0 = time.perf_counter(), time.time()
        self._window_start, self._window_step = self._perf0, first_step
        self.progress.step, self.progress.last_step_end = first_step, self._perf0
        # After the clock is set: the stall watchdog arms at the first step finished after it.
        self._alerts = self._start_alerts()
        for monitor in self.custom_monitors:
            monitor.alert_engine = self._alerts

        self._run_span = self._telemetry.tracer.start_span(
            semconv.SPAN_RUN,
            context=launcher_context(),
            attributes={**identity.attributes(), "training.epochs": int(cb_params.get("epoch_num") or 0)},
        )
        self._run_context = trace.set_span_in_context(self._run_span)
        self._epoch_span = None
        self._running = True
        atexit.register(self._finish_at_exit)
        self._call_custom("on_train_begin", run_context)

    def on_train_epoch_begin(self, run_context: Any) -> None:
        if not self._running:
            return
        epoch = int(run_context.original_args().get("cur_epoch_num") or 0)
        self._epoch_span = self._telemetry.tracer.start_span(
            semconv.SPAN_EPOCH, context=self._run_context, attributes={semconv.ATTR_EPOCH: epoch}
        )

    def on_train_step_end(self, run_context: Any) -> None:
        if not self._running:
            return
        now = time.perf_counter()
        cb_params = run_context.original_args()
        # Indexed, not `cb_params.cur_step_num`: that attribute goes through a failed lookup
        # and a Python __getattr__, measured at ~25 us per step inside Model.train.
        step = cb_params["cur_step_num"]
        progress = self.progress
        previous_end = progress.last_step_end
        progress.step, progress.last_step_end = step, now
        if self.custom_monitors:
            self._feed_custom_monitors(cb_params)
            self._call_custom("on_train_step_end", run_context)
        if step >= self._next_sample or step >= self._last_step:
            self._sample(run_context, cb_params, step, previous_end, now)

    def on_train_epoch_end(self, run_context: Any) -> None:
        if not self._running:
            return
        self._call_custom("on_train_epoch_end", run_context)
        if self._epoch_span is not None:
            self._epoch_span.end()
            self._epoch_span = None

    def on_train_end(self, run_context: Any) -> None:
        if not self._running:
            return
        self._call_custom("on_train_end", run_context)
        self._finish(error=None)

    # MindSpore enters callbacks as context managers: __exit__ sees a training exception,
    # which on_train_end never does. The exception itself propagates unchanged.
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._running and exc is not None:
            self._finish(error=exc)

    # --- sampled steps -------------------------------------------------------------------------
    def _sample(self, run_context: Any, cb_params: Any, step: int, previous_end: float, now: float) -> None:
        self._next_sample = (step // self._interval + 1) * self._interval
        steps = max(1, step - self._window_step)
        elapsed = now - self._window_start
        step_seconds = elapsed / steps
        self._window_start, self._window_step = now, step

        values: dict[str, float | bool] = {}
        if self._reader.reads_anything:
            values = self._reader.read(cb_params, step)
        if self._wants_time:
            values[rec.STEP_TIME] = step_seconds * 1000.0
        if self._wants_throughput and elapsed > 0 and self._batch_size:
            samples = self._batch_size * steps / elapsed
            if rec.SAMPLES_PER_SECOND in self._wants_throughput:
                values[rec.SAMPLES_PER_SECOND] = samples
            if rec.TOKENS_PER_SECOND in self._wants_throughput and self._tokens_per_sample:
                values[rec.TOKENS_PER_SECOND] = samples * self._tokens_per_sample
        record = StepRecord(
            step=step,
            epoch=self._epoch_of(cb_params, step),
            rank=self.identity.rank,
            time_stamp=self._wall0 + (now - self._perf0),
            steps_in_window=steps,
            values=values,
            device=self._devices.snapshot() if self._devices is not None else {},
            is_last=step >= self._last_step,
        )
        def start_span() -> Span:
            return self._telemetry.tracer.start_span(
                semconv.SPAN_STEP,
                # A trace per step, linked to the run span: traces stay small and tail sampling
                # can keep anomalous steps without buffering a whole run.
                context=otel_context.Context(),
                links=[Link(self._run_span.get_span_context())],
                start_time=self._epoch_ns(previous_end),
                attributes=record.span_attributes(),
            )

        # Steps that `step_spans` skips still get their span if an anomaly is recorded on them.
        span = start_span() if self._wants_span(record) else LazySpan(start_span)
        with trace.use_span(span, end_on_exit=False):
            self._instruments.record(record, step_seconds)
            if record.nonfinite():
                span.set_status(Status(StatusCode.ERROR, f"non-finite {', '.join(record.nonfinite())}"))
            stop_reason = self._alerts.evaluate(record, span) if self._alerts is not None else None
        span.end(end_time=self._epoch_ns(now))
        self._dispatcher.submit(record)
        if stop_reason and self.stop_reason is None:
            self.stop_reason = stop_reason
            self._run_span.add_event("early_stop", {"reason": stop_reason, semconv.ATTR_STEP: step})
            self._run_span.set_attribute(semconv.ATTR_STOP_REASON, stop_reason)
            _logger.warning("otel_mindformers: stopping training at step %d: %s", step, stop_reason)
            run_context.request_stop()

    def _wants_span(self, record: StepRecord) -> bool:
        """`step_spans`: true, false, or every N-th step plus the last. (Anomalous steps get
        theirs regardless, through LazySpan.)"""
        every = self.config.step_spans
        if isinstance(every, bool):
            return every
        return record.step % every == 0 or record.is_last

    def _epoch_of(self, cb_params: Any, step: int) -> int:
        epoch = cb_params.get("cur_epoch_num")
        if epoch:
            return int(epoch)
        return (step - 1) // self._epoch_steps + 1 if self._epoch_steps else 1

    def _epoch_ns(self, perf: float) -> int:
        return int((self._wall0 + (perf - self._perf0)) * 1e9)

    def _batch_geometry(self, cb_params: Any) -> tuple[int | None, int | None]:
        """Samples per step and tokens per sample, from metadata only (no readback).

        Tokens per sample come from `tokens_per_sample` (the MindFormers integration fills it
        from the model's `seq_length`); a generic dataset does not say which column is text.
        """
        dataset = cb_params.get("train_dataset")
        try:
            batch_size = int(dataset.get_batch_size()) if dataset is not None else None
        except Exception:  # a dataset without batch metadata: no throughput, not a failure
            batch_size = None
        return batch_size, self.config.tokens_per_sample

    # --- collaborators ---------------------------------------------------------------------------
    def _start_devices(self) -> Any:
        if not self.config.device_monitor:
            return None
        from otel_mindformers.devices import DeviceTelemetry

        return DeviceTelemetry.start(self.config, self.identity, self._telemetry.meter)

    def _start_alerts(self) -> Any:
        if not self.config.alert_config.enable_alert:
            return None
        from otel_mindformers.alerts import AlertEngine

        return AlertEngine.start(self.config, self.identity, self._telemetry, self.progress)

    def _feed_custom_monitors(self, cb_params: Any) -> None:
        """The article's custom monitor reads `train_loss` and `learning_rate` tensors."""
        handles = self._reader.split(cb_params.get("net_outputs"))
        if rec.LOSS in handles:
            cb_params.train_loss = handles[rec.LOSS]
        lr = handles.get(rec.LEARNING_RATE)
        if lr is None:
            optimizer = optimizer_of(cb_params)
            if optimizer is not None:
                lr = learning_rate_tensor(optimizer, max(0, int(cb_params.get("cur_step_num") or 1) - 1))
        if lr is not None:
            cb_params.learning_rate = lr

    def _call_custom(self, hook: str, run_context: Any) -> None:
        for monitor in self.custom_monitors:
            getattr(monitor, hook)(run_context)

    # --- shutdown ----------------------------------------------------------------------------------
    def _finish(self, error: BaseException | None) -> None:
        self._running = False
        atexit.unregister(self._finish_at_exit)
        timeout = self.config.shutdown_timeout
        if self._epoch_span is not None:
            self._epoch_span.end()
        if error is not None:
            self._run_span.record_exception(error)
            self._run_span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self._run_span.set_attribute(semconv.ATTR_STEP, self.progress.step)
        self._run_span.end()
        if self._alerts is not None:
            self._alerts.shutdown(timeout)
        if self._devices is not None:
            self._devices.shutdown()
        self._dispatcher.close(timeout)
        self._telemetry.close(timeout)

    def _finish_at_exit(self) -> None:
        if self._running:
            self._finish(error=RuntimeError("the process exited before training ended"))


class OtelCallback(MonitorCallback):
    """`MonitorCallback` under the name MindFormers YAMLs use in `callbacks: - type: OtelCallback`."""
