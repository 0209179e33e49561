"""User-marked phases (`otel_mindformers.phase`) in real MindSpore training, and outside it."""

from __future__ import annotations

import json
import threading
import time

import pytest
from mindspore.train import Callback
from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Status, StatusCode

import otel_mindformers
import otel_mindformers.timing.phases
from otel_mindformers.names import semconv
from otel_mindformers.names.phase_names import (
    ATTR_PHASE,
    ATTR_PHASE_CLOSED_BY_RUN_END,
    MAX_PHASE_NAME_CHARS,
    MAX_USER_PHASES,
    PHASE_DURATION,
    USER_PHASE_PREFIX,
)
from otel_mindformers.telemetry.deferred_span import DeferredSpan
from tests.support import training
from tests.support.configs import config
from tests.support.in_memory import Capture
from tests.support.step_times import StepTimes

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs


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


class _OwnIds(RandomIdGenerator):
    """Ids the run cannot preset (AWS X-Ray's carry a timestamp): phase spans are then
    started on the calling thread, not deferred to the pipeline's worker."""

    def is_trace_id_random(self) -> bool:
        return False


@pytest.mark.parametrize("id_generator", [None, _OwnIds()], ids=["deferred", "started_here"])
def test_user_phase_is_current_child_of_epoch_with_rank_and_clock(tmp_path, id_generator):
    capture = Capture(id_generator)
    monitor = capture.callback(config(tmp_path))
    user = _Reshard(monitor, at_step=3)
    training.train([monitor, user], steps=6)
    assert isinstance(user.seen["current"], DeferredSpan) is (id_generator is None)

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


def test_what_is_done_to_the_current_span_inside_a_phase_reaches_its_span(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=2))
    tracer = capture.tracer_provider.get_tracer("user")

    def upload(cb):
        with otel_mindformers.phase("upload", bytes=1024) as marked:
            span = trace.get_current_span()
            span.set_attribute("upload.retries", 2)
            span.add_event("chunk", {"n": 1})
            span.set_status(Status(StatusCode.ERROR, "slow"))
            marked.set_attributes(result="ok")
            with tracer.start_as_current_span("user.work"), otel_mindformers.phase("inner"):
                pass
        cb.seen["after"] = span.is_recording()
        span.set_attribute("late", 1)  # the phase has ended: nothing more reaches its span

    user = _AtSteps(monitor, {3: upload})
    training.train([monitor, user], steps=6)

    (span,) = capture.finished("mindformers.phase.upload")
    assert {"upload.retries": 2, "bytes": 1024, "result": "ok"}.items() <= dict(span.attributes).items()
    assert "late" not in span.attributes and user.seen["after"] is False
    assert [(e.name, dict(e.attributes)) for e in span.events] == [("chunk", {"n": 1})]
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "slow"
    # A user's span inside the phase is its child, and a phase inside that one the user's.
    (work,) = capture.finished("user.work")
    (inner,) = capture.finished("mindformers.phase.inner")
    (run,) = capture.finished(semconv.SPAN_RUN)
    assert work.parent.span_id == span.context.span_id and inner.parent.span_id == work.context.span_id
    assert {span.context.trace_id, work.context.trace_id, inner.context.trace_id} == {run.context.trace_id}


def test_many_phases_per_step_are_all_recorded_and_charged(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=5))

    class Many(Callback):
        def on_train_step_end(self, run_context):
            for i in range(20):
                with otel_mindformers.phase(f"upload_{i % 4}"):
                    pass

    training.train([monitor, Many()], steps=30)

    (run,) = capture.finished(semconv.SPAN_RUN)  # the whole run's breakdown (the last line precedes the last hooks)
    for i in range(4):
        spans = capture.finished(f"mindformers.phase.upload_{i}")
        assert len(spans) == 150
        (point,) = _phase_points(capture, f"upload_{i}")
        assert point.count == 150
        # Each span's times are whole nanoseconds of a float wall clock (~0.25 us apart today).
        expected = sum(map(_span_seconds, spans))
        assert run.attributes[f"training.time.user.upload_{i}"] == pytest.approx(expected, abs=len(spans) * 5e-7)


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


# --- phases that do not nest, end elsewhere, or outlive the run (issue 24 item 8) -----------


class _AtSteps(StepTimes):
    """Calls `actions[step](self)` at those steps' ends, on the training thread (and keeps
    the steps' own times)."""

    def __init__(self, monitor, actions) -> None:
        super().__init__()
        self.monitor, self.actions = monitor, actions
        self.seen: dict = {}

    def on_train_step_end(self, run_context):
        super().on_train_step_end(run_context)
        action = self.actions.get(run_context.original_args()["cur_step_num"])
        if action is not None:
            action(self)


def _time(tmp_path) -> dict:
    return json.loads((tmp_path / "m.json").read_text().splitlines()[-1])["time"]


def _span_seconds(span) -> float:
    return (span.end_time - span.start_time) / 1e9


def test_phases_exited_out_of_order_restore_only_their_own_state(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=2))

    def overlap(cb):
        a, b = otel_mindformers.phase("a"), otel_mindformers.phase("b")
        a.__enter__()
        b.__enter__()
        cb.seen["inside"] = cb.monitor.progress.phase
        a.__exit__(None, None, None)
        cb.seen["after_a"] = (cb.monitor.progress.phase, otel_mindformers.timing.phases.open_phase_name())
        b.__exit__(None, None, None)
        cb.seen["after_b"] = (cb.monitor.progress.phase, otel_mindformers.timing.phases.open_phase_name())
        cb.seen["current"] = trace.get_current_span()

    def later(cb):
        with otel_mindformers.phase("later"):
            time.sleep(0.05)

    user = _AtSteps(monitor, {3: overlap, 5: later})
    training.train([monitor, user], steps=8)

    assert user.seen["inside"] == "b"
    assert user.seen["after_a"] == ("b", "b")
    assert user.seen["after_b"] == ("step", None)  # not stuck in "a"
    assert not user.seen["current"].is_recording()  # no ended phase span left current
    (a,) = capture.finished("mindformers.phase.a")
    (b,) = capture.finished("mindformers.phase.b")
    (later_span,) = capture.finished("mindformers.phase.later")
    time_ = _time(tmp_path)
    # The union of a and b once, each stretch charged to the phase that covered it first.
    assert time_["user.a"] + time_["user.b"] == pytest.approx((b.end_time - a.start_time) / 1e9, abs=1e-3)
    assert time_["user.later"] == pytest.approx(_span_seconds(later_span), abs=1e-3)


def test_a_phase_exited_on_another_thread_closes_without_raising(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=2))
    errors = []

    def enter_here_exit_there(cb):
        upload = otel_mindformers.phase("upload")
        upload.__enter__()
        cb.seen["inside"] = cb.monitor.progress.phase

        def finish():
            try:
                upload.__exit__(None, None, None)
            except Exception as exc:  # noqa: BLE001 - what the user would see
                errors.append(exc)

        worker = threading.Thread(target=finish)
        worker.start()
        worker.join()
        cb.seen["after"] = (cb.monitor.progress.phase, otel_mindformers.timing.phases.open_phase_name())

    def later(cb):
        with otel_mindformers.phase("later") as marked:
            cb.seen["later_parent"] = marked

    user = _AtSteps(monitor, {3: enter_here_exit_there, 5: later})
    training.train([monitor, user], steps=8)

    assert errors == []
    assert user.seen["inside"] == "upload" and user.seen["after"] == ("step", None)
    (upload,) = capture.finished("mindformers.phase.upload")
    (later_span,) = capture.finished("mindformers.phase.later")
    (epoch,) = capture.finished(semconv.SPAN_EPOCH)
    assert later_span.parent.span_id == epoch.context.span_id  # not a child of the closed upload
    assert _time(tmp_path)["user.upload"] == pytest.approx(_span_seconds(upload), abs=1e-3)


def test_a_phase_left_open_is_closed_by_the_run_end_and_does_not_leak_into_the_next_run(tmp_path):
    first = Capture()
    monitor = first.callback(config(tmp_path / "one", interval=2))
    user = _AtSteps(monitor, {3: lambda cb: otel_mindformers.phase("forgotten").__enter__()})
    training.train([monitor, user], steps=6)
    (forgotten,) = first.finished("mindformers.phase.forgotten")
    assert forgotten.attributes[ATTR_PHASE_CLOSED_BY_RUN_END] is True
    (run,) = first.finished(semconv.SPAN_RUN)
    assert run.attributes["training.time.user.forgotten"] == pytest.approx(_span_seconds(forgotten), abs=1e-3)
    assert otel_mindformers.timing.phases.open_phase_name() is None
    assert not trace.get_current_span().is_recording()

    second = Capture()
    monitor = second.callback(config(tmp_path / "two", interval=2))

    def mark(cb):
        cb.seen["clock"] = cb.monitor.progress.phase
        with otel_mindformers.phase("next"):
            pass

    user = _AtSteps(monitor, {2: mark})
    training.train([monitor, user], steps=4)
    assert user.seen["clock"] == "step"
    (next_span,) = second.finished("mindformers.phase.next")
    (epoch,) = second.finished(semconv.SPAN_EPOCH)
    assert next_span.parent.span_id == epoch.context.span_id
    assert "user.next" in _time(tmp_path / "two") and "user.forgotten" not in _time(tmp_path / "two")


# --- names in their own namespace, bounded (issue 24 item 9) ---------------------------------


def test_user_phase_names_are_namespaced_cut_and_capped(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=2))
    long_name = "x" * 500

    def many(cb):
        for name in ["wall", "productive", long_name, *(f"upload_{i}" for i in range(60))]:
            with otel_mindformers.phase(name):
                pass

    training.train([monitor, _AtSteps(monitor, {3: many})], steps=6)

    lines = [json.loads(line) for line in (tmp_path / "m.json").read_text().splitlines()]
    time_ = lines[-1]["time"]
    user = {k for k in time_ if k.startswith(USER_PHASE_PREFIX)}
    assert len(user) == MAX_USER_PHASES + 1  # 32 names and "other"
    assert {"user.wall", "user.productive", "user." + "x" * MAX_PHASE_NAME_CHARS, "user.other"} <= user
    # The ledger's own totals are untouched: the wall time is the run's, not a phase's.
    wall = lines[-1]["time_stamp"] - capture.finished("mindformers.phase.startup")[0].start_time / 1e9
    assert time_["wall"] == pytest.approx(wall, abs=0.05)
    assert time_["productive"] + sum(v for k, v in time_.items() if k not in ("wall", "productive")) == (
        pytest.approx(time_["wall"], abs=1e-9)
    )
    (run,) = capture.finished(semconv.SPAN_RUN)
    assert len(run.attributes) < 128  # no "Attributes dict is full"
    histogram_names = {p.attributes[ATTR_PHASE] for p in capture.points()[PHASE_DURATION.name]}
    assert len({n for n in histogram_names if n.startswith(("upload_", "x", "wall", "productive", "other"))}) == 33


# --- the time ledger: phases disjoint, nothing counted twice (issue 23 item 9) ----------------


def test_a_nested_phase_is_counted_once_and_a_phase_between_steps_is_not_data_wait(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=2))

    def nested(cb):
        with otel_mindformers.phase("outer"), otel_mindformers.phase("inner"):
            time.sleep(0.1)

    def between_steps(cb):
        with otel_mindformers.phase("upload"):
            time.sleep(0.5)

    user = _AtSteps(monitor, {2: nested, 4: between_steps})
    training.train([monitor, user], steps=8)

    time_ = _time(tmp_path)
    (outer,) = capture.finished("mindformers.phase.outer")
    assert "user.inner" not in time_
    assert time_["user.outer"] == pytest.approx(_span_seconds(outer), abs=1e-3)
    (upload,) = capture.finished("mindformers.phase.upload")
    assert time_["user.upload"] == pytest.approx(_span_seconds(upload), abs=1e-3)
    # The phases sit in the gaps between steps, yet are not data wait: the data wait is the
    # gaps (the test's own clocks) less them.
    gaps = [begin - end for begin, end in zip(user.begins[1:], user.ends)]
    expected = sum(gaps) - _span_seconds(outer) - _span_seconds(upload)
    assert time_["data_wait"] == pytest.approx(expected, abs=0.05)
    for line in (tmp_path / "m.json").read_text().splitlines():
        t = json.loads(line)["time"]
        assert t["productive"] + sum(v for k, v in t.items() if k not in ("wall", "productive")) == (
            pytest.approx(t["wall"], abs=1e-9)
        )


class PhaseAcrossTheEnd(Callback):
    """Opens a phase at step 2 and exits it in its own on_train_end, after the run ended
    (listed after MonitorCallback); keeps the run's clock to read it afterwards."""

    def __init__(self, monitor) -> None:
        self.monitor, self.clock, self.open = monitor, None, None

    def on_train_begin(self, run_context):
        self.clock = self.monitor._run.clock

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == 2:
            self.open = otel_mindformers.phase("upload")
            self.open.__enter__()

    def on_train_end(self, run_context):
        self.open.__exit__(None, None, None)


def test_a_phase_exited_after_its_run_ended_leaves_the_run_outside(tmp_path):
    monitor = otel_mindformers.MonitorCallback(config(tmp_path, interval=2))
    late = PhaseAcrossTheEnd(monitor)
    training.train([monitor, late], steps=4)
    assert late.clock.phase == "outside"
