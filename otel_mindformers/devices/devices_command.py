"""`otel-mindformers devices`: what the device sources see on this node right now."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.devices.selection import build_sources
from otel_mindformers.devices.source import MIB, Point, SourceError
from otel_mindformers.names import semconv

_UNITS = {spec.name: spec.unit for spec in semconv.DEVICE_METRICS}
# Shown once in the device's heading instead of on every line.
_DEVICE_KEYS = (semconv.ATTR_HW_ID, semconv.ATTR_HW_TYPE, semconv.ATTR_HW_VENDOR, semconv.ATTR_HW_MODEL)
_IDENTITY_KEYS = (
    semconv.ATTR_HW_NAME,
    semconv.ATTR_HW_DRIVER_VERSION,
    semconv.ATTR_HW_FIRMWARE_VERSION,
    semconv.ATTR_HW_SERIAL_NUMBER,
    semconv.ATTR_HW_PARENT,
)


def print_devices(config: MonitorConfig, out: TextIO = sys.stdout) -> int:
    """Read every source of `config.device_config` once, for the whole node, and print one
    block per device (its ports, e.g. an NPU's RoCE port, inside the device's block), each
    reading with the tool it came from.

    Returns 0 when at least one source gave readings, 1 when none did.
    """
    sources = build_sources(config.device_config, identity=None)
    if any(source.name == "psutil" for source in sources):  # psutil is an extra: imported only then
        from otel_mindformers.devices.host import CPU_WINDOW_S

        time.sleep(CPU_WINDOW_S)  # the host source reports CPU use only over a window this long
    devices: dict[str, list[Point]] = {}
    answered = 0
    for source in sources:
        try:
            readings = source.read()
        except Exception as exc:  # show what went wrong, as training would count it
            # A tool this node lacks (no npu-smi, no NVIDIA driver) is no fault: one plain line.
            absent = isinstance(exc, SourceError) and exc.error_type == "not_found"
            print(f"{source.name}: {exc}" if absent else f"{source.name}: no readings ({_error(exc)})", file=out)
            continue
        finally:
            source.close()
        answered += bool(readings.points)
        for problem in readings.problems:
            print(f"{source.name}: `{problem.query}` failed ({_error(problem)})", file=out)
        for point in readings.points:
            devices.setdefault(_device_of(point), []).append(point)
    for device, points in devices.items():
        print(f"\n{_heading(device, points)}", file=out)
        for point in points:
            print(f"  {_series(point, device):<80} {_value(point):>12}  {point.tool}", file=out)
    return 0 if answered else 1


def _error(exc: Exception) -> str:
    error_type = exc.error_type if isinstance(exc, SourceError) else type(exc).__name__
    return f"{error_type}: {exc}"


def _device_of(point: Point) -> str:
    attrs = point.attributes
    return str(attrs.get(semconv.ATTR_HW_PARENT) or attrs.get(semconv.ATTR_HW_ID) or "host")


def _heading(device: str, points: list[Point]) -> str:
    own = next((p.attributes for p in points if p.attributes.get(semconv.ATTR_HW_ID) == device), None)
    if own is None:
        return device
    words = [str(own[key]) for key in _DEVICE_KEYS if key in own]
    details = [f"{key.removeprefix('hw.')}={own[key]}" for key in _IDENTITY_KEYS if key in own]
    return " ".join(words) + (f"  ({', '.join(details)})" if details else "")


def _series(point: Point, device: str) -> str:
    attrs = point.attributes
    labels = ",".join(f"{k}={v}" for k, v in attrs.items() if k not in _DEVICE_KEYS + _IDENTITY_KEYS)
    name = f"{point.metric}{{{labels}}}" if labels else point.metric
    part = attrs.get(semconv.ATTR_HW_ID)
    return f"[{part}] {name}" if part and part != device else name


def _value(point: Point) -> str:
    unit = _UNITS.get(point.metric, "")
    if point.metric.endswith(".utilization"):
        return f"{point.value * 100:.1f} %"
    if unit == "1":
        return f"{point.value:g}"
    if unit == "By":
        return f"{point.value / MIB:.0f} MiB"
    if unit == "Cel":
        return f"{point.value:g} °C"
    if unit == "Hz":
        return f"{point.value / 1e6:g} MHz"
    if point.metric.startswith("hw.network.optical.power"):
        return f"{point.value * 1000:.4g} mW"
    return f"{point.value:g} {unit}".rstrip()


def add_command(commands: argparse._SubParsersAction) -> None:
    devices = commands.add_parser("devices", help="print the NPU, GPU and host readings this node offers now")
    devices.add_argument(
        "config", nargs="?", help="YAML with a monitor_config section; its device_config picks the sources"
    )
    devices.set_defaults(func=_devices)


def _devices(args: argparse.Namespace) -> int:
    try:
        # Without a file, defaults: loading one would also create the output folders.
        config = MonitorConfig() if args.config is None else load_monitor_config(args.config)
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    return print_devices(config)
