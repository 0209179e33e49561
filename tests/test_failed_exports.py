"""A failed OTLP export lets go of its batch as it returns (otel_mindformers/telemetry/failed_exports.py).

Without it, the SDK exporters' failures keep their batch in a reference cycle until Python's
cyclic collector runs: the collector is paused here, so only that cycle could keep a span.
"""

from __future__ import annotations

import gc
import weakref

import pytest
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


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_a_failed_span_export_holds_no_span_once_it_returns(blackhole, protocol):
    span_exporter, *_ = otlp_exporters(OtlpConfig(endpoint=blackhole, protocol=protocol, timeout=0.2))
    tracer = TracerProvider().get_tracer("test")
    batch = []
    for index in range(32):
        span = tracer.start_span(f"s{index}")
        span.end()
        batch.append(span)
    alive = [weakref.ref(span) for span in batch]
    del span
    gc.disable()
    try:
        result = span_exporter.export(batch)
        del batch
        held = sum(ref() is not None for ref in alive)
    finally:
        gc.enable()
        span_exporter.shutdown()
    assert result.name == "FAILURE"
    assert held == 0, f"{held} spans of a failed {protocol} export are still alive"


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
