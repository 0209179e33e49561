"""DeviceTelemetry: poll thread, cache, observable instruments on a real SDK reader, failure
counting and warnings, and the `otel-mindformers devices` command."""

import logging
import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_mindformers.config import load_monitor_config
from otel_mindformers.devices import DeviceTelemetry
from otel_mindformers.devices.cache import ReadingCache
from otel_mindformers.devices.poller import Poller
from otel_mindformers.devices.source import MIB, Point, Readings, SourceError
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv
from otel_mindformers.telemetry.observables import RunObservables
from tests.support.cli import cli
from tests.support.npu_fixture import NPU1_IDENTITY
from tests.support.paths import FAKE_BIN, REPO
from tests.support.waiting import wait_until

IDENTITY = Identity(rank=1, world_size=2, local_rank=1, node_rank=0, device_id=1, device_target="Ascend")


@pytest.fixture
def reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    reader.meter = provider.get_meter("test")
    yield reader
    provider.shutdown()


def collect(reader) -> dict[str, list]:
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def config(**device_config):
    return load_monitor_config(
        {"device_monitor": True, "output_type": ["stdout"], "device_config": {"poll_interval": 0.1, **device_config}}
    )


@pytest.fixture
def started():
    telemetries = []

    def start(cfg, identity=IDENTITY, observables=None):
        telemetry = DeviceTelemetry.start(cfg.device_config, identity, observables)
        telemetries.append(telemetry)
        return telemetry

    yield start
    for telemetry in telemetries:
        if telemetry is not None:
            telemetry.shutdown(timeout=10)


# --- cache and poller ------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_cache_drops_readings_older_than_max_age():
    clock = Clock()
    cache = ReadingCache(max_age=10.0, clock=clock)
    cache.put("a", Readings((Point("m", 1.0, {}),), {"a_mb": 1.0}))
    clock.now += 5
    cache.put("b", Readings((Point("m", 2.0, {}),), {"b_mb": 2.0}))
    assert [p.value for p in cache.points("m")] == [1.0, 2.0]
    assert cache.snapshot() == {"a_mb": 1.0, "b_mb": 2.0}
    clock.now += 6
    assert [p.value for p in cache.points("m")] == [2.0] and cache.snapshot() == {"b_mb": 2.0}
    cache.drop("b")
    assert cache.points("m") == [] and cache.snapshot() == {}


class Flaky:
    name = "flaky"

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.closed = False

    def read(self):
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def close(self):
        self.closed = True


class CountingCounter:
    def __init__(self):
        self.adds = []

    def add(self, amount, attributes):
        self.adds.append((amount, attributes))


def test_poller_counts_every_failure_warns_once_and_never_keeps_stale_readings(caplog):
    good = Readings((Point("m", 1.0, {}),), {"x": 1.0})
    source = Flaky([good, SourceError("timeout", "slow"), RuntimeError("bug"), good])
    cache, counter = ReadingCache(60.0), CountingCounter()
    poller = Poller([source], cache, 60.0, counter)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers.devices.poller"):
        poller.poll_once()
        assert cache.snapshot() == {"x": 1.0}
        poller.poll_once()
        assert cache.snapshot() == {} and cache.points("m") == []
        poller.poll_once()
        poller.poll_once()
    assert cache.snapshot() == {"x": 1.0}
    source_attr = {semconv.ATTR_DEVICE_SOURCE: "flaky"}
    assert counter.adds == [
        (1, {**source_attr, semconv.ATTR_ERROR_TYPE: "timeout"}),
        (1, {**source_attr, semconv.ATTR_ERROR_TYPE: "RuntimeError"}),
    ]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "flaky" in warnings[0].getMessage()


def test_poller_counts_each_failing_query_and_warns_once_per_query(caplog):
    ecc = SourceError("exit_status", "no ecc", query="npu-smi info -t ecc")
    board = SourceError("parse", "no board", query="npu-smi info -t board")
    partial = Readings((Point("m", 1.0, {}),), {"x": 1.0}, (ecc, board))
    source = Flaky([partial, Readings((Point("m", 1.0, {}),), {"x": 1.0}, (ecc,))])
    cache, counter = ReadingCache(60.0), CountingCounter()
    poller = Poller([source], cache, 60.0, counter)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers.devices.poller"):
        poller.poll_once()
        poller.poll_once()
    assert cache.snapshot() == {"x": 1.0}  # the poll's other readings stay
    source_attr = {semconv.ATTR_DEVICE_SOURCE: "flaky"}
    assert counter.adds == [
        (1, {**source_attr, semconv.ATTR_ERROR_TYPE: "exit_status"}),
        (1, {**source_attr, semconv.ATTR_ERROR_TYPE: "parse"}),
        (1, {**source_attr, semconv.ATTR_ERROR_TYPE: "exit_status"}),
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "`npu-smi info -t ecc`" in warnings[0] and "-t board" in warnings[1]


def test_a_missing_tool_is_counted_once_and_not_run_again():
    missing = Flaky([SourceError("not_found", "cannot run 'hccn_tool'")])
    counter = CountingCounter()
    poller = Poller([missing], ReadingCache(60.0), 60.0, counter)
    for _ in range(3):
        poller.poll_once()  # a second read would pop from an empty list and count an IndexError
    assert counter.adds == [(1, {semconv.ATTR_DEVICE_SOURCE: "flaky", semconv.ATTR_ERROR_TYPE: "not_found"})]


def test_a_gpu_run_without_an_nvidia_driver_warns_once_and_stops_asking_nvml(caplog):
    import pynvml  # the real nvidia-ml-py; no driver library on this machine

    from otel_mindformers.devices.nvidia import NvmlSource

    counter = CountingCounter()
    poller = Poller([NvmlSource(pynvml, ["0"], "0", {})], ReadingCache(60.0), 60.0, counter)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers.devices.poller"):
        for _ in range(3):
            poller.poll_once()
    assert counter.adds == [(1, {semconv.ATTR_DEVICE_SOURCE: "nvml", semconv.ATTR_ERROR_TYPE: "not_found"})]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "device source 'nvml' failed (not_found: no NVIDIA driver on this node)" in warning


def test_poller_thread_closes_sources_when_stopped():
    source = Flaky([Readings()] * 1000)
    poller = Poller([source], ReadingCache(60.0), 0.01)
    poller.start()
    assert wait_until(lambda: len(source.outcomes) < 1000)
    poller.stop(timeout=10)
    assert source.closed


# --- DeviceTelemetry ----------------------------------------------------------------------------


def test_nothing_to_read_is_none(started):
    assert started(config(sources=[])) is None


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_gauges_carry_the_fixture_numbers_with_rank_and_device(fake_npu_smi, reader, started):
    telemetry = started(config(sources=["ascend", "host"]), observables=RunObservables(reader.meter))
    assert wait_until(lambda: {"npu_hbm_used_mb", "host_rss_mb"} <= set(telemetry.snapshot()))
    points = collect(reader)
    (hbm,) = [p for p in points[semconv.HW_NPU_MEMORY_USAGE] if p.attributes[semconv.ATTR_HW_NPU_MEMORY_TYPE] == "hbm"]
    assert hbm.value == 21504 * MIB
    assert dict(hbm.attributes) == {
        semconv.ATTR_RANK: 1,
        semconv.ATTR_DEVICE_ID: 1,
        semconv.ATTR_HW_ID: "npu-1",
        semconv.ATTR_HW_TYPE: "npu",
        semconv.ATTR_HW_VENDOR: "Huawei",
        semconv.ATTR_HW_MODEL: "910B4",
        semconv.ATTR_HW_NPU_MEMORY_TYPE: "hbm",
        **NPU1_IDENTITY,
    }
    (aicore,) = [p for p in points[semconv.HW_NPU_UTILIZATION] if p.attributes[semconv.ATTR_HW_NPU_TASK] == "aicore"]
    assert aicore.value == 0.47
    assert points[semconv.HW_TEMPERATURE][0].value == 35.0
    (rss,) = points[semconv.PROCESS_MEMORY_USAGE]
    assert rss.value > 0 and dict(rss.attributes) == {semconv.ATTR_RANK: 1}
    assert semconv.SYSTEM_CPU_UTILIZATION not in points  # local rank 1: the node is rank 0's
    snapshot = telemetry.snapshot()
    assert snapshot["npu_utilization"] == 47.0 and snapshot["npu_hbm_used_mb"] == 21504.0
    assert snapshot["host_rss_mb"] > 0


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_collections_and_snapshots_never_run_npu_smi(fake_npu_smi, reader, started):
    telemetry = started(config(sources=["ascend"], poll_interval=3600), observables=RunObservables(reader.meter))
    assert wait_until(lambda: telemetry.snapshot())
    for _ in range(5):
        collect(reader)
        telemetry.snapshot()
    # One poll: the table and the usages of the rank's NPU, whatever was collected since.
    assert fake_npu_smi.read_text().splitlines() == [
        "info",
        "info -t usages -i 1",
        "info -t common -i 1",
        "info -t ecc -i 1",
        "info -t health -i 1 -c 0",
        "info -t board -i 1 -c 0",
    ]


def test_local_rank_zero_also_reports_the_node(fake_npu_smi, reader, started):
    identity = Identity(rank=0, world_size=2, local_rank=0, node_rank=3, device_id=0, device_target="Ascend")
    telemetry = started(config(sources=["host"]), identity=identity, observables=RunObservables(reader.meter))
    assert wait_until(lambda: "host_cpu_percent" in telemetry.snapshot())  # after a whole CPU window
    (cpu,) = collect(reader)[semconv.SYSTEM_CPU_UTILIZATION]
    # Issue 11 item 28: node series carry the reporting rank too, as every device point does.
    assert dict(cpu.attributes) == {semconv.ATTR_RANK: 0, semconv.ATTR_NODE_RANK: 3} and 0.0 <= cpu.value <= 1.0


@pytest.mark.slow  # runs the fake npu-smi in a child process
# Only the hung call must time out: on 2 loaded cores the fake's bash alone can take longer
# than a short timeout, and a failure would then be counted as a timeout.
@pytest.mark.parametrize(
    "mode, error_type, timeout", [("exit1", "exit_status", 10.0), ("garbage", "parse", 10.0), ("hang", "timeout", 0.2)]
)
def test_failing_npu_smi_is_counted_and_warned_once(
    fake_npu_smi, reader, started, monkeypatch, caplog, mode, error_type, timeout
):
    monkeypatch.setenv("FAKE_NPU_SMI_MODE", mode)
    with caplog.at_level(logging.WARNING, logger="otel_mindformers"):
        telemetry = started(
            config(sources=["ascend", "host"], command_timeout=timeout, poll_interval=0.1),
            observables=RunObservables(reader.meter),
        )

        def failures():
            points = collect(reader).get(semconv.DEVICE_POLL_FAILURES, [])
            return sum(p.value for p in points)

        assert wait_until(lambda: failures() >= 3)
    # npu-smi's: at a 0.2 s timeout a loaded machine's fake hccn_tool (the RoCE port) may time out too.
    failures_by_source = {
        (f.attributes[semconv.ATTR_DEVICE_SOURCE], f.attributes[semconv.ATTR_ERROR_TYPE])
        for f in collect(reader)[semconv.DEVICE_POLL_FAILURES]
    }
    assert ("npu-smi", error_type) in failures_by_source
    assert failures_by_source <= {("npu-smi", error_type), ("hccn_tool", "timeout")}, failures_by_source
    points = collect(reader)
    assert semconv.HW_NPU_UTILIZATION not in points and points[semconv.PROCESS_MEMORY_USAGE]
    assert "npu_utilization" not in telemetry.snapshot() and "host_rss_mb" in telemetry.snapshot()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("'npu-smi' failed" in w for w in warnings) == 1, warnings
    assert all("'npu-smi' failed" in w or "'hccn_tool' failed (timeout" in w for w in warnings), warnings


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_a_second_run_on_the_same_meter_is_observed(fake_npu_smi, reader, started, monkeypatch):
    # The SDK returns the first registration's instrument (and callbacks) for a repeated name:
    # each run's readings are its sources on the shared instruments, removed at its end.
    first_run = RunObservables(reader.meter)
    first = started(config(sources=["ascend"]), observables=first_run)
    assert wait_until(lambda: first.snapshot())
    first.shutdown(timeout=10)
    first_run.close()  # the run's end (Telemetry.close)
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "a3")
    second_run = RunObservables(reader.meter)
    second = started(config(sources=["ascend"]), observables=second_run)
    assert wait_until(lambda: second.snapshot().get("npu_power_w") == 85.6)
    (power,) = collect(reader)[semconv.HW_POWER]
    assert power.value == 85.6
    second_run.close()
    assert semconv.HW_POWER not in collect(reader)  # a run that ended reports nothing


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_readings_outlive_shutdown_for_the_final_export(fake_npu_smi, reader, started):
    telemetry = started(config(sources=["ascend"]), observables=RunObservables(reader.meter))
    assert wait_until(lambda: telemetry.snapshot())
    telemetry.shutdown(timeout=10)
    assert collect(reader)[semconv.HW_TEMPERATURE][0].value == 35.0


# --- the `devices` command ---------------------------------------------------------------------


def run_cli(*args, **env):
    return cli(
        "devices", *args, env={"PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}", **env}, cwd=REPO, timeout=120
    )


def line_with(out: str, *parts: str) -> str:
    """The one output line holding every part."""
    lines = [line for line in out.splitlines() if all(part in line for part in parts)]
    assert len(lines) == 1, f"{parts} on {len(lines)} lines of:\n{out}"
    return lines[0]


@pytest.mark.slow  # the `devices` command in a child process
def test_devices_command_prints_one_block_per_device_with_the_tool_of_each_reading():
    result = run_cli(FAKE_NPU_SMI_VARIANT="a3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    blocks = out.split("\n\n")
    for device, name in (
        ("npu-0", "NPU 0 chip 0"),
        ("npu-1", "NPU 0 chip 1"),
        ("npu-2", "NPU 1 chip 0"),
        ("npu-3", "NPU 1 chip 1"),
    ):
        (block,) = [b for b in blocks if b.startswith(f"{device} npu Huawei Ascend910  (name={name}, ")]
        assert "driver_version=24.1.rc3, firmware_version=24.1.rc3.b030)" in block.splitlines()[0]
        assert f"[{device}-roce] hw.network.up" in block  # the chip's RoCE port sits in its block
    assert "40448 MiB  npu-smi info" in line_with(out, "hw.npu.memory.usage{hw.npu.memory.type=hbm}", "40448")
    assert line_with(out, "hw.power", "85.6 W").endswith("npu-smi info -t common")  # the A3 second chip
    assert line_with(
        out, "hw.npu.error_code{hw.npu.error_code=0x80E01809,mindcluster.fault.level=NotHandleFault}"
    ).endswith("npu-smi info -t health")
    assert line_with(out, "hw.errors{error.type=uncorrected,hw.npu.memory.type=hbm}", " 2 {error}").endswith(
        "npu-smi info -t ecc"
    )
    assert line_with(out, "[npu-3-roce] hw.network.packets{network.io.direction=receive}").endswith("hccn_tool -stat")
    assert "[npu-2-roce] hw.network.optical.power{" not in out  # no optical module: only its thresholds
    assert line_with(out, "[npu-1-roce] hw.network.optical.power{network.io.direction=receive}", "1.11 mW").endswith(
        "hccn_tool -optical"
    )
    assert line_with(out, "system.memory.limit").endswith("psutil")
    # nvidia-ml-py is installed, no driver here: one plain line, not an NVML error.
    assert line_with(out, "nvml") == "nvml: no NVIDIA driver on this node"


@pytest.mark.slow  # the `devices` command in a child process
def test_devices_command_reports_a_broken_npu_smi(tmp_path):
    yaml = tmp_path / "m.yaml"
    yaml.write_text("monitor_config:\n  output_type: [stdout]\n  device_config:\n    sources: [ascend]\n")
    result = run_cli(str(yaml), FAKE_NPU_SMI_MODE="exit1")
    assert result.returncode == 1
    assert "npu-smi: no readings (exit_status: npu-smi info exited with status 1: dcmi" in result.stdout


def _peak_rss_mb(*args, **env) -> tuple[int, float]:
    """Exit status and peak RSS (MB) of the `devices` command, read from its rusage."""
    environ = {**os.environ, "PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}", **env}
    process = subprocess.Popen(
        [sys.executable, "-m", "otel_mindformers.cli", "devices", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environ,
        cwd=REPO,
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss / 1024  # Linux: KiB


@pytest.mark.slow  # runs the devices command in a child process
def test_devices_command_against_a_streaming_npu_smi_stays_small(tmp_path):
    yaml = tmp_path / "m.yaml"
    yaml.write_text(
        "monitor_config:\n  output_type: [stdout]\n  device_config:\n    sources: [ascend]\n    command_timeout: 3\n"
    )
    _, baseline = _peak_rss_mb(str(yaml))
    code, streaming = _peak_rss_mb(str(yaml), FAKE_NPU_SMI_MODE="stream")
    assert code == 1  # no readings
    # The cap (4 MiB) and its chunks: a few times that at most, not the gigabytes of 3 s of `yes`.
    assert streaming - baseline < 64, (baseline, streaming)
