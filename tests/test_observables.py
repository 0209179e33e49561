"""telemetry/observables.py on a real SDK reader: one instrument per (meter, name) whose
callback asks the sources of the runs still registered."""

from __future__ import annotations

import logging
import threading

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider

from otel_mindformers.names.diagnosis import PROGRESS_STEP
from otel_mindformers.telemetry.observables import RunObservables
from tests.support.in_memory import KeepingReader
from tests.support.metrics import observed


def pipeline():
    reader = KeepingReader()
    return reader, MeterProvider(metric_readers=[reader]).get_meter("test")


def step_source(rank: int, step: int):
    def observe(_options):
        yield Observation(step, {"training.rank": rank})

    return observe


def steps(reader) -> list:
    return sorted(observed(reader.collect_now()).get(PROGRESS_STEP.name, []), key=lambda p: p[1]["training.rank"])


def test_each_run_is_observed_until_it_closes_and_the_instrument_outlives_it():
    reader, meter = pipeline()
    first, second = RunObservables(meter), RunObservables(meter)
    first.observe(PROGRESS_STEP, step_source(3, 5))
    second.observe(PROGRESS_STEP, step_source(0, 12))
    assert steps(reader) == [(12, {"training.rank": 0}), (5, {"training.rank": 3})]
    first.close()
    first.close()  # idempotent
    assert steps(reader) == [(12, {"training.rank": 0})]
    second.close()
    assert steps(reader) == []
    third = RunObservables(meter)  # a later run on the same meter: the same instrument, its source
    third.observe(PROGRESS_STEP, step_source(0, 7))
    assert steps(reader) == [(7, {"training.rank": 0})]


def test_separate_meters_have_separate_instruments():
    (reader_a, meter_a), (reader_b, meter_b) = pipeline(), pipeline()
    RunObservables(meter_a).observe(PROGRESS_STEP, step_source(0, 1))
    RunObservables(meter_b).observe(PROGRESS_STEP, step_source(0, 2))
    assert steps(reader_a) == [(1, {"training.rank": 0})]
    assert steps(reader_b) == [(2, {"training.rank": 0})]


def test_a_failing_source_is_reported_once_and_hides_no_other(caplog):
    reader, meter = pipeline()

    def broken(_options):
        yield from ()
        raise ValueError("no reading")

    RunObservables(meter).observe(PROGRESS_STEP, broken)
    RunObservables(meter).observe(PROGRESS_STEP, step_source(0, 4))
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        assert steps(reader) == [(4, {"training.rank": 0})]
        assert steps(reader) == [(4, {"training.rank": 0})]
    warnings = [r.getMessage() for r in caplog.records if "observing" in r.getMessage()]
    assert warnings == [f"otel_mindformers: observing {PROGRESS_STEP.name} failed: no reading"]


def test_collections_on_another_thread_while_runs_come_and_go():
    reader, meter = pipeline()
    steady = RunObservables(meter)
    steady.observe(PROGRESS_STEP, step_source(0, 1))
    done, seen, failures = threading.Event(), [], []

    def collect() -> None:
        while not done.is_set():
            try:
                seen.append(steps(reader))
            except Exception as exc:  # noqa: BLE001  (a failure here is the finding)
                failures.append(exc)

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        for rank in range(1, 400):
            run = RunObservables(meter)
            run.observe(PROGRESS_STEP, step_source(rank, rank))
            run.close()
    finally:
        done.set()
        collector.join()
    assert not failures and seen
    assert all((1, {"training.rank": 0}) in points and len(points) <= 2 for points in seen)
    assert steps(reader) == [(1, {"training.rank": 0})]
