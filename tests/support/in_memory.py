"""In-memory SDK pipelines for exact assertions: tracer, meter and logger providers that keep
what they record (the role opentelemetry-test-utils' TestBase plays in contrib's tests), in
one place instead of one per test file."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class KeepingReader(InMemoryMetricReader):
    """Keeps every collection: the callback's flush at train end is a collection too, and
    exemplars belong to the collection they were made in."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Any] = []

    def _receive_metrics(self, metrics_data, timeout_millis=10_000, **kwargs):
        if metrics_data is not None:
            self.batches.append(metrics_data)
        super()._receive_metrics(metrics_data, timeout_millis, **kwargs)

    def collect_now(self) -> Any:
        """A new collection's data, None when nothing was observed (`get_metrics_data` then
        hands back what the previous collection, a train-end flush say, left behind)."""
        kept = len(self.batches)
        self.collect()
        return self.batches[-1] if len(self.batches) > kept else None


class Capture:
    """Spans, metrics and log records of whatever records through `providers()`
    (`id_generator`: the tracer's, else the SDK's random one)."""

    def __init__(self, id_generator: Any = None) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(id_generator=id_generator)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = KeepingReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider()
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))

    def providers(self) -> dict[str, Any]:
        return {
            "tracer_provider": self.tracer_provider,
            "meter_provider": self.meter_provider,
            "logger_provider": self.logger_provider,
        }

    def callback(self, config: Any) -> Any:
        from otel_mindformers.runtime.callback import MonitorCallback

        return MonitorCallback(config, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)

    def finished(self, name: str | None = None) -> list[Any]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self) -> dict[str, list[Any]]:
        """Latest points by metric name (cumulative temporality: the last collection is the total)."""
        latest = {}
        for data in self.reader.batches + [self.reader.get_metrics_data()]:
            for rm in data.resource_metrics if data else []:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        latest[m.name] = list(m.data.data_points)
        return latest

    def exemplars(self, name: str) -> list[Any]:
        return [
            e
            for data in self.reader.batches
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.data.data_points
            for e in p.exemplars
        ]

    def log_records(self) -> list[Any]:
        return [finished.log_record for finished in self.logs.get_finished_logs()]
