"""`mindformers.job.info`: the rank's job (parallel layout, sizes, software versions) as
the attributes of a gauge that is always 1, read when the run starts.

The resource cannot carry the layout under `opentelemetry-instrument`: the SDK builds it
at start-up, before MindSpore's parallel context is set and before a MindFormers Trainer
reads its YAML. The run span carries the same attributes (`Identity.attributes()`).
"""

from __future__ import annotations

from collections.abc import Iterator

from opentelemetry.metrics import CallbackOptions, Observation

from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv
from otel_mindformers.telemetry.observables import RunObservables


def job_info_attributes(identity: Identity) -> dict[str, str | int]:
    """The rank (to join on), the job's id and size, and what `identity.job` holds."""
    attributes: dict[str, str | int] = {**identity.point_attributes(), semconv.ATTR_WORLD_SIZE: identity.world_size}
    if identity.job_id:
        attributes[semconv.ATTR_JOB_ID] = identity.job_id
    attributes.update(identity.job)
    return attributes


class JobInfo:
    """The gauge's source for the run (until `observables` closes); it only yields a constant."""

    def __init__(self, observables: RunObservables, identity: Identity) -> None:
        self._attributes = job_info_attributes(identity)
        observables.observe(semconv.JOB_INFO, self._observe)

    def _observe(self, _options: CallbackOptions) -> Iterator[Observation]:
        yield Observation(1, self._attributes)
