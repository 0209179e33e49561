"""The RoCE port of each NPU, from `hccn_tool` (the driver's network tool).

Per port and poll: `-link -g` (`link status: UP`), `-net_health -g` (`net health status:
Success`; the detection of the peer address), `-stat -g` (`key:value` packet counters) and
`-optical -g` (`Key : value` optical module readings with units). Recorded examples of each
form are in tests/fixtures/hccn_tool/; docs/devices.md says where each form comes from.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from otel_mindformers.devices.ascend import VENDOR, status_points
from otel_mindformers.devices.command import Queries, run_tool
from otel_mindformers.devices.npu_smi import key_value_blocks, number
from otel_mindformers.devices.source import AttributeValue, Point, Readings, SourceError
from otel_mindformers.names import semconv

_T = TypeVar("_T")

# Where the driver installs it; it is rarely on PATH.
DRIVER_HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"

# `net health status` values meaning the port can reach its detection address. "Init" is a
# port whose detection is not configured: healthy, as MindCluster's npu-exporter counts it.
_HEALTHY = frozenset({"success", "init"})

# `-stat` counters -> (error.type, network.io.direction); npu-exporter's names in docs/devices.md.
_ERROR_COUNTERS = {
    "mac_rx_fcs_err_pkt_num": ("crc", "receive"),
    "mac_rx_bad_pkt_num": ("bad_packet", "receive"),
    "mac_tx_bad_pkt_num": ("bad_packet", "transmit"),
    "roce_rx_err_pkt_num": ("roce", "receive"),
    "roce_tx_err_pkt_num": ("roce", "transmit"),
}
_TRAFFIC_COUNTERS = {
    "nic_rx_all_pkg_num": (semconv.HW_NETWORK_PACKETS, "receive"),
    "nic_tx_all_pkg_num": (semconv.HW_NETWORK_PACKETS, "transmit"),
    "nic_rx_all_oct_num": (semconv.HW_NETWORK_IO, "receive"),
    "nic_tx_all_oct_num": (semconv.HW_NETWORK_IO, "transmit"),
}
_DIRECTIONS = {"tx": "transmit", "rx": "receive"}
# "Tx Power", "Rx Power2", "TxPower Lane0(dBm)"; thresholds "TxPower High Thres".
_POWER_KEY = re.compile(r"^(tx|rx)power(?:lane)?(\d*)(\(dbm\))?$")
_LIMIT_KEY = re.compile(r"^(tx|rx)power(high|low)thres$")

LINK, NET_HEALTH, STAT, OPTICAL = "hccn_tool -link", "hccn_tool -net_health", "hccn_tool -stat", "hccn_tool -optical"


class HccnParseError(SourceError):
    def __init__(self, message: str) -> None:
        super().__init__("parse", message)


def locate_hccn_tool() -> str:
    """hccn_tool on PATH (a container may put it there), else where the driver installs it."""
    return shutil.which("hccn_tool") or DRIVER_HCCN_TOOL


def _field(text: str, key: str, what: str) -> str:
    for block in key_value_blocks(text):
        if block.get(key):
            return block[key]
    raise HccnParseError(f"no `{what}` line in the hccn_tool output")


def parse_link(text: str) -> bool:
    """`link status: UP` -> True, `DOWN` -> False."""
    status = _field(text, "linkstatus", "link status").upper()
    if status not in ("UP", "DOWN"):
        raise HccnParseError(f"unknown link status {status[:40]!r}")
    return status == "UP"


def parse_net_health(text: str) -> str:
    """The `net health status` text: Success, Init, Socket failed, Receive timeout, ..."""
    return _field(text, "nethealthstatus", "net health status")


def parse_stat(text: str) -> dict[str, float]:
    """`-stat -g` counters by name (`mac_rx_fcs_err_pkt_num`); `NA` ones left out."""
    counters = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and re.fullmatch(r"[a-z0-9_]+", key) and (count := number(value.strip())) is not None:
            counters[key] = count
    if not counters:
        raise HccnParseError("no `name:count` lines in the `hccn_tool -stat` output")
    return counters


@dataclass(frozen=True)
class Optical:
    present: bool | None
    temperature_c: float | None = None
    power_w: list[tuple[str, str | None, float]] = field(default_factory=list)  # (direction, lane, W)
    limits_w: list[tuple[str, str, float]] = field(default_factory=list)  # (direction, high/low, W)


def _watts(text: str, unit_in_key: bool) -> float | None:
    words = text.split()
    value = number(words[0]) if words else None
    unit = "dbm" if unit_in_key else (words[1].lower() if len(words) > 1 else "")
    if value is None:
        return None
    if unit == "mw":
        return value / 1000.0
    if unit == "dbm":
        return 10 ** (value / 10) / 1000.0
    return None  # a unit we do not know: better no value than a wrong one


def parse_optical(text: str) -> Optical:
    """`-optical -g`: presence, module temperature, power per direction (and lane) and the
    module's power thresholds, all in W; `NA` and unknown units left out."""
    raw: dict[str, str] = {}
    for block in key_value_blocks(text):
        raw.update(block)
    if "present" not in raw and not any(_POWER_KEY.match(key) for key in raw):
        raise HccnParseError("no optical module lines in the `hccn_tool -optical` output")
    present = {"present": True, "notpresent": False}.get("".join(raw.get("present", "").lower().split()))
    temperature = number(raw.get("temperature", "").split(" ")[0])
    power, limits = [], []
    for key, value in raw.items():
        if (match := _POWER_KEY.match(key)) and (watts := _watts(value, bool(match.group(3)))) is not None:
            power.append((_DIRECTIONS[match.group(1)], match.group(2) or None, watts))
        elif (match := _LIMIT_KEY.match(key)) and (watts := _watts(value, False)) is not None:
            limits.append((_DIRECTIONS[match.group(1)], match.group(2), watts))
    return Optical(present, temperature, power, limits)


class HccnSource:
    """The RoCE ports of `devices()` (driver device ids, called at each poll). Failing
    queries of one port are problems of the poll; a timeout fails the poll."""

    name = "hccn_tool"

    def __init__(
        self,
        hccn_tool: str,
        timeout: float,
        devices: Callable[[], Collection[int]],
        own_device: int | None,
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        self._hccn_tool = hccn_tool
        self._timeout = timeout
        self._devices = devices
        self._own_device = own_device
        self._attributes = dict(attributes)

    def read(self) -> Readings:
        queries = Queries()
        points: list[Point] = []
        snapshot: dict[str, float] = {}
        for device in self._devices():
            attrs = {
                **self._attributes,
                semconv.ATTR_HW_ID: f"npu-{device}-roce",
                semconv.ATTR_HW_TYPE: "network",
                semconv.ATTR_HW_VENDOR: VENDOR,
                semconv.ATTR_HW_NAME: f"RoCE port of NPU device {device}",
                semconv.ATTR_HW_PARENT: f"npu-{device}",
            }
            up = queries.run(LINK, partial(self._parsed, parse_link, device, "-link"))
            health = queries.run(NET_HEALTH, partial(self._parsed, parse_net_health, device, "-net_health"))
            stat = queries.run(STAT, partial(self._parsed, parse_stat, device, "-stat")) or {}
            optical = queries.run(OPTICAL, partial(self._parsed, parse_optical, device, "-optical"))
            if up is not None:
                points.append(Point(semconv.HW_NETWORK_UP, 1.0 if up else 0.0, attrs, LINK))
            if health is not None:
                points += status_points("ok" if health.lower() in _HEALTHY else "failed", attrs, NET_HEALTH)
            points += _stat_points(stat, attrs)
            if optical is not None:
                points += _optical_points(optical, attrs)
            if device == self._own_device:
                snapshot = {key: value for key, value in (
                    ("roce_link_up", None if up is None else float(up)),
                    ("roce_net_healthy", None if health is None else float(health.lower() in _HEALTHY)),
                ) if value is not None}  # fmt: skip
        return Readings(tuple(points), snapshot, tuple(queries.problems))

    def close(self) -> None:
        """Nothing is held between polls."""

    def _parsed(self, parse: Callable[[str], _T], device: int, flag: str) -> _T:
        return parse(self._query(device, flag))

    def _query(self, device: int, query: str) -> str:
        return run_tool([self._hccn_tool, "-i", str(device), query, "-g"], self._timeout)


def _stat_points(stat: Mapping[str, float], attrs: dict[str, AttributeValue]) -> list[Point]:
    points = []
    for counter, (error_type, direction) in _ERROR_COUNTERS.items():
        if counter in stat:
            labels = {**attrs, semconv.ATTR_ERROR_TYPE: error_type, semconv.ATTR_NETWORK_IO_DIRECTION: direction}
            points.append(Point(semconv.HW_ERRORS, stat[counter], labels, STAT))
    for counter, (metric, direction) in _TRAFFIC_COUNTERS.items():
        if counter in stat:
            points.append(Point(metric, stat[counter], {**attrs, semconv.ATTR_NETWORK_IO_DIRECTION: direction}, STAT))
    return points


def _optical_points(optical: Optical, attrs: dict[str, AttributeValue]) -> list[Point]:
    points = []
    if optical.temperature_c is not None:
        points.append(Point(semconv.HW_TEMPERATURE, optical.temperature_c, attrs, OPTICAL))
    for direction, lane, watts in optical.power_w:
        labels = {**attrs, semconv.ATTR_NETWORK_IO_DIRECTION: direction}
        if lane is not None:
            labels[semconv.ATTR_HW_NETWORK_OPTICAL_LANE] = lane
        points.append(Point(semconv.HW_NETWORK_OPTICAL_POWER, watts, labels, OPTICAL))
    for direction, bound, watts in optical.limits_w:
        labels = {
            **attrs,
            semconv.ATTR_NETWORK_IO_DIRECTION: direction,
            semconv.ATTR_HW_LIMIT_TYPE: f"{bound}.critical",
        }
        points.append(Point(semconv.HW_NETWORK_OPTICAL_POWER_LIMIT, watts, labels, OPTICAL))
    return points
