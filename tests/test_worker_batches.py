"""The background worker's batches, and the gauge and counter measurements a batch holds.

A worker takes what is queued when it wakes as one batch, then rests: at interval 1 the
pipeline wakes a few times a second instead of once per step, and a batch's gauges and
counters reach the SDK once (telemetry/training_instruments.py `Coalesced`). Real threads, a real
SDK MeterProvider with an in-memory reader; events, not sleeps, decide the order.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_mindformers.core.measurements import measurements
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.core.workers import BoundedWorker
from otel_mindformers.names import training as tm
from otel_mindformers.telemetry.training_instruments import TrainingInstruments

WAIT = 30.0  # seconds an event may take on a loaded machine


class _Recorder(BoundedWorker[int]):
    """Handles ints; `hold[n]`, when set, blocks the handling of item n until released."""

    def __init__(self, hold: dict[int, threading.Event], **batching: float) -> None:
        self.handled: list[int] = []
        self.batches: list[list[int]] = [[]]
        self.entered = {n: threading.Event() for n in hold}
        self._hold = hold
        super().__init__("test-batches", 100, **batching)

    def handle(self, item: int) -> None:
        if item in self._hold:
            self.entered[item].set()
            assert self._hold[item].wait(WAIT)
        self.handled.append(item)
        self.batches[-1].append(item)

    def end_batch(self) -> None:
        self.batches.append([])


@pytest.mark.parametrize(
    ("batching", "batches"),
    [
        ({"batch_interval": 0.05, "max_batch": 64}, [[0], list(range(1, 11))]),  # the pipeline's way
        ({}, [[n] for n in range(11)]),  # the default: one item at a time
    ],
)
def test_what_queues_while_the_worker_is_busy_is_handled_in_order_in_batches(batching, batches):
    release = threading.Event()
    worker = _Recorder({0: release}, **batching)
    worker.submit(0)
    assert worker.entered[0].wait(WAIT)
    for item in range(1, 11):
        worker.submit(item)
    release.set()
    assert worker.close(WAIT) == []
    assert worker.handled == list(range(11))
    assert [batch for batch in worker.batches if batch] == batches


def test_close_returns_the_batch_the_worker_did_not_reach_and_never_handles_it_after():
    first, second = threading.Event(), threading.Event()
    worker = _Recorder({0: first, 1: second}, batch_interval=0.05, max_batch=64)
    worker.submit(0)
    assert worker.entered[0].wait(WAIT)
    for item in range(1, 6):
        worker.submit(item)
    first.set()
    assert worker.entered[1].wait(WAIT)  # stuck inside item 1; 2..5 wait in its batch
    assert worker.close(0.1) == [2, 3, 4, 5]
    second.set()
    worker._thread.join(WAIT)
    assert worker.handled == [0, 1]


def _taken(worker: BoundedWorker) -> bool:
    """The worker took everything submitted off its queue (it holds it, handled or not)."""
    deadline = time.monotonic() + WAIT
    while worker._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.001)
    return not worker._queue.qsize()


def _handled(worker: _Recorder, count: int) -> float:
    """Wait until `count` items are handled; the seconds it took."""
    started = time.monotonic()
    while len(worker.handled) < count and time.monotonic() - started < WAIT:
        time.sleep(0.001)
    assert len(worker.handled) >= count
    return time.monotonic() - started


def test_an_item_that_arrives_soon_after_another_waits_for_company_up_to_min_batch():
    worker = _Recorder({}, batch_interval=0.5, max_batch=64, min_batch=4, max_delay=WAIT)
    worker.submit(0)  # the first item goes at once: nothing came before it
    _handled(worker, 1)
    worker.submit(1)
    assert _taken(worker)  # the worker holds item 1, waiting
    for item in range(2, 5):
        worker.submit(item)
    assert worker.close(WAIT) == []
    assert [batch for batch in worker.batches if batch] == [[0], [1, 2, 3, 4]]


def test_a_lone_item_waits_at_most_max_delay_and_not_at_all_when_items_come_seldom():
    worker = _Recorder({}, batch_interval=0.01, max_batch=64, min_batch=8, max_delay=1.0)
    worker.submit(0)
    _handled(worker, 1)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 1.2:  # longer than max_delay without an item
        time.sleep(0.01)
    worker.submit(1)
    assert _handled(worker, 2) < 0.9, "an item long after the last one waits for nothing"
    worker.submit(2)  # soon after item 1: it waits for company, which never comes
    assert _handled(worker, 3) >= 0.9
    assert worker.close(WAIT) == []


def test_a_lone_item_stops_waiting_when_nothing_else_comes():
    worker = _Recorder({}, batch_interval=0.01, max_batch=64, min_batch=8, max_delay=WAIT, max_quiet=0.05)
    worker.submit(0)
    _handled(worker, 1)
    worker.submit(1)  # the caller then pauses (a hang, a checkpoint, a kill on its way)
    assert _handled(worker, 2) < WAIT / 2, "max_quiet without a new item ends the wait, not max_delay"
    assert worker.close(WAIT) == []


def test_close_does_not_wait_out_the_wait():
    worker = _Recorder({}, batch_interval=3600.0, max_batch=64, min_batch=8, max_delay=3600.0)
    worker.submit(0)
    _handled(worker, 1)
    worker.submit(1)  # the worker rests, then would wait an hour for company
    assert worker.close(WAIT) == [] and worker.handled == [0, 1]


def _record(step: int, loss: float, overflow: bool) -> StepRecord:
    values = {tm.LOSS: loss, tm.STEP_TIME: 4.0 + step / 10, tm.OVERFLOW: overflow}
    return StepRecord(step=step, epoch=1, rank=0, time_stamp=1.0e9 + step, values=values)


def _points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out[metric.name] = sorted(
                    (tuple(sorted(p.attributes.items())), getattr(p, "value", None), getattr(p, "count", None))
                    for p in metric.data.data_points
                )
    return out


@pytest.mark.parametrize("copies", [False, True], ids=["one attribute dict", "equal dicts in turn"])
def test_a_batchs_gauges_and_counters_export_what_applying_each_record_would(copies):
    """Five records applied as one batch against the same five applied one by one, each
    flushed at once: a gauge's last value, a counter's sum, every histogram observation.
    Measurements are held by their attribute dict's identity: equal dicts (the model state's
    are new for each record) are separate keys, and a gauge's last value must still win."""
    records = [_record(step, loss=2.0 - step / 10, overflow=step in (2, 3)) for step in range(1, 6)]
    attributes = {"training.rank": 0}
    batched_reader, single_reader = InMemoryMetricReader(), InMemoryMetricReader()
    batched = TrainingInstruments(MeterProvider(metric_readers=[batched_reader]).get_meter("t"))
    single = TrainingInstruments(MeterProvider(metric_readers=[single_reader]).get_meter("t"))
    calls = []
    real_flush = batched.coalesced.flush
    batched.coalesced.flush = lambda: (calls.append(1), real_flush())  # type: ignore[method-assign]
    for record in records:
        # In turn: the shared dict, then an equal copy, then the shared dict again...
        held = dict(attributes) if copies and record.step % 2 == 0 else attributes
        batched.apply(measurements(record, held))
        single.apply(measurements(record, attributes))
        single.flush()
    batched.flush()
    got, want = _points(batched_reader), _points(single_reader)
    assert got == want
    assert got[tm.instrument_name(tm.LOSS)] == [((("training.rank", 0),), 1.5, None)]
    assert got[tm.STEPS.name] == [((("training.rank", 0),), 5, None)]
    assert got[tm.OVERFLOW_STEPS.name] == [((("training.rank", 0),), 2, None)]
    assert got[tm.instrument_name(tm.STEP_TIME)][0][2] == 5  # five observations, none merged
    assert calls == [1]


def test_nothing_held_reaches_the_sdk_before_the_batch_ends():
    reader = InMemoryMetricReader()
    instruments = TrainingInstruments(MeterProvider(metric_readers=[reader]).get_meter("t"))
    instruments.apply(measurements(_record(1, 2.0, False), {"training.rank": 0}))
    held = _points(reader)
    assert tm.STEPS.name not in held and tm.instrument_name(tm.LOSS) not in held
    assert held[tm.instrument_name(tm.STEP_TIME)][0][2] == 1  # histograms are not held
    instruments.flush()
    assert _points(reader)[tm.STEPS.name] == [((("training.rank", 0),), 1, None)]


@pytest.mark.slow
def test_a_batch_of_sampled_steps_reaches_each_output_in_one_write(tmp_path, monkeypatch):
    """In a real training at interval 1: while the worker is held inside its first write, the
    next steps queue; they then reach the JSON lines output as one batch, every line once, in
    step order."""
    from mindspore.train import Callback

    from otel_mindformers import MonitorCallback
    from otel_mindformers.outputs.jsonl import JsonLinesSink
    from tests.support import training

    queued = threading.Event()  # the training thread has ended step 10
    batches: list[list[int]] = []
    real_write = JsonLinesSink.write

    def held_write(sink, records):
        batches.append([record.step for record in records])
        if len(batches) == 1:
            assert queued.wait(WAIT)
        real_write(sink, records)

    monkeypatch.setattr(JsonLinesSink, "write", held_write)

    class StepTen(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 10:
                queued.set()

    path = tmp_path / "m.json"
    monitor = MonitorCallback({"interval": 1, "output_type": ["json_file"], "json_log_path": str(path)})
    training.train([monitor, StepTen()], steps=30)
    assert [step for batch in batches for step in batch] == list(range(1, 31))
    assert len(batches[1]) >= 9, f"steps 2..10 queued behind the held write: {batches}"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 31))
