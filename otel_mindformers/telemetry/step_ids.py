"""Step spans whose trace and span ids are known before the spans exist.

A step span is started on the pipeline's worker thread after its step has ended, so
nothing made during the step (a log record, above all) can read its ids from the current
context. Instead, a run derives them: a hash of a per-run random seed and the window the
sampled step closes (the step number of the previous sample, which both the training thread,
from `Cadence.window_step`, and the worker, from the StepRecord, know). The training thread
computes the ids of the step in progress without waiting for anything; the worker makes the
SDK use them for that step's span. Records are exported as they are made, nothing is held
back, and the span keeps its real start and end times.

The SDK takes ids only from its tracer's `id_generator`: `StepSpanIds.install` wraps that of
our tracer in a generator that hands out the preset ids once, on the thread that asked for
them, inside `preset()`, and the tracer's own ids everywhere else. A tracer that is not the
SDK's, or whose generator makes non-random ids (AWS X-Ray's carry a timestamp), keeps its
ids: `install` returns None and step spans cannot be found from their records.

**One trace per sampled step across the job.** Every rank of one attempt of a job derives
the same trace id for a sampled step, with no message between ranks: a keyed hash of the
job id, the attempt number (`job_trace_key`) and the window's opening step, which all ranks
share because they sample the same steps. The same hash gives the span id of the trace's
root, `mindformers.job.step`, which one rank emits (telemetry/export_ranks.py) and which
every rank's step span names as its parent; the step span's own id stays the run's (a hash
of its random seed), so ranks never collide. Without a job id or an attempt number (the
job ledger is off) a rank's step spans start traces of their own, as one process's do.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_mindformers.names import semconv

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


def job_trace_key(job_id: str | None, attempt: int | None) -> bytes | None:
    """The key every rank of one attempt of a job derives its step traces from; None without
    a job id or an attempt number."""
    if not job_id or not attempt:
        return None
    return hashlib.blake2b(f"{job_id}\0{attempt}".encode(), digest_size=32, person=b"mf-job-step").digest()


def job_step_ids(job_key: bytes, window_start: int) -> tuple[int, int]:
    """(trace id, root span id) of the job step whose window opened at `window_start`: the
    same on every rank that holds `job_key`."""
    digest = hashlib.blake2b(window_start.to_bytes(8, "big", signed=True), key=job_key, digest_size=24).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1


def root_sampled(tracer: Any, trace_id: int) -> bool:
    """Whether the tracer's sampler keeps the job step's root: every rank asks it with the
    same trace id, so a sampler that decides by trace id (ratio, always on or off, and their
    parent-based forms) keeps or drops a job step on all ranks alike."""
    sampler = getattr(tracer, "sampler", None)
    if sampler is None:
        return True
    try:
        return bool(
            sampler.should_sample(otel_context.Context(), trace_id, semconv.SPAN_JOB_STEP).decision.is_sampled()
        )
    except Exception:  # a sampler of the user's that cannot answer out of a span: keep it
        return True


def job_step_context(tracer: Any, job_key: bytes, window_start: int) -> otel_context.Context:
    """A context whose (remote) current span is the job step's root: a step span started in
    it joins the job step's trace."""
    trace_id, root_id = job_step_ids(job_key, window_start)
    flags = _SAMPLED if root_sampled(tracer, trace_id) else _NOT_SAMPLED
    root = NonRecordingSpan(SpanContext(trace_id, root_id, is_remote=True, trace_flags=flags))
    return trace.set_span_in_context(root, otel_context.Context())


class _PresetIdGenerator:
    """The tracer's id generator, except for one span started inside `preset()`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._local = threading.local()

    @contextmanager
    def preset(self, trace_id: int, span_id: int) -> Iterator[None]:
        self._local.ids = [trace_id, span_id]
        try:
            yield
        finally:
            self._local.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return ids[0] if ids else self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        if not ids:
            return self.inner.generate_span_id()
        self._local.ids = None  # one span: a child started inside the preset gets its own id
        return ids[1]

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()


class StepSpanIds:
    """One run's step-span ids: `context_of(window)` on any thread, `preset(window)` on the
    thread that starts the span; `parent(window)` the context it starts in (the job step's
    trace, or a fresh one), `preset_root(window)` for the rank that emits the root."""

    def __init__(self, generator: _PresetIdGenerator, seed: bytes | None = None, *, tracer: Any = None,
                 job_key: bytes | None = None) -> None:  # fmt: skip
        self._generator = generator
        self._seed = seed if seed is not None else os.urandom(16)
        self._tracer = tracer
        self.job_key = job_key  # None: each step span starts a trace of its own

    def preset_ids(self, trace_id: int, span_id: int) -> Any:
        """The next span started on this thread inside the block gets these ids (a span
        recorded after the fact: a killed attempt's run span, restarts/attempt_tracker.py)."""
        return self._generator.preset(trace_id, span_id)

    @classmethod
    def install(cls, tracer: Any, job_key: bytes | None = None) -> StepSpanIds | None:
        """Ids for the step spans `tracer` starts, in the job's step traces when `job_key`
        (`job_trace_key`) is given; None when the tracer cannot be told them."""
        current = getattr(tracer, "id_generator", None)
        if isinstance(current, _PresetIdGenerator):  # a previous run in this process
            return cls(current, tracer=tracer, job_key=job_key)
        if current is None or not current.is_trace_id_random():
            return None
        generator = _PresetIdGenerator(current)
        tracer.id_generator = generator
        return cls(generator, tracer=tracer, job_key=job_key)

    def ids(self, window_start: int) -> tuple[int, int]:
        """(trace id, span id) of the span of the sample that closes the window opened at
        step `window_start`. The span id is hashed from the run's random seed, so it is
        random too and differs between ranks and runs; the trace id is the job step's
        (`job_step_ids`), or, without a job key, the run's own hash as well (the W3C
        random-trace-id flag stays true either way)."""
        digest = hashlib.blake2b(window_start.to_bytes(8, "big", signed=True), key=self._seed, digest_size=24).digest()
        span_id = int.from_bytes(digest[16:], "big") or 1
        if self.job_key is not None:
            return job_step_ids(self.job_key, window_start)[0], span_id
        return int.from_bytes(digest[:16], "big") or 1, span_id

    def parent(self, window_start: int) -> otel_context.Context:
        """The context the step span of `window_start` starts in: under the job step's root,
        or (no job key) an empty one, so that it starts a trace of its own."""
        if self.job_key is None:
            return otel_context.Context()
        return job_step_context(self._tracer, self.job_key, window_start)

    def context_of(self, window_start: int) -> otel_context.Context:
        """A context whose current span has that step span's ids (for log records)."""
        trace_id, span_id = self.ids(window_start)
        span = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED))
        return trace.set_span_in_context(span, otel_context.Context())

    @contextmanager
    def preset(self, window_start: int) -> Iterator[None]:
        """The next span started on this thread gets the ids of `window_start`'s step span."""
        with self._generator.preset(*self.ids(window_start)):
            yield

    @contextmanager
    def preset_root(self, window_start: int) -> Iterator[None]:
        """The next span started on this thread is `window_start`'s job step root (needs a job key)."""
        assert self.job_key is not None
        with self._generator.preset(*job_step_ids(self.job_key, window_start)):
            yield
