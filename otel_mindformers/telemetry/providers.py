"""Tracer, meter and logger providers: reuse the process's configured ones, or build ours.

Under `opentelemetry-instrument` (or any code that configured the SDK) the global providers
already carry the user's service name, resource, sampler and exporters: we only ask them
for a tracer and a meter, and flush them at train end. Otherwise we build providers from
`monitor_config` (OTLP and/or Prometheus), own them, and shut them down within a deadline.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import _logs, metrics, trace
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from otel_mindformers.config import ConfigError, OtlpConfig, TelemetryConfig
from otel_mindformers.config.extras import PROMETHEUS_MODULES, output_off_warning
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv
from otel_mindformers.names.semconv import DEFAULT_SERVICE_NAME
from otel_mindformers.telemetry import config_file
from otel_mindformers.telemetry.export_errors import ExportErrorReporter
from otel_mindformers.telemetry.failed_exports import free_failed_batches
from otel_mindformers.telemetry.header_variables import check_header_variables
from otel_mindformers.telemetry.observables import RunObservables
from otel_mindformers.version import __version__

_logger = get_logger(__name__)

# An export failure this recent at train end means the collector is failing now (the SDK's
# exporters retry every few seconds, and each retry that fails is seen): the last flush then
# gets FAILING_FLUSH_SECONDS, not the whole `shutdown_timeout`.
FAILING_NOW_SECONDS = 30.0
FAILING_FLUSH_SECONDS = 1.0
_SDK_LOG_BATCH_SIZE = 512  # the SDK's default OTEL_BLRP_MAX_EXPORT_BATCH_SIZE


@dataclass
class Telemetry:
    """What the callback records through, and how to close it."""

    tracer: trace.Tracer
    meter: metrics.Meter
    logger: Any  # opentelemetry._logs.Logger
    resource: Resource
    logger_provider: Any = None  # where shipped Python logging goes too (telemetry/log_bridge.py)
    _owned: list[Any] = field(default_factory=list)  # providers we built and must shut down
    _borrowed: list[Any] = field(default_factory=list)  # global providers: flush only
    _on_close: list[Callable[[], None]] = field(default_factory=list)
    # Run first and at once: what a next run in this process may need (a listening port).
    _release: list[Callable[[], None]] = field(default_factory=list)
    _export_errors: ExportErrorReporter | None = None  # reports a flush that overran, once
    # The run's sources on the meter's observable instruments, removed by `close`.
    observables: RunObservables = field(init=False)

    def __post_init__(self) -> None:
        self.observables = RunObservables(self.meter)

    def flush_soon(self, timeout: float = 5.0) -> None:
        """Export what is buffered now, on a daemon thread (a span recorded after the fact
        that should not wait for the batch delay: a process may be killed before it)."""

        def work() -> None:
            for provider in self._borrowed + self._owned:
                _call_quietly(provider, "force_flush", int(timeout * 1000))

        threading.Thread(target=work, name="otel-mindformers-flush", daemon=True).start()

    def close(self, timeout: float) -> bool:
        """Flush (borrowed) or shut down (owned) every provider, within `timeout` seconds
        (what is left of the run's shutdown budget), then remove the run's observable sources:
        the last export carries the run's last values, and a borrowed provider exports none
        of them after it. False: it did not finish in time.

        Exporter retries against a dead collector can outlive any deadline, so the work runs
        on a daemon thread that we stop waiting for: exit is never held hostage.
        """
        try:
            return self._flush_or_shut_down(timeout)
        finally:
            self.observables.close()

    def _flush_or_shut_down(self, timeout: float) -> bool:
        for release in self._release:
            release()
        reporter = self._export_errors or ExportErrorReporter.installed()
        if reporter is not None and reporter.failed_within(FAILING_NOW_SECONDS):
            # The collector refused the last exports: one more try, not the whole budget.
            timeout = min(timeout, FAILING_FLUSH_SECONDS)

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
        if not worker.is_alive():
            return True
        if timeout < 0.05:  # not the exporter's fault: the run's shutdown budget was gone
            message = (
                "telemetry got no time to flush: monitor_config.shutdown_timeout was used up by what "
                "closes before it (queued alert notifications, the local outputs' drain); unsent data "
                "is dropped; raise shutdown_timeout or notify_timeout"
            )
        else:
            message = f"telemetry did not flush within {timeout:.1f} s; unsent data is dropped"
        if reporter is not None:
            reporter.report(message)  # one warning in all, with the export failures
        else:
            _logger.warning("otel_mindformers: %s", message)
        return False


def _call_quietly(provider: Any, method: str, *args: Any) -> None:
    call = getattr(provider, method, None)
    if call is None:
        return
    try:
        call(*args)
    except Exception as exc:  # shutting down must never raise into training code
        _logger.warning("otel_mindformers: %s.%s failed: %s", type(provider).__name__, method, exc)


def service_name(config: TelemetryConfig) -> str:
    return config.service_name or os.environ.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME


def build_resource(config: TelemetryConfig, identity: Identity) -> Resource:
    # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES; ours win on the training keys.
    return Resource.create({"service.name": service_name(config), **identity.attributes()})


def _is_configured(provider: Any) -> bool:
    """True for an SDK provider someone installed globally (not the API's proxy/no-op)."""
    return type(provider).__module__.startswith("opentelemetry.sdk")


def builds_own_otlp_exporters(config: TelemetryConfig) -> bool:
    """Whether a run of `config` in this process builds our OTLP exporters: `otlp` is an
    output, no OTEL_CONFIG_FILE brings the file's (a run applies it before building ours),
    and no SDK configured for the process (opentelemetry-instrument's) brings its own."""
    if "otlp" not in config.output_type or config_file.path() is not None:
        return False
    globals_ = (trace.get_tracer_provider(), metrics.get_meter_provider(), _logs.get_logger_provider())
    return not all(_is_configured(provider) for provider in globals_)


# Our (span, metric, log) OTLP exporters, None for a signal not exported.
OtlpExporters = tuple[SpanExporter | None, MetricExporter | None, LogRecordExporter | None]


class CheckedExporters:
    """The OTLP exporters `check_own_exporters` built, for the run that follows to use
    (build_telemetry's `checked_exporters`): they are built once. Taken once, in the process
    that built them; a later run, or one in a forked child (a gRPC channel does not outlive
    a fork), builds its own."""

    def __init__(self, exporters: OtlpExporters | None) -> None:
        self._exporters = exporters
        self._pid = os.getpid()

    def take(self) -> OtlpExporters | None:
        exporters, self._exporters = self._exporters, None
        return exporters if self._pid == os.getpid() else None

    def shut_down(self) -> None:
        """For a check that starts no run (`otel-mindformers validate`)."""
        _shut_down(self.take())


def _shut_down(exporters: OtlpExporters | None) -> None:
    for exporter in exporters or ():
        if exporter is not None:
            exporter.shutdown()


def check_own_exporters(config: TelemetryConfig) -> CheckedExporters:
    """Build our OTLP exporters now, so that settings they refuse (an
    OTEL_EXPORTER_OTLP_PROTOCOL naming no protocol, OTEL_EXPORTER_OTLP_TIMEOUT=5s, an unknown
    compression) are one ConfigError before training and before the run is entered in the
    job's ledger, not an exception as the run starts; the run uses them. Nothing to check
    where the run does not build them (`builds_own_otlp_exporters`)."""
    if not builds_own_otlp_exporters(config):
        return CheckedExporters(None)
    config.otlp.resolved_protocol()
    try:
        return CheckedExporters(otlp_exporters(config.otlp, exported_signals()))
    except ConfigError:  # ours, already naming the variable
        raise
    except Exception as exc:  # the SDK's exporters read and check their variables when built
        raise ConfigError(
            "the OTLP exporters refuse their settings (monitor_config.otlp, the OTEL_EXPORTER_OTLP_* "
            f"variables): {type(exc).__name__}: {exc}"
        ) from None


class SdkExitGuard:
    """Under `opentelemetry-instrument`, the SDK's own providers end the way ours do.

    The SDK shuts its global providers down at exit and waits out every exporter's
    OTEL_EXPORTER_OTLP_TIMEOUT and retries, logging each failure. While installed, their
    export failures make one warning (ExportErrorReporter), and exit shuts them down within
    `shutdown_timeout`; once export is known to fail (a failure was reported, or a train-end
    flush overran), exit does not wait for it at all: that flush has spent the budget.
    """

    def __init__(self, timeout: float, providers: list[Any], reporter: ExportErrorReporter) -> None:
        self._timeout = timeout
        self._providers = providers
        self._reporter = reporter

    @classmethod
    def install(cls, timeout: float) -> SdkExitGuard | None:
        """Guard the configured global providers; None when there are none (nothing to bound)."""
        globals_ = (trace.get_tracer_provider(), metrics.get_meter_provider(), _logs.get_logger_provider())
        providers = [provider for provider in globals_ if _is_configured(provider)]
        if not providers:
            return None
        reporter = ExportErrorReporter(sdk_destination()).install()
        guard = cls(timeout, providers, reporter)
        # Registered after the SDK's own handlers, so it runs before them (atexit is LIFO).
        atexit.register(guard.shutdown)
        return guard

    def uninstall(self) -> None:
        atexit.unregister(self.shutdown)
        self._reporter.uninstall()

    def shutdown(self) -> None:
        for provider in self._providers:
            atexit.unregister(provider.shutdown)  # the SDK's unbounded handler
        budget = 0.0 if self._reporter.failing else self._timeout

        def work() -> None:
            for provider in self._providers:
                _call_quietly(provider, "shutdown")

        worker = threading.Thread(target=work, name="otel-mindformers-exit", daemon=True)
        worker.start()
        worker.join(budget)


_SIGNAL_ENDPOINTS = tuple(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT" for signal in ("TRACES", "METRICS", "LOGS"))


def otlp_destination(otlp: OtlpConfig) -> str:
    """Where `otlp` exports to, as a message names it. Without `otlp.endpoint` the exporters
    read the environment, where a per-signal endpoint wins over OTEL_EXPORTER_OTLP_ENDPOINT;
    words naming no single host make the reporter take every export failure as its own."""
    if otlp.endpoint:
        return otlp.endpoint
    general = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    endpoints = {os.environ.get(variable) or general for variable in _SIGNAL_ENDPOINTS}
    if len(endpoints) > 1:
        return "the endpoints of OTEL_EXPORTER_OTLP_*_ENDPOINT"
    return general or "the default OTLP endpoint"


def sdk_destination() -> str:
    """Where the SDK's own exporters (built by `opentelemetry-instrument`) send, as a message
    names it: the file's endpoints when `OTEL_CONFIG_FILE` configured it (the SDK then ignores
    the OTEL_EXPORTER_OTLP_* variables)."""
    if config_file.path() is not None:
        return f"the endpoints of {config_file.VARIABLE}={config_file.path()}"
    return otlp_destination(OtlpConfig())


# The standard per-signal exporter variables: `none` turns that signal's export off, as the
# SDK's own configurator does under opentelemetry-instrument.
_EXPORTER_VARIABLES = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}


def exported_signals() -> frozenset[str]:
    """The signals whose OTEL_*_EXPORTER variable is not `none`."""
    return frozenset(
        signal
        for signal, variable in _EXPORTER_VARIABLES.items()
        if os.environ.get(variable, "").strip().lower() != "none"
    )


def otlp_exporters(otlp: OtlpConfig, signals: frozenset[str] = frozenset(_EXPORTER_VARIABLES)):
    """(span, metric, log) exporters for the configured protocol, None for a signal not in
    `signals`; None fields of `otlp` use OTEL_* env."""
    protocol = otlp.resolved_protocol()
    kwargs: dict[str, Any] = {}
    if otlp.headers:
        kwargs["headers"] = dict(otlp.headers)
    else:  # the exporters read the variables: checked first, or the SDK logs a bad one whole
        check_header_variables()
    if otlp.timeout is not None:
        kwargs["timeout"] = otlp.timeout
    # Each branch imports its protocol's classes under these names.
    OTLPSpanExporter: Callable[..., SpanExporter]
    OTLPMetricExporter: Callable[..., MetricExporter]
    OTLPLogExporter: Callable[..., LogRecordExporter]
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        # The SDK's exporters sending span and log requests we write as wire bytes: a
        # thirtieth of the SDK encoders' CPU under the pure-Python protobuf MindSpore forces
        # (otlp_wire_encoder.py).
        from otel_mindformers.telemetry.otlp_wire_encoder import InPlaceOTLPLogExporter as OTLPLogExporter
        from otel_mindformers.telemetry.otlp_wire_encoder import InPlaceOTLPSpanExporter as OTLPSpanExporter

        if otlp.insecure is not None:
            kwargs["insecure"] = otlp.insecure
        endpoints = {"traces": otlp.endpoint, "metrics": otlp.endpoint, "logs": otlp.endpoint}
    else:
        if protocol == "http/json":
            # JSON, encoded by the C json module: MindSpore forces protobuf's pure-Python
            # implementation on the whole process, where encoding a span costs ~10x more
            # (docs/performance.md).
            from opentelemetry.exporter.otlp.json.http._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.json.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # An explicit HTTP endpoint is used verbatim by the exporter: add the signal path as
        # the OTEL_EXPORTER_OTLP_ENDPOINT rules do.
        base = otlp.endpoint.rstrip("/") if otlp.endpoint else None
        endpoints = {s: f"{base}/v1/{s}" if base else None for s in ("traces", "metrics", "logs")}
    metric_kwargs: dict[str, Any] = {}
    if otlp.temporality is not None:
        metric_kwargs["preferred_temporality"] = metric_temporality(otlp.temporality)

    def transport() -> dict[str, Any]:
        # One session per protobuf HTTP exporter: each applies its own signal's certificate
        # variables. (The JSON exporters' urllib3 transport reads them itself.)
        if protocol != "http/protobuf":
            return {}
        from otel_mindformers.telemetry.otlp_http import CertificateSession

        return {"session": CertificateSession()}

    exporters = (
        OTLPSpanExporter(endpoint=endpoints["traces"], **kwargs, **transport()) if "traces" in signals else None,
        OTLPMetricExporter(endpoint=endpoints["metrics"], **kwargs, **metric_kwargs, **transport())
        if "metrics" in signals
        else None,
        OTLPLogExporter(endpoint=endpoints["logs"], **kwargs, **transport()) if "logs" in signals else None,
    )
    if protocol == "grpc":  # the span and log exporters are ours: they free a failed batch themselves
        return exporters
    return tuple(None if exporter is None else free_failed_batches(exporter) for exporter in exporters)


def log_processor(exporter: LogRecordExporter, otlp: OtlpConfig) -> BatchLogRecordProcessor:
    """The batch processor of the OTLP log records, its queue sized for the documented burst
    and rate (`otlp.logs_queue_size`, docs/logs.md). Batch size and schedule delay stay the
    SDK's (OTEL_BLRP_MAX_EXPORT_BATCH_SIZE, 512; OTEL_BLRP_SCHEDULE_DELAY, 1 s): batches of
    64 to 1024 carried the same rate, and the worker exports as soon as a batch is queued, so
    the delay only bounds how long a trickle waits."""
    queue_size = otlp.resolved_logs_queue_size()
    variable = os.environ.get("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "").strip()
    batch_size = int(variable) if variable.isdigit() and int(variable) >= 1 else _SDK_LOG_BATCH_SIZE
    # The SDK refuses a batch larger than its queue: a small queue exports it whole.
    return BatchLogRecordProcessor(
        exporter, max_queue_size=queue_size, max_export_batch_size=min(batch_size, queue_size)
    )


def metric_temporality(choice: str) -> dict[type, AggregationTemporality]:
    """`otlp.temporality`, with the meaning OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE
    gives it: `delta` makes counters and histograms send what changed since the last
    export (and nothing when nothing changed); gauges and up-down counters stay cumulative."""
    temporality = AggregationTemporality.DELTA if choice == "delta" else AggregationTemporality.CUMULATIVE
    return {Counter: temporality, Histogram: temporality, ObservableCounter: temporality}


def _prometheus_reader(config: TelemetryConfig, identity: Identity) -> tuple[MetricReader, Callable[[], None]] | None:
    """A reader served on `prometheus.host:port`; None (with one warning) if it cannot listen
    or its extra is not installed."""
    unavailable = output_off_warning("prometheus", PROMETHEUS_MODULES)
    if unavailable:  # an optional extra: training goes on without this output
        _logger.warning(unavailable)
        return None
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    port = identity.node_port(config.prometheus.port)
    # A registry per run: a previous run's reader that is still shutting down keeps its own.
    registry = CollectorRegistry(auto_describe=True)
    try:
        server, _thread = start_http_server(port, addr=config.prometheus.host, registry=registry)
    except (OSError, OverflowError) as exc:
        _logger.warning(
            "otel_mindformers: cannot serve Prometheus metrics on %s:%s (monitor_config.prometheus.port"
            "%s, monitor_config.prometheus.host: %s): %s. The prometheus output is off for this run; "
            "choose a free port, or 0 for any.",
            config.prometheus.host,
            port,
            f" {config.prometheus.port} + local rank {identity.local_rank}" if port != config.prometheus.port else "",
            config.prometheus.host,
            exc,
        )
        return None

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return PrometheusMetricReader(registry=registry), stop


def _ignored_settings(
    config: TelemetryConfig, borrowed: set[str], builds_none: bool, from_file: bool = False
) -> list[str]:
    """The settings of `config` that global providers (`borrowed`) override; `builds_none`:
    no provider of ours is built, so no exporter of ours either; `from_file`: the providers
    are OTEL_CONFIG_FILE's (whose resource takes `service_name` where it sets no
    `service.name`, telemetry/config_file.py)."""
    ignored = []
    if "meter_provider" in borrowed and "prometheus" in config.output_type:
        served = "a pull reader in the file serves it" if from_file else "OTEL_METRICS_EXPORTER=prometheus serves it"
        ignored.append(f"output_type 'prometheus' ({served})")
    if builds_none and config.otlp != OtlpConfig():  # the SDK's exporters send where its environment says
        ignored.append(
            "the otlp section ("
            + ("the file's exporters send" if from_file else "set OTEL_EXPORTER_OTLP_* instead")
            + ")"
        )
    if "logger_provider" in borrowed and not builds_none and config.otlp.logs_queue_size is not None:
        ignored.append("otlp.logs_queue_size (set OTEL_BLRP_MAX_QUEUE_SIZE instead)")
    if "tracer_provider" in borrowed and config.service_name and not from_file:
        ignored.append("service_name (set OTEL_SERVICE_NAME instead)")
    return ignored


def build_telemetry(
    config: TelemetryConfig,
    identity: Identity,
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    logger_provider: Any = None,
    checked_exporters: OtlpExporters | None = None,
) -> Telemetry:
    """Providers passed in (tests, the instrumentor) win; then configured globals; then ours,
    with `checked_exporters` where the check before training built them (`check_own_exporters`)."""
    resource = build_resource(config, identity)
    owned: list[Any] = []
    borrowed: list[Any] = []
    on_close: list[Callable[[], None]] = []
    release: list[Callable[[], None]] = []
    reporter: ExportErrorReporter | None = None
    wants_otlp = "otlp" in config.output_type
    wants_prometheus = "prometheus" in config.output_type

    from_globals: set[str] = set()
    # OTEL_CONFIG_FILE configured the SDK: its globals are what the file says, a no-op for
    # a signal it leaves out (the spec's default), never a provider of ours.
    from_file = config_file.applied() is not None
    if tracer_provider is None and (from_file or _is_configured(trace.get_tracer_provider())):
        tracer_provider = trace.get_tracer_provider()
        from_globals.add("tracer_provider")
    if meter_provider is None and (from_file or _is_configured(metrics.get_meter_provider())):
        meter_provider = metrics.get_meter_provider()
        from_globals.add("meter_provider")
    if logger_provider is None and (from_file or _is_configured(_logs.get_logger_provider())):
        logger_provider = _logs.get_logger_provider()
        from_globals.add("logger_provider")
    builds_none = None not in (tracer_provider, meter_provider, logger_provider)
    ignored = _ignored_settings(config, from_globals, builds_none, from_file) if from_globals else []
    if ignored:
        # Said once, as the run starts: the SDK's environment decides where telemetry goes.
        _logger.warning(
            "otel_mindformers: the OpenTelemetry SDK is configured from %s, and its exporters "
            "are used: in monitor_config, %s %s ignored.",
            f"{config_file.VARIABLE}"
            if from_file
            else "its environment (opentelemetry-instrument, or code that set the global providers)",
            "; ".join(ignored),
            "is" if len(ignored) == 1 else "are",
        )

    span_exporter = metric_exporter = log_exporter = None
    if wants_otlp and None in (tracer_provider, meter_provider, logger_provider):
        span_exporter, metric_exporter, log_exporter = checked_exporters or otlp_exporters(
            config.otlp, exported_signals()
        )
    else:  # checked, and no provider of ours is built now to use them
        _shut_down(checked_exporters)

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
            interval_warning = config.otlp.export_interval_warning()
            if interval_warning is not None:  # the SDK's reader says the same and goes on
                _logger.warning("otel_mindformers: %s", interval_warning)
            readers.append(
                PeriodicExportingMetricReader(
                    metric_exporter,
                    export_interval_millis=config.otlp.resolved_export_interval() * 1000,
                )
            )
        served = _prometheus_reader(config, identity) if wants_prometheus else None
        if served is not None:
            reader, stop_server = served
            readers.append(reader)
            release.append(stop_server)
        meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
        owned.append(meter_provider)
    else:
        borrowed.append(meter_provider)

    if logger_provider is None:
        logger_provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        if log_exporter is not None:
            logger_provider.add_log_record_processor(log_processor(log_exporter, config.otlp))
        owned.append(logger_provider)
    else:
        borrowed.append(logger_provider)

    if (span_exporter, metric_exporter, log_exporter) != (None, None, None):
        # After the providers are built: their own set-up warnings are not export failures.
        reporter = ExportErrorReporter(otlp_destination(config.otlp), secrets=config.otlp.headers.values()).install()
        on_close.append(reporter.uninstall)

    name, version = semconv.INSTRUMENTATION_NAME, __version__
    return Telemetry(
        tracer=tracer_provider.get_tracer(name, version),
        meter=meter_provider.get_meter(name, version),
        logger=logger_provider.get_logger(name, version),
        resource=resource,
        logger_provider=logger_provider,
        _owned=owned,
        _borrowed=borrowed,
        _on_close=on_close,
        _release=release,
        _export_errors=reporter,
    )
