"""The OTLP/gRPC span and log exporters, encoding each batch straight to its wire bytes.

MindSpore forces protobuf's pure-Python implementation on the whole process. There, every
message object the SDK's encoders (`encode_spans`, `encode_logs`) build costs Python calls
per field set, per presence check and per serialization pass, on the exporters' threads,
where they hold the GIL and a core the training needs (docs/performance.md has the cost).
This module writes the same bytes directly (`tests/test_otlp_wire_encoder.py` compares them
with the SDK's request, field for field and byte for byte) and hands them to the SDK's gRPC
exporter through a stub that sends bytes as they are. Retries, timeouts, TLS, headers,
compression and the exporter's own metrics are the SDK's, unchanged.

The field numbers and wire types come from the generated descriptors, never from this file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.exporter import OTLPExporterMixin
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, SpanFlags, Status
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind

from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.telemetry.failed_exports import TracebackFreeMetrics

_logger = get_logger(__name__)

# --- tags from the descriptors -------------------------------------------------------------
_WIRE_TYPES = {
    FieldDescriptor.TYPE_MESSAGE: 2,
    FieldDescriptor.TYPE_STRING: 2,
    FieldDescriptor.TYPE_BYTES: 2,
    FieldDescriptor.TYPE_ENUM: 0,
    FieldDescriptor.TYPE_UINT32: 0,
    FieldDescriptor.TYPE_INT64: 0,
    FieldDescriptor.TYPE_BOOL: 0,
    FieldDescriptor.TYPE_FIXED64: 1,
    FieldDescriptor.TYPE_DOUBLE: 1,
    FieldDescriptor.TYPE_FIXED32: 5,
}


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int below 2**64."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(message: Any, field: str) -> bytes:
    descriptor: Descriptor = message.DESCRIPTOR
    number_and_type = descriptor.fields_by_name[field]
    return _varint(number_and_type.number << 3 | _WIRE_TYPES[number_and_type.type])


class _Layout(NamedTuple):
    """The tags of a request's resource and scope levels, from the request's own messages."""

    request: bytes
    resource: bytes
    scopes: bytes
    resource_schema: bytes
    scope: bytes
    items: bytes
    scope_schema: bytes


_SPANS_LAYOUT = _Layout(
    _tag(trace_service_pb2.ExportTraceServiceRequest, "resource_spans"),
    _tag(ResourceSpans, "resource"),
    _tag(ResourceSpans, "scope_spans"),
    _tag(ResourceSpans, "schema_url"),
    _tag(ScopeSpans, "scope"),
    _tag(ScopeSpans, "spans"),
    _tag(ScopeSpans, "schema_url"),
)
_LOGS_LAYOUT = _Layout(
    _tag(logs_service_pb2.ExportLogsServiceRequest, "resource_logs"),
    _tag(ResourceLogs, "resource"),
    _tag(ResourceLogs, "scope_logs"),
    _tag(ResourceLogs, "schema_url"),
    _tag(ScopeLogs, "scope"),
    _tag(ScopeLogs, "log_records"),
    _tag(ScopeLogs, "schema_url"),
)
_RESOURCE_ATTRIBUTES = _tag(Resource, "attributes")
_SCOPE_NAME = _tag(InstrumentationScope, "name")
_SCOPE_VERSION = _tag(InstrumentationScope, "version")
_SCOPE_ATTRIBUTES = _tag(InstrumentationScope, "attributes")

_SPAN = {
    name: _tag(Span, name)
    for name in (
        "trace_id", "span_id", "trace_state", "parent_span_id", "name", "kind", "start_time_unix_nano",
        "end_time_unix_nano", "attributes", "dropped_attributes_count", "events", "dropped_events_count",
        "links", "dropped_links_count", "status", "flags",
    )
}  # fmt: skip
_EVENT = {name: _tag(Span.Event, name) for name in ("time_unix_nano", "name", "attributes", "dropped_attributes_count")}
_LINK = {
    name: _tag(Span.Link, name) for name in ("trace_id", "span_id", "attributes", "dropped_attributes_count", "flags")
}
_STATUS_MESSAGE, _STATUS_CODE = _tag(Status, "message"), _tag(Status, "code")
_LOG = {
    name: _tag(LogRecord, name)
    for name in (
        "time_unix_nano", "severity_number", "severity_text", "body", "attributes", "dropped_attributes_count",
        "flags", "trace_id", "span_id", "observed_time_unix_nano", "event_name",
    )
}  # fmt: skip
_KEY, _VALUE = _tag(KeyValue, "key"), _tag(KeyValue, "value")
_STRING, _BOOL, _INT, _DOUBLE, _ARRAY, _KVLIST, _BYTES = (
    _tag(AnyValue, name)
    for name in (
        "string_value",
        "bool_value",
        "int_value",
        "double_value",
        "array_value",
        "kvlist_value",
        "bytes_value",
    )
)
_ARRAY_VALUES, _KVLIST_VALUES = _tag(ArrayValue, "values"), _tag(KeyValueList, "values")
_TRUE, _FALSE = _BOOL + b"\x01", _BOOL + b"\x00"

_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE_BYTES = struct.Struct("<d").pack
_INT64_MIN, _INT64_LIMIT, _UINT64 = -(2**63), 2**63, 2**64 - 1

_KINDS = {
    SpanKind.INTERNAL: Span.SpanKind.SPAN_KIND_INTERNAL,
    SpanKind.SERVER: Span.SpanKind.SPAN_KIND_SERVER,
    SpanKind.CLIENT: Span.SpanKind.SPAN_KIND_CLIENT,
    SpanKind.PRODUCER: Span.SpanKind.SPAN_KIND_PRODUCER,
    SpanKind.CONSUMER: Span.SpanKind.SPAN_KIND_CONSUMER,
}
_HAS_IS_REMOTE = int(SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
_IS_REMOTE = int(SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)

# Attribute keys repeat on every span: their encoded prefix is kept, up to this many keys.
_KEY_CACHE_SIZE = 4096
_key_prefixes: dict[str, bytes] = {}


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + _varint(len(payload)) + payload


def _string(tag: bytes, text: str) -> bytes:
    """A proto3 string field: left out when empty."""
    return _field(tag, text.encode()) if text else b""


def _count(tag: bytes, value: int) -> bytes:
    return tag + _varint(value) if value else b""


# --- the exporters -------------------------------------------------------------------------
def _bytes_stub(service: ServiceDescriptor, response: Any) -> Callable[[Any], Any]:
    """Made like a generated stub (`stub(channel)`), whose `Export` sends the request's bytes
    as they are; the reply is parsed by its generated message."""
    path = f"/{service.full_name}/Export"

    def stub(channel: Any) -> SimpleNamespace:
        return SimpleNamespace(
            Export=channel.unary_unary(path, request_serializer=None, response_deserializer=response.FromString)
        )

    return stub


# A collector's gRPC server takes requests of up to 4 MiB by default (the OTel Collector's
# `max_recv_msg_size_mib`, grpc-go's and grpcio's default): a batch is sent as requests of at
# most this many bytes of items, leaving room for the resource and scope around them, so one
# large item (a traceback, a big attribute) costs no other item its delivery.
MAX_REQUEST_BYTES = 3 * 1024 * 1024


class _Chunk(list[Any]):
    """Items of one request, with each item's encoded bytes (encoded once, to size it)."""

    encoded: list[bytes]


def _chunks(items: Sequence[Any], encoded: list[bytes], limit: int) -> list[_Chunk]:
    chunks: list[_Chunk] = []
    chunk, size = _Chunk(), 0
    chunk.encoded = []
    for item, body in zip(items, encoded):
        if chunk and size + len(body) > limit:
            chunks.append(chunk)
            chunk, size = _Chunk(), 0
            chunk.encoded = []
        chunk.append(item)
        chunk.encoded.append(body)
        size += len(body) + 8  # the item's tag and length prefix, at most
    if chunk:
        chunks.append(chunk)
    return chunks


class _BoundedRequests:
    """The SDK's gRPC exporter, sending bytes through `_bytes_stub` (the SDK reconnects with
    it too), a request per chunk of at most MAX_REQUEST_BYTES; the first chunk that fails
    (after the SDK's retries) fails the batch, as one request would have. A failed export
    leaves no reference cycle holding its batch (telemetry/failed_exports.py)."""

    _result: Any
    _channel: Any
    _service: ServiceDescriptor
    _response: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stub = _bytes_stub(self._service, self._response)
        self._client = self._stub(self._channel)

    @property
    def _metrics(self) -> Any:
        return self._traceback_free_metrics

    @_metrics.setter
    def _metrics(self, metrics: Any) -> None:  # the SDK sets it at init and with a new meter provider
        self._traceback_free_metrics = TracebackFreeMetrics(metrics)

    def _encode_item(self, item: Any) -> bytes:
        raise NotImplementedError

    def _encode(self, items: Sequence[Any], encoded: list[bytes]) -> bytes:
        raise NotImplementedError

    def export(self, batch: Sequence[Any]) -> Any:
        items = list(batch)
        for chunk in _chunks(items, [self._encode_item(item) for item in items], MAX_REQUEST_BYTES):
            result = OTLPExporterMixin._export(self, chunk)  # type: ignore[arg-type]
            if result is not self._result.SUCCESS:
                return result
        return self._result.SUCCESS

    def _translate_data(self, data: Sequence[Any]) -> bytes:
        encoded = data.encoded if isinstance(data, _Chunk) else [self._encode_item(item) for item in data]
        return self._encode(data, encoded)


class InPlaceOTLPSpanExporter(_BoundedRequests, OTLPSpanExporter):  # type: ignore[misc]  # bytes for the bytes stub
    """The SDK's gRPC span exporter, sending the requests `encode_spans` writes."""

    _service = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"]
    _response = trace_service_pb2.ExportTraceServiceResponse

    def _encode_item(self, item: Any) -> bytes:
        return _span(item)

    def _encode(self, items: Sequence[Any], encoded: list[bytes]) -> bytes:
        return encode_spans(items, encoded)


class InPlaceOTLPLogExporter(_BoundedRequests, OTLPLogExporter):  # type: ignore[misc]  # bytes for the bytes stub
    """The SDK's gRPC log exporter, sending the requests `encode_logs` writes."""

    _service = logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"]
    _response = logs_service_pb2.ExportLogsServiceResponse

    def _encode_item(self, item: Any) -> bytes:
        return _log_record(item)

    def _encode(self, items: Sequence[Any], encoded: list[bytes]) -> bytes:
        return encode_logs(items, encoded)


# --- requests ------------------------------------------------------------------------------
def encode_spans(spans: Sequence[ReadableSpan], encoded: list[bytes] | None = None) -> bytes:
    """The serialized ExportTraceServiceRequest for `spans` (`encoded`: each one's bytes)."""
    return _request(_SPANS_LAYOUT, spans, encoded if encoded is not None else [_span(span) for span in spans])


def encode_logs(records: Sequence[ReadableLogRecord], encoded: list[bytes] | None = None) -> bytes:
    """The serialized ExportLogsServiceRequest for `records` (`encoded`: each one's bytes)."""
    return _request(_LOGS_LAYOUT, records, encoded if encoded is not None else [_log_record(r) for r in records])


def _request(layout: _Layout, items: Sequence[Any], encoded: list[bytes]) -> bytes:
    """One resource entry per resource, one scope entry per instrumentation scope in it, in
    the order they first appear (as the SDK groups them)."""
    grouped: dict[Any, dict[Any, list[bytes]]] = {}
    for item, body in zip(items, encoded):
        grouped.setdefault(item.resource, {}).setdefault(item.instrumentation_scope or None, []).append(body)
    parts = []
    for resource, scopes in grouped.items():
        entry = [_field(layout.resource, _attributes(_RESOURCE_ATTRIBUTES, resource.attributes))]
        for scope, members in scopes.items():
            scope_entry = [_field(layout.scope, _scope(scope))]
            scope_entry.extend(_field(layout.items, body) for body in members)
            if scope is not None and scope.schema_url:
                scope_entry.append(_string(layout.scope_schema, scope.schema_url))
            entry.append(_field(layout.scopes, b"".join(scope_entry)))
        if resource.schema_url:
            entry.append(_string(layout.resource_schema, resource.schema_url))
        parts.append(_field(layout.request, b"".join(entry)))
    return b"".join(parts)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    return (
        _string(_SCOPE_NAME, scope.name)
        + _string(_SCOPE_VERSION, scope.version or "")
        + _attributes(_SCOPE_ATTRIBUTES, scope.attributes)
    )


def _span(span: ReadableSpan) -> bytes:
    tags = _SPAN
    context = span.context  # a finished span always has one
    assert context is not None
    parts = [
        tags["trace_id"] + b"\x10" + context.trace_id.to_bytes(16, "big"),
        tags["span_id"] + b"\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state is not None:
        parts.append(_string(tags["trace_state"], ",".join(f"{k}={v}" for k, v in context.trace_state.items())))
    if span.parent is not None:
        parts.append(tags["parent_span_id"] + b"\x08" + span.parent.span_id.to_bytes(8, "big"))
    parts.append(_string(tags["name"], span.name))
    parts.append(_count(tags["kind"], _KINDS[span.kind]))
    if span.start_time:
        parts.append(tags["start_time_unix_nano"] + _FIXED64(span.start_time))
    if span.end_time:
        parts.append(tags["end_time_unix_nano"] + _FIXED64(span.end_time))
    parts.append(_attributes(tags["attributes"], span.attributes))
    parts.append(_count(tags["dropped_attributes_count"], span.dropped_attributes))
    for event in span.events:
        body = (
            (_EVENT["time_unix_nano"] + _FIXED64(event.timestamp) if event.timestamp else b"")
            + _string(_EVENT["name"], event.name)
            + _attributes(_EVENT["attributes"], event.attributes)
            + _count(_EVENT["dropped_attributes_count"], event.dropped_attributes)
        )
        parts.append(_field(tags["events"], body))
    parts.append(_count(tags["dropped_events_count"], span.dropped_events))
    for link in span.links:
        body = (
            _LINK["trace_id"] + b"\x10" + link.context.trace_id.to_bytes(16, "big")
            + _LINK["span_id"] + b"\x08" + link.context.span_id.to_bytes(8, "big")
            + _attributes(_LINK["attributes"], link.attributes)
            + _count(_LINK["dropped_attributes_count"], link.dropped_attributes)
            + _LINK["flags"] + _FIXED32(_flags(link.context))
        )  # fmt: skip
        parts.append(_field(tags["links"], body))
    parts.append(_count(tags["dropped_links_count"], span.dropped_links))
    if span.status is not None:
        status = _string(_STATUS_MESSAGE, span.status.description or "")
        parts.append(_field(tags["status"], status + _count(_STATUS_CODE, span.status.status_code.value)))
    parts.append(tags["flags"] + _FIXED32(_flags(span.parent)))
    return b"".join(parts)


def _flags(context: SpanContext | None) -> int:
    flags = _HAS_IS_REMOTE
    if context is not None and context.is_remote:
        flags |= _IS_REMOTE
    return flags


def _log_record(readable: ReadableLogRecord) -> bytes:
    tags = _LOG
    record = readable.log_record
    parts = []
    if record.timestamp:
        parts.append(tags["time_unix_nano"] + _FIXED64(record.timestamp))
    severity = getattr(record.severity_number, "value", None)
    if severity:
        parts.append(tags["severity_number"] + _varint(severity))
    parts.append(_string(tags["severity_text"], record.severity_text or ""))
    parts.append(tags["body"] + _any_value_field(record.body))
    parts.append(_attributes(tags["attributes"], record.attributes))
    parts.append(_count(tags["dropped_attributes_count"], readable.dropped_attributes))
    flags = int(record.trace_flags or 0)
    if flags:
        parts.append(tags["flags"] + _FIXED32(flags))
    if record.trace_id:
        parts.append(tags["trace_id"] + b"\x10" + record.trace_id.to_bytes(16, "big"))
    if record.span_id:
        parts.append(tags["span_id"] + b"\x08" + record.span_id.to_bytes(8, "big"))
    if record.observed_timestamp:
        parts.append(tags["observed_time_unix_nano"] + _FIXED64(record.observed_timestamp))
    parts.append(_string(tags["event_name"], record.event_name or ""))
    return b"".join(parts)


# --- attributes and values -----------------------------------------------------------------
def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """One KeyValue field per attribute; a value no OTLP type holds is left out with a
    logged error, as the SDK's encoder does."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():
        try:
            encoded = _any_value_field(value)
        except Exception as error:
            _logger.exception("Failed to encode key %s: %s", key, error)
            continue
        prefix = _key_prefixes.get(key)
        if prefix is None:
            prefix = _string(_KEY, key)
            if len(_key_prefixes) < _KEY_CACHE_SIZE:
                _key_prefixes[key] = prefix
        pair = prefix + _VALUE + encoded
        parts.append(tag + _varint(len(pair)) + pair)
    return b"".join(parts)


def _key_value(key: str, value: Any) -> bytes:
    return _string(_KEY, key) + _VALUE + _any_value_field(value)


def _any_value_field(value: Any) -> bytes:
    """The length prefix and body of the AnyValue holding `value` (set oneof members are
    written even at their zero value, as protobuf does)."""
    if value is None:
        return b"\x00"
    if isinstance(value, bool):
        body = _TRUE if value else _FALSE
    elif isinstance(value, str):
        body = _field(_STRING, value.encode())
    elif isinstance(value, int):
        if not _INT64_MIN <= value < _INT64_LIMIT:
            raise ValueError(f"Value out of range: {value}")
        body = _INT + _varint(value & _UINT64)
    elif isinstance(value, float):
        body = _DOUBLE + _DOUBLE_BYTES(value)
    elif isinstance(value, bytes):
        body = _field(_BYTES, value)
    elif isinstance(value, Sequence):
        items = b"".join(_ARRAY_VALUES + _any_value_field(item) for item in value)
        body = _field(_ARRAY, items)
    elif isinstance(value, Mapping):
        pairs = b"".join(_field(_KVLIST_VALUES, _key_value(str(key), item)) for key, item in value.items())
        body = _field(_KVLIST, pairs)
    else:
        raise TypeError(f"Invalid type {type(value)} of value {value}")
    return _varint(len(body)) + body
