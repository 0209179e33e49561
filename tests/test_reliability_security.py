"""Security: secrets stay out of everything we print, write or export; YAML is loaded
safely; OTLP over TLS honours the standard certificate variable.
"""

from __future__ import annotations

import gzip
import re
import shutil
import socket
import ssl
import subprocess
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_mindformers.config import ConfigError, load_monitor_config
from tests.support.backends import unavailable
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.reliability_worker import run

HEADER_SECRET = "hdr-7f3a9c-do-not-print"
WEBHOOK_TOKEN = "tok-2b8e41-do-not-print"
SIGNING_SECRET = "SEC9d0c55donotprint"
SECRETS = (HEADER_SECRET, WEBHOOK_TOKEN, SIGNING_SECRET)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a secret leaked into {where}"


def _secret_config(otlp_endpoint: str, dead_port: int) -> dict:
    """Every kind of secret the config holds, used for real: OTLP headers, a webhook URL with
    a token (through ${VAR} and literally), and a signing secret."""
    return {
        "interval": 1,
        "output_type": ["stdout", "json_file", "otlp"],
        "otlp": {
            "endpoint": otlp_endpoint,
            "headers": {"authorization": f"Bearer {HEADER_SECRET}"},
            "export_interval": 0.2,
            "timeout": 2,
        },
        "alert_config": {
            "enable_alert": True,
            "loss_threshold": 0.0,  # every step alerts, so the notifiers run and fail
            "alert_interval": 1,
            "notify_timeout": 0.5,
            "notify_retries": 0,
            "notifiers": [
                {"type": "webhook", "url": "${ALERT_WEBHOOK_URL}"},
                {
                    "type": "dingtalk",
                    "url": f"http://127.0.0.1:{dead_port}/robot/send?access_token={WEBHOOK_TOKEN}",
                    "secret": SIGNING_SECRET,
                },
            ],
        },
    }


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["healthy", "down"])
def test_secrets_never_leave_in_output_logs_or_telemetry(tmp_path, collector):
    dead_port = _free_port()
    with OtlpReceiver() as receiver:
        endpoint = receiver.grpc_endpoint if collector == "healthy" else f"http://127.0.0.1:{dead_port}"
        spec = {
            "config": _secret_config(endpoint, dead_port),
            "steps": 30,
            "graph": True,
            "report": str(tmp_path / "report.json"),
            "log_level": "DEBUG",
        }
        env = {"ALERT_WEBHOOK_URL": f"http://127.0.0.1:{dead_port}/hook?token={WEBHOOK_TOKEN}"}
        process, _ = run(spec, tmp_path, env=env)
        assert process.returncode == 0, process.stderr[-3000:]
        if collector == "healthy":
            assert receiver.wait_for(lambda rx: rx.spans("mindformers.train") and rx.log_records())
        exported = "\n".join(
            str(request) for request in receiver.trace_requests + receiver.metric_requests + receiver.log_requests
        )

    assert "alert notifier" in process.stderr, "the notifiers ran and failed, so their errors were logged"
    _assert_no_secret("stdout", process.stdout)
    _assert_no_secret("stderr / logs", process.stderr)
    _assert_no_secret("the JSON log", (tmp_path / "output" / "train_metric.json").read_text())
    _assert_no_secret("exported spans, metrics and logs", exported)


def test_config_repr_hides_secrets(workdir, monkeypatch):
    monkeypatch.setenv("ALERT_WEBHOOK_URL", f"https://example.invalid/hook?token={WEBHOOK_TOKEN}")
    config = load_monitor_config(_secret_config("http://127.0.0.1:4317", 9))
    assert config.otlp.headers == {"authorization": f"Bearer {HEADER_SECRET}"}
    assert config.alert_config.notifiers[0].url.endswith(WEBHOOK_TOKEN)
    for text in (repr(config), str(config), repr(config.otlp), repr(config.alert_config)):
        _assert_no_secret("the config's repr", text)


@pytest.mark.parametrize(
    "section",
    [
        {"otlp": {"headers": ["authorization", HEADER_SECRET]}},
        {"otlp": {"headers": {"authorization": [HEADER_SECRET]}}},
        {"otlp": {"headers": f"authorization {HEADER_SECRET}"}},
        {"alert_config": {"notifiers": [{"type": "webhook", "url": f"ftp://h/?token={WEBHOOK_TOKEN}"}]}},
        {"alert_config": {"notifiers": [{"type": "webhook", "url": ["x", WEBHOOK_TOKEN]}]}},
        {"alert_config": {"notifiers": [{"type": "webhook", "url": "https://h/x", "secret": SIGNING_SECRET}]}},
        {"alert_config": {"notifiers": [{"type": "dingtalk", "url": "https://h/x", "secret": {"k": SIGNING_SECRET}}]}},
        # a notifier written as a plain string URL, alone or in a list
        {"alert_config": {"notifiers": f"https://h/robot/send?access_token={WEBHOOK_TOKEN}"}},
        {"alert_config": {"notifiers": [f"https://h/robot/send?access_token={WEBHOOK_TOKEN}"]}},
        # whitespace inside a URL or a line break inside a header value
        {"alert_config": {"notifiers": [{"type": "slack", "url": f"https://h/x?token= {WEBHOOK_TOKEN}"}]}},
        {"otlp": {"headers": {"authorization": f"Bearer\n{HEADER_SECRET}"}}},
        # credentials in an endpoint that does not parse
        {"otlp": {"endpoint": f"http://user:{HEADER_SECRET}@[::1:4317"}},
        {"otlp": {"endpoint": f"ftp://user:{HEADER_SECRET}@h:4317"}},
    ],
)
def test_config_errors_do_not_echo_secrets(workdir, section):
    with pytest.raises(ConfigError) as raised:
        load_monitor_config(section)
    _assert_no_secret("a ConfigError", str(raised.value))
    assert "monitor_config." in str(raised.value), "the message still names the key"


def test_whitespace_around_secrets_is_stripped(workdir, monkeypatch):
    """What `$(cat token-file)` gives: a trailing newline, which made every delivery fail."""
    monkeypatch.setenv("ALERT_WEBHOOK_URL", f"https://example.invalid/hook?token={WEBHOOK_TOKEN}\n")
    monkeypatch.setenv("OTLP_TOKEN", f"{HEADER_SECRET}\n")
    config = load_monitor_config(
        {
            "otlp": {"headers": {"authorization": "Bearer ${OTLP_TOKEN}"}},
            "alert_config": {
                "notifiers": [
                    {"type": "webhook", "url": "${ALERT_WEBHOOK_URL}"},
                    {"type": "dingtalk", "url": "https://h/x", "secret": f" {SIGNING_SECRET}\n"},
                ]
            },
        }
    )
    assert config.otlp.headers == {"authorization": f"Bearer {HEADER_SECRET}"}
    assert config.alert_config.notifiers[0].url == f"https://example.invalid/hook?token={WEBHOOK_TOKEN}"
    assert config.alert_config.notifiers[1].secret == SIGNING_SECRET


def test_credentials_in_the_otlp_endpoint_stay_out_of_the_repr(workdir):
    config = load_monitor_config(
        {"otlp": {"endpoint": f"https://trainer:{HEADER_SECRET}@collector.example:4318/v1?key={WEBHOOK_TOKEN}"}}
    )
    assert config.otlp.endpoint.startswith("https://trainer:")  # used as written
    for text in (repr(config), str(config), repr(config.otlp)):
        _assert_no_secret("the config's repr", text)
        assert "endpoint='https://***@collector.example:4318/v1?***'" in text


@pytest.mark.parametrize(
    "key, section",
    [
        (
            "monitor_config.otlp.headers.authorization",
            {"otlp": {"headers": {"authorization": "Bearer ${NO_SUCH_TOKEN_VAR}"}}},
        ),
        (
            "monitor_config.otlp.headers.authorization",
            {"otlp": {"headers": "authorization=Bearer ${NO_SUCH_TOKEN_VAR}"}},
        ),
        ("monitor_config.otlp.endpoint", {"otlp": {"endpoint": "https://${NO_SUCH_TOKEN_VAR}@collector:4318"}}),
        ("monitor_config.json_log_path", {"json_log_path": "${NO_SUCH_TOKEN_VAR}/train.json"}),
    ],
)
def test_an_unset_variable_is_a_config_error(workdir, key, section):
    with pytest.raises(ConfigError, match=re.escape(f"{key}: environment variable 'NO_SUCH_TOKEN_VAR' is not set")):
        load_monitor_config(section)


def test_yaml_syntax_error_does_not_echo_the_line(workdir):
    path = workdir / "monitor.yaml"
    path.write_text(f"monitor_config:\n  otlp:\n    headers: {{authorization: Bearer {HEADER_SECRET}\n")
    with pytest.raises(ConfigError, match="not valid YAML at line") as raised:
        load_monitor_config(str(path))
    _assert_no_secret("a YAML error", str(raised.value))


def test_yaml_is_loaded_safely(workdir):
    """A YAML tag that would construct a Python object is refused, not executed."""
    marker = workdir / "pwned"
    path = workdir / "evil.yaml"
    path.write_text(f"monitor_config:\n  service_name: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_monitor_config(str(path))
    assert not marker.exists()


# --- OTLP over TLS ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command."""
    if shutil.which("openssl") is None:
        unavailable("openssl is not installed")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class TlsReceiver:
    """OTLP over TLS on 127.0.0.1: gRPC and HTTPS; keeps the span names it decodes."""

    def __init__(self, cert: Path, key: str | Path) -> None:
        self.span_names: list[str] = []
        lock = threading.Lock()
        receiver = self

        def keep_spans(request: trace_service_pb2.ExportTraceServiceRequest) -> None:
            with lock:
                receiver.span_names.extend(
                    span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
                )

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                keep_spans(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request, context):
                return logs_service_pb2.ExportLogsServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), self._grpc)
        credentials = grpc.ssl_server_credentials([(Path(key).read_bytes(), cert.read_bytes())])
        self.grpc_port = self._grpc.add_secure_port("127.0.0.1:0", credentials)
        self._grpc.start()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    keep_spans(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._https = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._https.socket = context.wrap_socket(self._https.socket, server_side=True)
        self.https_port = self._https.server_address[1]
        threading.Thread(target=self._https.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._grpc.stop(grace=None)
        self._https.shutdown()
        self._https.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize("trusted", [True, False])
def test_otlp_over_tls_honours_the_certificate_variable(tmp_path, certificate, protocol, trusted):
    cert, key = certificate
    receiver = TlsReceiver(cert, key)
    try:
        port = receiver.grpc_port if protocol == "grpc" else receiver.https_port
        spec = {
            "config": {
                "interval": 1,
                "output_type": ["otlp"],
                "otlp": {"endpoint": f"https://127.0.0.1:{port}", "protocol": protocol, "timeout": 3},
                "shutdown_timeout": 5,
            },
            "steps": 10,
            "graph": True,
            "report": str(tmp_path / "report.json"),
        }
        env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert)} if trusted else {}
        process, _ = run(spec, tmp_path, env=env)
    finally:
        receiver.close()
    assert process.returncode == 0, process.stderr[-3000:]
    if trusted:
        assert "mindformers.train" in receiver.span_names, process.stderr[-3000:]
    else:
        assert receiver.span_names == [], "an untrusted certificate must be refused"
        assert (
            len([line for line in process.stderr.splitlines() if line.startswith("otel_mindformers: OTLP export")]) == 1
        )


@pytest.mark.parametrize("control", ["\r", "\x00", "\x7f", "\t"], ids=["CR", "NUL", "DEL", "TAB"])
def test_a_header_value_with_a_control_character_is_refused_without_echoing_it(workdir, control):
    """A CR ends the header (request smuggling), NUL and DEL are no valid header octets; a
    tab is refused too (any control character). The key is named, the value never shown."""
    with pytest.raises(ConfigError) as raised:
        load_monitor_config({"otlp": {"headers": {"authorization": f"Bearer {HEADER_SECRET}{control}x"}}})
    assert raised.value.problems == [
        "monitor_config.otlp.headers.authorization: contains a control character such as a line break (value not shown)"
    ]
    _assert_no_secret("a ConfigError", str(raised.value))
