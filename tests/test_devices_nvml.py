"""NvmlSource. No NVIDIA GPU exists on the test machines, so the readings come from a fake
NVML module (tests/fixtures/fake_pynvml.py) — every test using it says so in its name. The
real nvidia-ml-py is exercised where it runs here: without a driver library."""

import pynvml
import pytest

from otel_mindformers.config import DeviceConfig
from otel_mindformers.devices.nvidia import NvmlSource
from otel_mindformers.devices.selection import build_sources
from otel_mindformers.devices.source import SourceError, physical_device
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv
from tests.fixtures.fake_pynvml import GIB, FakeGpu, FakeNvml, own_process

ATTRS = {semconv.ATTR_RANK: 1, semconv.ATTR_DEVICE_ID: 1}


def two_gpus(**second):
    return FakeNvml([FakeGpu("GPU-aaaa"), FakeGpu("GPU-bbbb", **second)])


def by_metric(readings, **match):
    return {p.metric: p.value for p in readings.points if all(p.attributes.get(k) == v for k, v in match.items())}


def test_fake_nvml_no_gpu_here_own_gpu_readings_and_snapshot():
    nvml = two_gpus(used=20 * GIB, gpu_percent=55, process_bytes=own_process(18 * GIB))
    readings = NvmlSource(nvml, ["1"], "1", ATTRS).read()
    values = by_metric(readings)
    assert values[semconv.HW_GPU_MEMORY_USAGE] == 20 * GIB
    assert values[semconv.HW_GPU_MEMORY_LIMIT] == 80 * GIB
    assert values[semconv.HW_GPU_MEMORY_UTILIZATION] == 0.25
    assert values[semconv.HW_GPU_UTILIZATION] == 0.55
    assert values[semconv.HW_TEMPERATURE] == 61.0 and values[semconv.HW_POWER] == 287.5
    assert values[semconv.DEVICE_PROCESS_MEMORY] == 18 * GIB  # our pid only, not the other process
    errors = {p.attributes[semconv.ATTR_ERROR_TYPE]: p.value for p in readings.points if p.metric == semconv.HW_ERRORS}
    assert errors == {"corrected": 4.0, "uncorrected": 0.0}
    for point in readings.points:
        assert point.attributes[semconv.ATTR_HW_ID] == "gpu-1"
        assert point.attributes[semconv.ATTR_HW_TYPE] == "gpu"
        assert point.attributes[semconv.ATTR_HW_VENDOR] == "NVIDIA"
        assert point.attributes[semconv.ATTR_HW_MODEL] == "NVIDIA A100-SXM4-80GB"
        assert point.attributes[semconv.ATTR_RANK] == 1
    assert readings.snapshot == {
        "gpu_memory_used_mb": 20 * 1024,
        "gpu_memory_total_mb": 80 * 1024,
        "gpu_utilization": 55.0,
        "gpu_temperature_c": 61.0,
        "gpu_power_w": 287.5,
        "gpu_process_memory_mb": 18 * 1024,
    }
    assert nvml.init_calls == 1


def test_fake_nvml_no_gpu_here_unsupported_readings_are_left_out():
    nvml = two_gpus(power_mw=None, ecc=None)
    readings = NvmlSource(nvml, ["1"], "1", ATTRS).read()
    values = by_metric(readings)
    assert semconv.HW_POWER not in values and semconv.HW_ERRORS not in values
    assert values[semconv.HW_GPU_UTILIZATION] == 0.73
    assert "gpu_power_w" not in readings.snapshot and semconv.DEVICE_PROCESS_MEMORY not in values


def test_fake_nvml_no_gpu_here_lost_gpu_is_a_source_error():
    source = NvmlSource(two_gpus(lost=True), ["1"], "1", ATTRS)
    with pytest.raises(SourceError) as raised:
        source.read()
    assert raised.value.error_type == "NVMLError_GpuIsLost"


def test_fake_nvml_no_gpu_here_every_gpu_for_the_devices_command():
    readings = NvmlSource(two_gpus(), None, None, {}).read()
    assert {p.attributes[semconv.ATTR_HW_ID] for p in readings.points} == {"gpu-0", "gpu-1"}
    assert readings.snapshot == {}


def test_fake_nvml_no_gpu_here_init_once_and_shutdown_on_close():
    nvml = two_gpus()
    source = NvmlSource(nvml, ["0"], "0", ATTRS)
    source.read()
    source.read()
    source.close()
    source.close()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


@pytest.mark.parametrize(
    "visible, expected", [("", "gpu-1"), ("3,1", "gpu-1"), ("1,0", "gpu-0"), ("GPU-bbbb,GPU-aaaa", "gpu-0")]
)
def test_fake_nvml_no_gpu_here_rank_device_follows_cuda_visible_devices(monkeypatch, visible, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    selector = physical_device(1, "CUDA_VISIBLE_DEVICES")  # what the rank's device 1 is to NVML
    fake = FakeNvml([FakeGpu("GPU-aaaa"), FakeGpu("GPU-bbbb"), FakeGpu("GPU-cccc"), FakeGpu("GPU-dddd")])
    readings = NvmlSource(fake, [selector], selector, ATTRS).read()
    assert {p.attributes[semconv.ATTR_HW_ID] for p in readings.points} == {expected}
    assert readings.snapshot["gpu_memory_used_mb"] == 30 * 1024


def test_gpu_target_selects_nvml():
    names = [s.name for s in build_sources(DeviceConfig(), Identity(device_target="GPU"))]
    assert names[:2] == ["nvml", "psutil"]


def test_real_nvml_without_a_driver_library_is_an_absent_tool():
    """As a missing npu-smi: the poller stops asking, and `devices` says it in one plain line
    on an Ascend or CPU node, where an NVML error's name was noise."""
    source = NvmlSource(pynvml, ["0"], "0", ATTRS)
    with pytest.raises(SourceError) as raised:
        source.read()
    assert raised.value.error_type == "not_found"
    assert str(raised.value) == "no NVIDIA driver on this node"
    source.close()


# --- errors, links, throttling, energy, identity (issue 16) ------------------------------------------


def by_type(readings, metric, key):
    return {p.attributes.get(key): p.value for p in readings.points if p.metric == metric}


def test_fake_nvml_no_gpu_here_identity_attributes_on_every_point():
    readings = NvmlSource(two_gpus(), ["1"], "1", ATTRS).read()
    for point in readings.points:
        assert point.attributes[semconv.ATTR_HW_DRIVER_VERSION] == "550.127.05"
        assert point.attributes[semconv.ATTR_HW_FIRMWARE_VERSION] == "92.00.45.00.06"
        assert point.attributes[semconv.ATTR_HW_SERIAL_NUMBER] == "1652022012345"
    gpu = [p for p in readings.points if p.attributes[semconv.ATTR_HW_ID] == "gpu-1"]
    assert {p.attributes[semconv.ATTR_HW_NAME] for p in gpu} == {"GPU 1"}
    no_serial = NvmlSource(two_gpus(serial=None), ["1"], "1", ATTRS).read()
    assert semconv.ATTR_HW_SERIAL_NUMBER not in no_serial.points[0].attributes


def test_fake_nvml_no_gpu_here_xid_events_are_counted_per_xid_across_polls():
    nvml = two_gpus(xids=[79, 48])
    source = NvmlSource(nvml, ["1"], "1", ATTRS)
    assert by_type(source.read(), semconv.HW_ERRORS, semconv.ATTR_ERROR_TYPE)["xid_79"] == 1.0
    nvml.gpus[1].xids.append(79)
    errors = by_type(source.read(), semconv.HW_ERRORS, semconv.ATTR_ERROR_TYPE)
    assert (errors["xid_79"], errors["xid_48"]) == (2.0, 1.0)


def test_fake_nvml_no_gpu_here_remapped_rows_and_their_state():
    for rows, state in (((0, 0, 0, 0), "ok"), ((3, 1, 1, 0), "degraded"), ((3, 1, 0, 1), "failed")):
        readings = NvmlSource(two_gpus(remapped_rows=rows), ["1"], "1", ATTRS).read()
        assert by_type(readings, semconv.HW_GPU_MEMORY_REMAPPED_ROWS, semconv.ATTR_ERROR_TYPE) == {
            "corrected": float(rows[0]),
            "uncorrected": float(rows[1]),
        }
        states = by_type(readings, semconv.HW_STATUS, semconv.ATTR_HW_STATE)
        assert [s for s, v in states.items() if v == 1.0] == [state] and len(states) == 4
    unsupported = NvmlSource(two_gpus(remapped_rows=None), ["1"], "1", ATTRS).read()
    assert not by_type(unsupported, semconv.HW_STATUS, semconv.ATTR_HW_STATE)  # pre-Ampere: no state to tell


def test_fake_nvml_no_gpu_here_throttle_reasons():
    readings = NvmlSource(two_gpus(throttle_mask=0x1 | 0x40), ["1"], "1", ATTRS).read()  # idle + HW thermal
    throttled = by_type(readings, semconv.HW_GPU_THROTTLED, semconv.ATTR_HW_GPU_THROTTLE_REASON)
    assert [reason for reason, value in throttled.items() if value] == ["hw_thermal_slowdown"]
    assert set(throttled) == {
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }


def test_fake_nvml_no_gpu_here_nvlinks_are_network_ports_of_the_gpu():
    readings = NvmlSource(two_gpus(nvlinks=[(True, {2: 5}), (False, {})]), ["1"], "1", ATTRS).read()
    up = {p.attributes[semconv.ATTR_HW_ID]: p.value for p in readings.points if p.metric == semconv.HW_NETWORK_UP}
    assert up == {"gpu-1-nvlink-0": 1.0, "gpu-1-nvlink-1": 0.0}
    (crc,) = [
        p
        for p in readings.points
        if p.metric == semconv.HW_ERRORS and p.attributes[semconv.ATTR_ERROR_TYPE] == "crc_flit" and p.value
    ]
    assert crc.value == 5.0 and crc.attributes[semconv.ATTR_HW_TYPE] == "network"
    assert crc.attributes[semconv.ATTR_HW_PARENT] == "gpu-1"


def test_fake_nvml_no_gpu_here_energy_from_nvml_else_integrated_from_power():
    counter = NvmlSource(two_gpus(), ["1"], "1", ATTRS).read()
    assert by_type(counter, semconv.HW_ENERGY, semconv.ATTR_HW_ID) == {"gpu-1": 5000.0}  # 5,000,000 mJ
    source = NvmlSource(two_gpus(energy_mj=None), ["1"], "1", ATTRS)
    first = by_type(source.read(), semconv.HW_ENERGY, semconv.ATTR_HW_ID)["gpu-1"]
    assert first == 0.0 and by_type(source.read(), semconv.HW_ENERGY, semconv.ATTR_HW_ID)["gpu-1"] >= first
