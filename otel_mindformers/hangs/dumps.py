"""`StackDumper`: record every thread's stack when a rank stops making progress.

A dump is taken by the stall watchdog (at `stall_timeout`, and again at twice it, where
the comparison says "stuck" or "slow"), on `SIGUSR1`, or on demand with `dump_stacks()`.
Each dump becomes a span event on the run span, an OTel log record, one warning line, and
a line in the rank's diagnosis file beside the JSON log (outputs/diagnosis_file.py), which
`otel-mindformers hang-report` merges across ranks. It runs on the asking thread, never
on the training thread, and never raises.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.trace import Span

from otel_mindformers.core.clock import WallClock
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.hangs.heartbeat_gauges import Progress
from otel_mindformers.hangs.signals import SignalTrigger
from otel_mindformers.hangs.stacks import Snapshot, capture, phase_of
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import diagnosis as names
from otel_mindformers.names import phase_names, semconv
from otel_mindformers.outputs import diagnosis_file as records

_logger = get_logger(__name__)

# Stack text in span events and log records; the diagnosis file keeps the full snapshot.
MAX_TEXT_CHARS = 32_000


@dataclass(frozen=True)
class StackDump:
    reason: str
    phase: str
    step: int
    verdict: str | None  # "stuck" / "slow" when compared with an earlier dump
    snapshot: Snapshot
    record: dict[str, Any]

    def headline(self) -> str:
        """One line: where the training thread is, and the innermost code of the user's."""
        parts = [f"phase {self.phase}"]
        if self.verdict:
            parts.append(self.verdict)
        training = self.snapshot.training_thread()
        innermost = training.innermost() if training is not None else None
        if innermost is not None:
            parts.append(f"training thread in {innermost.location()}")
        blocking = self.snapshot.blocking_own_code()
        if blocking is not None:
            thread, frames = blocking
            parts.append(
                f'own code nearest the wait (thread "{thread.name}"): ' + " -> ".join(f.location() for f in frames)
            )
        return "; ".join(parts)

    def text(self) -> str:
        return f"{self.reason} at step {self.step}: {self.headline()}\n\n{self.snapshot.text(MAX_TEXT_CHARS)}"


class StackDumper:
    """Dumps this rank's stacks to telemetry and to its diagnosis file."""

    def __init__(self, identity: Identity, otel_logger: Any, progress: Progress, path: Path) -> None:
        self._identity = identity
        self._otel_logger = otel_logger
        self._progress = progress
        self.path = path
        self._clock = WallClock()
        self._training_ident = threading.get_ident()  # built at train begin, on the training thread
        self._lock = threading.Lock()
        self._run_span: Span | None = None
        self._file_failed = False
        self._signals: SignalTrigger | None = None

    @classmethod
    def start(cls, json_log_path: str, identity: Identity, otel_logger: Any, progress: Progress) -> StackDumper:
        """A dumper writing beside `json_log_path`, reachable by `dump_stacks()` and SIGUSR1."""
        dumper = cls(identity, otel_logger, progress, records.diagnosis_path(json_log_path, identity.rank))
        dumper._signals = SignalTrigger.install(lambda: dumper.dump(names.REASON_SIGNAL))
        with _ACTIVE_LOCK:
            _ACTIVE.append(dumper)
        return dumper

    def attach_run_span(self, span: Span) -> None:
        """Dumps become events of this span (the run span, created after the dumper)."""
        self._run_span = span

    def stop(self) -> None:
        with _ACTIVE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        if self._signals is not None:
            self._signals.stop()

    def dump(
        self,
        reason: str,
        *,
        idle_seconds: float | None = None,
        earlier: StackDump | None = None,
        include_caller: bool = False,
    ) -> StackDump:
        """Capture and record now. With `earlier` (a dump of the same stall), say whether
        the training thread's stack moved since ("slow") or not ("stuck"). The asking
        thread is left out (the watchdog, the signal thread) unless `include_caller`."""
        with self._lock:
            snapshot = capture(self._training_ident, skip_current=not include_caller)
            moved = snapshot.moved_threads(earlier.snapshot) if earlier is not None else {}
            verdict = None
            if earlier is not None:
                training = snapshot.training_thread()
                key_threads = [training] if training is not None else [t for t in snapshot.threads if not t.telemetry]
                verdict = names.SLOW if any(moved.get(t.ident) for t in key_threads) else names.STUCK
            phase = phase_of(getattr(self._progress, "phase", None), snapshot.training_thread())
            step = int(self._progress.step)
            identity = self._identity
            record = {
                "kind": records.KIND_STACKS,
                "time_stamp": round(time.time(), 6),
                "rank": identity.rank,
                "world_size": identity.world_size,
                "host": identity.host_name,
                "pid": os.getpid(),
                "reason": reason,
                "phase": phase,
                "step": step,
                "last_step_time": round(self._clock.wall(self._progress.last_step_end), 6),
                "idle_seconds": None if idle_seconds is None else round(idle_seconds, 3),
                "verdict": verdict,
                "threads": [{**t.to_json(), "moved": moved.get(t.ident)} for t in snapshot.threads],
                "omitted_threads": snapshot.omitted_threads,
            }
            result = StackDump(reason, phase, step, verdict, snapshot, record)
            self._record(result)
            return result

    def _record(self, dump: StackDump) -> None:
        attributes: dict[str, Any] = {
            names.ATTR_STACKS_REASON: dump.reason,
            phase_names.ATTR_PHASE: dump.phase,
            semconv.ATTR_STEP: dump.step,
            names.ATTR_STACKS_THREADS: [t.name for t in dump.snapshot.threads],
            names.ATTR_STACKS_FILE: str(self.path),
        }
        if dump.verdict:
            attributes[names.ATTR_STACKS_VERDICT] = dump.verdict
        if dump.record["idle_seconds"] is not None:
            attributes[names.ATTR_IDLE_SECONDS] = dump.record["idle_seconds"]
        text = dump.text()
        span = self._run_span
        if span is not None and span.is_recording():
            span.add_event(names.EVENT_STACKS, {**attributes, names.ATTR_STACKS_TEXT: text})
        try:
            self._otel_logger.emit(
                severity_number=SeverityNumber.WARN,
                severity_text="WARNING",
                body=text,
                attributes={**self._identity.point_attributes(), **attributes},
                event_name=names.EVENT_STACKS,
            )
        except Exception as exc:  # a telemetry failure never takes the dump down with it
            _logger.debug("otel_mindformers: stack dump log record failed: %s", exc)
        written = self._write(dump.record)
        _logger.warning(
            "otel_mindformers: rank %d thread stacks (%s, step %d): %s%s",
            self._identity.rank,
            dump.reason,
            dump.step,
            dump.headline(),
            f"; written to {self.path}" if written else "",
        )

    def _write(self, record: dict[str, Any]) -> bool:
        try:
            records.append(self.path, record)
        except (OSError, ValueError) as exc:
            if not self._file_failed:
                self._file_failed = True
                _logger.warning("otel_mindformers: cannot write stack dumps to %s: %s", self.path, exc)
            return False
        return True


_ACTIVE: list[StackDumper] = []
_ACTIVE_LOCK = threading.Lock()


def dump_stacks(reason: str = "on demand") -> str:
    """Dump this process's thread stacks now and return them as text.

    While a run is monitored, the dump is also recorded (span event, log record, the rank's
    diagnosis file); otherwise it is only returned.
    """
    with _ACTIVE_LOCK:
        dumpers = list(_ACTIVE)
    if not dumpers:
        return capture(None, skip_current=False).text(MAX_TEXT_CHARS)
    return "\n\n".join(d.dump(reason, include_caller=True).text() for d in dumpers)
