"""This rank's verdicts told to ClusterD as public faults (`PubFault.SendPublicFault`).

Off by default (`cluster.tell`). A verdict's `occur` is sent at most once per
`min_interval` seconds per verdict, and only while none of it is open; its `recover` carries
the same fault id and fault time (ClusterD keys a public fault by sender and id, and keeps
the occur's time: component/clusterd/pkg/application/publicfault/). A run that completes
recovers what it left open; one that crashes or is stopped leaves it for ClusterD to act on.

The request follows ClusterD's checks (checker.go): version `1.0`, ids of 8 to 128 of
`[A-Za-z0-9-_.]`, millisecond times, a nine-digit code its configuration lists, the
sender (`resource`) its configuration allows, the Kubernetes node name and the NPUs'
physical ids. ClusterD answers 0 (taken), 409 (a parameter it refuses: said once, naming
its reason, not retried) or 410 (over its rate: retried). Connections are opened per
request: ClusterD accepts 1,024 in all, and every rank of a large job may tell.

Everything runs on the teller's thread, fed through a bounded queue; `tell` never blocks.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import uuid
from typing import Any

from opentelemetry._logs import SeverityNumber

from otel_mindformers.cluster import client
from otel_mindformers.cluster.verdicts import OCCUR, RECOVER
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.names import cluster_names as names
from otel_mindformers.telemetry.events import record_event
from otel_mindformers.telemetry.training_instruments import create_instrument

_logger = get_logger(__name__)

THREAD_NAME = "otel-mindformers-cluster-tell"
VERSION = "1.0"
OK, INVALID, RATE_LIMITED = 0, 409, 410
SEND_TRIES = 4  # per request: a ClusterD restarting takes seconds, a verdict is worth minutes
FAULT_TYPES = {
    names.VERDICT_SDC_SUSPECT: "NPU",
    names.VERDICT_SLOW_NODE: "Node",
    names.VERDICT_STALLED_RANK: "NPU",
}
_STOP = object()


@dataclasses.dataclass(frozen=True)
class Where:
    """Who tells: the job, the rank, its Kubernetes node and the NPUs' physical ids."""

    job_id: str
    rank: int
    node_name: str
    device: int  # this rank's NPU
    node_devices: tuple[int, ...]  # the NPUs mounted on this pod (a node verdict names them all)


@dataclasses.dataclass
class _Open:
    fault_id: str
    fault_time: int  # ms


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _description(text: str) -> str:
    """ClusterD takes `[\\S ]{0,512}`: no line breaks or tabs."""
    return "".join(ch if ch.isprintable() else " " for ch in text)[:512]


class PublicFaultTeller:
    def __init__(
        self,
        target: str,
        resource: str,
        where: Where,
        codes: dict[str, str],
        *,
        min_interval: float,
        timeout: float,
        retry_max: float,
        telemetry: Any,
        run_span: Any,
        point_attributes: dict[str, Any],
    ) -> None:
        self._target, self._resource, self._where, self._codes = target, resource, where, dict(codes)
        self._min_interval, self._timeout = min_interval, timeout
        self._retry = client.Backoff(min(1.0, retry_max), retry_max)
        self._logger, self._span, self._points = telemetry.logger, run_span, dict(point_attributes)
        self._counter = create_instrument(telemetry.meter, names.PUBLIC_FAULTS)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=64)
        self._open: dict[str, _Open] = {}
        self._last_occur: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._channel: Any = None  # the request's, while one is in flight (close() aborts it)
        self.problems = client.Problems("telling ClusterD this rank's verdicts")
        self.sent: list[tuple[str, str]] = []  # (verdict, assertion) taken by ClusterD
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> PublicFaultTeller:
        self._thread.start()
        return self

    # --- any thread ------------------------------------------------------------------------
    def tell(self, verdict: str, assertion: str, detail: str, step: int) -> None:
        """Queue a verdict's transition; dropped (said at debug level) when the queue is full."""
        try:
            self._queue.put_nowait((verdict, assertion, detail, step, time.time()))
        except queue.Full:
            _logger.debug("otel_mindformers: public fault queue full; %s %s dropped", verdict, assertion)

    def close(self, timeout: float, recover_open: bool) -> None:
        """Send what is queued (and, with `recover_open`, a recover for each open verdict)
        within `timeout` seconds, then end the thread."""
        deadline = time.monotonic() + max(timeout, 0.0)
        try:
            self._queue.put((_STOP, recover_open), timeout=max(timeout, 0.0))
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()  # past the deadline: give up any retry wait, and the call in flight
        with self._lock:
            channel = self._channel
        if channel is not None:
            channel.close()
        self._thread.join(0.5)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            _, pubfault_pb2 = client.stubs()
        except client.Unavailable as exc:
            _logger.warning("otel_mindformers: telling ClusterD is off: %s", exc)
            return
        while True:
            item = self._queue.get()
            if item[0] is _STOP:
                if item[1]:
                    for verdict in list(self._open):
                        self._transition(pubfault_pb2, verdict, RECOVER, "the run completed", -1)
                return
            verdict, assertion, detail, step, at = item
            self._transition(pubfault_pb2, verdict, assertion, detail, step, at)

    def _transition(
        self, pb2: Any, verdict: str, assertion: str, detail: str, step: int, at: float | None = None
    ) -> None:
        at = time.time() if at is None else at
        if assertion == OCCUR:
            if verdict in self._open:
                return
            last = self._last_occur.get(verdict)
            if last is not None and at - last < self._min_interval:
                _logger.debug("otel_mindformers: %s again within cluster.min_interval: not told", verdict)
                return
            self._last_occur[verdict] = at
            opened = _Open(f"otel-mindformers.{verdict}.r{self._where.rank}.{uuid.uuid4().hex[:12]}", _ms(at))
            if self._send(pb2, verdict, OCCUR, opened, detail, step):
                self._open[verdict] = opened
        elif assertion == RECOVER:
            known = self._open.pop(verdict, None)
            if known is not None:
                self._send(pb2, verdict, RECOVER, known, detail, step)

    def _request(self, pb2: Any, verdict: str, assertion: str, fault: _Open, detail: str, step: int) -> Any:
        where = self._where
        devices = where.node_devices if verdict == names.VERDICT_SLOW_NODE and where.node_devices else (where.device,)
        location = {"rank": str(where.rank), "job": where.job_id[:128]}
        if step >= 0:
            location["step"] = str(step)
        return pb2.PublicFaultRequest(
            id=f"otel-mindformers.{uuid.uuid4().hex}",
            timestamp=_ms(time.time()),
            version=VERSION,
            resource=self._resource,
            faults=[
                pb2.Fault(
                    faultId=fault.fault_id,
                    faultType=FAULT_TYPES[verdict],
                    faultCode=self._codes[verdict],
                    faultTime=fault.fault_time,
                    assertion=assertion,
                    faultLocation=location,
                    influence=[pb2.PubFaultInfo(nodeName=where.node_name, deviceIds=list(devices)[:32])],
                    description=_description(f"otel-mindformers {verdict} on rank {where.rank}: {detail}"),
                )
            ],
        )

    def _send(self, pb2: Any, verdict: str, assertion: str, fault: _Open, detail: str, step: int) -> bool:
        request = self._request(pb2, verdict, assertion, fault, detail, step)
        service = pb2.DESCRIPTOR.services_by_name["PubFault"]
        outcome, words = "failed", ""
        for attempt in range(SEND_TRIES):
            if attempt and self._stop.wait(self._retry.next()):
                break
            channel = None
            try:
                channel = client.channel(self._target)
                with self._lock:
                    self._channel = channel
                if self._stop.is_set():
                    break
                status = client.call(channel, service, "SendPublicFault", request, pb2.RespStatus, self._timeout)
            except Exception as exc:  # grpc.RpcError: unreachable, slow, malformed answer
                kind, words = client.kind_of(exc)
                self.problems.report(kind, words, "trying again" if attempt + 1 < SEND_TRIES else "giving up this one")
                continue
            finally:
                with self._lock:
                    self._channel = None
                if channel is not None:
                    channel.close()
            if status.code == OK:
                outcome = "sent"
                self._retry.reset()
                self.problems.recovered("ClusterD takes this rank's public faults again")
                break
            words = f"answered {status.code}: {str(status.info)[:200]}"
            if status.code == RATE_LIMITED:
                self.problems.report("rate", words, "trying again")
                continue
            outcome = "refused"
            self.problems.report(
                client.REFUSED, words,
                f"not sent again; the cluster admin must allow sender {self._resource!r} and code "
                f"{self._codes[verdict]} (docs/mindcluster.md)",
            )  # fmt: skip
            break
        self._record(verdict, assertion, fault, outcome, detail, words)
        return outcome == "sent"

    def _record(self, verdict: str, assertion: str, fault: _Open, outcome: str, detail: str, words: str) -> None:
        attributes = {
            **self._points,
            names.ATTR_VERDICT: verdict,
            names.ATTR_ASSERTION: assertion,
            names.ATTR_OUTCOME: outcome,
        }
        self._counter.add(1, attributes)
        event = {**attributes, names.ATTR_FAULT_CODE: self._codes[verdict], names.ATTR_FAULT_ID: fault.fault_id}
        message = f"public fault {verdict} {assertion} to ClusterD: {outcome}" + (f" ({words})" if words else "")
        record_event(
            self._span, self._logger, names.EVENT_PUBLIC_FAULT, f"{message}: {detail}", event,
            SeverityNumber.WARN if assertion == OCCUR else SeverityNumber.INFO,
        )  # fmt: skip
        if outcome == "sent":
            self.sent.append((verdict, assertion))
            log = _logger.warning if assertion == OCCUR else _logger.info
            log("otel_mindformers: told ClusterD %s %s (code %s): %s", verdict, assertion, self._codes[verdict], detail)


__all__ = ["THREAD_NAME", "VERSION", "PublicFaultTeller", "Where"]
