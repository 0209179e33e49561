"""Tracer, meter and logger providers: reuse the process's configured ones, or build ours.

Under `opentelemetry-instrument` (or any code that configured the SDK) the global providers
already carry the user's service name, resource, sampler and exporters: we only ask them
for a tracer and a meter, and flush them at train end. Otherwise we build providers from
`monitor_config` (OTLP and/or Prometheus), own them, and shut them down within a deadline.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from opentelemetry import _logs, metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_mindformers import semconv
from otel_mindformers.config import MonitorConfig, OtlpConfig
from otel_mindformers.identity import Identity
from otel_mindformers.telemetry.export_errors import ExportErrorReporter
from otel_mindformers.version import __version__

_logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "mindformers-train"


@dataclass
class Telemetry:
    """What the callback records through, and how to close it."""

    tracer: trace.Tracer
    meter: metrics.Meter
    logger: Any  # opentelemetry._logs.Logger
    resource: Resource
    _owned: list[Any] = field(default_factory=list)  # providers we built and must shut down
    _borrowed: list[Any] = field(default_factory=list)  # global providers: flush only
    _on_close: list[Callable[[], None]] = field(default_factory=list)

    def close(self, timeout: float) -> None:
        """Flush (borrowed) or shut down (owned) every provider, within `timeout` seconds.

        Exporter retries against a dead collector can outlive any deadline, so the work runs
        on a daemon thread that we stop waiting for: exit is never held hostage.
        """

        def work() -> None:
            millis = int(timeout * 1000)
            for provider in self._borrowed:
                _call_quietly(provider, "force_flush", millis)
            for provider in self._owned:
                _call_quietly(provider, "shutdown")
            for hook in self._on_close:
                hook()

        worker = threading.Thread(target=work, name="otel-mindformers-shutdown", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            _logger.warning(
                "otel_mindformers: telemetry did not flush within %.1f s; unsent data is dropped",
                timeout,
            )


def _call_quietly(provider: Any, method: str, *args: Any) -> None:
    call = getattr(provider, method, None)
    if call is None:
        return
    try:
        call(*args)
    except Exception as exc:  # shutting down must never raise into training code
        _logger.warning("otel_mindformers: %s.%s failed: %s", type(provider).__name__, method, exc)


def service_name(config: MonitorConfig) -> str:
    return config.service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME


def build_resource(config: MonitorConfig, identity: Identity) -> Resource:
    # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES; ours win on the training keys.
    return Resource.create({"service.name": service_name(config), **identity.attributes()})


def _is_configured(provider: Any) -> bool:
    """True for an SDK provider someone installed globally (not the API's proxy/no-op)."""
    return type(provider).__module__.startswith("opentelemetry.sdk")


def otlp_exporters(otlp: OtlpConfig):
    """(span, metric, log) exporters for the configured protocol; None fields use OTEL_* env."""
    protocol = otlp.resolved_protocol()
    kwargs: dict[str, Any] = {}
    if otlp.headers:
        kwargs["headers"] = dict(otlp.headers)
    if otlp.timeout is not None:
        kwargs["timeout"] = otlp.timeout
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        if otlp.insecure is not None:
            kwargs["insecure"] = otlp.insecure
        endpoints = {"traces": otlp.endpoint, "metrics": otlp.endpoint, "logs": otlp.endpoint}
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        from otel_mindformers.telemetry.otlp_http import CertificateSession

        # An explicit HTTP endpoint is used verbatim by the exporter: add the signal path as
        # the OTEL_EXPORTER_OTLP_ENDPOINT rules do.
        base = otlp.endpoint.rstrip("/") if otlp.endpoint else None
        endpoints = {s: f"{base}/v1/{s}" if base else None for s in ("traces", "metrics", "logs")}
    metric_kwargs: dict[str, Any] = {}
    if otlp.temporality is not None:
        metric_kwargs["preferred_temporality"] = metric_temporality(otlp.temporality)

    def transport() -> dict[str, Any]:
        # One session per HTTP exporter: each applies its own signal's certificate variables.
        return {} if protocol == "grpc" else {"session": CertificateSession()}

    return (
        OTLPSpanExporter(endpoint=endpoints["traces"], **kwargs, **transport()),
        OTLPMetricExporter(endpoint=endpoints["metrics"], **kwargs, **metric_kwargs, **transport()),
        OTLPLogExporter(endpoint=endpoints["logs"], **kwargs, **transport()),
    )


def metric_temporality(choice: str) -> dict[type, AggregationTemporality]:
    """`otlp.temporality`, with the meaning OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE
    gives it: `delta` makes counters and histograms send what changed since the last
    export (and nothing when nothing changed); gauges and up-down counters stay cumulative."""
    temporality = AggregationTemporality.DELTA if choice == "delta" else AggregationTemporality.CUMULATIVE
    return {Counter: temporality, Histogram: temporality, ObservableCounter: temporality}


def _prometheus_reader(config: MonitorConfig, identity: Identity) -> tuple[MetricReader, Callable[[], None]]:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import start_http_server

    # Ranks sharing a node cannot share a port: local rank r serves on `port + r`.
    port = config.prometheus.port + identity.local_rank if config.prometheus.port else 0
    server, _thread = start_http_server(port, addr=config.prometheus.host)

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return PrometheusMetricReader(), stop


def build_telemetry(
    config: MonitorConfig,
    identity: Identity,
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    logger_provider: Any = None,
) -> Telemetry:
    """Providers passed in (tests, the instrumentor) win; then configured globals; then ours."""
    resource = build_resource(config, identity)
    owned: list[Any] = []
    borrowed: list[Any] = []
    on_close: list[Callable[[], None]] = []
    wants_otlp = "otlp" in config.output_type
    wants_prometheus = "prometheus" in config.output_type

    if tracer_provider is None and _is_configured(trace.get_tracer_provider()):
        tracer_provider = trace.get_tracer_provider()
    if meter_provider is None and _is_configured(metrics.get_meter_provider()):
        meter_provider = metrics.get_meter_provider()
    if logger_provider is None and _is_configured(_logs.get_logger_provider()):
        logger_provider = _logs.get_logger_provider()

    span_exporter = metric_exporter = log_exporter = None
    if wants_otlp and None in (tracer_provider, meter_provider, logger_provider):
        span_exporter, metric_exporter, log_exporter = otlp_exporters(config.otlp)

    if tracer_provider is None:
        # shutdown_on_exit=False: the SDK's own atexit shutdown waits out every exporter
        # timeout and retry against a dead collector; Telemetry.close bounds ours instead.
        tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        if span_exporter is not None:
            tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        owned.append(tracer_provider)
    else:
        borrowed.append(tracer_provider)

    if meter_provider is None:
        readers: list[MetricReader] = []
        if metric_exporter is not None:
            readers.append(
                PeriodicExportingMetricReader(
                    metric_exporter,
                    export_interval_millis=config.otlp.resolved_export_interval() * 1000,
                )
            )
        if wants_prometheus:
            reader, stop_server = _prometheus_reader(config, identity)
            readers.append(reader)
            on_close.append(stop_server)
        meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
        owned.append(meter_provider)
    else:
        borrowed.append(meter_provider)

    if logger_provider is None:
        logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        if log_exporter is not None:
            logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
        owned.append(logger_provider)
    else:
        borrowed.append(logger_provider)

    if span_exporter is not None:
        # After the providers are built: their own set-up warnings are not export failures.
        destination = config.otlp.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the default endpoint")
        on_close.append(ExportErrorReporter(destination).install().uninstall)

    name, version = semconv.INSTRUMENTATION_NAME, __version__
    return Telemetry(
        tracer=tracer_provider.get_tracer(name, version),
        meter=meter_provider.get_meter(name, version),
        logger=logger_provider.get_logger(name, version),
        resource=resource,
        _owned=owned,
        _borrowed=borrowed,
        _on_close=on_close,
    )
