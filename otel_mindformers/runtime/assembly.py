"""The composition root: one straight-line function that starts a run's parts in their order.

`assemble(inputs, started)` calls each starter of runtime/parts.py with explicit, typed
arguments: what the run knew before any part started (`RunInputs`) and the parts started
before it. A starter cannot be called before the parts it needs: their values are its
parameters, and a value does not exist before the line that makes it (mypy reports a name
used before its definition, and a `None` where a started part is expected, as errors;
tests/test_assembly_types.py holds that). What started is returned as one typed record,
`StartedRun`, which MonitorRun keeps. Both doors into a run (the callback, the run API) go
through here, from their own `TrainingLoop`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Span

from otel_mindformers.captures.controller import CaptureController, NoCaptures
from otel_mindformers.cluster.part import start_cluster
from otel_mindformers.config import MonitorConfig
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.run_part import RunPart
from otel_mindformers.flight_recorder.recorder import FlightRecorder, NoRecorder
from otel_mindformers.job.identity import Identity
from otel_mindformers.model_state.grad_norm_reader import GradNormReader
from otel_mindformers.nonfinite.first_nonfinite import FirstNonFinite
from otel_mindformers.runtime import parts
from otel_mindformers.runtime.cadence import Cadence
from otel_mindformers.runtime.extract import OutputReader
from otel_mindformers.runtime.pipeline import SampledStepPipeline
from otel_mindformers.runtime.state_reader import StateReader
from otel_mindformers.runtime.training_loop import TrainingLoop
from otel_mindformers.telemetry.providers import Telemetry
from otel_mindformers.timing.timeline import RunTimeline

if TYPE_CHECKING:
    from otel_mindformers.alerts import AlertEngine


@dataclasses.dataclass(frozen=True)
class RunInputs:
    """What a run knows before any part starts, and the run's own callbacks the parts call."""

    config: MonitorConfig
    identity: Identity  # the job's id and attempt come from the ledger entry
    loop: TrainingLoop
    clock: StepClock
    wall_clock: WallClock
    cadence: Cadence
    reader: OutputReader  # the sampled step's readback (runtime/extract.py)
    reports_training: bool
    providers: parts.Providers
    launcher: otel_context.Context  # the launcher's trace context (TRACEPARENT), the run span's parent
    request_stop: Callable[[str], None]  # a rule or a check asks training to stop (any thread)
    phase_parent: Callable[[], Any]  # the span phases start under: the epoch's, else the run's
    phase_charged: Callable[[str, float], None]  # an outermost phase ended on the training thread


@dataclasses.dataclass(frozen=True)
class StartedRun:
    """The run's started parts, as MonitorRun and the doors use them."""

    config: MonitorConfig  # the ledger entry may have moved its paths
    identity: Identity  # with the ledger's job id and attempt
    telemetry: Telemetry
    flight: FlightRecorder | NoRecorder
    captures: CaptureController | NoCaptures
    alerts: AlertEngine | None
    run_span: Span
    run_span_context: otel_context.Context  # the epochs' and phases' parent
    grad_norm_probe: GradNormReader | None
    first_nonfinite: FirstNonFinite | None
    state_reader: StateReader | None
    timeline: RunTimeline
    pipeline: SampledStepPipeline


def assemble(inputs: RunInputs, started: list[RunPart]) -> StartedRun:
    """Start every part in order; each part with something to end or close is appended to
    `started` as soon as it started, so a caller whose start fails ends and closes those."""

    def keep(part: RunPart | None) -> None:
        if part is not None:
            started.append(part)

    loop, clock, wall_clock, cadence = inputs.loop, inputs.clock, inputs.wall_clock, inputs.cadence
    first_step, reports_training = loop.first_step, inputs.reports_training
    ledger_entry, config, identity = parts.start_ledger_entry(
        inputs.config, inputs.identity, first_step, clock, wall_clock
    )
    keep(ledger_entry)
    attempt = ledger_entry.tracker if ledger_entry is not None else None
    telemetry, exports, step_ids, telemetry_part = parts.start_telemetry(config, identity, inputs.providers, clock)
    keep(telemetry_part)
    flight = parts.start_flight_recorder(config, identity, wall_clock, clock, telemetry, attempt)
    keep(flight)
    devices, devices_part = parts.start_devices(config, identity, telemetry)
    keep(devices_part)
    stacks, stacks_part = parts.start_stacks(config, identity, first_step, telemetry, clock)
    keep(stacks_part)
    captures, captures_part = parts.start_captures(config, identity, telemetry, loop, clock)
    keep(captures_part)
    alerts, alerts_part = parts.start_alerts(config, identity, telemetry, clock, reports_training, captures, stacks)
    keep(alerts_part)
    keep(parts.start_logs(config, identity, telemetry, exports, step_ids, clock, cadence))
    run_span, run_span_context, run_span_part = parts.start_run_span(
        identity, loop, telemetry, inputs.launcher, attempt, stacks
    )
    keep(run_span_part)
    keep(parts.start_attempt(config, identity, ledger_entry, telemetry, step_ids, run_span, alerts))
    keep(start_cluster(config, identity, telemetry, run_span, attempt, alerts, clock))
    probe, probe_part = parts.start_grad_norm_probe(config, loop, clock, first_step, inputs.reader, reports_training)
    keep(probe_part)
    first_nonfinite, state_reader, state_part = parts.start_model_state(
        config, identity, telemetry, reports_training, loop
    )
    keep(state_part)
    timeline, timeline_part = parts.start_timeline(
        identity, telemetry, exports, clock, loop, inputs.reader, attempt, run_span, inputs.phase_parent,
        inputs.phase_charged,
    )  # fmt: skip
    keep(timeline_part)
    pipeline, pipeline_part = parts.start_pipeline(
        config, identity, loop, first_step, reports_training, wall_clock, cadence, inputs.request_stop,
        telemetry, exports, step_ids, flight, devices, captures, alerts, run_span, timeline,
    )  # fmt: skip
    keep(pipeline_part)
    return StartedRun(
        config=config, identity=identity, telemetry=telemetry, flight=flight, captures=captures, alerts=alerts,
        run_span=run_span, run_span_context=run_span_context, grad_norm_probe=probe,
        first_nonfinite=first_nonfinite, state_reader=state_reader, timeline=timeline, pipeline=pipeline,
    )  # fmt: skip


__all__ = ["RunInputs", "StartedRun", "assemble"]
