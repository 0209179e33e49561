"""A real OTLP receiver on 127.0.0.1 (gRPC and HTTP/protobuf) that keeps what it decodes.

Built on opentelemetry-proto's generated services, so the bytes on the wire are what a
collector would receive. Gzip bodies (what rotel forwards) are accepted on both transports.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict, ParseDict
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def attributes(key_values) -> dict[str, Any]:
    """OTLP KeyValue list → plain dict."""
    out = {}
    for kv in key_values:
        value = MessageToDict(kv.value)
        out[kv.key] = next(iter(value.values())) if value else None
        if "intValue" in value:
            out[kv.key] = int(value["intValue"])
    return out


_OTLP_JSON_IDS = frozenset({"traceId", "spanId", "parentSpanId"})


def _otlp_json_ids(value):
    """OTLP/JSON writes trace and span ids as hex, where protobuf's JSON mapping wants base64."""
    if isinstance(value, dict):
        return {
            key: base64.b64encode(bytes.fromhex(item)).decode()
            if key in _OTLP_JSON_IDS and item
            else _otlp_json_ids(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_otlp_json_ids(item) for item in value]
    return value


@dataclass
class ReceivedSpan:
    resource: dict[str, Any]
    name: str
    attributes: dict[str, Any]
    trace_id: str
    span_id: str
    parent_span_id: str
    start_time_unix_nano: int
    end_time_unix_nano: int
    status_code: int
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]


@dataclass
class ReceivedPoint:
    resource: dict[str, Any]
    metric: str
    unit: str
    attributes: dict[str, Any]
    value: float | None  # gauge/sum value; None for histograms
    count: int | None  # histogram count
    sum: float | None
    exemplars: list[tuple[str, str]]  # (trace_id, span_id) hex
    time_unix_nano: int


@dataclass
class ReceivedLog:
    resource: dict[str, Any]
    scope: str  # the instrumentation scope: a Python logger's name for bridged logging
    body: Any
    severity_text: str
    attributes: dict[str, Any]
    trace_id: str  # hex; "" when the record carries no span
    span_id: str
    time_unix_nano: int


class OtlpReceiver:
    """Start with `with OtlpReceiver() as rx:`; `rx.grpc_endpoint` / `rx.http_endpoint`."""

    def __init__(self) -> None:
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.log_requests: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self._lock = threading.Lock()
        self._grpc_server: grpc.Server | None = None
        self._http_server: ThreadingHTTPServer | None = None

    # --- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> OtlpReceiver:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        receiver = self
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver._keep(receiver.trace_requests, request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):
                receiver._keep(receiver.metric_requests, request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request, context):
                receiver._keep(receiver.log_requests, request)
                return logs_service_pb2.ExportLogsServiceResponse()

        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
        self.grpc_port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._grpc_server = server

        routes: dict[str, tuple[Callable[[], Any], list]] = {
            "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, self.trace_requests),
            "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, self.metric_requests),
            "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, self.log_requests),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                route = routes.get(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if route is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                message_type, store = route
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    message = ParseDict(_otlp_json_ids(json.loads(body)), message_type())
                else:
                    message = message_type.FromString(body)
                receiver._keep(store, message)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self._http_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http_port = self._http_server.server_address[1]
        threading.Thread(target=self._http_server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._grpc_server is not None:
            self._grpc_server.stop(grace=None)
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _keep(self, store: list, request) -> None:
        with self._lock:
            store.append(request)

    # --- decoded views -------------------------------------------------------------------
    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            requests = list(self.trace_requests)
        out = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        if name is not None and span.name != name:
                            continue
                        out.append(
                            ReceivedSpan(
                                resource=resource,
                                name=span.name,
                                attributes=attributes(span.attributes),
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                start_time_unix_nano=span.start_time_unix_nano,
                                end_time_unix_nano=span.end_time_unix_nano,
                                status_code=span.status.code,
                                events=[(e.name, attributes(e.attributes)) for e in span.events],
                                links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            )
                        )
        return out

    def points(self, metric: str | None = None) -> list[ReceivedPoint]:
        with self._lock:
            requests = list(self.metric_requests)
        out = []
        for request in requests:
            for resource_metrics in request.resource_metrics:
                resource = attributes(resource_metrics.resource.attributes)
                for scope_metrics in resource_metrics.scope_metrics:
                    for m in scope_metrics.metrics:
                        if metric is not None and m.name != metric:
                            continue
                        out.extend(_points_of(resource, m))
        return out

    def log_records(self) -> list[tuple[dict[str, Any], Any]]:
        with self._lock:
            requests = list(self.log_requests)
        return [
            (attributes(rl.resource.attributes), record)
            for request in requests
            for rl in request.resource_logs
            for sl in rl.scope_logs
            for record in sl.log_records
        ]

    def log_count(self, scope: str | None = None) -> int:
        """Log records received (of one instrumentation scope), without decoding them."""
        with self._lock:
            requests = list(self.log_requests)
        return sum(
            len(scope_logs.log_records)
            for request in requests
            for resource_logs in request.resource_logs
            for scope_logs in resource_logs.scope_logs
            if scope is None or scope_logs.scope.name == scope
        )

    def logs(self, scope: str | None = None) -> list[ReceivedLog]:
        """Decoded log records; `scope` keeps those of one instrumentation scope."""
        with self._lock:
            requests = list(self.log_requests)
        out = []
        for request in requests:
            for resource_logs in request.resource_logs:
                resource = attributes(resource_logs.resource.attributes)
                for scope_logs in resource_logs.scope_logs:
                    if scope is not None and scope_logs.scope.name != scope:
                        continue
                    for record in scope_logs.log_records:
                        body = MessageToDict(record.body)
                        out.append(
                            ReceivedLog(
                                resource=resource,
                                scope=scope_logs.scope.name,
                                body=next(iter(body.values())) if body else None,
                                severity_text=record.severity_text,
                                attributes=attributes(record.attributes),
                                trace_id=record.trace_id.hex(),
                                span_id=record.span_id.hex(),
                                time_unix_nano=record.time_unix_nano,
                            )
                        )
        return out

    def wait_for(self, predicate: Callable[[OtlpReceiver], bool], timeout: float = 20.0) -> bool:
        """Poll until `predicate(self)` holds; exports are asynchronous by design."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.05)
        return predicate(self)


def _points_of(resource: dict[str, Any], metric) -> list[ReceivedPoint]:
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind)
    out = []
    for p in data.data_points:
        exemplars = [(e.trace_id.hex(), e.span_id.hex()) for e in getattr(p, "exemplars", [])]
        if kind == "histogram":
            value, count, total = None, p.count, p.sum
        else:
            value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
            count = total = None
        out.append(
            ReceivedPoint(
                resource=resource,
                metric=metric.name,
                unit=metric.unit,
                attributes=attributes(p.attributes),
                value=value,
                count=count,
                sum=total,
                exemplars=exemplars,
                time_unix_nano=p.time_unix_nano,
            )
        )
    return out
