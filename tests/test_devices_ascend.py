"""AscendSource against a fake `npu-smi` put first on PATH (tests/fixtures/bin/npu-smi):
normal output of each board form, exit 1, garbage, missing, and a hang past the timeout."""

import dataclasses
import threading
from pathlib import Path

import pytest

from otel_mindformers.config import DeviceConfig
from otel_mindformers.devices import command
from otel_mindformers.devices import npu_smi as smi
from otel_mindformers.devices.ascend import AscendSource
from otel_mindformers.devices.energy import EnergyIntegrator
from otel_mindformers.devices.selection import build_sources
from otel_mindformers.devices.source import MIB, SourceError
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def source(device, timeout=5.0, attrs=None):
    return AscendSource(
        "npu-smi",
        timeout,
        None if device is None else [device],
        device,
        attrs or {semconv.ATTR_RANK: 3, semconv.ATTR_DEVICE_ID: device},
    )


def by_metric(readings, **match):
    """{metric: value} of the points whose attributes include `match` (ECC series, which
    carry a memory type too, only when `match` names an error.type)."""
    return {
        p.metric: p.value
        for p in readings.points
        if all(p.attributes.get(k) == v for k, v in match.items())
        and (semconv.ATTR_ERROR_TYPE in match or semconv.ATTR_ERROR_TYPE not in p.attributes)
    }


FIRST_POLL_910B_NPU1 = [
    "info",
    "info -t usages -i 1",
    "info -t common -i 1",
    "info -t ecc -i 1",
    "info -t health -i 1 -c 0",
    "info -t board -i 1 -c 0",
]


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_910b_own_device_numbers_attributes_and_snapshot(fake_npu_smi):
    readings = source(1).read()
    hbm = by_metric(readings, **{semconv.ATTR_HW_NPU_MEMORY_TYPE: "hbm"})
    assert hbm == {
        semconv.HW_NPU_MEMORY_USAGE: 21504 * MIB,
        semconv.HW_NPU_MEMORY_LIMIT: 32768 * MIB,
        semconv.HW_NPU_MEMORY_UTILIZATION: 21504 / 32768,
    }
    ddr = by_metric(readings, **{semconv.ATTR_HW_NPU_MEMORY_TYPE: "ddr"})
    assert ddr == {semconv.HW_NPU_MEMORY_LIMIT: 15171 * MIB, semconv.HW_NPU_MEMORY_UTILIZATION: 0.06}
    tasks = {
        p.attributes[semconv.ATTR_HW_NPU_TASK]: p.value
        for p in readings.points
        if p.metric == semconv.HW_NPU_UTILIZATION
    }
    assert tasks == {"aicore": 0.47, "aivector": 0.38, "aicpu": 0.01, "ctrlcpu": 0.05, "overall": 0.52}
    plain = by_metric(readings)
    assert plain[semconv.HW_TEMPERATURE] == 35.0 and plain[semconv.HW_POWER] == 88.7
    assert plain[semconv.DEVICE_PROCESS_MEMORY] == 18432 * MIB  # the fake lists its caller: us
    states = {p.attributes[semconv.ATTR_HW_STATE]: p.value for p in readings.points if p.metric == semconv.HW_STATUS}
    assert states == {"ok": 0.0, "degraded": 1.0, "predicted_failure": 0.0, "failed": 0.0}  # Health: Warning
    for point in readings.points:
        assert point.attributes[semconv.ATTR_HW_ID] == "npu-1"
        assert point.attributes[semconv.ATTR_HW_TYPE] == "npu"
        assert point.attributes[semconv.ATTR_HW_VENDOR] == "Huawei"
        assert point.attributes[semconv.ATTR_HW_MODEL] == "910B4"
        assert point.attributes[semconv.ATTR_RANK] == 3 and point.attributes[semconv.ATTR_DEVICE_ID] == 1
    assert readings.snapshot == {
        "npu_utilization": 47.0,
        "npu_hbm_used_mb": 21504.0,
        "npu_hbm_total_mb": 32768.0,
        "npu_temperature_c": 35.0,
        "npu_power_w": 88.7,
        "npu_process_memory_mb": 18432.0,
    }
    assert calls(fake_npu_smi) == FIRST_POLL_910B_NPU1


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_other_process_memory_is_not_ours(fake_npu_smi):
    readings = source(0).read()
    assert semconv.DEVICE_PROCESS_MEMORY not in by_metric(readings)
    assert "npu_process_memory_mb" not in readings.snapshot and readings.snapshot["npu_hbm_used_mb"] == 3197.0


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_a3_second_chip_takes_power_from_common(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "a3")
    readings = source(1).read()
    plain = by_metric(readings)
    assert plain[semconv.HW_POWER] == 85.6 and plain[semconv.HW_TEMPERATURE] == 37.0
    assert plain[semconv.DEVICE_PROCESS_MEMORY] == 37376 * MIB
    assert {p.attributes[semconv.ATTR_HW_ID] for p in readings.points} == {"npu-1"}
    assert readings.snapshot["npu_utilization"] == 29.0
    assert calls(fake_npu_smi) == [
        "info",
        "info -t usages -i 0",
        "info -t common -i 0",
        "info -t ecc -i 0",
        "info -t health -i 0 -c 1",
        "info -t board -i 0 -c 1",
    ]


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_a3_critical_chip_without_any_power_reading(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "a3")
    readings = source(3).read()
    assert semconv.HW_POWER not in by_metric(readings) and semconv.HW_ENERGY not in by_metric(readings)
    states = {p.attributes[semconv.ATTR_HW_STATE]: p.value for p in readings.points if p.metric == semconv.HW_STATUS}
    assert states == {"ok": 0.0, "degraded": 0.0, "predicted_failure": 0.0, "failed": 1.0}
    assert calls(fake_npu_smi) == [
        "info",
        "info -t usages -i 1",
        "info -t common -i 1",
        "info -t ecc -i 1",
        "info -t health -i 1 -c 1",
        "info -t board -i 1 -c 1",
    ]


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_old_driver_ddr_from_the_table(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "old_driver")
    readings = source(0).read()
    ddr = by_metric(readings, **{semconv.ATTR_HW_NPU_MEMORY_TYPE: "ddr"})
    assert ddr[semconv.HW_NPU_MEMORY_USAGE] == 2703 * MIB and ddr[semconv.HW_NPU_MEMORY_LIMIT] == 15039 * MIB
    hbm = by_metric(readings, **{semconv.ATTR_HW_NPU_MEMORY_TYPE: "hbm"})
    assert hbm[semconv.HW_NPU_MEMORY_USAGE] == 0.0
    assert readings.snapshot["npu_utilization"] == 0.0


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_every_chip_of_the_node_for_the_devices_command(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "a3")
    readings = AscendSource("npu-smi", 5.0, None, None, {}).read()
    assert {p.attributes[semconv.ATTR_HW_ID] for p in readings.points} == {"npu-0", "npu-1", "npu-2", "npu-3"}
    assert readings.snapshot == {}
    assert calls(fake_npu_smi).count("info -t usages -i 0") == 1  # once per NPU, not per chip


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_device_missing_from_the_table(fake_npu_smi):
    with pytest.raises(SourceError) as raised:
        source(5).read()
    assert raised.value.error_type == "parse" and "5" in str(raised.value)


@pytest.mark.slow  # runs the fake npu-smi in a child process
@pytest.mark.parametrize("mode, error_type", [("exit1", "exit_status"), ("garbage", "parse")])
def test_failing_tool(fake_npu_smi, monkeypatch, mode, error_type):
    monkeypatch.setenv("FAKE_NPU_SMI_MODE", mode)
    with pytest.raises(SourceError) as raised:
        source(0).read()
    assert raised.value.error_type == error_type
    if mode == "exit1":
        assert "status 1" in str(raised.value) and "dcmi" in str(raised.value)


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_missing_tool(tmp_path):
    with pytest.raises(SourceError) as raised:
        AscendSource(str(tmp_path / "npu-smi"), 5.0, [0], 0, {}).read()
    assert raised.value.error_type == "not_found"


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_hung_tool_is_killed_with_its_children_at_the_timeout(fake_npu_smi, monkeypatch):
    # The fake runs `sleep 600` as a child: killing only the script would leave the
    # sleep holding the output pipe, and the read would wait for it.
    monkeypatch.setenv("FAKE_NPU_SMI_MODE", "hang")
    outcome = []

    def read():
        try:
            source(0, timeout=0.5).read()
        except SourceError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "a hung npu-smi outlived its timeout"
    assert outcome[0].error_type == "timeout"


@pytest.mark.slow  # runs the fake npu-smi in a child process
@pytest.mark.parametrize("mode", ["stream", "flood"])
def test_output_past_the_byte_cap_stops_the_tool_and_is_a_parse_failure(fake_npu_smi, monkeypatch, mode):
    # stream: writes without end (a broken driver, `yes`); flood: 200 MiB, then exit 0.
    monkeypatch.setenv("FAKE_NPU_SMI_MODE", mode)
    with pytest.raises(SourceError) as raised:
        source(0, timeout=60.0).read()  # a timeout would say "timeout": the cap stops it first
    assert raised.value.error_type == "parse"
    assert f"more than {command.MAX_OUTPUT_BYTES} bytes" in str(raised.value)


@pytest.mark.slow  # runs `head` in a child process
def test_output_under_the_cap_is_read_whole(tmp_path):
    text = command.run_tool(["head", "-c", str(command.MAX_OUTPUT_BYTES), "/dev/zero"], timeout=30)
    assert len(text) == command.MAX_OUTPUT_BYTES


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_rank_device_follows_ascend_rt_visible_devices(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1")
    identity = Identity(rank=1, local_rank=1, device_id=1, device_target="Ascend")
    ascend = next(s for s in build_sources(DeviceConfig(sources=["ascend"]), identity))
    assert ascend.read().snapshot["npu_hbm_used_mb"] == 21504.0
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1,0")
    ascend = next(s for s in build_sources(DeviceConfig(sources=["ascend"]), identity))
    assert ascend.read().snapshot["npu_hbm_used_mb"] == 3197.0  # logical 1 is the driver's 0
    first = Identity(rank=0, local_rank=0, device_id=0, device_target="Ascend")
    ascend = next(s for s in build_sources(DeviceConfig(sources=["ascend"]), first))
    assert ascend.read().snapshot["npu_hbm_used_mb"] == 21504.0  # logical 0 is the driver's 1


def test_auto_finds_npu_smi_on_path_even_on_cpu(fake_npu_smi):
    names = [s.name for s in build_sources(DeviceConfig(), Identity(device_target="CPU"))]
    assert names == ["npu-smi", "hccn_tool", "psutil"]


def test_auto_without_npu_smi_on_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    names = [s.name for s in build_sources(DeviceConfig(), Identity(device_target="CPU"))]
    assert names == ["psutil"]


# --- health, errors, clocks, identity (issue 16) --------------------------------------------------------


def points_of(readings, metric):
    return [p for p in readings.points if p.metric == metric]


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_fixture_910b_faulty_npu_error_code_ecc_clock_and_identity(fake_npu_smi):
    readings = source(1).read()
    assert readings.problems == ()
    (code,) = points_of(readings, semconv.HW_NPU_ERROR_CODE)
    assert code.value == 1.0 and code.attributes[semconv.ATTR_HW_NPU_ERROR_CODE] == "0x80E18005"
    # The level MindCluster's device plugin gives the code (cluster/fault_codes.json).
    assert code.attributes[semconv.ATTR_CLUSTER_FAULT_LEVEL] == "RestartNPU"
    assert code.tool == "npu-smi info -t health"
    errors = {
        (p.attributes[semconv.ATTR_HW_NPU_MEMORY_TYPE], p.attributes[semconv.ATTR_ERROR_TYPE]): p.value
        for p in points_of(readings, semconv.HW_ERRORS)
    }
    assert errors == {("hbm", "corrected"): 17.0, ("hbm", "uncorrected"): 0.0}  # lifetime counts; DDR is NA
    pages = {
        p.attributes[semconv.ATTR_ERROR_TYPE]: p.value
        for p in points_of(readings, semconv.HW_NPU_MEMORY_ISOLATED_PAGES)
    }
    assert pages == {"corrected": 1.0, "uncorrected": 0.0}
    (speed,) = points_of(readings, semconv.HW_NPU_SPEED)
    (limit,) = points_of(readings, semconv.HW_NPU_SPEED_LIMIT)
    assert (speed.value, limit.value) == (1300e6, 1800e6) and limit.attributes[semconv.ATTR_HW_LIMIT_TYPE] == "max"
    assert speed.tool == "npu-smi info -t common"
    for point in readings.points:
        assert point.attributes[semconv.ATTR_HW_NAME] == "NPU 1 chip 0"
        assert point.attributes[semconv.ATTR_HW_DRIVER_VERSION] == "23.0.rc3"
        assert point.attributes[semconv.ATTR_HW_FIRMWARE_VERSION] == "7.1.0.7.220"
        assert semconv.ATTR_HW_SERIAL_NUMBER not in point.attributes  # -t board prints none


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_fixture_910b_healthy_npu_has_no_error_code(fake_npu_smi):
    readings = source(0).read()
    assert points_of(readings, semconv.HW_NPU_ERROR_CODE) == []
    assert {p.value for p in points_of(readings, semconv.HW_ERRORS)} == {0.0}


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_fixture_a3_uncorrected_errors_and_two_codes_on_the_critical_chip(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "a3")
    readings = source(3).read()
    codes = {
        p.attributes[semconv.ATTR_HW_NPU_ERROR_CODE]: p.attributes[semconv.ATTR_CLUSTER_FAULT_LEVEL]
        for p in points_of(readings, semconv.HW_NPU_ERROR_CODE)
    }
    assert codes == {"0x80E01801": "RestartBusiness", "0x80E01809": "NotHandleFault"}
    errors = {
        (p.attributes[semconv.ATTR_HW_NPU_MEMORY_TYPE], p.attributes[semconv.ATTR_ERROR_TYPE]): p.value
        for p in points_of(readings, semconv.HW_ERRORS)
    }
    assert errors[("hbm", "uncorrected")] == 2.0 and errors[("ddr", "uncorrected")] == 0.0


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_fixture_disagree_table_wins_then_usages_then_common(fake_npu_smi, monkeypatch):
    # Issue 11 item 25: which npu-smi source wins when two print different values.
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "disagree")
    readings = source(1).read()
    (aicore,) = [
        p for p in points_of(readings, semconv.HW_NPU_UTILIZATION) if p.attributes[semconv.ATTR_HW_NPU_TASK] == "aicore"
    ]
    assert (aicore.value, aicore.tool) == (0.47, "npu-smi info")  # not usages' 50 nor common's 49
    (temperature,) = points_of(readings, semconv.HW_TEMPERATURE)
    (power,) = points_of(readings, semconv.HW_POWER)
    assert (temperature.value, power.value) == (35.0, 88.7)  # not common's 36 and 90.0
    states = {p.attributes[semconv.ATTR_HW_STATE]: p.value for p in points_of(readings, semconv.HW_STATUS)}
    assert states["degraded"] == 1.0  # the table's Warning, not `-t health`'s OK
    assert readings.snapshot["npu_utilization"] == 47.0 and readings.snapshot["npu_power_w"] == 88.7


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_fixture_disagree_usages_wins_over_common_where_the_table_is_silent(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "disagree")
    monkeypatch.setattr(smi, "parse_table", lambda text: _without_aicore(real_parse_table(text)))
    (aicore,) = [
        p
        for p in points_of(source(1).read(), semconv.HW_NPU_UTILIZATION)
        if p.attributes[semconv.ATTR_HW_NPU_TASK] == "aicore"
    ]
    assert (aicore.value, aicore.tool) == (0.50, "npu-smi info -t usages")


@pytest.mark.slow  # runs the fake npu-smi in a child process
def test_old_driver_without_ecc_health_board_keeps_its_readings_and_names_each_query(fake_npu_smi, monkeypatch):
    monkeypatch.setenv("FAKE_NPU_SMI_VARIANT", "old_driver")
    ascend = source(0)
    readings = ascend.read()
    assert readings.snapshot["npu_hbm_total_mb"] == 32768.0
    assert [(p.query, p.error_type) for p in readings.problems] == [
        ("npu-smi info -t ecc", "exit_status"),
        ("npu-smi info -t health", "exit_status"),
        ("npu-smi info -t board", "exit_status"),
    ]
    assert semconv.ATTR_HW_FIRMWARE_VERSION not in readings.points[0].attributes
    assert [p.query for p in ascend.read().problems] == ["npu-smi info -t ecc", "npu-smi info -t health"]
    assert calls(fake_npu_smi).count("info -t board -i 0 -c 0") == 1  # a board that cannot tell is not asked again


@pytest.mark.slow  # runs a fake npu-smi in a child process
def test_each_failing_query_names_its_own_command(tmp_path):
    # A driver whose table reads but whose `-t` queries print bytes that are not UTF-8:
    # each query's one-time warning names the command that printed them (the `-t common`
    # one used to name `-t usages`, which sends the operator to the wrong query).
    table = Path(__file__).parent / "fixtures" / "npu_smi" / "910b" / "info.txt"
    tool = tmp_path / "npu-smi"
    tool.write_text(f'#!/bin/sh\nif [ "$*" = info ]; then cat "{table}"; else printf "\\377\\376\\n"; fi\n')
    tool.chmod(0o755)
    readings = AscendSource(str(tool), 5.0, [0], 0, {}).read()
    assert readings.snapshot["npu_hbm_total_mb"] == 32768.0  # the table still reads
    problems = {p.query: str(p) for p in readings.problems}
    assert {"npu-smi info -t usages", "npu-smi info -t common"} <= problems.keys()
    assert all(f"`{query}` output" in message for query, message in problems.items()), problems


def test_energy_is_integrated_from_power_over_the_polls():
    clock = Clock()
    energy = EnergyIntegrator(clock)
    assert energy.add("npu-1", 100.0) == 0.0
    clock.now += 10
    assert energy.add("npu-1", 200.0) == 1500.0  # (100 + 200) / 2 W for 10 s
    clock.now += 5
    assert energy.add("npu-1", 200.0) == 2500.0
    assert energy.add("npu-0", 50.0) == 0.0  # each device its own counter


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


real_parse_table = smi.parse_table


def _without_aicore(table):
    chips = tuple(
        dataclasses.replace(c, values={k: v for k, v in c.values.items() if k != smi.AICORE}) for c in table.chips
    )
    return dataclasses.replace(table, chips=chips)
