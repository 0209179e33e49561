"""A failed OTLP export lets go of its batch when it returns, not at the next garbage collection.

The SDK's exporters keep a failure's exception on a local of the export call (the gRPC
exporter on its own-metrics result, the HTTP client on the result it returns). The
exception's traceback holds the frames it passed through, and a frame that outlives its
call holds its caller's frame: a reference cycle through the export's frames and those of
its callers, the SDK batch processor's included, which keeps the failed batch alive until
Python's cyclic collector runs. Against a collector that keeps failing, failed batches then
pile up beside the batch processor's bounded queue (OTEL_BSP_MAX_QUEUE_SIZE) and the batch
in flight. Dropping the failure's traceback as the export returns breaks the cycle: nothing
reads it after the exporter has logged it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def drop_tracebacks(error: BaseException | None) -> None:
    """Clear the traceback of `error` and of the exceptions chained to it."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__cause__, current.__context__]


class TracebackFreeMetrics:
    """An SDK exporter's own-metrics recorder whose `export_operation` drops the traceback of
    the failure the export put on its result, once the export is over (gRPC exporters)."""

    def __init__(self, metrics: Any) -> None:
        self._metrics = metrics

    @contextmanager
    def export_operation(self, num_items: int) -> Iterator[Any]:
        with self._metrics.export_operation(num_items) as result:
            try:
                yield result
            finally:
                drop_tracebacks(getattr(result, "error", None))


class TracebackFreeClient:
    """An SDK OTLP/HTTP exporter's client whose `export` returns its failure without a
    traceback; everything else is the client's."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def export(self, data: bytes) -> Any:
        result = self._client.export(data)
        drop_tracebacks(getattr(result, "error", None))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def free_failed_batches(exporter: Any) -> Any:
    """`exporter` (an SDK OTLP/HTTP exporter), its failed exports no longer holding their batch;
    unchanged if it keeps no `_client` (an SDK release other than those tested)."""
    client = getattr(exporter, "_client", None)
    if client is not None:
        exporter._client = TracebackFreeClient(client)
    return exporter
