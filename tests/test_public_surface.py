"""The public surface survives the package's moves, checked in a fresh interpreter: the API
names, every entry point this distribution declares, the CLI's commands, every telemetry
name and every `monitor_config` key that existed (tests/fixtures/public_surface.json, taken
from the release before the subpackage layout; new names may be added, none removed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SURFACE = json.loads((REPO / "tests" / "fixtures" / "public_surface.json").read_text())

PROBE = r"""
import dataclasses, importlib.metadata, json, typing
from otel_mindformers import MonitorCallback, load_monitor_config, ConfigError, BaseMonitor, phase, trace_environment
from otel_mindformers.config import MonitorConfig
from otel_mindformers.names import diagnosis, model_state, semconv, spec, training
from otel_mindformers.names import phase_names as phases

names = {s.name for s in semconv.all_metrics()}
for module in (semconv, training, diagnosis, model_state, phases, spec):
    for key, value in vars(module).items():
        if key.isupper() and isinstance(value, str) and ("." in value or key.startswith(("ATTR_", "SPAN_", "EVENT_", "PHASE_"))):
            names.add(value)

keys = set()
def walk(cls, prefix):
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in MonitorConfig.INTERNAL_FIELDS:
            continue
        keys.update(prefix + name for name in (field.name, *field.metadata.get("aliases", ())))
        for tp in (hints[field.name], *typing.get_args(hints[field.name])):
            if dataclasses.is_dataclass(tp):
                walk(tp, prefix + field.name + ("." if tp is hints[field.name] else "[]."))
walk(MonitorConfig, "monitor_config.")

dist = importlib.metadata.distribution("otel-mindformers")
loaded = {}
for ep in dist.entry_points:
    loaded[f"{ep.group}:{ep.name}"] = repr(ep.load())
print(json.dumps({"telemetry_names": sorted(names), "yaml_keys": sorted(keys), "entry_points": loaded}))
"""


@pytest.fixture(scope="module")
def surface() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_every_telemetry_name_of_the_last_release_is_still_emitted(surface):
    assert sorted(set(SURFACE["telemetry_names"]) - set(surface["telemetry_names"])) == []


@pytest.mark.slow
def test_every_monitor_config_key_of_the_last_release_is_still_accepted(surface):
    assert sorted(set(SURFACE["yaml_keys"]) - set(surface["yaml_keys"])) == []


@pytest.mark.slow
def test_every_entry_point_loads(surface):
    groups = {key.split(":")[0] for key in surface["entry_points"]}
    assert {
        "console_scripts",
        "opentelemetry_instrumentor",
        "opentelemetry_distro",
        "opentelemetry_configurator",
        "opentelemetry_traces_exporter",
        "opentelemetry_logs_exporter",
        "opentelemetry_resource_detector",
        "opentelemetry_environment_variables",
    } <= groups
    assert "MindFormersInstrumentor" in surface["entry_points"]["opentelemetry_instrumentor:mindformers"]


@pytest.mark.slow
def test_the_cli_keeps_its_commands():
    done = subprocess.run(
        [sys.executable, "-m", "otel_mindformers.cli", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    for command in ("validate", "devices", "hang-report", "report", "plot", "replay"):
        assert command in done.stdout
