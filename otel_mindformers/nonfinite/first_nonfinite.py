"""The first bad rank: the first non-finite loss or grad norm a rank sees in its own host
values (`NONFINITE_WATCHED`: a custom scalar's NaN is the user's metric, not a bad step).

With `nonfinite_check: all_ranks` every rank reads back its local loss / grad norm on
sampled steps, and `FirstNonFinite.check` runs on them. The first NaN/Inf of the run is
recorded once — a span event, an OTel log record, the counter
`mindformers.train.nonfinite.first` and a line in the rank's diagnosis file — so
`report` and `hang-report` can name the first rank and step across the job. After that,
`check` is one attribute test. A non-finite grad norm on a step that overflowed is loss
scaling at work, not a fault (core/step_record.py `loss_scaling_explains`): it is not recorded,
and the run's first real one still is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.metrics import Meter
from opentelemetry.trace import Span

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import counted_nonfinite
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import diagnosis as names
from otel_mindformers.names import semconv
from otel_mindformers.names.training import ATTR_METRIC, NONFINITE_WATCHED, OVERFLOW
from otel_mindformers.outputs import diagnosis_file as records
from otel_mindformers.telemetry.events import record_event
from otel_mindformers.telemetry.training_instruments import create_instrument

_logger = get_logger(__name__)


def nonfinite_names(values: Mapping[str, Any]) -> list[str]:
    """Names of the watched values (`NONFINITE_WATCHED`) that are NaN or Inf (booleans and
    absent values are not)."""
    found = []
    for name in NONFINITE_WATCHED:
        value = values.get(name)
        if value is None or isinstance(value, bool):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(number):
            found.append(name)
    return found


class FirstNonFinite:
    """Once per run: which value of which rank went non-finite first, and at which step."""

    def __init__(self, meter: Meter, otel_logger: Any, identity: Identity, json_log_path: str) -> None:
        self._counter = create_instrument(meter, names.NONFINITE_FIRST)
        self._otel_logger = otel_logger
        self._identity = identity
        self.path = records.diagnosis_path(json_log_path, identity.rank)
        self.seen = False

    def check(self, step: int, values: Mapping[str, Any], span: Span | None = None) -> list[str]:
        """Record the run's first non-finite values (on `span` too, when given); return
        their names, or [] when there are none or the first was already recorded."""
        if self.seen:
            return []
        # An infinite grad norm where the step overflowed is loss scaling, not the fault:
        # the run's first real NaN/Inf is still to come.
        bad = counted_nonfinite(nonfinite_names(values), values.get(OVERFLOW))
        if not bad:
            return []
        self.seen = True
        self._record(step, bad, {name: str(float(values[name])) for name in bad}, span)
        return bad

    def _record(self, step: int, bad: list[str], shown: dict[str, str], span: Span | None) -> None:
        rank = self._identity.rank
        message = f"rank {rank}: first non-finite value of the run at step {step}: " + ", ".join(
            f"{name} = {value}" for name, value in shown.items()
        )
        attributes = {**self._identity.point_attributes(), semconv.ATTR_STEP: step, ATTR_METRIC: bad[0]}
        self._counter.add(1, attributes)
        event = {**attributes, "training.nonfinite.metrics": bad, "message": message}
        record_event(span, self._otel_logger, names.EVENT_FIRST_NONFINITE, message, event, SeverityNumber.ERROR)
        _logger.error("otel_mindformers: %s", message)
        # Written here, once per run: a few hundred bytes, not worth a thread hand-off.
        try:
            records.append(
                self.path,
                {
                    "kind": records.KIND_NONFINITE,
                    "time_stamp": round(time.time(), 6),
                    "rank": rank,
                    "step": step,
                    "metrics": bad,
                    "values": shown,
                },
            )
        except OSError as exc:
            _logger.warning("otel_mindformers: cannot write the first non-finite value to %s: %s", self.path, exc)
