"""The run's flight recorder: its own ring, and its predecessors' tails handed on.

At the run's start (MonitorRun, before its outputs write a line of their own) the dead runs
of the same job and rank are recovered: their tails go to the JSON log and TensorBoard as
the run's outputs are configured (so they come before the new attempt's lines, and a
resumed run's TensorBoard restart marker hides those it computes again, as it hides what
the dead run did write), and as step spans with their original times, linked to their own
attempt's run span (which the next attempt records: runtime/attempt.py). Then the ring is
marked written and removed. Then the run opens its own ring.

While the run lives: the step hook stores the job's step into `finished[0]` (every step),
`write(sampled)` stores a sampled step (training thread), `written(step)` notes what the
outputs wrote (pipeline worker). At the end the ring is removed when its outputs wrote
everything, and kept for the next process otherwise.

A ring that cannot be created (a read-only folder, a file system without shared mappings)
gives one warning: the run goes on without one (`NoRecorder`).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Link, SpanContext, TraceFlags

from otel_mindformers.config import MonitorConfig
from otel_mindformers.config.extras import TENSORBOARD_MODULES, first_problem
from otel_mindformers.core import measurements
from otel_mindformers.core.clock import WallClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.run_part import Remaining, RunPart
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.flight_recorder.recovery import Tail, tails_of_run
from otel_mindformers.flight_recorder.ring import FLAG_STEP_TIME, RingWriter, ring_name
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import job as job_names
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.outputs.jsonl import JsonLinesSink, last_step_line, rank_path
from otel_mindformers.telemetry.step_ids import job_step_context, job_trace_key

_logger = get_logger(__name__)


class NoRecorder(RunPart):
    """A run without a ring: the same surface, nothing kept."""

    def __init__(self) -> None:
        self.finished = memoryview(bytearray(8)).cast("q")  # the step hook's store lands here

    def write(self, sampled: tuple) -> None:
        pass

    def written(self, step: int) -> None:
        pass


class FlightRecorder(RunPart):
    """`write(sampled)`: a sampled step, as MonitorRun hands it to the pipeline (training
    thread: the ring's own method, no frame of ours in between)."""

    def __init__(self, ring: RingWriter) -> None:
        self._ring = ring
        self.finished = ring.finished
        self.write = ring.write

    def written(self, step: int) -> None:
        """The outputs wrote every record up to `step` (pipeline worker, after each batch)."""
        try:
            self._ring.written(step)
        except ValueError:  # closed: a worker that outlived the run's deadline
            pass

    def close(self, remaining: Remaining) -> None:
        """After the pipeline's end (core/run_part.py: every part ends before any closes):
        removed when the outputs wrote all it holds; kept for the next process otherwise."""
        self._ring.close(remove=self._ring.all_written)


def start(
    config: MonitorConfig,
    identity: Identity,
    wall_clock: WallClock,
    tracer: Any,
    history: list[dict[str, Any]] | None = None,
) -> FlightRecorder | NoRecorder:
    """Recover the job's dead runs on this rank, then open this run's ring. `identity` is the
    run's (job id and attempt from the ledger, when it keeps one); `history`: the ledger's
    earlier attempts (their run spans, which recovered step spans link to)."""
    job_id = identity.job_id or ""
    attempt_id = identity.attempt_id or uuid.uuid4().hex
    path = ring_name(config.json_log_path, identity.rank, attempt_id)
    try:
        tails = tails_of_run(config.json_log_path, identity.rank, job_id, own=path)
    except OSError as exc:  # the folder cannot be listed
        _logger.warning("otel_mindformers: cannot look for flight rings beside %s: %s", config.json_log_path, exc)
        tails = []
    for tail in tails:
        _hand_on(tail, config, identity, tracer, history or [])
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
    except (OSError, ValueError) as exc:  # read-only, full, no shared mappings there
        _logger.warning(
            "otel_mindformers: cannot keep a flight ring at %s (%s); a death of this process loses "
            "what its outputs had not written yet",
            path,
            getattr(exc, "strerror", None) or exc,
        )
        return NoRecorder()
    return FlightRecorder(ring)


def _hand_on(tail: Tail, config: MonitorConfig, identity: Identity, tracer: Any, history: list[dict]) -> None:
    """The dead run's tail to this run's outputs and OTLP, then its ring goes."""
    if not tail.slots:
        tail.release(remove=True)
        return
    log = tail.path.parent / (tail.header.json_name or rank_path(config.json_log_path, identity).name)
    records = tail.unlogged(last_step_line(log))
    if not records:
        tail.mark_written()
        tail.release(remove=True)
        return
    try:
        _write_outputs(records, log, config, identity)
    except OSError as exc:
        _logger.warning("otel_mindformers: cannot write the records recovered from %s: %s", tail.path, exc)
        tail.release()  # kept: the next process tries again
        return
    try:
        links = _run_span_of(tail.header.attempt_id, history)
        _record_spans(
            records, tracer, links, tail.header.attempt, job_trace_key(tail.header.job_id, tail.header.attempt)
        )
    except Exception as exc:  # telemetry: the lines are out
        _logger.warning("otel_mindformers: cannot export the records recovered from %s: %s", tail.path, exc)
    try:
        tail.mark_written()
    finally:
        tail.release(remove=True)
    _logger.warning(
        "otel_mindformers: recovered %d record(s) (steps %d..%d) that a run which died (pid %d, attempt %s) "
        "had not written yet",
        len(records), records[0].step, records[-1].step, tail.header.pid, tail.header.attempt or "-",
    )  # fmt: skip


def _write_outputs(records: list[StepRecord], log: Path, config: MonitorConfig, identity: Identity) -> None:
    kinds = config.output_type
    if "json_file" in kinds:
        sink = JsonLinesSink(log, config.log_rotation)
        try:
            sink.write(records)
        finally:
            sink.close()
    if "tensorboard" in kinds and first_problem(TENSORBOARD_MODULES) is None:
        from otel_mindformers.outputs.tensorboard import TensorBoardSink, rank_dir

        board = TensorBoardSink(rank_dir(config.tensorboard_path, identity), config.log_rotation)
        try:
            board.write(records)
        finally:
            board.close()


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
