"""OTel metric names as Prometheus shows them, derived from the package's own table
(semconv.all_metrics()) by the OTLP -> Prometheus translation rules (OTel spec "Prometheus and
OpenMetrics compatibility"), in both flavours users meet: the Python Prometheus exporter (the
`prometheus` output) and the Collector / Prometheus / Mimir OTLP translator."""

from __future__ import annotations

import re

from otel_mindformers.names import semconv
from otel_mindformers.names import training as training_metrics
from otel_mindformers.names.semconv import Kind, MetricSpec

_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes",
    "MiBy": "mebibytes", "GiBy": "gibibytes", "KBy": "kilobytes", "MBy": "megabytes",
    "GBy": "gigabytes", "m": "meters", "V": "volts", "A": "amperes", "J": "joules",
    "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz", "%": "percent",
}  # fmt: skip
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_MONOTONIC = {Kind.COUNTER, Kind.OBSERVABLE_COUNTER}


def sanitize(name: str) -> str:
    """OTel name or attribute key → Prometheus metric / label name."""
    return re.sub(r"[^a-zA-Z0-9_:]+", "_", name)


def unit_suffix(spec: MetricSpec, collector: bool) -> str:
    unit = re.sub(r"\{[^}]*\}", "", spec.unit)
    if unit == "1":
        # The one difference between the flavours: the Collector translator turns a
        # dimensionless gauge into `_ratio`; the Python exporter drops the unit.
        return "ratio" if collector and spec.kind in (Kind.GAUGE, Kind.OBSERVABLE_GAUGE) else ""
    if unit in _UNITS:
        return _UNITS[unit]
    top, slash, bottom = unit.partition("/")
    if slash and bottom:
        top = _UNITS.get(top, sanitize(top).strip("_"))
        per = f"per_{_PER_UNITS.get(bottom, sanitize(bottom))}"
        return f"{top}_{per}" if top else per
    return sanitize(unit).strip("_")


def prometheus_base_name(spec: MetricSpec, *, collector: bool = False) -> str:
    name = sanitize(spec.name)
    suffix = unit_suffix(spec, collector)
    if suffix and not name.endswith(f"_{suffix}"):
        name = f"{name}_{suffix}"
    if spec.kind in _MONOTONIC:
        name = f"{name}_total"
    return name


def prometheus_series_names(spec: MetricSpec, *, collector: bool = False) -> set[str]:
    """Every series name one metric becomes (a histogram becomes three)."""
    base = prometheus_base_name(spec, collector=collector)
    if spec.kind is Kind.HISTOGRAM:
        return {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    return {base}


def emitted_series_names() -> set[str]:
    """Names in either flavour: rules must work with both the scrape and the OTLP path."""
    return {
        name
        for spec in semconv.all_metrics()
        for collector in (False, True)
        for name in prometheus_series_names(spec, collector=collector)
    }


def package_labels() -> set[str]:
    """Every attribute key the package defines (semconv and the training-metric table), as a
    Prometheus label."""
    modules = (semconv, training_metrics)
    return {sanitize(value) for module in modules for key, value in vars(module).items() if key.startswith("ATTR_")}
