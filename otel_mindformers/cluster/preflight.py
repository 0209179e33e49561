"""The pre-flight check (`cluster.preflight`): MindSpore's stress test of this rank's device
before the first step, recorded as a span with its result.

`stress_detect` (compat/stress_detect.py) answers 0 (passed), 1 (some test cases could not
start: recorded, training goes on) or 2 (a hardware fault: the run does not start, so the
job's restart lands elsewhere). Where MindSpore offers no stress test for the device (CPU,
GPU) or not at all, the result is `not_available`, said in one line, and training goes on.
It runs on the training thread, once, before the first step: a gate the user asked for.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace

from otel_mindformers.compat import stress_detect as compat
from otel_mindformers.compat.lookup import ApiNotFound
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names import cluster_names as names

_logger = get_logger(__name__)

PASSED, FAILED, INCOMPLETE, NOT_AVAILABLE = "passed", "failed", "incomplete", "not_available"
_MEANING = {0: PASSED, 1: INCOMPLETE, 2: FAILED}


class PreflightFailed(RuntimeError):
    """The device failed MindSpore's stress test: training does not start on it."""


def run_preflight(tracer: Any, parent: Any, point_attributes: dict[str, Any], device_target: str | None) -> str:
    """Run the check under a `mindformers.preflight` span; the result's name. Raises
    PreflightFailed on a hardware fault."""
    started = time.time()
    result, detail, code = NOT_AVAILABLE, "", None
    if device_target not in (None, "Ascend"):
        detail = f"MindSpore's stress test needs an Ascend device; this run's device_target is {device_target}"
    else:
        try:
            code = int(compat.stress_detect()())
            result = _MEANING.get(code, INCOMPLETE)
            detail = f"stress_detect returned {code}"
        except ApiNotFound as exc:
            detail = str(exc)
        except Exception as exc:  # "Stress detection is not supported." on a device without it
            detail = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
    attributes = {**point_attributes, names.ATTR_PREFLIGHT_RESULT: result, names.ATTR_PREFLIGHT_DETAIL: detail}
    span = tracer.start_span(
        names.SPAN_PREFLIGHT, context=trace.set_span_in_context(parent), attributes=attributes,
        start_time=int(started * 1e9),
    )  # fmt: skip
    if result == FAILED:
        span.set_status(trace.Status(trace.StatusCode.ERROR, detail))
    span.end()
    if result == NOT_AVAILABLE:
        _logger.warning("otel_mindformers: pre-flight check not available here: %s", detail)
    elif result == PASSED:
        _logger.info("otel_mindformers: pre-flight check passed (%s)", detail)
    elif result == INCOMPLETE:
        _logger.warning("otel_mindformers: pre-flight check incomplete: %s (some test cases did not start)", detail)
    else:
        raise PreflightFailed(
            f"pre-flight check failed: {detail}: MindSpore's stress test found a hardware fault on this "
            "device; replace it (training does not start here)"
        )
    return result


__all__ = ["FAILED", "INCOMPLETE", "NOT_AVAILABLE", "PASSED", "PreflightFailed", "run_preflight"]
