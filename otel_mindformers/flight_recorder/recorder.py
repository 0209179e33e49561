"""The run's flight recorder: its own ring, and its predecessors' tails handed on.

At the run's start (MonitorRun, before its outputs write a line of their own) the dead runs
on this rank are recovered, oldest first:

- the same job's (an earlier attempt): their tails go to this run's outputs, built as the
  run builds them (outputs/build_sinks), so they come before the new attempt's lines, and
  a resumed run's TensorBoard restart marker hides those it computes again, as it hides
  what the dead run did write (TensorBoard takes the whole unwritten tail behind a marker of
  its own: `_write_outputs`); and as step spans with their original times, linked to
  their own attempt's run span (which the next attempt records: restarts/run_attempt.py);
- another job's (a run killed, then a new one started from scratch in its folder): their
  tails go to that run's own JSON log (flight_recorder/recovery.py `own_log`: still at its
  name, since this run has not set it aside yet, or set aside by a run before).

Each ring is then marked written and removed. Then the run opens its own ring.

While the run lives: the step hook stores the job's step into `finished[0]` (every step),
`write(sampled)` stores a sampled step (training thread): memory stores into the ring;
`written(step)` notes what the outputs wrote and copies the ring into its file (pipeline
worker). At the end the ring is removed when its outputs wrote everything, and kept (in
its file) for the next process otherwise.

A ring that cannot be created (a read-only folder, a full disk) gives one warning: the run
goes on without one (`NoRecorder`). Nothing in a dead ring can stop the run from starting:
one that cannot be read or written out is one warning.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Link, SpanContext, TraceFlags

from otel_mindformers.config import ConfigError, MonitorConfig
from otel_mindformers.core import measurements
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.file_lock import FileLocked
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.run_part import Remaining, RunPart
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.flight_recorder.recovery import Tail, dead_rings, own_log, write_log
from otel_mindformers.flight_recorder.ring import FLAG_STEP_TIME, RingWriter, ring_name
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.outputs import build_sinks
from otel_mindformers.outputs.jsonl import last_step_line, rank_path
from otel_mindformers.outputs.tensorboard import TensorBoardSink
from otel_mindformers.telemetry.step_ids import job_step_context, job_trace_key

_logger = get_logger(__name__)


class NoRecorder(RunPart):
    """A run without a ring: the same surface, nothing kept."""

    def __init__(self) -> None:
        self.finished = memoryview(bytearray(8)).cast("q")  # the step hook's store lands here

    def attach(self, clock: StepClock) -> None:
        clock.finished = self.finished

    def write(self, sampled: tuple) -> None:
        pass

    def written(self, step: int) -> None:
        pass


class FlightRecorder(RunPart):
    """`write(sampled)`: a sampled step, as MonitorRun hands it to the pipeline (training
    thread: the ring's own method, no frame of ours in between)."""

    def __init__(self, ring: RingWriter) -> None:
        self._ring = ring
        self._clock: StepClock | None = None
        self.finished = ring.finished
        self.write = ring.write

    def attach(self, clock: StepClock) -> None:
        """The step hook's store of the job's step: into the ring's memory."""
        self._clock = clock
        clock.finished = self._ring.finished

    def written(self, step: int) -> None:
        """The outputs wrote every record up to `step` (pipeline worker, after each batch)."""
        self._ring.written(step)

    def close(self, remaining: Remaining) -> None:
        """After the pipeline's end (core/run_part.py: every part ends before any closes):
        removed when the outputs wrote all it holds; kept for the next process otherwise."""
        if self._clock is not None:
            self._clock.finished = memoryview(bytearray(8)).cast("q")  # the ring's memory goes now
        self._ring.close(remove=self._ring.all_written)


def start(
    config: MonitorConfig,
    identity: Identity,
    wall_clock: WallClock,
    tracer: Any,
    history: list[dict[str, Any]] | None = None,
) -> FlightRecorder | NoRecorder:
    """Recover the dead runs on this rank, then open this run's ring. `identity` is the
    run's (job id and attempt from the ledger, when it keeps one); `history`: the ledger's
    earlier attempts (their run spans, which recovered step spans link to)."""
    job_id = identity.job_id or ""
    attempt_id = identity.attempt_id or uuid.uuid4().hex
    path = ring_name(config.json_log_path, identity.rank, attempt_id)
    try:
        tails = dead_rings(config.json_log_path, identity.rank, own=path)
    except OSError as exc:  # the folder cannot be listed
        _logger.warning("otel_mindformers: cannot look for flight rings beside %s: %s", config.json_log_path, exc)
        tails = []
    for tail in tails:
        try:
            if tail.header.job_id == job_id:
                _hand_on(tail, config, identity, tracer, history or [])
            else:
                _to_own_log(tail)
        except Exception as exc:  # a ring this package cannot make sense of: never the run's end
            tail.set_aside(f"{type(exc).__name__}: {exc}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ring = RingWriter(
            path,
            rank=identity.rank,
            job_id=job_id,
            attempt_id=attempt_id,
            attempt=identity.attempt or 0,
            json_name=rank_path(config.json_log_path, identity).name,
            perf0=wall_clock.perf0,
            wall0=wall_clock.wall0,
            created=time.time(),
            flags=FLAG_STEP_TIME if tm.STEP_TIME in config.monitored_metrics else 0,
        )
    except (OSError, ValueError) as exc:  # read-only, full
        _logger.warning(
            "otel_mindformers: cannot keep a flight ring at %s (%s); a death of this process loses "
            "what its outputs had not written yet",
            path,
            getattr(exc, "strerror", None) or exc,
        )
        return NoRecorder()
    return FlightRecorder(ring)


def _hand_on(tail: Tail, config: MonitorConfig, identity: Identity, tracer: Any, history: list[dict]) -> None:
    """An earlier attempt's tail to this run's outputs and OTLP, then its ring goes."""
    if not tail.slots:
        tail.release(remove=True)
        return
    unwritten = tail.records()
    records = tail.unlogged(last_step_line(rank_path(config.json_log_path, identity)))
    unsent = tail.unsent(records)  # `report` may have written them into the log: not sent yet
    if not records and not unsent and "tensorboard" not in config.outputs.output_type:  # all out
        tail.mark_written()
        tail.release(remove=True)
        return
    try:
        written = _write_outputs(unwritten, records, config, identity)
    except FileLocked:  # a frozen writer holds the log: kept, and the run's own json_file says so once
        tail.release()
        return
    except (OSError, ConfigError) as exc:
        _logger.warning("otel_mindformers: cannot write the records recovered from %s: %s", tail.path, exc)
        tail.release()  # kept: the next process tries again
        return
    try:
        links = _run_span_of(tail.header.attempt_id, history)
        _record_spans(
            unsent, tracer, links, tail.header.attempt, job_trace_key(tail.header.job_id, tail.header.attempt)
        )
    except Exception as exc:  # telemetry: the lines are out
        _logger.warning("otel_mindformers: cannot export the records recovered from %s: %s", tail.path, exc)
    _done(tail, written)


def _to_own_log(tail: Tail) -> None:
    """Another job's dead run: its tail into its own JSON log, then its ring goes. One whose
    log is nowhere (another job's lines at its name, none set aside) stays, with one warning."""
    if not tail.slots:
        tail.release(remove=True)
        return
    log, why_not = own_log(tail.path, tail.header)
    if log is None:
        _logger.warning_once(
            str(tail.path), "otel_mindformers: the flight ring %s is not recovered: %s", tail.path, why_not
        )
        tail.release()
        return
    records = tail.unlogged(last_step_line(log))
    if records:
        try:
            write_log(records, log)
        except OSError as exc:
            _logger.warning("otel_mindformers: cannot write the records recovered from %s: %s", tail.path, exc)
            tail.release()
            return
    _done(tail, records)


def _done(tail: Tail, records: list[StepRecord]) -> None:
    try:
        tail.mark_written()
    finally:
        tail.release(remove=True)
    if records:
        _logger.warning(
            "otel_mindformers: recovered %d record(s) (steps %d..%d) that a run which died (pid %d, job %s, "
            "attempt %s) had not written yet",
            len(records), records[0].step, records[-1].step, tail.header.pid, tail.header.job_id or "-",
            tail.header.attempt or "-",
        )  # fmt: skip


def _write_outputs(
    unwritten: list[StepRecord], unlogged: list[StepRecord], config: MonitorConfig, identity: Identity
) -> list[StepRecord]:
    """Into the run's own outputs, as the run builds them: its JSON log and TensorBoard
    folder, written on (nothing set aside); the longest list of records written.

    The JSON log takes `unlogged`, the records past its last line (a line is whole or
    absent). The JSON log's last line says nothing of TensorBoard's: the outputs write a
    batch one after the other, and a run killed between the two left the batch in its JSON
    log only (TensorBoard lost up to a batch, 64 steps, in the middle of the run). So
    TensorBoard takes every record past the ring's written mark (`unwritten`: what some
    output may lack) behind its restart marker at the first of them, which hides whatever
    of them the dead run's event file does hold: each step shows once."""
    written: list[StepRecord] = []
    for sink in build_sinks(config.outputs, identity, reports_training=False, recovered=True):
        records = unwritten if isinstance(sink, TensorBoardSink) else unlogged
        try:
            if records:
                if isinstance(sink, TensorBoardSink):
                    sink.mark_restart(records[0].step)
                sink.write(records)
                written = max(written, records, key=len)
        finally:
            sink.close()
    return written


def _run_span_of(attempt_id: str, history: list[dict[str, Any]]) -> list[Link]:
    """A link to the dead attempt's run span, when the ledger has its ids."""
    for entry in history:
        if entry.get("attempt_id") == attempt_id and entry.get("trace_id") and entry.get("span_id"):
            try:
                context = SpanContext(
                    int(entry["trace_id"], 16), int(entry["span_id"], 16), is_remote=True,
                    trace_flags=TraceFlags(TraceFlags.SAMPLED),
                )  # fmt: skip
            except (TypeError, ValueError):
                return []
            return [Link(context)]
    return []


def _record_spans(
    records: list[StepRecord], tracer: Any, links: list[Link], attempt: int, job_key: bytes | None
) -> None:
    """Step spans with the records' own times, as the dead run's pipeline would have made them:
    each in its job step's trace (`job_key`: the dead run's job and attempt), under the root
    the other ranks' step spans of that step name; they carry its attempt (this process's
    resource names this one)."""
    mark: dict[str, Any] = {semconv.ATTR_RECOVERED: True}
    if attempt:
        mark[job_names.ATTR_ATTEMPT] = attempt
    for record in records:
        fields = measurements.step_span(record)
        window = record.step - record.steps_in_window
        span = tracer.start_span(
            fields.name,
            context=job_step_context(tracer, job_key, window) if job_key else otel_context.Context(),
            links=links,
            start_time=int(fields.start_time * 1e9),
            attributes={**fields.attributes, **mark},
        )
        span.set_status(fields.status)
        span.end(end_time=int(fields.end_time * 1e9))


__all__ = ["FlightRecorder", "NoRecorder", "start"]
