"""hccn_tool (the RoCE ports of Ascend NPUs): parsers against recorded output of each form
(tests/fixtures/hccn_tool/), and HccnSource against a fake hccn_tool first on PATH
(tests/fixtures/bin/hccn_tool) for each failure mode."""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_mindformers.devices.hccn import (
    DRIVER_HCCN_TOOL,
    HccnParseError,
    HccnSource,
    locate_hccn_tool,
    parse_link,
    parse_net_health,
    parse_optical,
    parse_stat,
)
from otel_mindformers.devices.source import SourceError
from otel_mindformers.names import semconv
from tests.support import paths

FIXTURES = paths.FIXTURES / "hccn_tool"
ATTRS = {semconv.ATTR_RANK: 1, semconv.ATTR_DEVICE_ID: 1}


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def fake_hccn_tool(fake_npu_smi, monkeypatch, tmp_path):
    """The fake tools first on PATH (fake_npu_smi does that); returns the file of hccn_tool calls."""
    log = tmp_path / "hccn_tool.calls"
    monkeypatch.setenv("FAKE_HCCN_LOG", str(log))
    return log


def source(devices=(1,), own=1, timeout=5.0):
    return HccnSource("hccn_tool", timeout, lambda: list(devices), own, ATTRS)


def series(readings, metric, **match):
    return {
        p.attributes.get(semconv.ATTR_ERROR_TYPE, p.attributes.get(semconv.ATTR_NETWORK_IO_DIRECTION)): p.value
        for p in readings.points
        if p.metric == metric and all(p.attributes.get(k) == v for k, v in match.items())
    }


# --- parsers ------------------------------------------------------------------------------------------


def test_fixture_link_up_and_down():
    assert parse_link(text("910b/link_0.txt")) is True
    assert parse_link(text("910b/link_1.txt")) is False


def test_fixture_net_health_values():
    assert parse_net_health(text("910b/net_health_0.txt")) == "Success"
    assert parse_net_health(text("910b/net_health_1.txt")) == "Receive timeout"
    assert parse_net_health(text("a3/net_health_2.txt")) == "Init"


def test_fixture_stat_counters_by_name():
    counters = parse_stat(text("910b/stat_1.txt"))
    assert counters["mac_rx_fcs_err_pkt_num"] == 12 and counters["roce_tx_err_pkt_num"] == 1
    assert counters["nic_rx_all_oct_num"] == 401882113 and "packet statistics" not in counters


def test_fixture_optical_power_in_watts_thresholds_and_temperature():
    optical = parse_optical(text("910b/optical_1.txt"))
    assert optical.present is True and optical.temperature_c == 45.0
    assert optical.power_w == [("transmit", None, pytest.approx(0.001198)), ("receive", None, pytest.approx(5.12e-5))]
    assert ("receive", "low", pytest.approx(1.445e-4)) in optical.limits_w and len(optical.limits_w) == 4


def test_fixture_optical_not_present_has_no_readings():
    optical = parse_optical(text("a3/optical_2.txt"))
    assert optical.present is False and optical.power_w == [] and optical.temperature_c is None


def test_optical_lanes_and_dbm_forms():
    optical = parse_optical(
        "Tx Power0 : 0.8000 mW\nTx Power1 : NA\nRxPower Lane3(dBm) : -3.0103\nRx Power2 : 12 furlongs\n"
    )
    assert optical.power_w == [("transmit", "0", pytest.approx(0.0008)), ("receive", "3", pytest.approx(0.0005))]


@pytest.mark.parametrize("parse", [parse_link, parse_net_health, parse_stat, parse_optical])
def test_garbage_is_a_parse_error(parse):
    with pytest.raises(HccnParseError):
        parse((FIXTURES.parent / "npu_smi" / "malformed" / "garbage.txt").read_text(errors="replace"))


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list(": _\n\t0123456789.-linkstatusUPDOWNnethealthmWdBmTxRxPowerLane()")), max_size=300
    )
)
def test_parsers_fail_only_with_parse_errors(garbage):
    for parse in (parse_link, parse_net_health, parse_stat, parse_optical):
        try:
            parse(garbage)
        except HccnParseError:
            pass


# --- HccnSource against the fake hccn_tool -----------------------------------------------------------


@pytest.mark.slow  # runs the fake hccn_tool in a child process
def test_fixture_910b_faulty_port_readings_with_attributes(fake_hccn_tool):
    readings = source().read()
    assert readings.problems == ()
    (up,) = [p for p in readings.points if p.metric == semconv.HW_NETWORK_UP]
    assert up.value == 0.0 and up.tool == "hccn_tool -link"
    assert up.attributes == {
        **ATTRS,
        semconv.ATTR_HW_ID: "npu-1-roce",
        semconv.ATTR_HW_TYPE: "network",
        semconv.ATTR_HW_VENDOR: "Huawei",
        semconv.ATTR_HW_NAME: "RoCE port of NPU device 1",
        semconv.ATTR_HW_PARENT: "npu-1",
    }
    states = {p.attributes[semconv.ATTR_HW_STATE]: p.value for p in readings.points if p.metric == semconv.HW_STATUS}
    assert states == {"ok": 0.0, "degraded": 0.0, "predicted_failure": 0.0, "failed": 1.0}  # Receive timeout
    errors = {
        (p.attributes[semconv.ATTR_ERROR_TYPE], p.attributes[semconv.ATTR_NETWORK_IO_DIRECTION]): p.value
        for p in readings.points
        if p.metric == semconv.HW_ERRORS
    }
    assert errors == {
        ("crc", "receive"): 12,
        ("bad_packet", "receive"): 12,
        ("bad_packet", "transmit"): 0,
        ("roce", "receive"): 4,
        ("roce", "transmit"): 1,
    }
    assert series(readings, semconv.HW_NETWORK_PACKETS) == {"receive": 5120331, "transmit": 98211}
    assert series(readings, semconv.HW_NETWORK_IO) == {"receive": 401882113, "transmit": 13002211}
    assert series(readings, semconv.HW_NETWORK_OPTICAL_POWER) == {
        "transmit": pytest.approx(0.001198),
        "receive": pytest.approx(5.12e-5),
    }
    assert series(readings, semconv.HW_NETWORK_OPTICAL_POWER_LIMIT, **{semconv.ATTR_HW_LIMIT_TYPE: "low.critical"}) == {
        "transmit": pytest.approx(2.818e-4),
        "receive": pytest.approx(1.445e-4),
    }
    assert series(readings, semconv.HW_TEMPERATURE) == {None: 45.0}
    assert readings.snapshot == {"roce_link_up": 0.0, "roce_net_healthy": 0.0}
    assert fake_hccn_tool.read_text().splitlines() == [
        "-i 1 -link -g",
        "-i 1 -net_health -g",
        "-i 1 -stat -g",
        "-i 1 -optical -g",
    ]


@pytest.mark.slow  # runs the fake hccn_tool in a child process
def test_a_port_the_tool_does_not_know_is_a_problem_per_query_not_a_failed_poll(fake_hccn_tool):
    readings = source(devices=(0, 7)).read()  # the 910b fixture has ports 0 and 1
    assert {p.attributes[semconv.ATTR_HW_ID] for p in readings.points} == {"npu-0-roce"}
    assert [(p.query, p.error_type) for p in readings.problems] == [
        ("hccn_tool -link", "exit_status"),
        ("hccn_tool -net_health", "exit_status"),
        ("hccn_tool -stat", "exit_status"),
        ("hccn_tool -optical", "exit_status"),
    ]


@pytest.mark.slow  # runs the fake hccn_tool in a child process
@pytest.mark.parametrize("mode, error_type", [("exit1", "exit_status"), ("garbage", "parse")])
def test_failing_tool_leaves_problems_and_no_points(fake_hccn_tool, monkeypatch, mode, error_type):
    monkeypatch.setenv("FAKE_HCCN_MODE", mode)
    readings = source().read()
    assert readings.points == () and {p.error_type for p in readings.problems} == {error_type}


@pytest.mark.slow  # runs the fake hccn_tool in a child process
def test_hung_tool_fails_the_poll_at_the_first_timeout(fake_hccn_tool, monkeypatch):
    monkeypatch.setenv("FAKE_HCCN_MODE", "hang")
    outcome = []
    thread = threading.Thread(
        target=lambda: outcome.append(pytest.raises(SourceError, source(timeout=0.3).read)), daemon=True
    )
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "a hung hccn_tool outlived its timeout"
    assert outcome[0].value.error_type == "timeout"
    assert len(fake_hccn_tool.read_text().splitlines()) == 1  # one timeout per poll, not one per query


@pytest.mark.slow  # runs the fake hccn_tool in a child process
def test_missing_tool(tmp_path):
    with pytest.raises(SourceError) as raised:
        HccnSource(str(tmp_path / "hccn_tool"), 5.0, lambda: [0], 0, {}).read()
    assert raised.value.error_type == "not_found"


def test_found_on_path_else_where_the_driver_installs_it(fake_npu_smi, monkeypatch, tmp_path):
    assert locate_hccn_tool().endswith("tests/fixtures/bin/hccn_tool")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert locate_hccn_tool() == DRIVER_HCCN_TOOL


@pytest.mark.slow  # runs the fake hccn_tool in a child process
def test_a_port_whose_net_health_is_init_reads_as_healthy(fake_hccn_tool, monkeypatch):
    """`Init`: detection is not configured on the port (A3 device 2 in the fixtures), not a
    fault; read as npu-exporter counts it, so no cluster of such ports looks failed."""
    monkeypatch.setenv("FAKE_HCCN_VARIANT", "a3")
    readings = source(devices=(2,), own=2).read()
    states = {p.attributes[semconv.ATTR_HW_STATE]: p.value for p in readings.points if p.metric == semconv.HW_STATUS}
    assert states == {"ok": 1.0, "degraded": 0.0, "predicted_failure": 0.0, "failed": 0.0}
    assert readings.snapshot["roce_net_healthy"] == 1.0
