"""The job's one subscription to ClusterD's fault service, on a thread of its own.

`Fault.Register(ClientInfo{jobId, role})`, then `SubscribeFaultMsgSignal` with the same
ClientInfo: a stream that stays open while the job runs, each message the job's fault
picture (cluster/signals.py). ClusterD keeps one publisher per (job, role) and a new
registration under the same pair replaces the old one's
(component/clusterd/pkg/application/fault/grpc_service.go `preemptPublisher`): so one rank
holds the subscription, under a role of its own (not TaskD's or MindIO's, which it would
take over).

Whatever ClusterD does (unreachable, slow to answer, refusing the job, sending what does not
parse, closing the stream as it restarts), the thread warns once per kind of problem and
tries again after a backoff (cluster/client.py); the training thread never waits for it.
`stop()` cancels the stream and joins the thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from otel_mindformers.cluster import client
from otel_mindformers.cluster.signals import Signal, read_signal
from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)

THREAD_NAME = "otel-mindformers-cluster-listen"
FIRST_RETRY = 1.0  # seconds before the first retry; doubling up to `retry_max`


class FaultListener:
    def __init__(
        self,
        target: str,
        job_id: str,
        role: str,
        on_signal: Callable[[Signal], None],
        *,
        timeout: float,
        retry_max: float,
    ) -> None:
        self._target, self._job_id, self._role = target, job_id, role
        self._on_signal = on_signal
        self._timeout = timeout
        self._backoff = client.Backoff(min(FIRST_RETRY, retry_max), retry_max)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None  # the open stream, cancelled by stop()
        self._channel: Any = None
        self.problems = client.Problems("hearing ClusterD's faults")
        self.signals = 0  # signals heard (tests and the docs' numbers)
        self._streaming = False  # the stream was open: an error now is ClusterD going away
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> FaultListener:
        self._thread.start()
        return self

    def stop(self, timeout: float) -> None:
        """Cancel the stream (or the retry wait) and join the thread within `timeout` s."""
        self._stop.set()
        with self._lock:
            call, channel = self._call, self._channel
        for cancel in (getattr(call, "cancel", None), getattr(channel, "close", None)):
            if cancel is not None:
                try:
                    cancel()
                except Exception:  # already done: nothing to cancel
                    pass
        self._thread.join(max(timeout, 0.0))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            fault_pb2, _ = client.stubs()
        except client.Unavailable as exc:
            _logger.warning("otel_mindformers: hearing ClusterD is off: %s", exc)
            return
        info = fault_pb2.ClientInfo(jobId=self._job_id, role=self._role)
        while not self._stop.is_set():
            then = "trying again"
            self._streaming = False
            try:
                self._subscribe(fault_pb2, info)
                if self._stop.is_set():
                    return
                self.problems.report(client.ENDED, "closed the fault stream", "subscribing again")
            except _Refused as refused:
                self.problems.report(client.REFUSED, f"refused the registration ({refused})", then)
            except Exception as exc:  # grpc.RpcError, or a channel that cannot be built
                if self._stop.is_set():
                    return
                kind, words = client.kind_of(exc)
                if self._streaming:  # it went away mid-stream (a restart)
                    kind, words = client.LOST, f"broke the fault stream ({words})"
                self.problems.report(kind, words, then)
            finally:
                self._close_channel()
            self._stop.wait(self._backoff.next())

    def _subscribe(self, fault_pb2: Any, info: Any) -> None:
        channel = client.channel(self._target)
        with self._lock:
            self._channel = channel
        if self._stop.is_set():
            return
        service = fault_pb2.DESCRIPTOR.services_by_name["Fault"]
        status = client.call(channel, service, "Register", info, fault_pb2.Status, self._timeout)
        if status.code != 0:
            raise _Refused(f"code {status.code}: {str(status.info)[:200]}")
        call = client.stream(channel, service, "SubscribeFaultMsgSignal", info)
        with self._lock:
            self._call = call
        if self._stop.is_set():
            call.cancel()
            return
        self._streaming = True
        self.problems.recovered(f"subscribed to ClusterD's faults for job {self._job_id} at {self._target}")
        self._backoff.reset()
        for raw in call:
            try:
                message = client.parse(fault_pb2.FaultMsgSignal, raw)
            except client.Malformed as exc:  # one bad message: said once, the stream goes on
                self.problems.report(client.MALFORMED, client.kind_of(exc)[1], "skipping it")
                continue
            self._heard(message)

    def _heard(self, message: Any) -> None:
        self.signals += 1
        try:
            self._on_signal(read_signal(message, time.time()))
        except Exception as exc:  # telemetry of a fault must not end the subscription
            _logger.warning("otel_mindformers: a ClusterD fault signal could not be recorded: %s", exc)

    def _close_channel(self) -> None:
        with self._lock:
            channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            try:
                channel.close()
            except Exception:
                pass


class _Refused(Exception):
    """ClusterD answered the registration with a non-zero status code."""


__all__ = ["THREAD_NAME", "FaultListener"]
