"""A failed OTLP export lets go of its batch (spans, log records) as it returns (otel_mindformers/telemetry/failed_exports.py).

Without it, the SDK exporters' failures keep their batch in a reference cycle until Python's
cyclic collector runs: the collector is paused here, so only that cycle could keep a span.
"""

from __future__ import annotations

import gc
import weakref

import pytest
from opentelemetry._logs import LogRecord
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider

from otel_mindformers.config import OtlpConfig
from otel_mindformers.telemetry.failed_exports import drop_tracebacks
from otel_mindformers.telemetry.providers import otlp_exporters
from tests.support.blackhole import Blackhole


@pytest.fixture(scope="module")
def blackhole():
    hole = Blackhole()
    yield f"http://127.0.0.1:{hole.port}"
    hole.close()


def _spans(count: int) -> list:
    tracer = TracerProvider().get_tracer("test")
    spans = []
    for index in range(count):
        span = tracer.start_span(f"s{index}")
        span.end()
        spans.append(span)
    return spans


def _log_records(count: int) -> list:
    finished = InMemoryLogRecordExporter()
    provider = LoggerProvider(shutdown_on_exit=False)
    provider.add_log_record_processor(SimpleLogRecordProcessor(finished))
    logger = provider.get_logger("test")
    for index in range(count):
        logger.emit(LogRecord(body=f"r{index}"))
    records = list(finished.get_finished_logs())
    finished.clear()  # the test's batch holds them, and nothing else
    return records


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
@pytest.mark.parametrize("signal", ["spans", "logs"])
def test_a_failed_export_holds_nothing_of_its_batch_once_it_returns(blackhole, protocol, signal):
    spans, _, logs = otlp_exporters(OtlpConfig(endpoint=blackhole, protocol=protocol, timeout=0.2))
    exporter, batch = (spans, _spans(32)) if signal == "spans" else (logs, _log_records(32))
    alive = [weakref.ref(item) for item in batch]
    gc.disable()
    try:
        result = exporter.export(batch)
        del batch
        held = sum(ref() is not None for ref in alive)
    finally:
        gc.enable()
        exporter.shutdown()
    assert result.name == "FAILURE"
    assert held == 0, f"{held} {signal} of a failed {protocol} export are still alive"


def test_chained_exceptions_lose_their_tracebacks_too():
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise ValueError("outer") from inner
    except ValueError as outer:
        error = outer
    drop_tracebacks(error)
    assert error.__traceback__ is None and error.__cause__.__traceback__ is None
