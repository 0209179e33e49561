"""A job's step traces as an OTLP receiver got them: which ranks' step spans each trace
holds, and its `mindformers.job.step` root (telemetry/step_ids.py)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from otel_mindformers.names import semconv
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan


@dataclass
class JobStepTrace:
    trace_id: str
    steps: list[ReceivedSpan] = field(default_factory=list)  # every rank's step span
    roots: list[ReceivedSpan] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted(span.resource[semconv.ATTR_RANK] for span in self.steps)

    @property
    def step(self) -> int:
        (step,) = {span.attributes[semconv.ATTR_STEP] for span in self.steps}
        return step

    def under_its_root(self) -> bool:
        """One root, no parent of its own, the parent of every step span in the trace."""
        if len(self.roots) != 1:
            return False
        (root,) = self.roots
        return root.parent_span_id == "" and {s.parent_span_id for s in self.steps} == {root.span_id}


def job_step_traces(receiver: OtlpReceiver) -> dict[str, JobStepTrace]:
    """Trace id -> the job step's trace, for every trace that holds a step span."""
    traces: dict[str, JobStepTrace] = collections.defaultdict(lambda: JobStepTrace(""))
    for span in receiver.spans(semconv.SPAN_STEP):
        traces[span.trace_id].steps.append(span)
    for span in receiver.spans(semconv.SPAN_JOB_STEP):
        if span.trace_id in traces:
            traces[span.trace_id].roots.append(span)
    for trace_id, trace in traces.items():
        trace.trace_id = trace_id
    return dict(traces)


def shared(traces: dict[str, JobStepTrace], ranks: list[int]) -> int:
    """How many sampled steps have all of `ranks`' step spans in one trace."""
    return sum(1 for trace in traces.values() if trace.ranks == ranks)
