"""The MindCluster bridge (cluster/, docs/mindcluster.md) in one process: its data against
MindCluster's published files, its gRPC threads against a real ClusterD on 127.0.0.1
(tests/support/clusterd.py, served from the stubs of ClusterD's .proto files), its verdicts,
MindSpore's detection lines and the report's words. Threads only: the trainings are in
tests/test_cluster_training.py."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from otel_mindformers.cluster import asd, endpoint, fault_levels, preflight
from otel_mindformers.cluster.heard import HeardFaults
from otel_mindformers.cluster.listener import THREAD_NAME as LISTEN_THREAD
from otel_mindformers.cluster.listener import FaultListener
from otel_mindformers.cluster.offline.attempt_fault import ended_by
from otel_mindformers.cluster.signals import read_signal
from otel_mindformers.cluster.teller import THREAD_NAME as TELL_THREAD
from otel_mindformers.cluster.teller import PublicFaultTeller, Where
from otel_mindformers.cluster.verdicts import OCCUR, RECOVER, SdcVerdict, SlowNodeVerdict
from otel_mindformers.config import ConfigError
from otel_mindformers.config.loading import parse_monitor_config
from otel_mindformers.config.schema import ClusterConfig
from otel_mindformers.core.clock import StepClock, WallClock
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.asd import asd_attributes
from otel_mindformers.names import cluster_names as names
from otel_mindformers.restarts.attempt_tracker import AttemptTracker
from otel_mindformers.restarts.offline.attempts_report import job_report, render_job
from tests.support.clusterd import ClusterD, fault_signal, normal_signal, told
from tests.support.in_memory import Capture
from tests.support.metrics import counter_values
from tests.support.paths import FIXTURES, REPO
from tests.support.waiting import wait_until

PROTO = REPO / "otel_mindformers" / "cluster" / "proto"
JOB = "mindx-job-0001"
CODES = {
    names.VERDICT_SDC_SUSPECT: "010011001",
    names.VERDICT_SLOW_NODE: "110011002",
    names.VERDICT_STALLED_RANK: "010011003",
}
LOGGER = "otel_mindformers.cluster"


def _no_thread(name: str) -> bool:
    return not any(thread.name == name for thread in threading.enumerate())


def _warnings(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and needle in r.getMessage()]


@pytest.fixture
def capture():
    capture = Capture()
    yield capture
    capture.tracer_provider.shutdown()
    capture.meter_provider.shutdown()
    capture.logger_provider.shutdown()


def _telemetry(capture: Capture) -> SimpleNamespace:
    return SimpleNamespace(logger=capture.logger_provider.get_logger("t"), meter=capture.meter_provider.get_meter("t"))


# --- MindCluster's data ------------------------------------------------------------------------
def test_the_fault_code_table_is_the_device_plugins_published_one():
    """tests/fixtures/mindcluster/faultCode.json is component/ascend-device-plugin/build/faultCode.json
    of MindCluster v26.1.0; the package's table gives each of its codes the level of the list it
    is in, the most severe when it is in two (the device plugin's GetFaultTypeByCode order)."""
    published = json.loads((FIXTURES / "mindcluster" / "faultCode.json").read_text())
    table = fault_levels.table()
    assert table["source"]["path"] == "component/ascend-device-plugin/build/faultCode.json"
    assert table["source"]["release"] == "v26.1.0"
    assert set(published) == {f"{level}Codes" for level in table["severity"]}
    expected: dict[str, str] = {}
    for level in reversed(table["severity"]):  # the least severe first: a more severe list overwrites
        for code in published[f"{level}Codes"]:
            expected[code.upper()] = level
    assert table["levels"] == expected
    assert fault_levels.level_of("A2301001") == "SeparateNPU"  # listed under RestartBusiness and SeparateNPU
    assert fault_levels.level_of(" 0x80818c00") == "SeparateNPU"  # npu-smi's spelling of MindSpore's SDC code
    assert fault_levels.level_of("80E21007") == "NotHandleFault"
    assert fault_levels.level_of("0xDEADBEEF") == fault_levels.UNLISTED
    assert fault_levels.most_severe(["SubHealthFault", "RestartNPU", "NotHandleFault"]) == "RestartNPU"
    assert fault_levels.most_severe(["SeparateNPU", "ManuallySeparateNPU"]) == "ManuallySeparateNPU"


def test_the_committed_stubs_describe_the_vendored_protos(tmp_path):
    """Compiled again from the .proto files with the test tools' grpcio-tools, they describe
    the same messages and services as the stubs scripts/generate_cluster_stubs.sh committed."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    from otel_mindformers.cluster.proto import fault_pb2, pubfault_pb2

    out = tmp_path / "set.pb"
    files = ["otel_mindformers/cluster/proto/fault.proto", "otel_mindformers/cluster/proto/pubfault.proto"]
    assert protoc.main(["protoc", f"-I{REPO}", f"--descriptor_set_out={out}", *files]) == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    for file in compiled.file:  # a descriptor set spells out the JSON names; the stubs leave them implied
        for message in [*file.message_type, *(nested for m in file.message_type for nested in m.nested_type)]:
            for field in message.field:
                field.ClearField("json_name")
    for stub, file in zip((fault_pb2, pubfault_pb2), compiled.file):
        committed = descriptor_pb2.FileDescriptorProto.FromString(stub.DESCRIPTOR.serialized_pb)
        assert committed == file, file.name
    for proto in files:
        header = (REPO / proto).read_text().split("syntax = ", 1)[0]
        assert "repository: Ascend/mind-cluster" in header and "release:    v26.1.0" in header
        assert "component/clusterd/pkg/interface/grpc/" in header and "Apache License" in header


def test_the_test_clusterd_serves_the_methods_the_proto_defines():
    from otel_mindformers.cluster.proto import fault_pb2, fault_pb2_grpc

    service = fault_pb2.DESCRIPTOR.services_by_name["Fault"]
    assert [m.name for m in service.methods] == ["Register", "SubscribeFaultMsgSignal", "GetFaultMsgSignal"]
    assert {m.name for m in service.methods} <= set(vars(fault_pb2_grpc.FaultServicer))
    with ClusterD(jobs={JOB}) as clusterd:
        import grpc

        with grpc.insecure_channel(clusterd.address) as channel:
            stub = fault_pb2_grpc.FaultStub(channel)
            assert stub.Register(fault_pb2.ClientInfo(jobId="other-job", role="r"), timeout=5).code == 404
            assert stub.GetFaultMsgSignal(fault_pb2.ClientInfo(jobId=JOB, role="r"), timeout=5).code == 0


# --- who and where -------------------------------------------------------------------------------
def test_clusterd_is_where_the_ascend_operator_says():
    operator = {"MINDX_TASK_ID": JOB, "MINDX_SERVER_IP": "10.96.0.8", "MINDX_SERVER_DOMAIN": "clusterd-grpc-svc"}
    assert endpoint.resolve(ClusterConfig(), operator) == endpoint.Endpoint("10.96.0.8:8899", JOB, True, None)
    # Not under the Operator: quietly off; `listen: false`: off.
    assert not endpoint.resolve(ClusterConfig(), {}).listen and endpoint.resolve(ClusterConfig(), {}).why_not is None
    assert not endpoint.resolve(ClusterConfig(listen=False), operator).listen
    # `server` wins; IPv6 in brackets; the domain when no IP is given.
    assert endpoint.resolve(ClusterConfig(server="127.0.0.1:7001"), operator).target == "127.0.0.1:7001"
    assert endpoint.resolve(ClusterConfig(server="[::1]", port=7002), operator).target == "[::1]:7002"
    only_domain = {"MINDX_TASK_ID": JOB, "MINDX_SERVER_DOMAIN": "clusterd-grpc-svc.mindx-dl.svc.cluster.local"}
    assert endpoint.resolve(ClusterConfig(listen=True), only_domain).target.endswith("cluster.local:8899")
    # Asked for, without a job id: said why.
    assert (
        endpoint.resolve(ClusterConfig(listen=True), {"MINDX_SERVER_IP": "10.0.0.1"}).why_not == "MINDX_TASK_ID not set"
    )


def test_the_physical_npu_is_the_device_ids_place_among_the_mounted_ones():
    assert endpoint.visible_devices("4-6,1") == [1, 4, 5, 6]
    assert endpoint.visible_devices("Ascend910-0") == []
    assert endpoint.physical_device(2, {"ASCEND_VISIBLE_DEVICES": "4-7"}) == 6
    assert endpoint.physical_device(0, {"ASCEND_VISIBLE_DEVICES": "4-7"}) == 4  # a pod's first NPU
    assert endpoint.physical_device(4, {"ASCEND_VISIBLE_DEVICES": "4-7"}) == 4  # past the mounted ones: as given
    assert endpoint.physical_device(2, {}) == 2
    assert endpoint.node_name(ClusterConfig(), {"NODE_NAME": "ascend-node-7"}) == "ascend-node-7"
    assert endpoint.node_name(ClusterConfig(), {"NODE_NAME": "Not_A_Node"}) is None
    assert endpoint.node_name(ClusterConfig(node_name="n1"), {"NODE_NAME": "ascend-node-7"}) == "n1"


@pytest.mark.parametrize(
    "section, needle",
    [
        ({"server": "10.0.0.1:0"}, "cluster.server: the port"),
        ({"codes": {"sdc_suspect": "0100110"}}, "cluster.codes.sdc_suspect: a public fault code is nine digits"),
        ({"node_name": "Node_7"}, "cluster.node_name: a Kubernetes node name"),
        ({"resource": "has space"}, "cluster.resource:"),
        ({"listen_rank": -1}, "cluster.listen_rank"),
    ],
)
def test_a_bad_cluster_key_is_named_before_training(section, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        parse_monitor_config({"cluster": section})


def test_stall_timeout_is_not_said_to_be_ignored_while_telling_clusterd_reads_it():
    alerts_off = parse_monitor_config({"alert_config": {"stall_timeout": 60}, "cluster": {"tell": True}})
    assert alerts_off.alert_config.ignored_while_off() is not None
    assert alerts_off.alert_config.ignored_while_off(stall_used=alerts_off.cluster.tell) is None


# --- ClusterD's signals -----------------------------------------------------------------------------
def test_a_signal_reads_as_one_fault_per_node_and_device_with_its_level():
    message = fault_signal(JOB, "worker-3", "3", ["80E21007", "80818C00"], ["NotHandleFault", "SeparateNPU"])
    signal = read_signal(message, 1000.0)
    (fault,) = signal.faults
    assert (signal.kind, fault.node, fault.device, fault.level, fault.codes) == (
        "fault", "worker-3", "3", "SeparateNPU", ("80E21007", "80818C00"),
    )  # fmt: skip
    assert fault.describe() == "node worker-3, NPU 3, SeparateNPU, 80E21007,80818C00"
    # Without the per-code levels ClusterD sends, the table gives them.
    bare = fault_signal(JOB, "worker-3", "3", ["0x80818c00"], [])
    assert read_signal(bare, 0.0).faults[0].level == "SeparateNPU"
    from otel_mindformers.cluster.proto import fault_pb2

    # The attempt is said to have ended by the signal's most severe fault, wherever it is listed.
    two = fault_signal(JOB, "worker-3", "3", ["80E21007"], ["NotHandleFault"])
    two.nodeFaultInfo[0].faultDevice.append(
        fault_pb2.DeviceFaultInfo(deviceId="5", faultCodes=["80818C00"], faultLevels=["RestartRequest"])
    )
    two.nodeFaultInfo.append(fault_pb2.NodeFaultInfo(nodeName="worker-4", faultDevice=[
        fault_pb2.DeviceFaultInfo(deviceId="0", faultCodes=["80E21007"], faultLevels=["SubHealthFault"]),
    ]))  # fmt: skip
    assert [f.level for f in read_signal(two, 0.0).faults] == ["NotHandleFault", "RestartRequest", "SubHealthFault"]
    assert read_signal(two, 0.0).worst.describe() == "node worker-3, NPU 5, RestartRequest, 80818C00"
    # Bounded: a signal of 1,100 devices keeps 1,024 faults, each with at most 32 codes.

    huge = fault_pb2.FaultMsgSignal(signalType="fault", nodeFaultInfo=[
        fault_pb2.NodeFaultInfo(nodeName="n\nx" * 200, faultDevice=[
            fault_pb2.DeviceFaultInfo(deviceId=str(i), faultCodes=["80E21007"] * 40) for i in range(1100)
        ])
    ])  # fmt: skip
    faults = read_signal(huge, 0.0).faults
    assert len(faults) == 1024 and len(faults[0].codes) == 32
    assert "\n" not in faults[0].node and len(faults[0].node) == 256


def test_a_heard_fault_is_an_event_a_log_record_a_counter_and_in_the_attempts_ledger(capture, tmp_path):
    tracker = AttemptTracker.begin(
        path=tmp_path / "m.job.rank_0.ledger", job_id=JOB, continues=False, rank=0, resume_step=0,
        process_start=time.time(), checkpoint_load_seconds=0.0, clock=StepClock(), wall_clock=WallClock(),
        heartbeat_interval=60.0,
    )  # fmt: skip
    span = capture.tracer_provider.get_tracer("t").start_span("run")
    heard = HeardFaults(_telemetry(capture), span, tracker, {"training.rank": 0})
    heard(read_signal(fault_signal(JOB, "worker-3", "3", ["80818C00"], ["SeparateNPU"]), 1234.5))
    # Written at once, not at the next heartbeat (60 s away here).
    ledger = json.loads((tmp_path / "m.job.rank_0.ledger").read_text())
    assert ledger["attempts"][0]["cluster_fault"] == {
        "time": 1234.5, "node": "worker-3", "node_ip": "192.168.0.12", "device": "3", "device_type": "NPU",
        "level": "SeparateNPU", "codes": ["80818C00"],
    }  # fmt: skip
    heard(read_signal(normal_signal(JOB), 1300.0))
    assert "cleared" in json.loads((tmp_path / "m.job.rank_0.ledger").read_text())["attempts"][0]["cluster_fault"]
    tracker.end("completed", None, 0)
    span.end()
    (run,) = capture.finished("run")
    events = [(e.name, dict(e.attributes)) for e in run.events]
    assert events[0][0] == names.EVENT_FAULT and events[1][0] == names.EVENT_FAULT_CLEARED
    assert {k: events[0][1][k] for k in (names.ATTR_FAULT_LEVEL, names.ATTR_NODE_NAME, names.ATTR_DEVICE_ID)} == {
        names.ATTR_FAULT_LEVEL: "SeparateNPU", names.ATTR_NODE_NAME: "worker-3", names.ATTR_DEVICE_ID: "3",
    }  # fmt: skip
    assert events[0][1]["time"] == 1234.5 and list(events[0][1][names.ATTR_FAULT_CODES]) == ["80818C00"]
    records = capture.log_records()
    assert records[0].body == "ClusterD: node worker-3, NPU 3, SeparateNPU, 80818C00"
    assert records[0].severity_text == "ERROR" and records[1].severity_text == "INFO"
    counts = counter_values(capture.reader, names.CLUSTER_FAULTS.name)
    assert counts == {((names.ATTR_FAULT_LEVEL, "SeparateNPU"), ("training.rank", 0)): 1}


def test_a_fault_that_restarts_is_an_error_one_below_a_warning_and_a_storm_is_counted_past_its_events(capture):
    from otel_mindformers.cluster.heard import MAX_EVENTS_PER_SIGNAL
    from otel_mindformers.cluster.proto import fault_pb2

    span = capture.tracer_provider.get_tracer("t").start_span("run")
    heard = HeardFaults(_telemetry(capture), span, None, {"training.rank": 0})
    heard(read_signal(fault_signal(JOB, "worker-3", "3", ["80818C00"], ["RestartRequest"]), 1.0))
    heard(read_signal(fault_signal(JOB, "worker-3", "3", ["80E21007"], ["SubHealthFault"]), 2.0))
    storm = fault_signal(JOB, "worker-3", "0", ["80E21007"], ["SubHealthFault"])
    storm.nodeFaultInfo[0].faultDevice.extend(
        fault_pb2.DeviceFaultInfo(deviceId=str(i), faultCodes=["80E21007"], faultLevels=["SubHealthFault"])
        for i in range(1, MAX_EVENTS_PER_SIGNAL + 6)
    )
    heard(read_signal(storm, 3.0))
    span.end()
    assert [r.severity_text for r in capture.log_records()[:2]] == ["ERROR", "WARN"]
    (run,) = capture.finished("run")
    assert len(run.events) == 2 + MAX_EVENTS_PER_SIGNAL
    counts = counter_values(capture.reader, names.CLUSTER_FAULTS.name)
    assert counts[((names.ATTR_FAULT_LEVEL, "SubHealthFault"), ("training.rank", 0))] == 1 + MAX_EVENTS_PER_SIGNAL + 6


# --- the subscription -------------------------------------------------------------------------------
def _listener(address: str, heard, timeout: float = 1.0) -> FaultListener:
    return FaultListener(address, JOB, "otel-mindformers", heard, timeout=timeout, retry_max=0.2).start()


def test_the_listener_registers_once_subscribes_and_hears_each_signal():
    heard = []
    with ClusterD(jobs={JOB}) as clusterd:
        listener = _listener(clusterd.address, heard.append)
        try:
            wait_until(lambda: clusterd.subscribed() == 1, "the subscription")
            assert clusterd.registrations == [(JOB, "otel-mindformers")] == clusterd.subscriptions
            clusterd.send(fault_signal(JOB, "worker-3", "3", ["80818C00"], ["SeparateNPU"]))
            clusterd.send(normal_signal(JOB))
            wait_until(lambda: len(heard) == 2, "both signals heard")
        finally:
            listener.stop(5.0)
    assert [signal.kind for signal in heard] == ["fault", "normal"]
    assert heard[0].faults[0].describe() == "node worker-3, NPU 3, SeparateNPU, 80818C00"
    assert _no_thread(LISTEN_THREAD)


def test_clusterd_down_garbage_killed_slow_and_refusing_each_warn_once_and_the_listener_keeps_trying(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    heard = []
    held = socket.socket()  # bound, not listening: refused, as a ClusterD that is down; no one else takes it
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    clusterd = ClusterD(jobs={JOB}, port=port)
    listener = _listener(f"127.0.0.1:{port}", heard.append, timeout=0.5)
    try:
        # Down at start: one warning however many tries.
        wait_until(lambda: listener.problems.count.get("unreachable", 0) >= 3, "three tries while down")
        held.close()
        clusterd = ClusterD(jobs={JOB}, port=port).start()
        wait_until(lambda: clusterd.subscribed() == 1, "subscribed once ClusterD is up")
        # Garbage on the stream: skipped, one warning, the stream goes on and the next signal is heard.
        clusterd.send_garbage()
        clusterd.send_garbage()
        clusterd.send(normal_signal(JOB))
        wait_until(lambda: len(heard) == 1, "a signal after the garbage")
        assert listener.problems.count["malformed"] == 2 and len(clusterd.subscriptions) == 1
        # Killed mid-stream, back later answering slowly, then normally.
        clusterd.stop()
        wait_until(lambda: listener.problems.count.get("lost"), "the broken stream seen")
        clusterd = ClusterD(jobs={JOB}, port=port, slow_register=1.5).start()
        wait_until(lambda: listener.problems.count.get("slow", 0) >= 2, "two slow registrations")
        clusterd.slow_register = 0.0
        wait_until(lambda: clusterd.subscribed() == 1, "subscribed again")
        # Restarted without this job: refused, said once.
        clusterd.stop()
        clusterd = ClusterD(jobs=set(), port=port).start()
        wait_until(lambda: listener.problems.count.get("refused", 0) >= 2, "two refusals")
    finally:
        held.close()
        listener.stop(5.0)
        clusterd.stop()
    assert _no_thread(LISTEN_THREAD)
    for words in (
        "ClusterD unreachable",
        "does not parse",
        "broke the fault stream",
        "no answer within the timeout",
        "refused the registration",
    ):
        assert len(_warnings(caplog, words)) == 1, (words, [r.getMessage() for r in caplog.records])
    assert all("training is not affected" in w for w in _warnings(caplog, "hearing ClusterD's faults"))
    assert [r.getMessage() for r in caplog.records if "subscribed to ClusterD" in r.getMessage()]


def test_stop_ends_the_listener_while_it_waits_on_a_quiet_stream_or_a_retry():
    with ClusterD(jobs={JOB}) as clusterd:
        listener = _listener(clusterd.address, lambda signal: None)
        try:
            wait_until(lambda: clusterd.subscribed() == 1, "subscribed")
        finally:
            started = time.monotonic()
            listener.stop(5.0)
        # A stop that waited on the quiet stream would take the whole 5 s given it.
        assert not listener.alive and time.monotonic() - started < 4.0
    waiting = FaultListener("127.0.0.1:9", JOB, "r", lambda s: None, timeout=0.2, retry_max=60.0).start()
    wait_until(lambda: waiting.problems.count, "a first failure")
    waiting.stop(5.0)
    assert not waiting.alive


# --- telling ClusterD -------------------------------------------------------------------------------
def _teller(clusterd_address: str, capture: Capture, **kwargs) -> PublicFaultTeller:
    where = Where(job_id=JOB, rank=1, node_name="ascend-node-7", device=5, node_devices=(4, 5))
    options = {"min_interval": 300.0, "timeout": 1.0, "retry_max": 0.1, **kwargs}
    return PublicFaultTeller(
        clusterd_address, "otel-mindformers", where, CODES, telemetry=_telemetry(capture), run_span=None,
        point_attributes={"training.rank": 1}, **options,
    ).start()  # fmt: skip


def test_a_verdict_is_told_once_as_occur_then_recover_with_the_same_fault_and_clusterds_checks_pass(capture):
    with ClusterD(jobs={JOB}) as clusterd:
        teller = _teller(clusterd.address, capture)
        teller.tell(names.VERDICT_SDC_SUSPECT, OCCUR, "loss non-finite 3 times", 10)
        teller.tell(names.VERDICT_SDC_SUSPECT, OCCUR, "again", 11)  # open: not told twice
        teller.tell(names.VERDICT_SDC_SUSPECT, RECOVER, "cleared", 14)
        teller.tell(names.VERDICT_SDC_SUSPECT, OCCUR, "within min_interval", 20)  # rate-limited
        teller.tell(names.VERDICT_SLOW_NODE, OCCUR, "waits for its data", 21)
        teller.close(10.0, recover_open=True)  # a completed run recovers what is open
    assert not teller.alive and _no_thread(TELL_THREAD)
    assert clusterd.refused == []
    sent = told(clusterd)
    assert [(assertion, code, node, devices, rank) for _, assertion, code, node, devices, rank in sent] == [
        ("occur", "010011001", "ascend-node-7", (5,), "1"),
        ("recover", "010011001", "ascend-node-7", (5,), "1"),
        ("occur", "110011002", "ascend-node-7", (4, 5), "1"),  # a node verdict names the pod's NPUs
        ("recover", "110011002", "ascend-node-7", (4, 5), "1"),
    ]
    faults = [f for request in clusterd.public_faults for f in request.faults]
    assert faults[0].faultId == faults[1].faultId and faults[0].faultTime == faults[1].faultTime
    assert faults[0].faultType == "NPU" and faults[2].faultType == "Node"
    assert faults[0].description.startswith("otel-mindformers sdc_suspect on rank 1: loss non-finite 3 times")
    counts = counter_values(capture.reader, names.PUBLIC_FAULTS.name)
    assert sum(counts.values()) == 4 and all(dict(key)[names.ATTR_OUTCOME] == "sent" for key in counts)
    # Without a rate limit, an open verdict is still told once: occur, then its recover.
    with ClusterD(jobs={JOB}) as clusterd:
        teller = _teller(clusterd.address, capture, min_interval=0.0)
        for assertion in (OCCUR, OCCUR, RECOVER, RECOVER):
            teller.tell(names.VERDICT_STALLED_RANK, assertion, "", 1)
        teller.close(10.0, recover_open=False)
    assert [assertion for _, assertion, *_ in told(clusterd)] == ["occur", "recover"]


def test_a_code_clusterd_does_not_allow_is_said_once_and_not_sent_again(capture, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    with ClusterD(jobs={JOB}, codes={"010011001"}) as clusterd:
        teller = _teller(clusterd.address, capture, min_interval=0.0)
        for step in range(3):
            teller.tell(names.VERDICT_STALLED_RANK, OCCUR, "no step", step)
        teller.close(10.0, recover_open=True)
    assert len(clusterd.refused) == 3 and clusterd.public_faults == []  # each occur tried once, none retried
    (warning,) = _warnings(caplog, "answered 409")
    assert "'otel-mindformers'" in warning and "010011003" in warning and "docs/mindcluster.md" in warning


def test_clusterd_down_or_rate_limiting_is_retried_and_said_once(capture, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    clusterd = ClusterD(jobs={JOB}, rate_limit=True).start()
    teller = _teller(clusterd.address, capture, min_interval=0.0)
    teller.tell(names.VERDICT_STALLED_RANK, OCCUR, "no step", 3)
    wait_until(lambda: teller.problems.count.get("rate", 0) >= 2, "a retry after 410")
    clusterd.rate_limit = False
    wait_until(lambda: teller.sent, "sent once ClusterD takes it")
    clusterd.stop()
    teller.tell(names.VERDICT_STALLED_RANK, RECOVER, "stepped", 4)
    wait_until(lambda: teller.problems.count.get("unreachable", 0) >= 2, "retries while down")
    teller.close(2.0, recover_open=False)
    assert not teller.alive
    assert len(_warnings(caplog, "answered 410")) == 1 and len(_warnings(caplog, "unreachable")) == 1


@pytest.mark.parametrize(("error", "recovered"), [(None, True), (RuntimeError("boom"), False)])
def test_a_completed_run_recovers_its_open_verdicts_a_crashed_one_leaves_them_to_clusterd(capture, error, recovered):
    from otel_mindformers.cluster.part import ClusterPart
    from otel_mindformers.core.run_part import RunEnding

    with ClusterD(jobs={JOB}) as clusterd:
        part = ClusterPart()
        part.teller = _teller(clusterd.address, capture)
        part.teller.tell(names.VERDICT_SLOW_NODE, OCCUR, "waits for its data", 7)
        ending = RunEnding(error=error, last_step=9, ended_at=0.0, remaining=lambda: 10.0, stop_reason=lambda: None)
        part.end(ending)
        part.close(lambda: 1.0)
    assert _no_thread(TELL_THREAD)
    assert [assertion for _, assertion, *_ in told(clusterd)] == (["occur", "recover"] if recovered else ["occur"])


# --- the verdicts ---------------------------------------------------------------------------------
def _record(step: int, loss: float | None = 0.5, data_wait: float = 0.0, world: int = 2) -> StepRecord:
    values = {} if loss is None else {"loss": loss}
    sections = {"data_wait": data_wait, "in_step": 1.0 - data_wait, "window": 1.0}
    return StepRecord(step=step, epoch=1, rank=1, time_stamp=0.0, values=values, sections=sections, world_size=world)


def test_an_sdc_suspect_is_three_non_finite_episodes_of_its_own_loss_and_recovers_after_clean_steps():
    verdict = SdcVerdict(strikes=3, window=100, recover_after=3)
    nan = float("nan")
    losses = {4: nan, 7: nan, 8: nan, 10: float("inf")}
    transitions = {s: t for s in range(1, 20) if (t := verdict.feed(_record(s, losses.get(s, 0.5)))) is not None}
    assert transitions == {10: OCCUR, 13: RECOVER}  # 7-8 is one episode; 11, 12, 13 clean
    assert "3 times within 100 sampled steps, the last at step 10" in verdict.detail
    # Parameters that took the NaN stay non-finite: one episode, never a suspect.
    stuck = SdcVerdict(strikes=3, window=100, recover_after=3)
    assert [stuck.feed(_record(s, nan if s >= 4 else 0.5)) for s in range(1, 30)].count(OCCUR) == 0
    # Episodes further apart than the window do not add up; a rank that reads no loss is not judged.
    apart = SdcVerdict(strikes=3, window=5, recover_after=3)
    assert all(apart.feed(_record(s, nan if s % 6 == 0 else 0.5)) is None for s in range(1, 40))
    assert SdcVerdict(3, 100, 3).feed(_record(1, None)) is None
    # `window` sampled steps: episodes at samples 1 and 5 are within 5, at 1 and 6 not.
    for last, judged in ((5, OCCUR), (6, None)):
        edge = SdcVerdict(strikes=2, window=5, recover_after=3)
        assert [edge.feed(_record(s, nan if s in (1, last) else 0.5)) for s in range(1, last + 1)][-1] == judged


def test_a_slow_node_waits_for_its_data_for_windows_in_a_row_in_a_job_of_several_ranks():
    verdict = SlowNodeVerdict(data_share=0.2, windows=3, recover_after=2)
    waits = [0.5, 0.5, 0.1, 0.5, 0.5, 0.5, 0.6, 0.1, 0.1]
    transitions = [verdict.feed(_record(s, data_wait=w)) for s, w in enumerate(waits, start=1)]
    assert transitions == [None, None, None, None, None, OCCUR, None, None, RECOVER]
    # Waiting exactly `data_share` of the window is not over it.
    at_share = SlowNodeVerdict(data_share=0.25, windows=1, recover_after=1)
    assert [at_share.feed(_record(s, data_wait=0.25)) for s in range(1, 5)] == [None] * 4
    # Recovery takes `recover_after` clean windows in a row: a slow one between starts the count again.
    again = SlowNodeVerdict(data_share=0.2, windows=1, recover_after=2)
    waits = [0.5, 0.1, 0.5, 0.1, 0.1]
    assert [again.feed(_record(s, data_wait=w)) for s, w in enumerate(waits, start=1)] == [
        OCCUR, None, None, None, RECOVER,
    ]  # fmt: skip
    alone = SlowNodeVerdict(0.2, 1, 1)
    assert alone.feed(_record(1, data_wait=0.9, world=1)) is None  # one rank holds no job back


# --- MindSpore's silent-data-corruption detection ----------------------------------------------------
# Lines as MindSpore 2.7.1+ writes them (its "Feature Value Detection" tutorial's worker_0.log, and
# the messages of mindspore/ccsrc/tools/silent_detect/silent_detector.cc), and CANN's device log.
STRIKE = (
    "[WARNING] DEBUG(2950752,fffee7e591e0,python):2025-08-26-10:46:26.665.782 "
    "[mindspore/ccsrc/tools/silent_detect/silent_detector.cc:109] SilentDetect] Silent detect strike detected: "
    "StrikeRecord{timestamp: 1756176386, name: fc1.weight, value: inf, stat: StatData{avg: 6.44326e+12, "
    "pre_value: 6.441e+14, count: 6, none_zero_count: 6}}"
)
STRIKEOUT = (
    "[WARNING] DEBUG(2950752,fffda37fe1e0,python):2025-08-26-10:47:18.112.011 "
    "[mindspore/ccsrc/tools/silent_detect/silent_detector.cc:356] DetectStrikeout] Feature value detection strikes "
    "out on rank 5, strikes_num: 3, CheckSum will be enabled globally."
)
CHECKSUM = (
    "[WARNING] DEBUG(2950752,fffda37fe1e0,python):2025-08-26-10:47:28.934.101 "
    "[mindspore/ccsrc/tools/silent_detect/silent_detector.cc:303] DoCheckSum] CheckSum detects MatMul error on rank 5"
)
SDC = (
    "[WARNING] DEBUG(2950752,fffda37fe1e0,python):2025-08-26-10:47:28.934.305 "
    "[mindspore/ccsrc/tools/silent_detect/silent_detector.cc:318] DoCheckSum] SilentCheck detects SDC error, which "
    "means training may be unstable. Search 'CheckSum detects MatMul error on rank' in training logs to get abnormal ranks."
)
L1 = (
    "[ERROR] AICPU(26533,aicpu_scheduler):2025-02-25-18:40:56.176.403 [silent_check_v3.cc:250][ComputeL1Error]"
    "[tid:26552]SilentCheckV3 ComputeL1Error:val = [nan], max = [nan], avg=[1.128970e-09], step=[5], "
    "c_thresh_l1 = [1.000000e+06], c_thresh_l2 = [1.000000e+04], beta1 = [9.900000e-01], npu_asd_detect = [1]."
)
GLOBAL_RESULT = (
    "[WARNING] DEBUG(2950752,fffda37fe1e0,python):2025-08-26-10:47:28.934.305 "
    "[mindspore/ccsrc/tools/silent_detect/silent_detector.cc:316] DoCheckSum] Global CheckSum result is 0"
)


def test_mindsporess_detection_lines_are_read_with_the_rank_they_name():
    found = {line: asd.parse_line(line, own_rank=2) for line in (STRIKE, STRIKEOUT, CHECKSUM, SDC, L1, GLOBAL_RESULT)}
    assert [(d.kind, d.rank, d.alert, d.severity) if d else None for d in found.values()] == [
        ("strike", 2, False, "warning"),
        ("strikeout", 5, True, "warning"),
        ("checksum_error", 5, True, "critical"),
        ("sdc_error", 2, True, "critical"),  # names no rank: the rank whose log it is
        ("l1_error", 2, True, "critical"),
        None,  # a checksum that found nothing is no detection
    ]


def test_the_watcher_tails_a_log_from_where_it_was_and_a_named_log_written_later(tmp_path):
    log = tmp_path / "worker_0.log"
    log.write_text(CHECKSUM + "\n")  # before the watch: not this run's
    later = tmp_path / "later.log"
    found = []
    watcher = asd.AsdWatcher([log, later], None, 0, found.append, poll=0.02).start()
    with log.open("a") as handle:
        handle.write(f"otel_mindformers: MindSpore silent-data-corruption detection: {SDC}\n")  # ours, quoting one
        handle.write("[INFO] ME(1:2,MainProcess):... ordinary line\n" + STRIKE + "\n" + STRIKEOUT[:60])
        handle.flush()
        wait_until(lambda: len(found) == 1, "the strike, read with the first piece of the next line")
        handle.write(STRIKEOUT[60:] + "\n")  # the rest of that line, read by a later poll
    later.write_text(SDC + "\n")
    wait_until(lambda: len(found) == 3, "the three detections")
    watcher.stop(5.0)
    assert sorted((d.kind, d.rank) for d in found) == [("sdc_error", 0), ("strike", 0), ("strikeout", 5)]
    assert _no_thread(asd.THREAD_NAME)


def test_a_log_truncated_under_the_watch_is_read_from_its_start(tmp_path):
    """copytruncate rotation (logrotate's way with a log a process keeps open): the file
    shrinks to nothing and grows again; what is written then is read."""
    log = tmp_path / "worker_0.log"
    log.write_text("")
    found = []
    watcher = asd.AsdWatcher([log], None, 0, found.append, poll=0.02).start()
    try:
        log.write_text("[INFO] ordinary line " + "x" * 2000 + "\n" + STRIKEOUT + "\n")
        wait_until(lambda: len(found) == 1, "the strike-out")
        log.write_text(SDC + "\n")  # truncated, then a shorter log than was read
        wait_until(lambda: len(found) == 2, "the line written after the truncation")
    finally:
        watcher.stop(5.0)
    assert [d.kind for d in found] == ["strikeout", "sdc_error"]


def test_mindspores_own_log_file_is_found_under_glog_log_dir(tmp_path):
    logs = tmp_path / "rank_3" / "logs"
    logs.mkdir(parents=True)
    (logs / "mindspore.host.root.log.INFO.20261205-234557.4242").write_text("")
    warning = logs / "mindspore.host.root.log.WARNING.20261205-234559.4242"
    warning.write_text("")
    (logs / "mindspore.host.root.log.WARNING.20261205-234559.999").write_text("")  # another process
    env = {"GLOG_logtostderr": "0", "GLOG_log_dir": str(tmp_path), "RANK_ID": "3"}
    assert asd.glog_files(env, 3, 4242) == [warning]
    assert asd.glog_files({**env, "GLOG_logtostderr": "1"}, 3, 4242) == []


def test_the_detection_switches_are_resource_attributes():
    assert asd_attributes({}) == {names.ATTR_ASD_ENABLED: False}
    assert asd_attributes({"NPU_ASD_ENABLE": "2"}) == {names.ATTR_ASD_ENABLED: True, names.ATTR_ASD_NPU_ASD_ENABLE: "2"}
    combined = asd_attributes(
        {"NPU_ASD_ENABLE": "0", "MS_NPU_ASD_CONFIG": "enable:true,with_checksum = true,cooldown:5"}
    )
    assert combined[names.ATTR_ASD_ENABLED] is True and combined[names.ATTR_ASD_CHECKSUM] is True
    assert asd_attributes({"MS_NPU_ASD_CONFIG": "enable:false,with_checksum:true"})[names.ATTR_ASD_CHECKSUM] is False


# --- the pre-flight check ---------------------------------------------------------------------------
def no_stress_test() -> int:
    """What MindSpore 2.9's stress_detect does on a device without the test (measured on this
    host's CPU; calling the real one here would initialise MindSpore's runtime for the rest of
    the test process)."""
    raise RuntimeError("Stress detection is not supported.\n\n----------------------------------------------------")


def test_the_preflight_check_is_not_available_on_this_host_and_says_so_once(capture, caplog, monkeypatch):
    from otel_mindformers.compat import stress_detect

    caplog.set_level(logging.INFO, LOGGER)
    tracer = capture.tracer_provider.get_tracer("t")
    run = tracer.start_span("run")
    assert preflight.run_preflight(tracer, run, {"training.rank": 0}, "CPU") == preflight.NOT_AVAILABLE
    # On a device whose MindSpore has no stress test: it raises, the check is not available.
    monkeypatch.setattr(stress_detect, "PLACES", ("tests.test_cluster_units:no_stress_test",))
    assert preflight.run_preflight(tracer, run, {"training.rank": 0}, "Ascend") == preflight.NOT_AVAILABLE
    run.end()
    spans = capture.finished(names.SPAN_PREFLIGHT)
    assert [s.attributes[names.ATTR_PREFLIGHT_RESULT] for s in spans] == ["not_available", "not_available"]
    assert "needs an Ascend device" in spans[0].attributes[names.ATTR_PREFLIGHT_DETAIL]
    assert spans[1].attributes[names.ATTR_PREFLIGHT_DETAIL] == "RuntimeError: Stress detection is not supported."
    assert len(_warnings(caplog, "pre-flight check not available here")) == 2


def hardware_fault() -> int:
    """stress_detect's answer for a device with a hardware fault (no Ascend device here)."""
    return 2


def test_a_hardware_fault_keeps_the_run_from_starting(capture, monkeypatch):
    from otel_mindformers.compat import stress_detect

    monkeypatch.setattr(stress_detect, "PLACES", ("tests.test_cluster_units:hardware_fault",))
    tracer = capture.tracer_provider.get_tracer("t")
    with pytest.raises(preflight.PreflightFailed, match="stress_detect returned 2: .* replace it"):
        preflight.run_preflight(tracer, tracer.start_span("run"), {}, "Ascend")
    (span,) = capture.finished(names.SPAN_PREFLIGHT)
    assert span.attributes[names.ATTR_PREFLIGHT_RESULT] == "failed" and not span.status.is_ok


def an_answer_of_a_later_release() -> int:
    """A code stress_detect does not document (0, 1 and 2 are its answers today)."""
    return 3


def test_an_answer_the_preflight_check_does_not_know_is_incomplete_not_passed(capture, monkeypatch):
    from otel_mindformers.compat import stress_detect

    monkeypatch.setattr(stress_detect, "PLACES", ("tests.test_cluster_units:an_answer_of_a_later_release",))
    tracer = capture.tracer_provider.get_tracer("t")
    assert preflight.run_preflight(tracer, tracer.start_span("run"), {}, "Ascend") == preflight.INCOMPLETE
    (span,) = capture.finished(names.SPAN_PREFLIGHT)
    assert span.attributes[names.ATTR_PREFLIGHT_DETAIL] == "stress_detect returned 3"


# --- the report's words -------------------------------------------------------------------------------
def _ledger(folder: Path, fault: dict | None, outcome: str | None) -> None:
    attempt = {
        "attempt": 1, "attempt_id": "a1", "pid": 1, "host": "h", "rank": 0, "process_start": 1000.0,
        "train_begin": 1001.0, "first_step_begin": 1002.0, "first_step_end": 1003.0, "resume_step": 0,
        "last_step": 40, "last_step_time": 1060.0, "last_heartbeat": 1064.0, "durable_step": 0,
        "checkpoint_save_seconds": 0.0, "checkpoint_load_seconds": 0.0, "data_wait_seconds": 0.0,
        "heartbeat_interval": 5.0, "outcome": outcome,
    }  # fmt: skip
    if outcome is not None:
        attempt.update(end=1064.0, reason="x")
    if fault is not None:
        attempt["cluster_fault"] = fault
    ledger = {"version": 1, "job_id": JOB, "attempts": [attempt]}
    (folder / "train_metric.job.rank_0.ledger").write_text(json.dumps(ledger))


FAULT = {
    "time": 1060.0,
    "node": "worker-3",
    "device": "3",
    "device_type": "NPU",
    "level": "SeparateNPU",
    "codes": ["80818C00"],
}


def test_the_attempt_a_clusterd_fault_ended_says_so_in_the_report(tmp_path):
    _ledger(tmp_path, FAULT, None)  # no end record: killed, ended at its last heartbeat
    text = render_job(job_report([tmp_path], now=5000.0))
    assert "  attempt 1 ended: node worker-3, NPU 3, SeparateNPU, 80818C00, 4 s before its last heartbeat" in text
    assert "- attempt 1 ended: node worker-3" in render_job(job_report([tmp_path], now=5000.0), "markdown")
    for fault, outcome in (({**FAULT, "cleared": 1062.0}, None), (FAULT, "completed")):
        _ledger(tmp_path, fault, outcome)
        assert "ended: node" not in render_job(job_report([tmp_path], now=5000.0))
    _ledger(tmp_path, FAULT, "crashed")
    assert ended_by(job_report([tmp_path], now=5000.0)["attempts"][0]).endswith("4 s before it ended")
    # The fault is in the ledger of the rank that listened, not necessarily the lowest one.
    _ledger(tmp_path, None, None)
    rank1 = json.loads((tmp_path / "train_metric.job.rank_0.ledger").read_text())
    rank1["attempts"][0].update(rank=1, cluster_fault=FAULT)
    (tmp_path / "train_metric.job.rank_1.ledger").write_text(json.dumps(rank1))
    assert "attempt 1 ended: node worker-3, NPU 3" in render_job(job_report([tmp_path], now=5000.0))
