"""Where the time goes, in real MindSpore training: data wait, goodput, evaluation and
checkpoint phases, ETA."""

from __future__ import annotations

import os
import statistics
import time

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Callback, Model
from mindspore.train.callback import CheckpointConfig

from otel_mindformers import MonitorCallback, phase
from otel_mindformers.names import training as tm
from otel_mindformers.names.phase_names import ATTR_CHECKPOINT_PATH, ATTR_CHECKPOINT_SIZE, ATTR_PHASE, PHASE_DURATION
from otel_mindformers.timing.accounting import DATA_WAIT_SPAN_SECONDS
from tests.support import training
from tests.support.configs import config
from tests.support.in_memory import Capture
from tests.support.jsonl import json_lines as _lines
from tests.support.step_times import StepTimes
from tests.support.timed_fit import TimedCheckpoint
from tests.support.training import Faults

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs

SLEEP = 0.15  # seconds the dataset sleeps before each batch from the second on


def test_data_wait_spans_match_the_sleep_and_goodput_matches_the_steps(tmp_path):
    # Graph mode: a step takes about a millisecond, so once the batches prefetched while the
    # first step compiled are used up, each step waits for its batch about SLEEP.
    steps = 16
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=1))
    # Clocks on either side of ours: MindSpore calls the callbacks in order at each step
    # begin and end, so ours reads its clocks between theirs, whatever the load.
    before, timer = StepTimes(), StepTimes()
    faults = Faults(sleep_at={step: SLEEP for step in range(2, steps + 1)})
    training.train([before, monitor, timer], steps=steps, faults=faults, mode=ms.GRAPH_MODE)

    waits = sorted(capture.finished("mindformers.phase.data_wait"), key=lambda span: span.start_time)
    # Each wait is the gap the steps' own clocks show before the step it precedes: up to
    # SLEEP, less what the loader prefetched while the previous step ran (a loaded machine
    # runs slower steps, so more of the sleep overlaps them, down to no span at all when a
    # gap is under DATA_WAIT_SPAN_SECONDS). So each span is paired with the step it ends at
    # (by the wall clock), never by position: a gap without a span would shift the pairs.
    assert len(waits) >= 3
    for span in waits:
        assert span.attributes[ATTR_PHASE] == "data_wait"
        step = min(range(1, steps), key=lambda k: abs(timer.wall_begins[k] - span.end_time))
        # The span ends as that step begins: between the two timers' clocks (1 ms for the run's
        # wall clock, derived from one perf_counter / time pair; a pause between them is the host's).
        assert before.wall_begins[step] - 1e6 <= span.end_time <= timer.wall_begins[step] + 1e6, step
        seconds = (span.end_time - span.start_time) / 1e9
        # Between the inner and the outer pair of the two timers' clocks (1 us of rounding).
        inner = before.begins[step] - timer.ends[step - 1]
        outer = timer.begins[step] - before.ends[step - 1]
        assert inner - 1e-6 <= seconds <= outer + 1e-6, (step, inner, seconds, outer)
    # Each wait is the wait of its step's window: a child of that step span, in its trace.
    step_spans = {span.context.span_id: span for span in capture.finished("mindformers.train.step")}
    for span in waits:
        step_span = step_spans[span.parent.span_id]
        assert step_span.context.trace_id == span.context.trace_id
        assert step_span.start_time <= span.start_time and span.end_time <= step_span.end_time
    (startup,) = capture.finished("mindformers.phase.startup")
    (run,) = capture.finished("mindformers.train")
    (epoch,) = capture.finished("mindformers.train.epoch")
    assert startup.parent.span_id == epoch.context.span_id and epoch.parent.span_id == run.context.span_id
    assert startup.start_time < run.start_time  # from the interpreter's start

    # The breakdown's data wait is the gaps between steps (the first one is start-up), between
    # the two timers' inner and outer clock reads.
    last = _lines(tmp_path / "m.json")[-1]
    inner = sum(before.begins[k] - timer.ends[k - 1] for k in range(1, steps))
    outer = sum(timer.begins[k] - before.ends[k - 1] for k in range(1, steps))
    assert inner - 1e-5 <= last["time"]["data_wait"] <= outer + 1e-5, (inner, last["time"]["data_wait"], outer)
    # Goodput: the steps' own time (less the first step's compile excess) over the wall time
    # since the origin, computed here from the steps' own clocks.
    durations = [end - begin for begin, end in zip(timer.begins, timer.ends)]
    compile_excess = max(0.0, durations[0] - statistics.median(durations[1:4]))
    expected = (sum(durations) - compile_excess) / last["time"]["wall"]
    assert last[tm.GOODPUT] == pytest.approx(expected, abs=0.05)
    # The histogram's data-wait sum is the ledger's.
    (point,) = [p for p in capture.points()[PHASE_DURATION.name] if p.attributes[ATTR_PHASE] == "data_wait"]
    assert point.sum == pytest.approx(last["time"]["data_wait"], rel=1e-4)


def test_a_well_fed_loader_gets_no_data_wait_spans_but_every_gap_is_counted(tmp_path):
    # No sleeps: the loader keeps ahead of a graph-mode step, so the gaps between steps are
    # tens of microseconds. They are observed and counted, without a span each.
    capture = Capture()
    training.train([capture.callback(config(tmp_path, interval=1))], steps=32, mode=ms.GRAPH_MODE)

    spans = capture.finished("mindformers.phase.data_wait")
    assert all((span.end_time - span.start_time) / 1e9 >= DATA_WAIT_SPAN_SECONDS for span in spans)
    (point,) = [p for p in capture.points()[PHASE_DURATION.name] if p.attributes[ATTR_PHASE] == "data_wait"]
    assert point.count > len(spans)
    assert point.sum == pytest.approx(_lines(tmp_path / "m.json")[-1]["time"]["data_wait"], rel=1e-4)


def _seconds(spans) -> float:
    return sum((span.end_time - span.start_time) / 1e9 for span in spans)


class _EvalTimes(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.windows: list[list[float]] = []

    def on_eval_begin(self, run_context):
        self.windows.append([time.time()])

    def on_eval_end(self, run_context):
        self.windows[-1].append(time.time())


def _fit_model():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    net = nn.SequentialCell(nn.Dense(training.FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    return Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer, metrics={"mae"})


def test_fit_with_validation_and_checkpoints_records_both_phases(tmp_path):
    capture = Capture()
    monitor = capture.callback(config(tmp_path, interval=2))
    checkpoint = TimedCheckpoint(
        prefix="net",
        directory=str(tmp_path / "ckpt"),
        config=CheckpointConfig(save_checkpoint_steps=3, keep_checkpoint_max=20),
    )
    evals, evals_after = _EvalTimes(), _EvalTimes()
    steps_before, steps_after = StepTimes(), StepTimes()
    model = _fit_model()
    # Ours after the checkpoint, so the checkpoint saved at train end (ModelCheckpoint.end) is inside the run.
    model.fit(
        2,
        training.build_dataset(6),
        valid_dataset=training.build_dataset(3),
        callbacks=[checkpoint, steps_before, evals, monitor, steps_after, evals_after],
        dataset_sink_mode=False,
        valid_dataset_sink_mode=False,
    )

    evaluations = capture.finished("mindformers.phase.evaluation")
    epochs = capture.finished("mindformers.train.epoch")
    assert len(evaluations) == len(evals.windows) == 2
    epochs = sorted(epochs, key=lambda s: s.start_time)
    for span, before, after, epoch in zip(evaluations, evals.windows, evals_after.windows, epochs):
        assert span.parent.span_id == epoch.context.span_id
        assert span.attributes["training.eval.mae"] >= 0
        # Ours reads its clock between the callbacks on either side of it, at the evaluation's
        # begin and at its end, whatever the load (1 ms: the run's wall clock is derived).
        assert before[0] - 1e-3 <= span.start_time / 1e9 <= after[0] + 1e-3, (before, after, span.start_time)
        assert before[1] - 1e-3 <= span.end_time / 1e9 <= after[1] + 1e-3, (before, after, span.end_time)

    saves = capture.finished("mindformers.phase.checkpoint.save")
    assert len(saves) == len(checkpoint.saves) >= 3
    for span, (begin, end, path) in zip(sorted(saves, key=lambda s: s.start_time), checkpoint.saves):
        assert span.attributes[ATTR_CHECKPOINT_PATH] == path
        assert span.attributes[ATTR_CHECKPOINT_SIZE] == os.path.getsize(path)
        # Ours wraps the save the checkpoint times itself (its `_save_ckpt`, the instance's):
        # at least as long, and not much longer. 1 ms: the checkpoint reads `time.time()`,
        # which a loaded VM's clock corrections step (0.5 ms once in CI), ours `perf_counter`.
        seconds = (span.end_time - span.start_time) / 1e9
        assert end - begin - 1e-3 <= seconds <= end - begin + 0.1, (begin, end, seconds)
        assert span.start_time / 1e9 <= begin + 1e-3, (begin, span.start_time)
    # Both are lost time in the breakdown: in the last line (which precedes the last epoch's
    # evaluation and the save at train end) and, complete, on the run span.
    # A phase span lasts exactly the seconds the ledger counts (the same clock reads), so the
    # only tolerance is the nanosecond rounding of the span times.
    last = _lines(tmp_path / "m.json")[-1]
    assert last["time"]["evaluation"] == pytest.approx(_seconds(evaluations[:1]), abs=1e-5)
    (run,) = capture.finished("mindformers.train")
    assert run.attributes["training.time.evaluation"] == pytest.approx(_seconds(evaluations), abs=1e-5)
    # A save inside an evaluation (Model.fit's on_eval_end) is the evaluation's time already:
    # counted once, not twice.
    inside = [s for s in saves if any(e.start_time <= s.start_time and s.end_time <= e.end_time for e in evaluations)]
    assert inside, "fit saves a checkpoint inside its evaluation"
    outside = [s for s in saves if s not in inside]
    # (The spans' lengths are the ledger's own seconds, to the nanosecond.)
    assert run.attributes["training.time.checkpoint.save"] == pytest.approx(_seconds(outside), abs=1e-5)
    assert 0 < run.attributes["training.goodput"] < 1
    # Data wait is the gaps between steps net of the phases inside them: the first epoch's
    # evaluation lies between its last step and the next epoch's first (the second one is
    # after the last step, in no gap). The gaps are bounded by the two step timers' clocks
    # on either side of ours; less the evaluation, they bound the data wait from above.
    gaps = range(1, len(steps_after.begins))
    outer = sum(steps_after.begins[k] - steps_before.ends[k - 1] for k in gaps)
    evaluation = _seconds(evaluations[:1])
    assert 0 <= run.attributes["training.time.data_wait"] <= outer - evaluation + 1e-5, (outer, evaluation)
    assert last[tm.ETA] == 0
    # The wrappers are gone after the run.
    assert "_save_ckpt" not in vars(checkpoint)


def test_fit_evaluations_are_not_step_time_and_the_last_line_adds_up(tmp_path):
    """Model.fit evaluates after each epoch, here for 0.4 s: the first evaluation lies inside
    the window of step 8 (steps 6..8), the second after the last step (10, not a multiple
    of the interval: sampled at train end, after it). Neither is step time, throughput or
    a step's share of the window; the last line's breakdown holds the second one, and its
    wall time with it."""
    model = _fit_model()
    before, after = StepTimes(), StepTimes()
    model.fit(
        2,
        training.build_dataset(5),
        valid_dataset=training.build_dataset(2, Faults(sleep_at={1: 0.4})),
        callbacks=[before, MonitorCallback(config(tmp_path, interval=4)), after],
        dataset_sink_mode=False,
        valid_dataset_sink_mode=False,
    )
    lines = {line["step"]: line for line in _lines(tmp_path / "m.json")}
    assert sorted(lines) == [1, 4, 8, 10]
    for step, first in ((8, 4), (10, 8)):
        # The window's steps (first+1..step; the timers' lists are 0-based) by the tests'
        # own clocks inside ours: at least that long, and far from it plus the evaluation's share.
        steps = step - first
        inner = sum(before.ends[k] - after.begins[k] for k in range(first, step)) / steps * 1000
        assert inner <= lines[step][tm.STEP_TIME] < inner + 0.4 * 1000 / steps / 2, (step, lines[step], inner)
        assert lines[step][tm.SAMPLES_PER_SECOND] == pytest.approx(training.BATCH * 1000 / lines[step][tm.STEP_TIME])
    # The first evaluation is in step 8's line, both in the last one; the phases and the
    # productive time add up to the wall time on every line.
    assert lines[4]["time"].get("evaluation", 0) == 0
    assert lines[8]["time"]["evaluation"] >= 0.4
    assert lines[10]["time"]["evaluation"] >= 0.8
    for line in lines.values():
        spent = line["time"]
        assert spent["productive"] + sum(v for k, v in spent.items() if k not in ("wall", "productive")) == (
            pytest.approx(spent["wall"], abs=1e-6)
        )
        assert spent["productive"] > 0


def test_eta_counts_down_in_sink_mode(tmp_path):
    capture = Capture()
    training.train([capture.callback(config(tmp_path, interval=2))], steps=8, epochs=2, sink_size=4, mode=ms.GRAPH_MODE)
    lines = _lines(tmp_path / "m.json")
    etas = [(line["step"], line[tm.ETA]) for line in lines if tm.ETA in line]
    assert etas and etas[-1][1] == 0
    assert all(eta >= 0 for _, eta in etas)
    # 2 epochs x 8 = 16 steps in all: the CPU falls back from sink mode to feeding whole epochs
    # while MindSpore reports batch_num = sink_size (4), which would end the ETA at step 8. Each
    # ETA is the remaining steps x the step time smoothed over the windows the lines report
    # (their own step times, so no load can move the expectation): a window of n steps
    # weighs 1 - 0.7^n, the first window (compilation) gives none.
    smoothed, previous, expected = None, None, []
    for line in lines:
        steps = line["step"] - previous if previous is not None else None
        previous = line["step"]
        if steps is None:
            continue
        mean = line[tm.STEP_TIME] / 1000
        smoothed = mean if smoothed is None else smoothed + (1 - 0.7**steps) * (mean - smoothed)
        expected.append((line["step"], max(0, 16 - line["step"]) * smoothed))
    assert [step for step, _ in etas] == [step for step, _ in expected]
    for (_, eta), (_, want) in zip(etas, expected):
        assert eta == pytest.approx(want, rel=1e-3, abs=1e-6)


class _SlowStepsThenAnUpload(Callback):
    """Listed before ours: every step end sleeps STEP_SLEEP (inside our window), and train end
    runs an `upload` phase of UPLOAD_SLEEP after the last step, before ours samples it."""

    STEP_SLEEP, UPLOAD_SLEEP = 0.05, 0.06

    def __init__(self):
        self.steps_ms: list[float] = []  # each step, from just before our begin to just before our end

    def on_train_step_begin(self, run_context):
        self._begun = time.perf_counter()

    def on_train_step_end(self, run_context):
        time.sleep(self.STEP_SLEEP)
        self.steps_ms.append((time.perf_counter() - self._begun) * 1000)

    def on_train_end(self, run_context):
        with phase("upload"):
            time.sleep(self.UPLOAD_SLEEP)


def test_a_phase_after_the_last_step_is_not_taken_out_of_the_last_window(tmp_path):
    """The last step (10, not a multiple of the interval) is sampled at train end, after the
    upload: its window (steps 9-10, each over STEP_SLEEP) holds no phase, so none of the
    upload, which is shorter than the window, comes off its step time; its breakdown holds it."""
    slow = _SlowStepsThenAnUpload()
    training.train([slow, MonitorCallback(config(tmp_path, interval=4))], steps=10, mode=ms.GRAPH_MODE)
    last = _lines(tmp_path / "m.json")[-1]
    assert last["step"] == 10
    # The window's steps as they took on this host (a loaded one stretches them): taken out,
    # the upload would leave 30 ms a step less, added 30 ms more.
    step_ms = sum(slow.steps_ms[-2:]) / 2
    assert step_ms - 12 < last[tm.STEP_TIME] < step_ms + 12, (slow.steps_ms[-2:], last)
    assert last[tm.STEP_TIME] >= slow.STEP_SLEEP * 1000
    assert last["time"]["user.upload"] >= slow.UPLOAD_SLEEP
    # Its sections run to train end too: the upload beside the steps, not taken from them.
    sections = last["sections"]
    assert sections["in_step"] >= 2 * slow.STEP_SLEEP, sections
    assert sections["other"] >= slow.UPLOAD_SLEEP
    assert sections["window"] == pytest.approx(
        sum(v for k, v in sections.items() if k not in ("window", "steps")), abs=1e-5
    )


def test_a_phase_before_the_run_is_taken_out_of_start_up_not_counted_twice(tmp_path):
    """A checkpoint loaded before training (here a user phase) is part of the run's start-up
    time, charged to its own phase: start-up is what no other phase covers, so the first
    line's productive time is the first step's own, not less the load."""
    load_seconds = 0.3
    with phase("load"):
        time.sleep(load_seconds)
    before, after = StepTimes(), StepTimes()
    training.train([before, MonitorCallback(config(tmp_path, interval=1)), after], steps=3)
    spent = _lines(tmp_path / "m.json")[0]["time"]
    assert spent["user.load"] >= load_seconds
    # Ours reads its step clocks between the two timers' (1 ms: the wall clock is derived).
    inner, outer = before.ends[0] - after.begins[0], after.ends[0] - before.begins[0]
    assert inner - 1e-3 <= spent["productive"] <= outer + 1e-3, (inner, spent, outer)
    assert spent["startup"] + spent["user.load"] + spent["productive"] == pytest.approx(spent["wall"], abs=1e-6)


class _SleepAtStepEnd(Callback):
    """Listed before ours: sleeps at the end of the steps named, inside our step's clock."""

    def __init__(self, seconds_at: dict[int, float]) -> None:
        super().__init__()
        self.seconds_at, self.step = seconds_at, 0

    def on_train_step_end(self, run_context):
        self.step += 1
        time.sleep(self.seconds_at.get(self.step, 0.0))


def test_compile_is_the_first_steps_excess_over_the_median_of_the_next_three(tmp_path):
    """docs/time.md: the median of the next 3 sampled steps, known (and in the line) at the
    third of them. Steps 2-4 of unequal lengths tell the median from their mean, and a long
    step 5 tells three samples from four."""
    capture = Capture()
    sleeper = _SleepAtStepEnd({1: 0.6, 2: 0.02, 3: 0.03, 4: 0.2, 5: 0.4})
    before, after = StepTimes(), StepTimes()
    training.train(
        [sleeper, before, capture.callback(config(tmp_path, interval=1)), after], steps=6, mode=ms.GRAPH_MODE
    )
    (span,) = capture.finished("mindformers.phase.compile")
    inner = [before.ends[k] - after.begins[k] for k in range(6)]
    outer = [after.ends[k] - before.begins[k] for k in range(6)]
    steady = span.attributes["training.steady_step.seconds"]
    assert statistics.median(inner[1:4]) - 1e-3 <= steady <= statistics.median(outer[1:4]) + 1e-3, (inner, steady)
    first = span.attributes["training.first_step.seconds"]
    assert inner[0] - 1e-3 <= first <= outer[0] + 1e-3
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(first - steady, abs=1e-6)
    lines = {line["step"]: line for line in _lines(tmp_path / "m.json")}
    assert "compile" not in lines[3]["time"]
    assert lines[4]["time"]["compile"] == pytest.approx(first - steady, abs=1e-6)


class _PhaseAtStepEnd(Callback):
    """Listed before ours: a user phase inside every step (its end hook runs before ours)."""

    SECONDS = 0.1

    def on_train_step_end(self, run_context):
        with phase("inside_step"):
            time.sleep(self.SECONDS)


def test_a_phase_inside_a_step_is_not_taken_out_of_the_data_wait(tmp_path):
    """Only a phase between two steps lies in their gap: one that ends inside a step leaves
    the gap's data wait whole."""
    steps = 6
    before, timer = StepTimes(), StepTimes()
    faults = Faults(sleep_at={step: SLEEP for step in range(2, steps + 1)})
    training.train(
        [_PhaseAtStepEnd(), before, MonitorCallback(config(tmp_path, interval=1)), timer],
        steps=steps,
        faults=faults,
        mode=ms.GRAPH_MODE,
    )
    last = _lines(tmp_path / "m.json")[-1]
    inner = sum(before.begins[k] - timer.ends[k - 1] for k in range(1, steps))
    outer = sum(timer.begins[k] - before.ends[k - 1] for k in range(1, steps))
    assert inner - 1e-5 <= last["time"]["data_wait"] <= outer + 1e-5, (inner, last["time"], outer)
    assert last["time"]["user.inside_step"] >= steps * _PhaseAtStepEnd.SECONDS
