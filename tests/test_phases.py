"""User-marked phases (`otel_mindformers.phase`) in real MindSpore training, and outside it."""

from __future__ import annotations

import pytest
from mindspore.train import Callback
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import otel_mindformers
from otel_mindformers.names import semconv
from otel_mindformers.names.phases import ATTR_PHASE, PHASE_DURATION
from tests.support import training
from tests.support.configs import config
from tests.support.in_memory import Capture

pytestmark = pytest.mark.slow  # real training runs


class _Reshard(Callback):
    """Marks a user phase at one step, from inside the training loop, and records what it saw."""

    def __init__(self, monitor, at_step: int) -> None:
        super().__init__()
        self.monitor, self.at_step = monitor, at_step
        self.seen: dict = {}

    def on_train_step_end(self, run_context):
        if run_context.original_args()["cur_step_num"] != self.at_step:
            return
        with otel_mindformers.phase("reshard", shards=8) as marked:
            self.seen["current"] = trace.get_current_span()
            self.seen["clock_phase"] = self.monitor.progress.phase
            self.seen["inner"] = self._inner()
        self.seen["marked"] = marked
        self.seen["clock_after"] = self.monitor.progress.phase

    @otel_mindformers.phase("inner_hook")
    def _inner(self):
        return trace.get_current_span()


def _phase_points(capture, phase):
    return [p for p in capture.points().get(PHASE_DURATION.name, []) if p.attributes.get(ATTR_PHASE) == phase]


def test_user_phase_is_current_child_of_epoch_with_rank_and_clock(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path))
    user = _Reshard(monitor, at_step=3)
    training.train([monitor, user], steps=6)

    (reshard,) = capture.finished("mindformers.phase.reshard")
    (epoch,) = capture.finished(semconv.SPAN_EPOCH)
    assert reshard.parent.span_id == epoch.context.span_id
    assert reshard.attributes[ATTR_PHASE] == "reshard"
    assert reshard.attributes["shards"] == 8
    assert reshard.attributes[semconv.ATTR_RANK] == 0
    # While it ran it was the current span, and the training thread's clock said so.
    assert user.seen["current"].get_span_context().span_id == reshard.context.span_id
    assert user.seen["clock_phase"] == "reshard"
    assert user.seen["clock_after"] == "step"
    # A decorated function inside it is its child.
    (inner,) = capture.finished("mindformers.phase.inner_hook")
    assert inner.parent.span_id == reshard.context.span_id
    assert user.seen["inner"].get_span_context().span_id == inner.context.span_id
    # The histogram has it once, by phase and rank; its sum is the span's length.
    (point,) = _phase_points(capture, "reshard")
    assert point.count == 1 and point.attributes[semconv.ATTR_RANK] == 0
    assert point.sum == pytest.approx((reshard.end_time - reshard.start_time) / 1e9, abs=1e-3)


def test_phase_records_the_exception_and_lets_it_through(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path))

    class Failing(Callback):
        def on_train_step_end(self, run_context):
            with otel_mindformers.phase("flaky"):
                raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        training.train([monitor, Failing()], steps=3)
    (flaky,) = capture.finished("mindformers.phase.flaky")
    assert flaky.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in flaky.events)


def test_phase_outside_a_run_is_kept_for_the_next_run(tmp_path):
    # No run, no configured global SDK: the span is a no-op, the call still works.
    @otel_mindformers.phase("prepare", source="cache")
    def prepare():
        return trace.get_current_span()

    assert not prepare().is_recording()
    capture = Capture()
    training.train([capture.callback(config(tmp_path))], steps=3)
    # The next run records it: a span under its run span, and one observation.
    (prepared,) = capture.finished("mindformers.phase.prepare")
    (run,) = capture.finished(semconv.SPAN_RUN)
    assert prepared.parent.span_id == run.context.span_id
    assert prepared.attributes["source"] == "cache"
    (point,) = _phase_points(capture, "prepare")
    assert point.count == 1


def test_phase_name_must_be_a_string():
    with pytest.raises(ValueError, match="non-empty string"):
        otel_mindformers.phase("")
