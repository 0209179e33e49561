"""A ClusterD on 127.0.0.1 for the tests: MindCluster's fault and public-fault gRPC services,
served from the stubs generated from ClusterD's published .proto files (cluster/proto/).

It behaves as ClusterD does where the package depends on it
(component/clusterd/pkg/application/fault/grpc_service.go, .../publicfault/checker.go):

- `Register` needs a role; a job id it does not know is refused (code 404 here, ClusterD's
  JobNotExist); `SubscribeFaultMsgSignal` needs a registration of the same job and role, and
  a new registration under one (job, role) ends the earlier subscriber's stream;
- `SendPublicFault` checks the request as ClusterD's checker does (version 1.0, ids, 13-digit
  times after 2025, a sender and codes its configuration allows, assertion, location bounds,
  node names, physical device ids) and answers 0, 409 with the reason, or 410 when told to
  rate-limit.

What a test can make it do: push a signal to the subscribers (`send`), push bytes that do not
parse as a FaultMsgSignal (`send_garbage`), answer `Register` slowly (`slow_register`), stop
and start again on the same port (`stop` / `start`). Everything it was asked is kept.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from otel_mindformers.cluster.proto import fault_pb2, pubfault_pb2, pubfault_pb2_grpc

FAULT_SERVICE = fault_pb2.DESCRIPTOR.services_by_name["Fault"].full_name  # "fault.Fault"
JOB_NOT_EXIST, INVALID, RATE_LIMITED = 404, 409, 410
_ID = re.compile(r"^[a-zA-Z0-9-_.]{8,128}$")
_TIME = re.compile(r"^\d{13}$")
_DESCRIPTION = re.compile(r"^[\S ]{0,512}$")
_NODE = re.compile(r"^[a-z0-9]([a-z0-9-.]{0,251}[a-z0-9])?$")
_2025 = 1735689600000  # 2025-01-01T00:00:00Z in ms
_END = object()


def fault_signal(job_id: str, node: str, device: str, codes: list[str], levels: list[str], state: str = "UnHealthy"):
    """A FaultMsgSignal as ClusterD builds one (faultDeviceToSortedFaultMsgSignal)."""
    return fault_pb2.FaultMsgSignal(
        uuid=f"uuid-{time.monotonic_ns()}",
        jobId=job_id,
        signalType="fault",
        nodeFaultInfo=[
            fault_pb2.NodeFaultInfo(
                nodeName=node,
                nodeIP="192.168.0.12",
                faultLevel=state,
                faultDevice=[
                    fault_pb2.DeviceFaultInfo(
                        deviceId=device, deviceType="NPU", faultCodes=codes, faultLevel=state, faultLevels=levels,
                        faultType=["Chip"], faultReason=["chip fault"],
                    )
                ],
            )
        ],
    )  # fmt: skip


def normal_signal(job_id: str):
    return fault_pb2.FaultMsgSignal(uuid=f"uuid-{time.monotonic_ns()}", jobId=job_id, signalType="normal")


@dataclass
class ClusterD:
    jobs: set[str]
    resources: set[str] = field(default_factory=lambda: {"otel-mindformers"})
    codes: set[str] = field(default_factory=lambda: {"010011001", "110011002", "010011003"})
    port: int = 0
    slow_register: float = 0.0  # seconds Register sleeps before answering
    rate_limit: bool = False
    registrations: list[tuple[str, str]] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)
    public_faults: list[object] = field(default_factory=list)  # accepted PublicFaultRequests
    refused: list[tuple[object, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[tuple[str, str], queue.Queue] = {}  # registered, each with its stream's queue
        self._open = 0  # subscription handlers running: streams a subscriber reads
        self._server: grpc.Server | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> ClusterD:
        # No SO_REUSEPORT: a port another process took since the test chose it fails here,
        # rather than sharing its connections with that process's server.
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=[("grpc.so_reuseport", 0)])
        handlers = {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register, request_deserializer=fault_pb2.ClientInfo.FromString,
                response_serializer=fault_pb2.Status.SerializeToString,
            ),
            "SubscribeFaultMsgSignal": grpc.unary_stream_rpc_method_handler(
                self._subscribe, request_deserializer=fault_pb2.ClientInfo.FromString,
                response_serializer=_serialized,
            ),
            "GetFaultMsgSignal": grpc.unary_unary_rpc_method_handler(
                self._get, request_deserializer=fault_pb2.ClientInfo.FromString,
                response_serializer=fault_pb2.FaultQueryResult.SerializeToString,
            ),
        }  # fmt: skip
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(FAULT_SERVICE, handlers),))
        pubfault_pb2_grpc.add_PubFaultServicer_to_server(_PubFault(self), server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop at once, as a killed ClusterD: open streams break (the client sees an error,
        not an ended stream); then the handlers still waiting are let go."""
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.put(_END)

    def __enter__(self) -> ClusterD:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # --- what a test makes it do --------------------------------------------------------------
    def subscribed(self) -> int:
        """Subscriptions whose stream is open now."""
        with self._lock:
            return self._open

    def send(self, message) -> int:
        """Push a FaultMsgSignal to every subscriber; how many got it."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.put(message)
        return len(streams)

    def send_garbage(self) -> int:
        """Bytes that do not parse as a FaultMsgSignal (a length past the end of the message)."""
        return self.send(b"\x0a\xff\xff\xff\x0f\x00")

    # --- the services ----------------------------------------------------------------------
    def _register(self, request, context):
        if self.slow_register:
            time.sleep(self.slow_register)
        self.registrations.append((request.jobId, request.role))
        if not request.role:
            context.abort(grpc.StatusCode.UNKNOWN, "request is nil or role is empty")
        if request.jobId not in self.jobs:
            return fault_pb2.Status(code=JOB_NOT_EXIST, info=f"jobId={request.jobId} not exist")
        with self._lock:
            old = self._streams.pop((request.jobId, request.role), None)
            self._streams[(request.jobId, request.role)] = queue.Queue()
        if old is not None:
            old.put(_END)  # preemptPublisher: the earlier subscriber's stream ends
        return fault_pb2.Status(code=0, info="register success")

    def _subscribe(self, request, context):
        key = (request.jobId, request.role)
        with self._lock:
            stream = self._streams.get(key)
        if stream is None:
            context.abort(grpc.StatusCode.UNKNOWN, f"jobId={request.jobId} not registered, role={request.role}")
        self.subscriptions.append(key)
        context.add_callback(lambda: stream.put(_END))
        with self._lock:
            self._open += 1
        try:
            while True:
                message = stream.get()
                if message is _END or not context.is_active():
                    with self._lock:
                        if self._streams.get(key) is stream:
                            del self._streams[key]
                    return
                yield message
        finally:
            with self._lock:
                self._open -= 1

    def _get(self, request, context):
        return fault_pb2.FaultQueryResult(code=0, info="no fault")

    def check(self, request) -> str | None:
        """ClusterD's checker.go, in order: why the request is refused, or None."""
        if not _ID.match(request.id):
            return "invalid id"
        if not _TIME.match(str(request.timestamp)) or request.timestamp < _2025:
            return "invalid timestamp"
        if request.version != "1.0":
            return "invalid version"
        if request.resource not in self.resources:
            return "invalid resource"
        if not 1 <= len(request.faults) <= 100:
            return "invalid faults length"
        for fault in request.faults:
            problem = self._check_fault(fault)
            if problem:
                return problem  # ClusterD drops such a fault; with none left, the request fails
        return None

    def _check_fault(self, fault) -> str | None:
        if not _ID.match(fault.faultId):
            return "invalid fault id"
        if fault.faultType not in ("NPU", "Node", "Network", "Storage"):
            return "invalid fault type"
        if len(fault.faultCode) != 9 or fault.faultCode not in self.codes:
            return "invalid fault code, not exist in the configuration file"
        if not _TIME.match(str(fault.faultTime)) or fault.faultTime < _2025:
            return "invalid fault time"
        if fault.assertion not in ("occur", "recover", "once"):
            return "invalid fault assertion"
        if len(fault.faultLocation) > 10 or any(len(k) > 16 or len(v) > 128 for k, v in fault.faultLocation.items()):
            return "invalid fault location key or value length"
        if not 1 <= len(fault.influence) <= 1000:
            return "invalid influence length"
        for influence in fault.influence:
            if not _NODE.match(influence.nodeName):
                return "invalid node name"
            ids = list(influence.deviceIds)
            if not 1 <= len(ids) <= 32 or len(set(ids)) != len(ids) or any(not 0 <= i <= 31 for i in ids):
                return "invalid device id"
        if not _DESCRIPTION.match(fault.description):
            return "invalid fault description"
        return None


def _serialized(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


class _PubFault(pubfault_pb2_grpc.PubFaultServicer):
    def __init__(self, clusterd: ClusterD) -> None:
        self._clusterd = clusterd

    def SendPublicFault(self, request, context):
        clusterd = self._clusterd
        if clusterd.rate_limit:
            return pubfault_pb2.RespStatus(code=RATE_LIMITED, info="limiter work by resource failed")
        problem = clusterd.check(request)
        if problem is not None:
            clusterd.refused.append((request, problem))
            return pubfault_pb2.RespStatus(code=INVALID, info=problem)
        clusterd.public_faults.append(request)
        return pubfault_pb2.RespStatus(code=0, info="public fault send successfully")


def told(clusterd: ClusterD) -> list[tuple[str, str, str, str, tuple[int, ...], str]]:
    """(fault id, assertion, code, node, device ids, location rank) of each public fault taken."""
    return [
        (f.faultId, f.assertion, f.faultCode, f.influence[0].nodeName, tuple(f.influence[0].deviceIds),
         f.faultLocation.get("rank", ""))
        for request in clusterd.public_faults
        for f in request.faults
    ]  # fmt: skip
