"""`otel-mindformers devices`: what the device sources see on this node right now."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from otel_mindformers import semconv
from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.devices.base import MIB, Point, SourceError
from otel_mindformers.devices.selection import build_sources

# psutil measures CPU use between two calls; give it a window worth reading.
_CPU_WINDOW_S = 0.5
_UNITS = {spec.name: spec.unit for spec in semconv.DEVICE_METRICS}
# Shown once per device instead of on every line.
_DEVICE_KEYS = (semconv.ATTR_HW_ID, semconv.ATTR_HW_TYPE, semconv.ATTR_HW_VENDOR, semconv.ATTR_HW_MODEL)


def print_devices(config: MonitorConfig, out: TextIO = sys.stdout) -> int:
    """Read every source of `config.device_config` once, for the whole node.

    Returns 0 when at least one source gave readings, 1 when none did.
    """
    sources = build_sources(config.device_config, identity=None)
    time.sleep(_CPU_WINDOW_S)
    answered = 0
    for source in sources:
        try:
            readings = source.read()
        except Exception as exc:  # show what went wrong, as training would count it
            error_type = exc.error_type if isinstance(exc, SourceError) else type(exc).__name__
            print(f"{source.name}: no readings ({error_type}: {exc})", file=out)
            continue
        finally:
            source.close()
        answered += 1
        print(f"{source.name}:", file=out)
        devices: dict[str, list[Point]] = {}
        for point in readings.points:
            devices.setdefault(_device_label(point), []).append(point)
        for label, points in devices.items():
            print(f"  {label}", file=out)
            for point in points:
                print(f"    {_series(point):<58} {_value(point)}", file=out)
    return 0 if answered else 1


def _device_label(point: Point) -> str:
    attrs = point.attributes
    if semconv.ATTR_HW_ID not in attrs:
        return "host"
    return " ".join(str(attrs[key]) for key in _DEVICE_KEYS if key in attrs)


def _series(point: Point) -> str:
    labels = ",".join(f"{k}={v}" for k, v in point.attributes.items() if k not in _DEVICE_KEYS)
    return f"{point.metric}{{{labels}}}" if labels else point.metric


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
    return f"{point.value:g} {unit}".rstrip()


def add_command(commands: argparse._SubParsersAction) -> None:
    devices = commands.add_parser("devices", help="print the NPU, GPU and host readings this node offers now")
    devices.add_argument("config", nargs="?",
                         help="YAML with a monitor_config section; its device_config picks the sources")
    devices.set_defaults(func=_devices)


def _devices(args: argparse.Namespace) -> int:
    try:
        # Without a file, defaults: loading one would also create the output folders.
        config = MonitorConfig() if args.config is None else load_monitor_config(args.config)
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    return print_devices(config)
