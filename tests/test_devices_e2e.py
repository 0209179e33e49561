"""End to end: real MindSpore training with `device_monitor: True`, the fake npu-smi first on
PATH, exported over OTLP to a real receiver on 127.0.0.1, and written to JSON lines."""

import json
import os
import resource
import time
from pathlib import Path

import mindspore
import pytest
from mindspore.train import Callback

from otel_mindformers import MonitorCallback
from otel_mindformers.devices.source import MIB
from otel_mindformers.names import semconv
from tests.support import training
from tests.support.npu_fixture import NPU1_IDENTITY
from tests.support.paths import FAKE_BIN
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # real training runs


@pytest.fixture
def rank1_on_device1(monkeypatch):
    monkeypatch.setenv("PATH", f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    monkeypatch.setenv("DEVICE_ID", "1")


def monitor(workdir, endpoint, **device_config):
    return MonitorCallback(
        {
            "interval": 2,
            "output_type": ["otlp", "json_file"],
            "json_log_path": str(workdir / "m.json"),
            "device_monitor": True,
            "device_config": {"poll_interval": 0.1, **device_config},
            "otlp": {"endpoint": endpoint, "protocol": "grpc", "export_interval": 0.2},
        }
    )


class WaitForReadings(Callback):
    """Holds step `step` until the receiver has NPU readings: on a loaded machine the fake
    npu-smi's first answer may otherwise come after a 30-step training ended."""

    def __init__(self, receiver, step: int = 4) -> None:
        self.receiver, self.step = receiver, step

    def on_train_step_begin(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            assert self.receiver.wait_for(lambda rx: rx.points(semconv.HW_NPU_MEMORY_USAGE), timeout=60)


class _HoldUntil(Callback):
    """Holds step `step` until `ready()`: on a loaded machine the poll thread's tool may
    otherwise start after a short training ended."""

    def __init__(self, ready, step: int = 2) -> None:
        self.ready, self.step = ready, step

    def on_train_step_begin(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            wait_until(self.ready, "the tool's child to start", timeout=60)


def test_device_gauges_reach_the_receiver_with_fixture_numbers_and_rank(workdir, otlp_receiver, rank1_on_device1):
    training.train([monitor(workdir, otlp_receiver.grpc_endpoint), WaitForReadings(otlp_receiver)], steps=30)

    assert otlp_receiver.wait_for(lambda rx: rx.points(semconv.HW_NPU_MEMORY_USAGE))
    hbm = [
        p
        for p in otlp_receiver.points(semconv.HW_NPU_MEMORY_USAGE)
        if p.attributes[semconv.ATTR_HW_NPU_MEMORY_TYPE] == "hbm"
    ]
    assert hbm and {p.value for p in hbm} == {21504 * MIB} and hbm[-1].unit == "By"
    point = hbm[-1]
    assert point.resource[semconv.ATTR_RANK] == 1 and point.resource[semconv.ATTR_DEVICE_ID] == 1
    assert point.attributes == {
        semconv.ATTR_RANK: 1,
        semconv.ATTR_DEVICE_ID: 1,
        semconv.ATTR_HW_ID: "npu-1",
        semconv.ATTR_HW_TYPE: "npu",
        semconv.ATTR_HW_VENDOR: "Huawei",
        semconv.ATTR_HW_MODEL: "910B4",
        semconv.ATTR_HW_NPU_MEMORY_TYPE: "hbm",
        **NPU1_IDENTITY,
    }
    aicore = {
        p.value
        for p in otlp_receiver.points(semconv.HW_NPU_UTILIZATION)
        if p.attributes[semconv.ATTR_HW_NPU_TASK] == "aicore"
    }
    assert aicore == {0.47}
    assert {p.value for p in otlp_receiver.points(semconv.HW_POWER)} == {88.7}
    # The fake lists its caller (this training process) on NPU 1.
    assert {p.value for p in otlp_receiver.points(semconv.DEVICE_PROCESS_MEMORY)} == {18432 * MIB}
    rss = otlp_receiver.points(semconv.PROCESS_MEMORY_USAGE)
    assert rss and all(p.value > 0 and p.attributes == {semconv.ATTR_RANK: 1} for p in rss)
    assert not otlp_receiver.points(semconv.DEVICE_POLL_FAILURES)

    lines = [json.loads(line) for line in (workdir / "m_rank_1.json").read_text().splitlines()]
    with_device = [line for line in lines if "npu_hbm_used_mb" in line]
    assert with_device and with_device[-1] is lines[-1]
    first = lines.index(with_device[0])
    assert lines[first:] == with_device  # once polled, every sampled step carries the readings
    for line in with_device:
        assert line["npu_hbm_used_mb"] == 21504.0 and line["npu_utilization"] == 47.0
        assert line["npu_process_memory_mb"] == 18432.0
    # The host reader is a source of its own: its first poll may land a sample after npu-smi's.
    assert with_device[-1]["host_rss_mb"] > 0


def test_hung_npu_smi_is_counted_while_training_runs_on(workdir, otlp_receiver, rank1_on_device1, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_MODE", "hang")
    training.train([monitor(workdir, otlp_receiver.grpc_endpoint, command_timeout=0.2)], steps=30)

    assert otlp_receiver.wait_for(lambda rx: rx.points(semconv.DEVICE_POLL_FAILURES))
    # npu-smi's, by source: on a loaded machine the fake hccn_tool may pass 0.2 s too.
    (npu_smi,) = [
        p
        for p in otlp_receiver.points(semconv.DEVICE_POLL_FAILURES)
        if p.attributes[semconv.ATTR_DEVICE_SOURCE] == "npu-smi"
    ][-1:]
    assert npu_smi.value >= 1
    assert npu_smi.attributes == {semconv.ATTR_DEVICE_SOURCE: "npu-smi", semconv.ATTR_ERROR_TYPE: "timeout"}
    assert not otlp_receiver.points(semconv.HW_NPU_UTILIZATION)
    lines = [json.loads(line) for line in (workdir / "m_rank_1.json").read_text().splitlines()]
    assert len(lines) == 16 and not any("npu_utilization" in line for line in lines)


def test_streaming_npu_smi_is_a_parse_failure_and_the_training_stays_small(
    workdir, otlp_receiver, rank1_on_device1, monkeypatch
):
    # A broken driver that never stops writing: without the byte cap each poll read it for
    # the whole timeout, gigabytes into this process.
    monkeypatch.setenv("FAKE_NPU_SMI_MODE", "stream")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    training.train([monitor(workdir, otlp_receiver.grpc_endpoint, command_timeout=3.0)], steps=30)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024

    assert otlp_receiver.wait_for(lambda rx: rx.points(semconv.DEVICE_POLL_FAILURES))
    failures = otlp_receiver.points(semconv.DEVICE_POLL_FAILURES)
    assert failures[-1].attributes == {semconv.ATTR_DEVICE_SOURCE: "npu-smi", semconv.ATTR_ERROR_TYPE: "parse"}
    lines = [json.loads(line) for line in (workdir / "m_rank_1.json").read_text().splitlines()]
    assert len(lines) == 16 and not any("npu_utilization" in line for line in lines)
    assert grown_mb < 256, f"peak RSS grew by {grown_mb:.0f} MB"


def test_stdout_and_tensorboard_carry_the_readings(workdir, rank1_on_device1, monkeypatch, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("RANK_ID", "0")  # stdout is rank 0's
    callback = MonitorCallback(
        {
            "interval": 2,
            "output_type": ["stdout", "tensorboard"],
            "tensorboard_path": str(workdir / "tb"),
            "device_monitor": True,
            "device_config": {"poll_interval": 0.1},
        }
    )
    training.train([callback], steps=30)

    accumulator = EventAccumulator(str(workdir / "tb" / "rank_0"))
    accumulator.Reload()
    hbm = accumulator.Scalars("device/npu_hbm_used_mb")
    assert hbm and {event.value for event in hbm} == {21504.0}
    assert {event.value for event in accumulator.Scalars("device/npu_utilization")} == {47.0}
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[otel_mindformers]")]
    assert "npu_hbm_used_mb 21504" in lines[-1] and "npu_utilization 47" in lines[-1]


def test_faults_links_clocks_energy_and_job_reach_the_receiver_from_fixtures(workdir, otlp_receiver, rank1_on_device1):
    # The 910b fixtures: NPU 1 has an error code, corrected HBM errors, a throttled clock, and
    # its RoCE port (hccn_tool) is down, unreachable, with CRC errors and low receive power.
    training.train([monitor(workdir, otlp_receiver.grpc_endpoint)], steps=30)

    def arrived(rx):
        return all(
            rx.points(name)
            for name in (
                semconv.HW_NPU_ERROR_CODE,
                semconv.HW_ERRORS,
                semconv.HW_NETWORK_UP,
                semconv.HW_NETWORK_OPTICAL_POWER,
                semconv.HW_ENERGY,
                semconv.HW_NPU_SPEED,
                semconv.HW_NETWORK_IO,
            )
        )

    assert otlp_receiver.wait_for(arrived)
    chip = {
        semconv.ATTR_RANK: 1,
        semconv.ATTR_DEVICE_ID: 1,
        semconv.ATTR_HW_ID: "npu-1",
        semconv.ATTR_HW_TYPE: "npu",
        semconv.ATTR_HW_VENDOR: "Huawei",
        semconv.ATTR_HW_MODEL: "910B4",
        **NPU1_IDENTITY,
    }
    code = otlp_receiver.points(semconv.HW_NPU_ERROR_CODE)[-1]
    assert code.value == 1 and code.attributes == {
        **chip,
        semconv.ATTR_HW_NPU_ERROR_CODE: "0x80E18005",
        semconv.ATTR_CLUSTER_FAULT_LEVEL: "RestartNPU",  # MindCluster's level for the code (cluster/)
    }
    ecc = [p for p in otlp_receiver.points(semconv.HW_ERRORS) if p.attributes[semconv.ATTR_HW_ID] == "npu-1"]
    assert {(p.attributes[semconv.ATTR_ERROR_TYPE], p.value) for p in ecc} == {("corrected", 17), ("uncorrected", 0)}
    assert ecc[-1].unit == "{error}"
    speed = otlp_receiver.points(semconv.HW_NPU_SPEED)[-1]
    assert (speed.value, speed.unit) == (1.3e9, "Hz")
    energy = otlp_receiver.points(semconv.HW_ENERGY)
    assert energy[-1].unit == "J" and energy[-1].value > 0 and energy[-1].attributes == chip

    port = {
        semconv.ATTR_RANK: 1,
        semconv.ATTR_DEVICE_ID: 1,
        semconv.ATTR_HW_ID: "npu-1-roce",
        semconv.ATTR_HW_TYPE: "network",
        semconv.ATTR_HW_VENDOR: "Huawei",
        semconv.ATTR_HW_NAME: "RoCE port of NPU device 1",
        semconv.ATTR_HW_PARENT: "npu-1",
    }
    up = otlp_receiver.points(semconv.HW_NETWORK_UP)[-1]
    assert (up.value, up.attributes) == (0, port)
    failed = [
        p for p in otlp_receiver.points(semconv.HW_STATUS) if p.attributes == {**port, semconv.ATTR_HW_STATE: "failed"}
    ]
    assert failed[-1].value == 1
    crc = [p for p in otlp_receiver.points(semconv.HW_ERRORS) if p.attributes.get(semconv.ATTR_ERROR_TYPE) == "crc"]
    assert crc[-1].value == 12 and crc[-1].attributes[semconv.ATTR_NETWORK_IO_DIRECTION] == "receive"
    received = {
        p.attributes[semconv.ATTR_NETWORK_IO_DIRECTION]: p.value for p in otlp_receiver.points(semconv.HW_NETWORK_IO)
    }
    assert received == {"receive": 401882113, "transmit": 13002211}
    rx_power = [
        p
        for p in otlp_receiver.points(semconv.HW_NETWORK_OPTICAL_POWER)
        if p.attributes[semconv.ATTR_NETWORK_IO_DIRECTION] == "receive"
    ]
    assert rx_power[-1].value == pytest.approx(5.12e-5) and rx_power[-1].unit == "W"

    resource = code.resource
    assert resource[semconv.ATTR_MINDSPORE_VERSION] == mindspore.__version__
    assert resource[semconv.ATTR_PARALLEL_MODE] == "stand_alone"
    assert not otlp_receiver.points(semconv.DEVICE_POLL_FAILURES)


def _running(pid: int) -> bool:
    """`pid` exists and is not a zombie (an orphan may wait for a reaper that never comes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_tool_hung_when_the_run_ends_does_not_outlive_it(workdir, monkeypatch):
    # npu-smi hangs in a child (a driver call under a wrapper) with a long command_timeout:
    # training ends while the poll waits on it. The poll thread is a daemon and the tool's
    # group runs in its own session, so once the script exits nothing would ever kill them.
    tool = workdir / "npu-smi"
    child = workdir / "child.pid"
    tool.write_text(f'#!/bin/sh\nsleep 600 &\necho $! > "{child}"\nwait\n')
    tool.chmod(0o755)
    callback = MonitorCallback(
        {
            "interval": 2,
            "output_type": ["json_file"],
            "json_log_path": str(workdir / "m.json"),
            "device_monitor": True,
            "device_config": {
                "poll_interval": 0.1,
                "command_timeout": 120.0,
                "npu_smi_path": str(tool),
                "sources": ["ascend"],
            },
        }
    )
    training.train([callback, _HoldUntil(lambda: child.exists() and child.read_text().strip())], steps=30)

    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid), "the hung npu-smi outlived the run"
    lines = [json.loads(line) for line in (workdir / "m.json").read_text().splitlines()]
    assert len(lines) == 16 and not any("npu_utilization" in line for line in lines)
