"""The test suite's OTLP receiver (tests/support/otlp_receiver.py) in its own process, so
decoding what the benchmarks export never competes with the measured training for the GIL.
The parent talks to it over the child's stdin/stdout, one JSON line per command.

    with ReceiverProcess() as receiver:
        ... export to receiver.grpc_endpoint ...
        stats = receiver.stats()   # what arrived so far, per rank, and the receiver's CPU time
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent

RANK_ATTRIBUTE = "training.rank"


def _stats(receiver: Any) -> dict[str, Any]:
    """What arrived, per rank. Bytes are serialized protobuf sizes as they cross the wire
    uncompressed; `*_envelope_bytes` is what each export message spends on the resource and
    scope around its spans or metrics."""
    from tests.support.otlp_receiver import attributes

    with receiver._lock:
        traces = list(receiver.trace_requests)
        metrics = list(receiver.metric_requests)
        logs = list(receiver.log_requests)
    per_rank: dict[int, dict[str, Any]] = defaultdict(
        lambda: {
            "span_batches": 0,
            "spans": 0,
            "span_bytes": 0,
            "span_envelope_bytes": 0,
            "span_names": defaultdict(int),
            "metric_exports": 0,
            "metric_envelope_bytes": 0,
            "points": defaultdict(int),
            "point_bytes": defaultdict(int),
            "series": defaultdict(set),
            "metric_points": defaultdict(int),  # by metric name
            "metric_bytes": defaultdict(int),
        }
    )
    for request in traces:
        for resource_spans in request.resource_spans:
            entry = per_rank[attributes(resource_spans.resource.attributes).get(RANK_ATTRIBUTE, -1)]
            entry["span_batches"] += 1
            spans = [span for scope in resource_spans.scope_spans for span in scope.spans]
            entry["spans"] += len(spans)
            span_bytes = sum(span.ByteSize() for span in spans)
            entry["span_bytes"] += span_bytes
            entry["span_envelope_bytes"] += resource_spans.ByteSize() - span_bytes
            for span in spans:
                entry["span_names"][span.name] += 1
    for request in metrics:
        for resource_metrics in request.resource_metrics:
            entry = per_rank[attributes(resource_metrics.resource.attributes).get(RANK_ATTRIBUTE, -1)]
            entry["metric_exports"] += 1
            metric_bytes = 0
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    data = getattr(metric, kind)
                    entry["points"][kind] += len(data.data_points)
                    entry["point_bytes"][kind] += metric.ByteSize()
                    entry["metric_points"][metric.name] += len(data.data_points)
                    entry["metric_bytes"][metric.name] += metric.ByteSize()
                    metric_bytes += metric.ByteSize()
                    for point in data.data_points:
                        key = tuple(sorted((kv.key, str(kv.value)) for kv in point.attributes))
                        entry["series"][kind].add((metric.name, key))
            entry["metric_envelope_bytes"] += resource_metrics.ByteSize() - metric_bytes
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "requests": len(traces) + len(metrics) + len(logs),
        "log_records": sum(len(scope.log_records) for r in logs for rl in r.resource_logs for scope in rl.scope_logs),
        "request_bytes": sum(r.ByteSize() for r in traces + metrics + logs),
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "per_rank": {
            rank: {
                **v,
                "span_names": dict(v["span_names"]),
                "points": dict(v["points"]),
                "point_bytes": dict(v["point_bytes"]),
                "series": {kind: len(keys) for kind, keys in v["series"].items()},
                "series_by_metric": {
                    name: sum(1 for keys in v["series"].values() for metric, _ in keys if metric == name)
                    for name in v["metric_points"]
                },
                "metric_points": dict(v["metric_points"]),
                "metric_bytes": dict(v["metric_bytes"]),
            }
            for rank, v in per_rank.items()
        },
    }


def _dump(receiver: Any, path: str) -> int:
    """Every request received, as (service path, serialized bytes) records for a replay."""
    with receiver._lock:
        batches = [
            ("/opentelemetry.proto.collector.trace.v1.TraceService/Export", receiver.trace_requests),
            ("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", receiver.metric_requests),
            ("/opentelemetry.proto.collector.logs.v1.LogsService/Export", receiver.log_requests),
        ]
        records = [(method, request.SerializeToString()) for method, requests in batches for request in requests]
    with open(path, "wb") as handle:
        pickle.dump(records, handle)
    return len(records)


def _serve() -> None:
    """Child side: endpoints as the first stdout line, then one JSON reply per command."""
    from tests.support.otlp_receiver import OtlpReceiver

    with OtlpReceiver() as receiver:
        print(json.dumps([receiver.grpc_endpoint, receiver.http_endpoint]), flush=True)
        for command in sys.stdin:
            command = command.strip()
            if command == "stop":
                break
            if command.startswith("dump "):
                reply: Any = _dump(receiver, command[5:])
            elif command == "clear":
                with receiver._lock:
                    for store in (receiver.trace_requests, receiver.metric_requests, receiver.log_requests):
                        store.clear()
                reply = True
            else:
                reply = _stats(receiver)
            print(json.dumps(reply), flush=True)


class ReceiverProcess:
    """`protobuf`: the receiver's protobuf implementation. "upb" (C, the default) decodes at
    about the speed of a collector written in Go, so its CPU on a small machine competes
    little with the training measured beside it; "python" is what the test suite's receiver
    runs on (inside a process that imports MindSpore), whose ingest cost bench_fleet.py
    reports."""

    def __init__(self, protobuf: str = "upb") -> None:
        self._protobuf = protobuf

    def __enter__(self) -> ReceiverProcess:
        env = {
            **os.environ,
            "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": self._protobuf,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")])),
        }
        self._process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.grpc_endpoint, self.http_endpoint = json.loads(self._process.stdout.readline())
        return self

    @property
    def pid(self) -> int:
        return self._process.pid

    def _ask(self, command: str) -> Any:
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return json.loads(self._process.stdout.readline())

    def stats(self) -> dict[str, Any]:
        """Totals and per-rank figures (JSON turns the rank keys into strings)."""
        return self._ask("stats")

    def clear(self) -> None:
        self._ask("clear")

    def dump(self, path: Path) -> int:
        """Write every request received so far to `path` (replayed by bench_fleet.py)."""
        return self._ask(f"dump {path}")

    def wait_quiet(self, seconds: float = 1.0, timeout: float = 30.0) -> dict[str, Any]:
        """Stats once nothing new has arrived for `seconds` (exports are asynchronous)."""
        deadline = time.monotonic() + timeout
        last = self.stats()
        while time.monotonic() < deadline:
            time.sleep(seconds)
            now = self.stats()
            if now["requests"] == last["requests"]:
                return now
            last = now
        return last

    def __exit__(self, *exc: object) -> None:
        try:
            self._process.stdin.write("stop\n")
            self._process.stdin.close()
            self._process.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()


if __name__ == "__main__":
    _serve()
