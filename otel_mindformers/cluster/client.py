"""The gRPC side of the MindCluster bridge: the generated stubs, a channel, and what went wrong.

The stubs (proto/) are generated from ClusterD's published .proto files and import only
where this runtime can load them (protobuf >= 5.26.1, grpcio >= 1.63.2: the generator's
floors); elsewhere the bridge is off, said once. Every failure a call can meet is one of a
few kinds, and each kind is warned about once per process (`Problems`): ClusterD
unreachable, slow, refusing, sending what does not parse, or ending the stream.
"""

from __future__ import annotations

import random
import threading
from types import ModuleType
from typing import Any

from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)

# ClusterD's connection limits (1,024 connections, 512 per IP; constants.go): the listener
# keeps one, a teller opens one per public fault. Keepalive pings no more often than a Go
# gRPC server's default enforcement (5 minutes) allows, or it drops the connection.
CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 330_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.enable_retries", 0),
)

UNREACHABLE, SLOW, REFUSED, MALFORMED, ENDED, LOST, FAILED = (
    "unreachable", "slow", "refused", "malformed", "ended", "lost", "failed",
)  # fmt: skip


class Unavailable(RuntimeError):
    """The stubs cannot load on this runtime (the message says why)."""


def stubs() -> tuple[ModuleType, ModuleType]:
    """(fault_pb2, pubfault_pb2): the messages and the services' descriptors. The calls are
    made from the descriptors (`call`, `stream`), so replies are parsed here."""
    try:
        import grpc  # noqa: F401  (the OTLP exporter's dependency: absent, nothing here can work)

        from otel_mindformers.cluster.proto import fault_pb2, pubfault_pb2
    except Exception as exc:  # an old protobuf, no grpcio, or a clashing message in the default pool
        raise Unavailable(
            f"ClusterD's gRPC stubs do not load here ({type(exc).__name__}: {exc}); they need "
            "protobuf >= 5.26.1 and grpcio >= 1.63.2"
        ) from exc
    return fault_pb2, pubfault_pb2


def channel(target: str) -> Any:
    import grpc

    return grpc.insecure_channel(target, options=list(CHANNEL_OPTIONS))


class Malformed(ValueError):
    """ClusterD sent bytes that do not parse as the message the .proto names."""


def parse(message_type: Any, raw: bytes) -> Any:
    """Replies are parsed here, not by gRPC: gRPC would log a traceback for every message that
    does not parse (ClusterD sending garbage), where this bridge says so once."""
    try:
        return message_type.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError and what a broken message makes it raise
        raise Malformed(f"{message_type.DESCRIPTOR.name}: {type(exc).__name__}: {str(exc)[:100]}") from exc


def _path(service: Any, method: str) -> str:
    return f"/{service.full_name}/{service.methods_by_name[method].name}"


def call(channel: Any, service: Any, method: str, request: Any, reply_type: Any, timeout: float) -> Any:
    """A unary call of `service` (the generated stubs' service descriptor), its reply parsed."""
    send = channel.unary_unary(_path(service, method), request_serializer=type(request).SerializeToString)
    return parse(reply_type, send(request, timeout=timeout))


def stream(channel: Any, service: Any, method: str, request: Any) -> Any:
    """A server-streaming call; it yields the replies' bytes (`parse` each)."""
    return channel.unary_stream(_path(service, method), request_serializer=type(request).SerializeToString)(request)


def kind_of(error: BaseException) -> tuple[str, str]:
    """(kind, words) of a failed call."""
    import grpc

    if isinstance(error, Malformed):
        return MALFORMED, f"sent a message that does not parse as the .proto says ({error})"
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        code, details = error.code(), (error.details() or "").strip()
        if code == grpc.StatusCode.UNAVAILABLE:
            return UNREACHABLE, f"unreachable ({details or code.name})"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return SLOW, "no answer within the timeout (cluster.timeout)"
        return FAILED, f"{code.name}: {details[:200]}"
    return FAILED, f"{type(error).__name__}: {str(error)[:200]}"


class Problems:
    """One warning per kind of problem per process; the rest at debug level. `what` names
    the bridge's side in the message (hearing ClusterD, telling ClusterD)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.failing = False
        self.count: dict[str, int] = {}

    def report(self, kind: str, words: str, then: str) -> None:
        with self._lock:
            self.count[kind] = self.count.get(kind, 0) + 1
            first = kind not in self._warned
            self._warned.add(kind)
            self.failing = True
        if first:
            _logger.warning(
                "otel_mindformers: %s: ClusterD %s; %s (said once; training is not affected)", self._what, words, then
            )
        else:
            _logger.debug("otel_mindformers: %s: ClusterD %s; %s", self._what, words, then)

    def recovered(self, words: str) -> None:
        with self._lock:
            was, self.failing = self.failing, False
        if was:
            _logger.info("otel_mindformers: %s: %s", self._what, words)


class Backoff:
    """Waits between retries: from `first` doubling to `most`, with jitter (many jobs losing
    one ClusterD must not come back to it in step)."""

    def __init__(self, first: float, most: float) -> None:
        self._first, self._most = first, max(first, most)
        self._next = first

    def next(self) -> float:
        wait = self._next
        self._next = min(self._most, self._next * 2)
        return wait * random.uniform(0.8, 1.0)

    def reset(self) -> None:
        self._next = self._first


__all__ = [
    "CHANNEL_OPTIONS",
    "ENDED",
    "FAILED",
    "LOST",
    "MALFORMED",
    "REFUSED",
    "SLOW",
    "UNREACHABLE",
    "Backoff",
    "Malformed",
    "Problems",
    "Unavailable",
    "call",
    "channel",
    "kind_of",
    "parse",
    "stream",
    "stubs",
]
