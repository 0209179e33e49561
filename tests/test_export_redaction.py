"""Credentials in `otlp.endpoint` (`http://user:token@host`) and `otlp.headers` never reach
a message: not our export warning, not the exporters' own text we quote, not `replay`'s
error or success lines."""

from __future__ import annotations

import json

import pytest

from otel_mindformers.config.redaction import printable_endpoint
from otel_mindformers.telemetry.export_errors import ExportErrorReporter
from tests.support.cli import cli
from tests.support.instrumented import free_port
from tests.support.reliability_worker import run

TOKEN = "tok3n-in-the-url"
HEADER_SECRET = "Bearer header-s3cret"


@pytest.mark.parametrize(
    "endpoint, shown",
    [
        (f"http://svc:{TOKEN}@127.0.0.1:4318/v1?key=query-s3cret", "http://***@127.0.0.1:4318/v1?***"),
        (f"svc:{TOKEN}@127.0.0.1:4317", "***@127.0.0.1:4317"),  # gRPC, no scheme
        ("http://127.0.0.1:4317", "http://127.0.0.1:4317"),
        ("the default OTLP endpoint", "the default OTLP endpoint"),
    ],
)
def test_the_printed_endpoint_has_no_credentials(endpoint, shown):
    assert printable_endpoint(endpoint) == shown


def test_the_exporters_own_text_is_masked_too():
    """The gRPC exporter names its target as `user:token@host:port` in its messages."""
    reporter = ExportErrorReporter(f"http://svc:{TOKEN}@127.0.0.1:4317", secrets=[HEADER_SECRET], announce=False)
    reporter.report(
        f"Failed to export traces to svc:{TOKEN}@127.0.0.1:4317 with header {HEADER_SECRET}, "
        "error code: StatusCode.UNAVAILABLE"
    )
    assert reporter.first_failure == (
        "Failed to export traces to ***@127.0.0.1:4317 with header ***, error code: StatusCode.UNAVAILABLE"
    )


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_export_warning_of_a_training_run_shows_no_credentials(tmp_path, protocol):
    port = free_port()  # nothing listens: every export fails
    spec = {
        "config": {
            "interval": 1,
            "output_type": ["json_file", "otlp"],
            "shutdown_timeout": 1.0,
            "otlp": {
                "endpoint": f"http://svc:{TOKEN}@127.0.0.1:{port}",
                "protocol": protocol,
                "timeout": 1.0,
                "export_interval": 0.2,
                "headers": {"authorization": HEADER_SECRET},
            },
        },
        "steps": 20,
        "report": str(tmp_path / "report.json"),
    }
    process, _ = run(spec, tmp_path)
    assert process.returncode == 0, process.stderr[-3000:]
    (warning,) = [line for line in process.stderr.splitlines() if line.startswith("otel_mindformers: OTLP export")]
    assert f"http://***@127.0.0.1:{port}" in warning
    output = process.stdout + process.stderr
    assert TOKEN not in output and "header-s3cret" not in output


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_replay_names_the_endpoint_without_credentials(tmp_path, protocol):
    log = tmp_path / "train_metric.json"
    log.write_text(
        "".join(
            json.dumps({"time_stamp": 1.7e9 + step, "step": step, "epoch": 1, "rank": 0, "loss": 1.0 / step}) + "\n"
            for step in range(1, 4)
        )
    )
    port = free_port()
    done = cli(
        "replay",
        str(log),
        "--endpoint",
        f"http://svc:{TOKEN}@127.0.0.1:{port}",
        "--protocol",
        protocol,
        "--timeout",
        "1",
        "--header",
        f"authorization={HEADER_SECRET}",
        timeout=120,
    )
    assert done.returncode == 1
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert f"http://***@127.0.0.1:{port}" in line, line
    assert TOKEN not in done.stdout + done.stderr and "header-s3cret" not in done.stdout + done.stderr


def test_a_url_quoted_header_secret_is_masked_too():
    """An HTTP library quotes a header value into a URL or a repr: `Bearer%20header-s3cret`."""
    reporter = ExportErrorReporter("http://127.0.0.1:4318", secrets=[HEADER_SECRET], announce=False)
    reporter.report("Failed to export to http://127.0.0.1:4318/v1/traces?auth=Bearer%20header-s3cret: 401")
    assert reporter.first_failure == "Failed to export to http://127.0.0.1:4318/v1/traces?auth=***: 401"
    assert "s3cret" not in reporter.first_failure


def test_records_a_full_sdk_queue_drops_are_counted_per_signal_and_not_blamed_on_the_collector(caplog):
    import logging
    import threading

    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExportResult

    release = threading.Event()

    class Stuck:  # a healthy but slower-than-the-producer exporter
        def export(self, batch):
            release.wait(10)
            return LogRecordExportResult.SUCCESS

        def shutdown(self):
            pass

        def force_flush(self, timeout_millis=0):
            return True

    provider = LoggerProvider()
    provider.add_log_record_processor(BatchLogRecordProcessor(Stuck(), max_queue_size=4, max_export_batch_size=2))
    reporter = ExportErrorReporter("http://127.0.0.1:4318").install()
    try:
        with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
            logger = provider.get_logger("t")
            from opentelemetry._logs import LogRecord

            for i in range(200):
                logger.emit(LogRecord(body=f"line {i}"))
            dropped = reporter.dropped.get("Log", 0)
            release.set()
            reporter.uninstall()
    finally:
        release.set()
        provider.shutdown()
    messages = [r.getMessage() for r in caplog.records]
    assert dropped > 150
    assert not any("is failing or too slow" in m for m in messages), messages
    (first,) = [m for m in messages if "queue for Log records is full" in m]
    assert "dropped in this process" in first
    (total,) = [m for m in messages if "full SDK queues dropped" in m]
    assert f"{dropped} Log record(s)" in total


def test_another_exporters_failure_is_not_taken_for_ours():
    """A provider of the user's, or an earlier run's, exporting to a collector that is down:
    its failures name its own address; this run's reporter, for another, lets them be."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider

    dead = f"http://127.0.0.1:{free_port()}"
    provider = TracerProvider()
    span = provider.get_tracer("test").start_span("s")
    span.end()
    for destination, blamed in ((f"http://127.0.0.1:{free_port()}", False), (dead, True)):
        exporter = OTLPSpanExporter(endpoint=dead, insecure=True, timeout=1)
        reporter = ExportErrorReporter(destination, announce=False).install()
        try:
            exporter.export([span])
        finally:
            reporter.uninstall()
            exporter.shutdown()
        assert reporter.failing is blamed, (destination, reporter.first_failure)
