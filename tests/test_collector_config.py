"""collector-config/ checked with the tools its users run: promtool, amtool, a JSON parser,
and the OTel Collector's own config rules (components defined, overlays merged)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from otel_mindformers.names import semconv
from otel_mindformers.names.phase_names import PHASE_DATA_WAIT, SPAN_PREFIX
from tests.support.paths import COLLECTOR_CONFIG as CONFIG_DIR
from tests.support.paths import RULE_FILES
from tests.support.prometheus import AMTOOL, PROMTOOL, run_tool

RULE_TESTS = sorted((CONFIG_DIR / "rules" / "tests").glob("*.test.yaml"))
DASHBOARD = CONFIG_DIR / "grafana" / "dashboards" / "otel-mindformers.json"
SEVERITIES = {"critical", "warning"}


def load(path: Path):
    return yaml.safe_load(path.read_text())


def alert_rules() -> list[dict]:
    return [rule for path in RULE_FILES for group in load(path)["groups"] for rule in group["rules"] if "alert" in rule]


# --- Prometheus rules --------------------------------------------------------------------------
@pytest.mark.slow
def test_promtool_checks_every_rule_file():
    result = run_tool(PROMTOOL, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(test_file):
    result = run_tool(PROMTOOL, "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_promtool_checks_prometheus_yml():
    result = run_tool(PROMTOOL, "check", "config", str(CONFIG_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda r: r["alert"])
def test_every_alert_has_severity_summary_description_and_runbook(rule):
    assert rule["labels"]["severity"] in SEVERITIES
    for annotation in ("summary", "description", "runbook"):
        assert rule["annotations"].get(annotation, "").strip(), f"{rule['alert']}: no {annotation}"


def test_every_alert_is_unit_tested_firing_and_not_firing():
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        for case in load(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - silent == set(), "alerts never tested not firing"


def test_every_rule_test_file_loads_the_rules_it_tests():
    shipped = {path.name for path in RULE_FILES}
    for path in RULE_TESTS:
        loaded = {Path(name).name for name in load(path)["rule_files"]}
        assert loaded <= shipped, f"{path.name} loads rule files that are not shipped"


# --- Alertmanager --------------------------------------------------------------------------------
ALERTMANAGER_YAML = str(CONFIG_DIR / "alertmanager.yaml")


@pytest.mark.slow  # amtool, a backend CLI, in a child process
@pytest.mark.integration
def test_amtool_checks_alertmanager_yaml():
    result = run_tool(AMTOOL, "check-config", ALERTMANAGER_YAML)
    assert result.returncode == 0, result.stdout + result.stderr
    integrations = {key for r in load(Path(ALERTMANAGER_YAML))["receivers"] for key in r if key != "name"}
    assert integrations == {"webhook_configs", "wechat_configs"}


@pytest.mark.slow  # amtool, a backend CLI, in a child process
@pytest.mark.integration
@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        ({"alertname": "MindformersNonFiniteLoss", "severity": "critical"}, "training-oncall-wecom,training-webhook"),
        ({"alertname": "MindformersDeviceUnhealthy", "severity": "critical"}, "training-oncall-wecom,training-webhook"),
        ({"alertname": "MindformersStragglerRank", "severity": "warning"}, "training-webhook"),
        ({"alertname": "MindformersLossSpike", "severity": "warning"}, "training-webhook"),
    ],
)
def test_amtool_routes_alerts_to_the_receivers(labels, receivers):
    labels = {**labels, "job": "llama", "training_rank": "0"}
    result = run_tool(
        AMTOOL,
        "config",
        "routes",
        "test",
        f"--config.file={ALERTMANAGER_YAML}",
        f"--verify.receivers={receivers}",
        *(f"{k}={v}" for k, v in labels.items()),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_groups_by_job_and_rank():
    route = load(Path(ALERTMANAGER_YAML))["route"]
    assert {"alertname", "job"} <= set(route["group_by"])
    assert any("training_rank" in child.get("group_by", []) for child in route["routes"])
    inhibit = load(Path(ALERTMANAGER_YAML))["inhibit_rules"]
    assert all(set(rule["equal"]) == {"job", "training_rank"} for rule in inhibit)


# --- Grafana -----------------------------------------------------------------------------------
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_is_valid_json_with_datasource_variables():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["tempo"]["type"] == "datasource" and variables["tempo"]["query"] == "tempo"
    assert {"job", "rank"} <= set(variables)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] in ("${datasource}", "${tempo}"), panel["title"]


def test_dashboard_has_the_panels_users_look_for():
    panels = {panel["title"]: panel for panel in dashboard()["panels"]}
    for title in (
        "Loss",
        "Learning rate",
        "Gradient norm",
        "Step time per rank",
        "Samples per second",
        "Overflow",
        "Accelerator utilisation",
        "Accelerator memory used",
        "Firing alerts",
    ):
        assert title in panels
    assert any("Straggler" in title for title in panels)
    assert any(t.get("exemplar") for p in panels.values() for t in p.get("targets", []))
    traces = [t for p in panels.values() for t in p.get("targets", []) if t.get("queryType") == "traceql"]
    assert traces and all(f'"{semconv.SPAN_STEP}"' in t["query"] for t in traces)


def test_grafana_provisioning_links_exemplars_to_the_tempo_datasource():
    sources = load(CONFIG_DIR / "grafana/provisioning/datasources/datasources.yaml")["datasources"]
    by_uid = {source["uid"]: source for source in sources}
    assert {"prometheus", "tempo"} <= set(by_uid)
    for destination in by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]:
        assert by_uid[destination["datasourceUid"]]["type"] == "tempo"
    provider = load(CONFIG_DIR / "grafana/provisioning/dashboards/dashboards.yaml")["providers"][0]
    compose = load(CONFIG_DIR / "docker-compose.yaml")
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in compose["services"]["grafana"]["volumes"]


# --- OpenTelemetry Collector ---------------------------------------------------------------------
def merge_collector_configs(*documents: dict) -> dict:
    """The Collector's `--config a --config b` rule: maps merge, everything else is replaced."""
    merged: dict = {}
    for document in documents:
        merged = _merge(merged, document)
    return merged


def _merge(base, overlay):
    if isinstance(base, dict) and isinstance(overlay, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in overlay.items()}}
    return overlay


@pytest.mark.parametrize("overlays", [(), ("otelcol.k8s.yaml",)], ids=["base", "k8s"])
def test_collector_pipelines_use_only_defined_components(overlays):
    config = merge_collector_configs(load(CONFIG_DIR / "otelcol.yaml"), *(load(CONFIG_DIR / o) for o in overlays))
    service = config["service"]
    assert set(service["extensions"]) <= set(config["extensions"])
    for name, pipeline in service["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            missing = set(pipeline[kind]) - set(config[kind])
            assert not missing, f"pipeline {name}: undefined {kind} {sorted(missing)}"
        processors = pipeline["processors"]
        assert processors[0] == "memory_limiter" and processors[-1] == "batch", name
    assert "tail_sampling" in service["pipelines"]["traces"]["processors"]
    assert "tail_sampling" not in service["pipelines"]["metrics"]["processors"]


def test_collector_config_has_the_documented_exporters_and_receivers():
    config = load(CONFIG_DIR / "otelcol.yaml")
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    assert {"otlp/tempo", "otlp/jaeger", "otlphttp/mimir", "prometheusremotewrite/mimir", "debug"} <= set(
        config["exporters"]
    )
    assert {"memory_limiter", "resourcedetection", "tail_sampling", "batch"} <= set(config["processors"])
    assert "k8sattributes" in load(CONFIG_DIR / "otelcol.k8s.yaml")["processors"]
    # Defaults listen on localhost only; the compose file opens them inside its network.
    for protocol in config["receivers"]["otlp"]["protocols"].values():
        assert ":-localhost:" in protocol["endpoint"]


def test_tail_sampling_matches_the_package_span_and_event_names():
    policies = load(CONFIG_DIR / "otelcol.yaml")["processors"]["tail_sampling"]["policies"]
    spans = {semconv.SPAN_RUN, semconv.SPAN_EPOCH, semconv.SPAN_STEP, semconv.SPAN_JOB_STEP}
    spans |= {SPAN_PREFIX + PHASE_DATA_WAIT}
    named: dict[str, set[str]] = {"span": set(), "spanevent": set()}
    for policy in policies:
        for context, conditions in policy.get("ottl_condition", {}).items():
            if context in named:
                for condition in conditions:
                    named[context].update(re.findall(r'name [!=]= "([^"]+)"', condition))
    assert named["span"] and named["span"] <= spans
    assert named["spanevent"] == {semconv.EVENT_ALERT}
    assert {p["type"] for p in policies} >= {"status_code", "probabilistic", "ottl_condition"}


# --- docker-compose ------------------------------------------------------------------------------
def test_compose_mounts_files_that_exist_and_publishes_on_localhost_only():
    compose = load(CONFIG_DIR / "docker-compose.yaml")
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (CONFIG_DIR / source).exists(), f"{name}: {source} is missing"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is published on every interface"
    assert {"otel-collector", "tempo", "prometheus", "alertmanager", "grafana"} <= set(compose["services"])
