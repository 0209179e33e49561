"""MindSpore's device stress test, which the pre-flight check runs (cluster/preflight.py).

`stress_detect(detect_type="aic")` returns 0 (normal), 1 (some test cases did not start) or 2
(a hardware fault: replace the device), and raises RuntimeError where the device has no
stress test (CPU, GPU). MindSpore 2.9 offers it as `mindspore.tools.stress_detect` and
`mindspore.utils.stress_detect`; the adapter takes the first that is there.
"""

from __future__ import annotations

from collections.abc import Callable

from otel_mindformers.compat.lookup import ApiNotFound, find

PLACES = ("mindspore.tools:stress_detect", "mindspore.utils:stress_detect")


def stress_detect() -> Callable[..., int]:
    """The function, or ApiNotFound naming the release and both places."""
    error: ApiNotFound | None = None
    for place in PLACES:
        try:
            function: Callable[..., int] = find(place, package="mindspore", needed_for="cluster.preflight")
            return function
        except ApiNotFound as exc:
            error = exc
    assert error is not None
    raise error


__all__ = ["PLACES", "stress_detect"]
