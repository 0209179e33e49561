"""The names in collector-config/ are the names the package emits.

Prometheus names are derived from the package's own table (semconv.all_metrics()) by the
OTLP -> Prometheus translation rules, in both flavours users meet: the Python Prometheus
exporter (the `prometheus` output) and the Collector / Prometheus / Mimir OTLP translator.
The translation itself is checked against what the real Python exporter serves.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
import yaml
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv
from otel_mindformers.names.semconv import Kind, MetricSpec
from tests.support.paths import COLLECTOR_CONFIG, RULE_FILES
from tests.support.prometheus_names import (
    emitted_series_names,
    package_labels,
    prometheus_base_name,
    prometheus_series_names,
    sanitize,
)
from tests.support.promql import labels_used, selectors

DASHBOARDS = sorted((COLLECTOR_CONFIG / "grafana" / "dashboards").glob("*.json"))

# Series Prometheus itself makes, which rules and panels may use besides the package's.
PROMETHEUS_OWN_SERIES = {"ALERTS", "ALERTS_FOR_STATE", "up", "target_info"}
# Labels that do not come from the package's attributes: scrape / OTLP target identity, the
# histogram bucket bound, and Prometheus' alert series.
PROMETHEUS_OWN_LABELS = {"job", "instance", "le", "alertname", "alertstate", "severity"}

# --- the real Python exporter --------------------------------------------------------------
IDENTITY = Identity(rank=3, world_size=4, job_id="job-42", host_name="node-a")


@pytest.fixture(scope="module")
def scraped() -> dict[str, dict]:
    """What the real PrometheusMetricReader serves for one point of every metric in the table,
    recorded with the package's resource and point attributes: family → [(series, labels)]."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    resource = Resource.create({"service.name": "consistency", **IDENTITY.attributes()})
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    meter = provider.get_meter(semconv.INSTRUMENTATION_NAME)
    attributes = IDENTITY.point_attributes()
    observe = [lambda _options: [Observation(1, attributes)]]
    for spec in semconv.all_metrics():
        args = {"name": spec.name, "unit": spec.unit, "description": spec.description}
        if spec.kind is Kind.COUNTER:
            meter.create_counter(**args).add(1, attributes)
        elif spec.kind is Kind.GAUGE:
            meter.create_gauge(**args).set(1.0, attributes)
        elif spec.kind is Kind.HISTOGRAM:
            meter.create_histogram(**args).record(0.5, attributes)
        elif spec.kind is Kind.OBSERVABLE_GAUGE:
            meter.create_observable_gauge(callbacks=observe, **args)
        elif spec.kind is Kind.OBSERVABLE_COUNTER:
            meter.create_observable_counter(callbacks=observe, **args)
        elif spec.kind is Kind.OBSERVABLE_UP_DOWN_COUNTER:
            meter.create_observable_up_down_counter(callbacks=observe, **args)
        else:
            pytest.fail(f"{spec.name}: no instrument for kind {spec.kind}")
    text = generate_latest(registry).decode()
    provider.shutdown()
    return {
        family.name: [(s.name, s.labels) for s in family.samples] for family in text_string_to_metric_families(text)
    }


def test_translation_matches_the_real_python_exporter(scraped):
    served = {name for samples in scraped.values() for name, _labels in samples}
    for spec in semconv.all_metrics():
        expected = prometheus_series_names(spec)
        assert expected <= served, f"{spec.name}: translated {sorted(expected)}, served {sorted(served)}"
    translated = {n for spec in semconv.all_metrics() for n in prometheus_series_names(spec)}
    assert served - translated == {"target_info"}


def test_rank_is_a_series_label_and_resource_attributes_go_to_target_info_only(scraped):
    rank_label, job_label = sanitize(semconv.ATTR_RANK), sanitize(semconv.ATTR_JOB_ID)
    rank = str(IDENTITY.rank)
    for family, samples in scraped.items():
        for name, labels in samples:
            if family == "target_info":
                assert labels[rank_label] == rank and labels[job_label] == "job-42"
                continue
            assert labels[rank_label] == rank, name
            assert job_label not in labels, f"{name}: resource attributes are not copied to series"


def test_the_flavours_differ_only_by_ratio_on_dimensionless_gauges():
    for spec in semconv.all_metrics():
        python, collector = prometheus_base_name(spec), prometheus_base_name(spec, collector=True)
        if python != collector:
            assert spec.unit == "1" and collector == f"{python}_ratio", spec.name


def test_translation_handles_each_unit_form():
    cases = {
        ("a.b", Kind.HISTOGRAM, "s"): "a_b_seconds",
        ("a.b", Kind.COUNTER, "{step}"): "a_b_total",
        ("a.b", Kind.GAUGE, "{sample}/s"): "a_b_per_second",
        ("a.b", Kind.GAUGE, "By/s"): "a_b_bytes_per_second",
        ("a.b", Kind.OBSERVABLE_GAUGE, "By"): "a_b_bytes",
        ("a.b", Kind.OBSERVABLE_GAUGE, "%"): "a_b_percent",
        ("a.b", Kind.OBSERVABLE_GAUGE, "Cel"): "a_b_celsius",
        ("a.b", Kind.OBSERVABLE_COUNTER, "J"): "a_b_joules_total",
        ("a.seconds", Kind.GAUGE, "s"): "a_seconds",
        ("a.b", Kind.GAUGE, ""): "a_b",
    }
    for (name, kind, unit), expected in cases.items():
        assert prometheus_base_name(MetricSpec(name, kind, unit, "")) == expected
    ratio = MetricSpec("hw.gpu.utilization", Kind.OBSERVABLE_GAUGE, "1", "")
    assert prometheus_base_name(ratio) == "hw_gpu_utilization"
    assert prometheus_base_name(ratio, collector=True) == "hw_gpu_utilization_ratio"


# --- what collector-config/ uses -------------------------------------------------------------
@functools.cache
def rule_groups() -> tuple[dict, ...]:
    return tuple(group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"])


def recorded_names() -> set[str]:
    return {rule["record"] for group in rule_groups() for rule in group["rules"] if "record" in rule}


def rule_expressions() -> dict[str, str]:
    return {rule.get("alert") or rule["record"]: rule["expr"] for group in rule_groups() for rule in group["rules"]}


# Grafana's built-in interval variables, replaced by a duration so the query parses.
_GRAFANA_DURATIONS = re.compile(r"\$__(rate_interval|interval|range)\b")


@functools.cache
def dashboard_expressions() -> dict[str, str]:
    out = {}
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    key = f"{path.name}: {panel['title']} [{target.get('refId', '')}]"
                    out[key] = _GRAFANA_DURATIONS.sub("5m", target["expr"])
    return out


@functools.cache
def all_expressions() -> dict[str, str]:
    return {**rule_expressions(), **dashboard_expressions()}


def test_there_is_something_to_check():
    assert RULE_FILES and DASHBOARDS
    assert any("alert" in r for g in rule_groups() for r in g["rules"])
    assert dashboard_expressions()


@pytest.mark.parametrize("where", sorted(all_expressions()))
def test_every_series_used_is_one_the_package_or_prometheus_makes(where):
    known = emitted_series_names() | recorded_names() | PROMETHEUS_OWN_SERIES
    for selector in selectors(all_expressions()[where]):
        assert selector.name, f"{where}: select series by name, not by a __name__ regex"
        assert selector.name in known, f"{where}: {selector.name!r} is not emitted by the package"


@pytest.mark.parametrize("where", sorted(all_expressions()))
def test_every_label_used_is_an_attribute_of_the_package(where):
    known = package_labels() | PROMETHEUS_OWN_LABELS
    unknown = labels_used(all_expressions()[where]) - known
    assert not unknown, f"{where}: labels {sorted(unknown)} come from no package attribute"


def test_dimensionless_gauges_are_queried_in_both_spellings():
    """A rule on a unit-"1" gauge must match the Collector's `_ratio` name too."""
    differing = {
        prometheus_base_name(spec): prometheus_base_name(spec, collector=True)
        for spec in semconv.all_metrics()
        if prometheus_base_name(spec) != prometheus_base_name(spec, collector=True)
    }
    for where, expr in all_expressions().items():
        names = {s.name for s in selectors(expr)}
        for python, collector in differing.items():
            assert (python in names) == (collector in names), f"{where}: uses only one of {python!r} / {collector!r}"


def dashboard_reach() -> set[str]:
    """Series the dashboards show, directly or through the recording rules they chart."""
    recording = {r["record"]: r["expr"] for g in rule_groups() for r in g["rules"] if "record" in r}
    reached = {s.name for expr in dashboard_expressions().values() for s in selectors(expr)}
    pending = [name for name in reached if name in recording]
    while pending:
        for selector in selectors(recording[pending.pop()]):
            if selector.name not in reached:
                reached.add(selector.name)
                if selector.name in recording:
                    pending.append(selector.name)
    return reached


def test_every_recording_rule_is_used():
    used = {s.name for expr in all_expressions().values() for s in selectors(expr)}
    assert recorded_names() <= used, f"unused recording rules: {sorted(recorded_names() - used)}"


def test_every_metric_the_package_emits_has_a_dashboard_panel():
    shown = dashboard_reach()
    for spec in semconv.all_metrics():
        names = prometheus_series_names(spec) | prometheus_series_names(spec, collector=True)
        assert names & shown, f"{spec.name} has no panel in {[p.name for p in DASHBOARDS]}"


# --- device faults (issue 16): each alert reads the package names it is about -------------------
DEVICE_FAULT_ALERTS = {
    "MindformersDeviceUncorrectableEcc": {semconv.HW_ERRORS},
    "MindformersDeviceCorrectableEccRate": {semconv.HW_ERRORS},
    "MindformersNpuErrorCode": {semconv.HW_NPU_ERROR_CODE},
    "MindformersNetworkDown": {semconv.HW_NETWORK_UP, semconv.HW_STATUS},
    "MindformersOpticalPowerOutOfRange": {semconv.HW_NETWORK_OPTICAL_POWER, semconv.HW_NETWORK_OPTICAL_POWER_LIMIT},
    "MindformersDeviceThrottled": {semconv.HW_GPU_THROTTLED, semconv.HW_NPU_SPEED, semconv.HW_NPU_SPEED_LIMIT},
}
DEVICE_FAULT_LABELS = {
    semconv.ATTR_ERROR_TYPE,
    semconv.ATTR_HW_NPU_ERROR_CODE,
    semconv.ATTR_NETWORK_IO_DIRECTION,
    semconv.ATTR_HW_LIMIT_TYPE,
    semconv.ATTR_HW_TYPE,
    semconv.ATTR_HW_STATE,
    semconv.ATTR_CLUSTER_FAULT_LEVEL,  # the level MindCluster gives an NPU error code (issue 50)
}


@pytest.mark.parametrize("alert", sorted(DEVICE_FAULT_ALERTS))
def test_device_fault_alerts_select_the_names_the_package_emits(alert):
    specs = {spec.name: spec for spec in semconv.DEVICE_METRICS}
    used = {s.name for s in selectors(rule_expressions()[alert])}
    for name in DEVICE_FAULT_ALERTS[alert]:
        spellings = prometheus_series_names(specs[name]) | prometheus_series_names(specs[name], collector=True)
        assert spellings & used, f"{alert} does not read {name} ({sorted(spellings)})"
    assert labels_used(rule_expressions()[alert]) - PROMETHEUS_OWN_LABELS <= (
        {sanitize(label) for label in DEVICE_FAULT_LABELS} | {"training_rank", "hw_id"}
    )


def test_every_device_name_added_for_faults_is_in_the_table_and_on_a_panel():
    new = {
        semconv.HW_ENERGY,
        semconv.HW_NETWORK_UP,
        semconv.HW_NETWORK_PACKETS,
        semconv.HW_NETWORK_IO,
        semconv.HW_NETWORK_OPTICAL_POWER,
        semconv.HW_NETWORK_OPTICAL_POWER_LIMIT,
        semconv.HW_NPU_SPEED,
        semconv.HW_NPU_SPEED_LIMIT,
        semconv.HW_NPU_ERROR_CODE,
        semconv.HW_NPU_MEMORY_ISOLATED_PAGES,
        semconv.HW_GPU_MEMORY_REMAPPED_ROWS,
        semconv.HW_GPU_THROTTLED,
    }
    specs = {spec.name: spec for spec in semconv.all_metrics()}
    assert new <= set(specs)
    shown = dashboard_reach()
    for name in sorted(new):
        assert (prometheus_series_names(specs[name]) | prometheus_series_names(specs[name], collector=True)) & shown, (
            name
        )
