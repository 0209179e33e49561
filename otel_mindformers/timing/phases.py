"""Phases: the named stretches of a run's wall time that are not training steps.

`phase("reshard")` marks one, as a context manager or a decorator. Inside a monitored run
its span is a child of the epoch span (else the run span; a phase inside a phase is a child
of the outer one), carries `training.phase` and the rank attributes, and is the current span
on the calling thread while the phase runs, so logs and spans made inside it belong to it. On
the training thread it also sets the run's `StepClock.phase` (what a stall dump reports) and
restores it after. Its duration goes to the `mindformers.phase.duration` histogram and, for
an outermost phase on the training thread, to the run's time ledger (goodput).

Outside a monitored run a phase still works: its span comes from the global tracer
provider (a no-op unless the process configured the OTel SDK, e.g. under
`opentelemetry-instrument`), parented on the current span. It is also remembered (the last
`PENDING_LIMIT`), and the next run in the process records it: a checkpoint loaded before
training starts is part of that run's start-up, so it shows in its breakdown and histogram,
and as a child of its run span when the global tracer did not record it.

The built-in phases (start-up, compile, data wait, evaluation, checkpoint save and load)
go through the same `PhaseRecorder`.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_mindformers.core.record import PhaseInterval
from otel_mindformers.names import phases as phase_names

# Phases finished outside any run that the next run picks up (a bound: phases in a loop
# between runs must not grow memory).
PENDING_LIMIT = 64

_F = TypeVar("_F", bound=Callable[..., Any])

# The phase open on this thread/task, so a nested one parents on it.
_open_phase: contextvars.ContextVar[phase | None] = contextvars.ContextVar("otel_mindformers_phase", default=None)


# (phase, whether the global tracer exported its span)
_pending: deque[tuple[PhaseInterval, bool]] = deque(maxlen=PENDING_LIMIT)
_active: PhaseRecorder | None = None


class PhaseRecorder:
    """One run's phases: spans under the run, the duration histogram, the training thread's
    clock, and where the seconds lost per phase go (`on_lost`, called on the training thread).

    `parent()` returns the context new top-level phases start in (the epoch span's, else the
    run span's); `on_lost(name, seconds)` is told each outermost training-thread phase."""

    def __init__(
        self,
        *,
        tracer: trace.Tracer,
        histogram: Any,
        parent: Callable[[], otel_context.Context],
        span_attributes: Mapping[str, Any],
        point_attributes: Mapping[str, Any],
        clock: Any,
        on_lost: Callable[[str, float], None],
    ) -> None:
        self.tracer = tracer
        self._histogram = histogram
        self.parent = parent
        self._span_attributes = dict(span_attributes)
        self._point_attributes = dict(point_attributes)
        self.clock = clock
        self._on_lost = on_lost
        self.training_thread = threading.get_ident()

    def span_attributes(self, name: str, extra: Mapping[str, Any]) -> dict[str, Any]:
        return {**self._span_attributes, **extra, phase_names.ATTR_PHASE: name}

    def observe(self, name: str, seconds: float) -> None:
        """One histogram observation (any thread)."""
        self._histogram.record(seconds, {**self._point_attributes, phase_names.ATTR_PHASE: name})

    def finished(self, name: str, seconds: float, *, outermost: bool) -> None:
        self.observe(name, seconds)
        if outermost and threading.get_ident() == self.training_thread:
            self._on_lost(name, seconds)

    def finished_interval(self, interval: PhaseInterval) -> None:
        """A phase a wrapper timed on the calling thread: recorded, and counted as lost time
        when that is the training thread."""
        self.record(interval)
        if threading.get_ident() == self.training_thread:
            self._on_lost(interval.name, interval.seconds)

    def record(self, interval: PhaseInterval) -> None:
        """A phase known from timestamps: its span and one observation. Any thread (the
        pipeline's worker records the built-in ones); the time ledger is the caller's."""
        if interval.traced:
            span = self.tracer.start_span(
                phase_names.SPAN_PREFIX + interval.name,
                context=self.parent(),
                attributes=self.span_attributes(interval.name, interval.attributes),
                start_time=int(interval.start_wall * 1e9),
            )
            span.end(end_time=int(interval.end_wall * 1e9))
        self.observe(interval.name, interval.seconds)

    def activate(self) -> list[PhaseInterval]:
        """Make this the recorder `phase()` uses; returns the phases that ended before the run
        (already observed here, and given a span under the run when none was exported)."""
        global _active
        _active = self
        before = list(_pending)
        _pending.clear()
        for done, exported in before:
            if exported:
                self.observe(done.name, done.seconds)
            else:
                self.record(done)
        return [done for done, _ in before]

    def deactivate(self) -> None:
        global _active
        if _active is self:
            _active = None


def active_recorder() -> PhaseRecorder | None:
    return _active


def open_phase_name() -> str | None:
    """The name of the phase open in this thread/task, if any."""
    current = _open_phase.get()
    return current.name if current is not None else None


class phase:
    """Mark a phase of the run: `with otel_mindformers.phase("reshard", shards=8): ...` or
    `@otel_mindformers.phase("eval_hook")`. Keyword arguments become span attributes.

    Exceptions propagate unchanged; the span records them and gets an error status.
    """

    def __init__(self, name: str, **attributes: Any) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"otel_mindformers.phase: the name must be a non-empty string, got {name!r}")
        self.name = name
        self.attributes = attributes
        self._entered: tuple[Any, ...] | None = None
        self._exported = False

    def __call__(self, function: _F) -> _F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(self.name, **self.attributes):  # a fresh one per call: reentrant, thread-safe
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def set_attributes(self, **attributes: Any) -> None:
        """Add span attributes while the phase is open (a result known only at its end)."""
        if self._entered is not None:
            self._entered[2].set_attributes(attributes)

    def __enter__(self) -> phase:
        if self._entered is not None:
            raise RuntimeError(f"otel_mindformers.phase({self.name!r}) is already open; use a new one")
        recorder = _active
        outer = _open_phase.get()
        start_perf, start_wall = time.perf_counter(), time.time()
        if recorder is not None:
            context = otel_context.get_current() if outer is not None else recorder.parent()
            span = recorder.tracer.start_span(
                phase_names.SPAN_PREFIX + self.name,
                context=context,
                attributes=recorder.span_attributes(self.name, self.attributes),
                start_time=int(start_wall * 1e9),
            )
        else:
            span = trace.get_tracer("otel_mindformers").start_span(
                phase_names.SPAN_PREFIX + self.name,
                attributes={**self.attributes, phase_names.ATTR_PHASE: self.name},
                start_time=int(start_wall * 1e9),
            )
        use = trace.use_span(span, end_on_exit=False, record_exception=True, set_status_on_exception=True)
        use.__enter__()
        token = _open_phase.set(self)
        previous_phase = None
        if recorder is not None and threading.get_ident() == recorder.training_thread:
            previous_phase, recorder.clock.phase = recorder.clock.phase, self.name
        self._entered = (recorder, outer, span, use, token, previous_phase, start_perf, start_wall)
        self._exported = span.is_recording()  # asked before the span ends, which makes it False
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._entered is not None, "phase.__exit__ without __enter__"
        recorder, outer, span, use, token, previous_phase, start_perf, start_wall = self._entered
        self._entered = None
        seconds = time.perf_counter() - start_perf
        try:
            use.__exit__(exc_type, exc, tb)  # records the exception and the error status
        finally:
            # The span lasts exactly the seconds the ledger counts: its own clock reads would
            # be a few calls away from ours (milliseconds on a loaded machine).
            span.end(end_time=int((start_wall + seconds) * 1e9))
            _open_phase.reset(token)
            if previous_phase is not None:
                recorder.clock.phase = previous_phase
            if recorder is not None:
                recorder.finished(self.name, seconds, outermost=outer is None)
            elif outer is None:
                done = PhaseInterval(self.name, start_wall, start_wall + seconds, seconds, dict(self.attributes))
                _pending.append((done, self._exported))


__all__ = ["PhaseRecorder", "active_recorder", "open_phase_name", "phase"]
