"""`RunContext`: what a run's parts share (their lifecycle: core/run_part.py).

It is filled in as the parts start (runtime/parts.py, in the order of `PARTS`): each part
reads what the parts before it put there and may add its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context

from otel_mindformers.captures.controller import NO_CAPTURES
from otel_mindformers.config import MonitorConfig
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.job.identity import Identity
from otel_mindformers.runtime.cadence import Cadence
from otel_mindformers.runtime.extract import OutputReader


@dataclasses.dataclass
class RunContext:
    """The run's shared state. Set before any part starts: the fields without a default.
    Set by the parts as they start (runtime/parts.py): the rest, each by the part named
    beside it."""

    config: MonitorConfig
    identity: Identity  # the job's id and attempt come from the attempt's part
    cb_params: Any  # one object for the whole run (the step of a checkpoint save)
    clock: StepClock
    wall_clock: WallClock
    cadence: Cadence
    reader: OutputReader  # the sampled step's readback (runtime/extract.py)
    first_step: int
    step_offset: int  # the job's step less MindSpore's (job/resume.py)
    reports_training: bool
    providers: dict[str, Any]  # the caller's tracer / meter / logger providers, if any
    request_stop: Callable[[str], None]  # a rule or a check asks training to stop (any thread)
    phase_parent: Callable[[], Any]  # the span phases start under: the epoch's, else the run's
    phase_charged: Callable[[str, float], None]  # an outermost phase ended on the training thread
    telemetry: Any = None  # telemetry: providers, tracer, meter, logger, observables
    step_ids: Any = None  # telemetry: StepSpanIds, the step spans' ids drawn in advance
    exports: Any = None  # telemetry: RankExports, what this rank sends (export_ranks)
    ledger_entry: Any = None  # restarts: the run's LedgerEntry part, or None
    flight: Any = None  # flight_recorder: FlightRecorder, or NoRecorder where no ring can be kept
    devices: Any = None  # devices: DeviceTelemetry, or None
    captures: Any = NO_CAPTURES  # captures: CaptureController
    stacks: Any = None  # hangs: StackDumper
    alerts: Any = None  # alerts: AlertEngine, or None
    run_span: Any = None  # the run span
    run_context: otel_context.Context | None = None  # the run span's context (the launcher's before)
    state_reader: Any = None  # model_state: StateReader (reporting ranks)
    grad_norm_probe: Any = None  # model_state: the GradNormReader of the optimizers' probes, or None
    first_nonfinite: Any = None  # nonfinite: FirstNonFinite (`nonfinite_check: all_ranks`)
    timeline: Any = None  # timing: RunTimeline
    pipeline: Any = None  # runtime: SampledStepPipeline

    @property
    def attempt(self) -> Any:
        """restarts: this run's AttemptTracker (the ledger entry's), or None."""
        return self.ledger_entry.tracker if self.ledger_entry is not None else None

    def point_attributes(self) -> dict[str, Any]:
        return self.identity.point_attributes()


__all__ = ["RunContext"]
