"""The standard OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER / OTEL_LOGS_EXPORTER `none` on
the code path (`output_type: [otlp]`, providers of our own): that signal is not exported, as
`opentelemetry-instrument`'s SDK does; the others still reach a real receiver."""

from __future__ import annotations

import pytest

from otel_mindformers.config import load_monitor_config
from otel_mindformers.job.identity import Identity
from otel_mindformers.telemetry.providers import build_telemetry


@pytest.mark.parametrize("switched_off", ["OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"])
def test_an_exporter_variable_set_to_none_drops_only_that_signal(monkeypatch, otlp_receiver, switched_off):
    for variable in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv(switched_off, " None ")
    config = load_monitor_config(
        {"output_type": ["otlp"], "otlp": {"endpoint": otlp_receiver.grpc_endpoint, "protocol": "grpc"}}
    )
    telemetry = build_telemetry(config.telemetry, Identity(rank=0, world_size=1))
    telemetry.tracer.start_span("switch.span").end()
    telemetry.meter.create_counter("switch.counter").add(1)
    assert telemetry.close(5.0)

    spans, points = otlp_receiver.spans("switch.span"), otlp_receiver.points("switch.counter")
    if switched_off == "OTEL_TRACES_EXPORTER":
        assert spans == [] and len(points) == 1
    else:
        assert len(spans) == 1 and points == []
