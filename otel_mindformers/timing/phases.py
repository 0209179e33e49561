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

What the calling thread pays (docs/performance.md): once the run's pipeline is up and its
tracer takes preset ids (`PhaseRecorder.defer`), a phase's span is a `DeferredSpan` while it
runs (its ids drawn at the entry, current as the SDK span would be) and the phase itself goes
to the pipeline's worker at its exit, which starts and ends the SDK span with those ids and
times, observes the histogram and charges the ledger. The calling thread keeps only what
must be known at once: the clock reads, the current context, the training thread's clock
phase and the ledger's cover (which phase covers which stretch).

Phases need not nest: each exit undoes only its own part (on any thread). The training
thread's clock shows the innermost phase still open there; the ledger counts the union of
the training thread's open phases once, each stretch charged to the phase that covered it
first (so a phase inside a phase, or a checkpoint save inside one, is not counted twice).
The run's end closes what is still open. User-marked names are cut to
`MAX_PHASE_NAME_CHARS` and, past `MAX_USER_PHASES` distinct ones in a run, counted as
`other` (the ledger and the histogram's `training.phase`; each span keeps its own name).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from otel_mindformers.core.step_record import PhaseInterval
from otel_mindformers.names import phase_names
from otel_mindformers.telemetry.deferred_span import DeferredSpan, new_span_id

# Phases finished outside any run that the next run picks up (a bound: phases in a loop
# between runs must not grow memory).
PENDING_LIMIT = 64

_F = TypeVar("_F", bound=Callable[..., Any])
_BUILT_IN = frozenset(phase_names.BUILT_IN_PHASES)

# The phase last entered on this thread; closed ones are skipped (`_innermost_open`), so an
# exit out of order or on another thread never leaves a stale one in front.
_local = threading.local()

# (phase, whether the global tracer exported its span)
_pending: deque[tuple[PhaseInterval, bool]] = deque(maxlen=PENDING_LIMIT)
_active: PhaseRecorder | None = None


def _innermost_open() -> phase | None:
    current = getattr(_local, "phase", None)
    while current is not None and current._closed:
        current = current._outer
    return current


def _heal_context() -> None:
    """The phase last entered on this thread was closed elsewhere (another thread, the run's
    end) while its span stayed this thread's current one: put back what it replaced."""
    last = getattr(_local, "phase", None)
    if last is not None and last._closed and trace.get_current_span() is last._span:
        last._restore_context()


class PhaseNames:
    """What a phase is counted as: a built-in name as it is; a user name cut to
    `MAX_PHASE_NAME_CHARS`, and `other` once a run has seen `MAX_USER_PHASES` of them."""

    def __init__(self) -> None:
        self._user: set[str] = set()

    def user(self, name: str) -> str:
        if name in _BUILT_IN:
            return name
        name = name[: phase_names.MAX_PHASE_NAME_CHARS]
        if name not in self._user:
            if len(self._user) >= phase_names.MAX_USER_PHASES:
                return phase_names.USER_PHASE_OTHER
            self._user.add(name)
        return name

    def ledger_key(self, name: str) -> str:
        """The key in the `time` object: user phases under `user.`."""
        if name in _BUILT_IN:
            return name
        return phase_names.USER_PHASE_PREFIX + self.user(name)


class PhaseRecorder:
    """One run's phases: spans under the run, the duration histogram, the training thread's
    clock, and where the seconds lost per phase go (`on_lost`).

    `parent_span()` returns the span new top-level phases are children of (the epoch span,
    else the run span); `on_lost(ledger_key, seconds)` is told the training thread's phase
    time, once (until `defer`)."""

    def __init__(
        self,
        *,
        tracer: trace.Tracer,
        histogram: Any,
        parent_span: Callable[[], Span],
        span_attributes: Mapping[str, Any],
        point_attributes: Mapping[str, Any],
        clock: Any,
        on_lost: Callable[[str, float], None],
    ) -> None:
        self.tracer = tracer
        self._histogram = histogram
        self.parent_span = parent_span
        self._span_attributes = dict(span_attributes)
        self._point_attributes = dict(point_attributes)
        self.clock = clock
        self._on_lost = on_lost
        self.training_thread = threading.get_ident()
        self._names = PhaseNames()
        self._points: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._open: dict[phase, None] = {}  # every phase of this run still open, any thread
        # The training thread's open phases in the order they were entered; the first one
        # covers the ledger since `_cover_start`; `_base` is the clock's phase before them.
        self._training: list[phase] = []
        self._ended = False  # deactivated: the run ended, and a phase closing now changes no clock
        self._cover_start = 0.0
        self._base: str | None = None
        # Set by `defer`: phase() objects go to the pipeline's worker at their exit.
        self._submit: Callable[[phase], None] | None = None
        self._preset_ids: Callable[[int, int], Any] | None = None
        self._on_charged: Callable[[str, float], None] | None = None

    def defer(
        self,
        submit: Callable[[phase], None],
        preset_ids: Callable[[int, int], Any],
        on_charged: Callable[[str, float], None],
    ) -> None:
        """From now on a `phase()` of this run costs its thread little: its span is a
        `DeferredSpan` with ids drawn at its entry, and at its exit the phase is handed to
        `submit` (the pipeline's bounded queue), whose worker calls `record_deferred`.
        `preset_ids(trace_id, span_id)` makes the tracer's next span on the calling thread
        take those ids (telemetry/step_ids.py); `on_charged(name, seconds)` is what the
        training thread must do itself when one of its outermost phases ends (the worker
        charges the ledger)."""
        self._preset_ids, self._on_charged = preset_ids, on_charged
        self._submit = submit

    def parent(self) -> otel_context.Context:
        """The context top-level phases start in."""
        return trace.set_span_in_context(self.parent_span())

    def span_attributes(self, name: str, extra: Mapping[str, Any]) -> dict[str, Any]:
        return {**self._span_attributes, **extra, phase_names.ATTR_PHASE: name}

    def observe(self, name: str, seconds: float) -> None:
        """One histogram observation (any thread)."""
        counted = self._names.user(name)
        attributes = self._points.get(counted)
        if attributes is None:  # one dict per name (at most MAX_USER_PHASES + the built-ins)
            attributes = self._points[counted] = {**self._point_attributes, phase_names.ATTR_PHASE: counted}
        self._histogram.record(seconds, attributes)

    def finished_interval(self, interval: PhaseInterval) -> None:
        """A phase a wrapper timed on the calling thread: recorded, and counted as lost time
        when that is the training thread and no phase open there covers it already."""
        self.record(interval)
        if threading.get_ident() == self.training_thread and not self._training:
            self._on_lost(interval.name, interval.seconds)

    def record(self, interval: PhaseInterval, parent: Span | None = None) -> None:
        """A phase known from timestamps: its span (under `parent`, else the epoch's or the
        run's) and one observation. Any thread (the pipeline's worker records the built-in
        ones); the time ledger is the caller's."""
        if interval.traced:
            span = self.tracer.start_span(
                phase_names.SPAN_PREFIX + interval.name,
                context=self.parent() if parent is None else trace.set_span_in_context(parent),
                attributes=self.span_attributes(interval.name, interval.attributes),
                start_time=int(interval.start_wall * 1e9),
            )
            span.end(end_time=int(interval.end_wall * 1e9))
        self.observe(interval.name, interval.seconds)

    # --- phase() objects open and close through these (any thread) ---------------------
    def opened(self, marked: phase, now: float) -> None:
        with self._lock:
            self._open[marked] = None
            if threading.get_ident() != self.training_thread:
                return
            if not self._training:
                self._base, self._cover_start = self.clock.phase, now
            self._training.append(marked)
            self.clock.phase = marked.name

    def closed(self, marked: phase, now: float) -> None:
        """Undo only `marked`'s part; its ledger share when it was covering. A deferred
        phase then goes to the worker (`record_deferred`), its share with it."""
        charge = None
        with self._lock:
            self._open.pop(marked, None)
            training = self._training
            if marked in training:
                if training[0] is marked:
                    charge = now - self._cover_start
                    self._cover_start = now
                training.remove(marked)
                if not self._ended:  # a finished run's clock stays `outside`
                    self.clock.phase = training[-1].name if training else self._base
        submit = self._submit
        if submit is not None and type(marked._span) is DeferredSpan:
            marked._charge = charge
            if charge is not None:
                self._on_charged(marked.name, charge)  # type: ignore[misc]  # set with _submit
            submit(marked)
        elif charge is not None:
            self._on_lost(self._names.ledger_key(marked.name), charge)

    def record_deferred(self, marked: phase) -> tuple[str, float] | None:
        """The worker's half of a deferred phase: the SDK span with the ids its stand-in
        carried, what was done to the stand-in, one observation. Returns its ledger key
        and share when it was covering the training thread's time (the caller charges)."""
        stand_in = cast(DeferredSpan, marked._span)  # what `closed` submits
        ids = stand_in.get_span_context()
        start = int(marked._start_wall * 1e9)
        end = int((marked._start_wall + marked._seconds) * 1e9)
        with self._preset_ids(ids.trace_id, ids.span_id):  # type: ignore[misc]  # set by defer
            span = self.tracer.start_span(
                phase_names.SPAN_PREFIX + marked.name,
                context=trace.set_span_in_context(stand_in.parent),
                attributes=self.span_attributes(marked.name, marked.attributes),
                start_time=start,
            )
        stand_in.replay(span)
        _end_span(span, marked._error, marked._by_run_end, end)
        self.observe(marked.name, marked._seconds)
        charge = marked._charge
        return None if charge is None else (self._names.ledger_key(marked.name), charge)

    def close_open(self) -> None:
        """The run ends: close every phase of it still open (their spans end, marked)."""
        with self._lock:
            still_open = list(self._open)
        for marked in reversed(still_open):
            marked._close(None, closed_by_run_end=True)

    def ledger_key(self, name: str) -> str:
        return self._names.ledger_key(name)

    def activate(self, run_span: Span) -> list[PhaseInterval]:
        """Make this the recorder `phase()` uses; returns the phases that ended before the run
        (already observed here, and given a span under `run_span` when none was exported)."""
        global _active
        _active = self
        before = list(_pending)
        _pending.clear()
        for done, exported in before:
            if exported:
                self.observe(done.name, done.seconds)
            else:
                self.record(done, run_span)
        return [done for done, _ in before]

    def deactivate(self) -> None:
        global _active
        self._ended = True
        self.close_open()
        if _active is self:
            _active = None


def active_recorder() -> PhaseRecorder | None:
    return _active


def open_phase_name() -> str | None:
    """The name of the innermost phase open on this thread, if any."""
    current = _innermost_open()
    return current.name if current is not None else None


class phase:
    """Mark a phase of the run: `with otel_mindformers.phase("reshard", shards=8): ...` or
    `@otel_mindformers.phase("eval_hook")`. Keyword arguments become span attributes.

    Exceptions propagate unchanged; the span records them and gets an error status. The
    exit may come out of order or on another thread: it closes this phase only.
    """

    __slots__ = (
        "name", "attributes", "_recorder", "_span", "_outer", "_context", "_thread",
        "_start_perf", "_start_wall", "_exported", "_entered", "_closed", "__weakref__",
        # a deferred phase's exit, for the worker (`PhaseRecorder.record_deferred`)
        "_seconds", "_error", "_by_run_end", "_charge",
    )  # fmt: skip
    _seconds: float
    _error: BaseException | None
    _by_run_end: bool
    _charge: float | None  # its ledger share (None: not the training thread's covering phase)

    def __init__(self, name: str, **attributes: Any) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"otel_mindformers.phase: the name must be a non-empty string, got {name!r}")
        self.name = name[: phase_names.MAX_PHASE_NAME_CHARS] if name not in _BUILT_IN else name
        self.attributes = attributes
        self._entered = False
        self._closed = False
        self._recorder: PhaseRecorder | None = None
        self._outer: phase | None = None

    def __call__(self, function: _F) -> _F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(self.name, **self.attributes):  # a fresh one per call: reentrant, thread-safe
                return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def set_attributes(self, **attributes: Any) -> None:
        """Add span attributes while the phase is open (a result known only at its end)."""
        if self._entered and not self._closed:
            self._span.set_attributes(attributes)

    def __enter__(self) -> phase:
        if self._entered:
            raise RuntimeError(f"otel_mindformers.phase({self.name!r}) is already open; use a new one")
        self._entered = True
        _heal_context()
        recorder = _active
        outer = _innermost_open()
        self._start_perf, self._start_wall = time.perf_counter(), time.time()
        current = otel_context.get_current()  # what this thread's context goes back to
        if recorder is not None and recorder._submit is not None:
            # The outer phase's span, or whatever the caller made current inside it.
            parent = trace.get_current_span(current) if outer is not None else recorder.parent_span()
            span: Span = DeferredSpan(parent, new_span_id())
        elif recorder is not None:
            context = current if outer is not None else recorder.parent()
            span = recorder.tracer.start_span(
                phase_names.SPAN_PREFIX + self.name,
                context=context,
                attributes=recorder.span_attributes(self.name, self.attributes),
                start_time=int(self._start_wall * 1e9),
            )
        else:
            span = trace.get_tracer("otel_mindformers").start_span(
                phase_names.SPAN_PREFIX + self.name,
                attributes={**self.attributes, phase_names.ATTR_PHASE: self.name},
                start_time=int(self._start_wall * 1e9),
            )
        self._recorder, self._span, self._outer = recorder, span, outer
        self._thread = threading.get_ident()
        self._context = current
        otel_context.attach(trace.set_span_in_context(span, current))
        _local.phase = self
        if recorder is not None:
            recorder.opened(self, self._start_perf)
        else:
            self._exported = span.is_recording()  # asked before the span ends, which makes it False
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._entered:
            raise RuntimeError(f"otel_mindformers.phase({self.name!r}) exited without being entered")
        self._close(exc)

    def _close(self, exc: BaseException | None, *, closed_by_run_end: bool = False) -> None:
        if self._closed:  # closed by the run's end already (or a second exit)
            return
        self._closed = True
        now = time.perf_counter()
        seconds = now - self._start_perf
        span, recorder = self._span, self._recorder
        error = exc if isinstance(exc, BaseException) else None
        if type(span) is DeferredSpan:  # the worker ends the real span (PhaseRecorder.record_deferred)
            deferred = True
            span.close()
            self._seconds, self._error, self._by_run_end = seconds, error, closed_by_run_end
        else:
            deferred = False
            _end_span(span, error, closed_by_run_end, int((self._start_wall + seconds) * 1e9))
        if threading.get_ident() == self._thread:
            self._restore_context()
        if recorder is not None:
            recorder.closed(self, now)
            if not deferred:
                recorder.observe(self.name, seconds)
        elif self._outer is None:
            done = PhaseInterval(
                self.name, self._start_wall, self._start_wall + seconds, seconds, dict(self.attributes)
            )
            _pending.append((done, self._exported))

    def _restore_context(self) -> None:
        """When this phase's span is this thread's current one, make the nearest phase still
        open the current one again (or what was current before them)."""
        if trace.get_current_span() is not self._span:
            return  # an inner phase is still open (it restores), or the caller changed context
        context, outer = self._context, self._outer
        while outer is not None and outer._closed:
            context, outer = outer._context, outer._outer
        otel_context.attach(context)
        _local.phase = outer


def _end_span(span: Span, error: BaseException | None, closed_by_run_end: bool, end: int) -> None:
    if error is not None:
        span.record_exception(error, timestamp=end)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    if closed_by_run_end:
        span.set_attribute(phase_names.ATTR_PHASE_CLOSED_BY_RUN_END, True)
    # The span lasts exactly the seconds the ledger counts: its own clock reads would be a
    # few calls away from ours (milliseconds on a loaded machine).
    span.end(end_time=end)


__all__ = ["PhaseNames", "PhaseRecorder", "active_recorder", "open_phase_name", "phase"]
