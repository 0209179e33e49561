"""Zero-code monitoring: the instrumentor, the distro, the resource detector.

In-process tests train real MindSpore loops with in-memory SDK providers handed to
`instrument()`; the end-to-end tests run an unmodified script under `opentelemetry-instrument`
exporting to a real OTLP receiver.
"""

import importlib.metadata
import json
import logging
import os
import subprocess
import sys

import pytest
from mindspore.train import Model
from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from packaging.requirements import Requirement

import otel_mindformers
from otel_mindformers import ConfigError, MonitorCallback
from otel_mindformers.integration.distro import (
    IN_PLACE_EXPORTER,
    JSON_EXPORTER,
    MindFormersConfigurator,
    MindFormersDistro,
)
from otel_mindformers.integration.instrumentor import MindFormersInstrumentor
from otel_mindformers.integration.package import _instruments
from otel_mindformers.integration.resource_detector import MindFormersResourceDetector
from otel_mindformers.names import semconv
from otel_mindformers.names import training as tm
from otel_mindformers.telemetry.otlp_wire_encoder import InPlaceOTLPLogExporter, InPlaceOTLPSpanExporter
from tests.support import training
from tests.support.in_memory import Capture as InMemoryCapture
from tests.support.instrumented import LAUNCHER_SPAN_ID, TRACE_ID, TRACEPARENT, child_env, instrumented, run
from tests.support.paths import PLAIN_TRAIN

pytestmark = [pytest.mark.slow, pytest.mark.mindspore_api]  # real training runs


class Capture(InMemoryCapture):
    def runs(self):
        return self.finished(semconv.SPAN_RUN)


@pytest.fixture
def capture():
    return Capture()


@pytest.fixture
def instrumentation(workdir):
    """instrument(...) for one test; always undone."""
    yield otel_mindformers.instrument
    otel_mindformers.uninstrument()


def quiet(tmp_path, **overrides):
    return {
        "interval": 5,
        "output_type": ["json_file"],
        "json_log_path": str(tmp_path / "m.json"),
        "grad_monitor": False,
        **overrides,
    }


# --- packaging -----------------------------------------------------------------------------


def test_instrumentation_dependencies_are_the_instruments_extra():
    declared = [
        Requirement(text)
        for text in importlib.metadata.requires("otel-mindformers")
        if Requirement(text).marker is not None and Requirement(text).marker.evaluate({"extra": "instruments"})
    ]
    ours = [Requirement(text) for text in MindFormersInstrumentor().instrumentation_dependencies()]
    assert [(r.name, r.specifier) for r in declared] == [(r.name, r.specifier) for r in ours]
    assert get_dependency_conflicts(list(_instruments)) is None  # the installed MindSpore satisfies it


def test_entry_points_name_our_classes():
    loaded = {
        group: importlib.metadata.entry_points(group=group, name="mindformers")
        for group in (
            "opentelemetry_instrumentor",
            "opentelemetry_distro",
            "opentelemetry_configurator",
            "opentelemetry_resource_detector",
            "opentelemetry_environment_variables",
        )
    }
    assert {group: [ep.load() for ep in eps] for group, eps in loaded.items()} == {
        "opentelemetry_instrumentor": [MindFormersInstrumentor],
        "opentelemetry_distro": [MindFormersDistro],
        "opentelemetry_configurator": [MindFormersConfigurator],
        "opentelemetry_resource_detector": [MindFormersResourceDetector],
        "opentelemetry_environment_variables": [otel_mindformers.integration.environment_variables],
    }


@pytest.mark.parametrize(
    ("environment", "traces_exporter", "logs_exporter"),
    [
        ({}, IN_PLACE_EXPORTER, IN_PLACE_EXPORTER),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "otlp", "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "otlp", IN_PLACE_EXPORTER),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "grpc"},
            "otlp",
            IN_PLACE_EXPORTER,
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "none"}, "otlp", "none"),  # what the user sets stays
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, JSON_EXPORTER, JSON_EXPORTER),
        ({"OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/json"}, IN_PLACE_EXPORTER, JSON_EXPORTER),
    ],
)
def test_the_distro_sends_grpc_spans_and_logs_through_the_in_place_exporters(
    monkeypatch, environment, traces_exporter, logs_exporter
):
    monkeypatch.setattr(os, "environ", dict(environment))
    MindFormersDistro()._configure()
    assert (os.environ["OTEL_TRACES_EXPORTER"], os.environ["OTEL_LOGS_EXPORTER"]) == (traces_exporter, logs_exporter)


@pytest.mark.parametrize(
    ("environment", "metrics_exporter"),
    [
        ({}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, JSON_EXPORTER),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"}, "otlp"),
    ],
)
def test_the_distro_picks_the_metric_exporter_of_the_protocol(monkeypatch, environment, metrics_exporter):
    """`http/json` gets the JSON exporters: the SDK's `otlp` name raises on it, and
    `opentelemetry-instrument` would then load no instrumentor at all."""
    monkeypatch.setattr(os, "environ", dict(environment))
    MindFormersDistro()._configure()
    assert os.environ["OTEL_METRICS_EXPORTER"] == metrics_exporter


def test_the_sdk_configurator_loads_the_json_exporters_by_their_name():
    from opentelemetry.exporter.otlp.json.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.json.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._configuration import _import_exporters

    loaded = _import_exporters([JSON_EXPORTER], [JSON_EXPORTER], [JSON_EXPORTER])
    assert loaded == (
        {JSON_EXPORTER: OTLPSpanExporter},
        {JSON_EXPORTER: OTLPMetricExporter},
        {JSON_EXPORTER: OTLPLogExporter},
    )


def test_the_sdk_configurator_loads_the_in_place_exporters_by_their_name():
    from opentelemetry.sdk._configuration import _import_exporters

    spans, _, logs = _import_exporters([IN_PLACE_EXPORTER], [], [IN_PLACE_EXPORTER])
    assert (spans, logs) == ({IN_PLACE_EXPORTER: InPlaceOTLPSpanExporter}, {IN_PLACE_EXPORTER: InPlaceOTLPLogExporter})


# --- in process ---------------------------------------------------------------------------------


def test_instrument_adds_one_callback_to_a_plain_training_run(instrumentation, capture, tmp_path):
    instrumentation(quiet(tmp_path), **capture.providers())
    training.train([], steps=10)
    (run_span,) = capture.runs()
    steps = [s for s in capture.spans.get_finished_spans() if s.name == semconv.SPAN_STEP]
    assert [s.attributes[semconv.ATTR_STEP] for s in steps] == [1, 5, 10]
    assert [json.loads(line)["step"] for line in (tmp_path / "m.json").read_text().splitlines()] == [1, 5, 10]


def test_a_callback_the_user_added_is_not_doubled(instrumentation, capture, tmp_path):
    instrumentation(quiet(tmp_path), **capture.providers())
    own = MonitorCallback(quiet(tmp_path, json_log_path=str(tmp_path / "own.json")), **capture.providers())
    training.train([own], steps=10)
    assert len(capture.runs()) == 1
    assert not (tmp_path / "m.json").exists()  # the instrumentor's would have written here
    assert len((tmp_path / "own.json").read_text().splitlines()) == 3


def test_a_disabled_config_adds_nothing(instrumentation, capture, tmp_path):
    instrumentation(quiet(tmp_path, enable=False), **capture.providers())
    training.train([], steps=4)
    assert capture.runs() == []


def test_uninstrument_restores_model_train(workdir, capture, tmp_path):
    original = {name: Model.__dict__[name] for name in ("train", "fit")}
    otel_mindformers.instrument(quiet(tmp_path), **capture.providers())
    training.train([], steps=2)
    assert {name: Model.__dict__[name].__wrapped__ for name in original} == original
    otel_mindformers.uninstrument()
    assert {name: Model.__dict__[name] for name in original} == original
    training.train([], steps=2)
    assert len(capture.runs()) == 1


def test_an_invalid_environment_config_is_said_at_start_and_refuses_training(workdir, monkeypatch, caplog, capture):
    """docs/zero_code.md: one bad key neither silences monitoring nor is skipped quietly.
    instrument() says it at once (and raises nothing, so the other instrumentors load);
    the training run raises the same ConfigError before its first step, as in code."""
    bad = workdir / "monitor.yaml"
    bad.write_text("monitor_config:\n  intervl: 5\n")
    monkeypatch.setenv("OTEL_PYTHON_MINDFORMERS_CONFIG", str(bad))
    with caplog.at_level(logging.ERROR, logger="otel_mindformers"):
        try:
            otel_mindformers.instrument(**capture.providers())
            (message,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            with pytest.raises(ConfigError) as refused:
                training.train([], steps=2)
        finally:
            otel_mindformers.uninstrument()
    assert str(refused.value) == message
    assert refused.value.problems == ["monitor_config.intervl: unknown key (did you mean 'interval'?)"]
    assert f"OTEL_PYTHON_MINDFORMERS_CONFIG={bad} is invalid, so training is refused" in message
    assert "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=mindformers" in message
    assert capture.runs() == []
    training.train([], steps=1)  # uninstrumented again: nothing left behind


def test_a_custom_monitor_whose_constructor_raises_is_one_config_error_naming_the_key(workdir, monkeypatch, capture):
    (workdir / "raising_monitor.py").write_text(
        "from otel_mindformers import BaseMonitor\n"
        "class Raising(BaseMonitor):\n"
        "    def __init__(self, config):\n"
        "        raise RuntimeError('no licence for the metrics server')\n"
    )
    config = workdir / "monitor.yaml"
    config.write_text("monitor_config:\n  custom_monitor_callback: raising_monitor.Raising\n")
    monkeypatch.setenv("OTEL_PYTHON_MINDFORMERS_CONFIG", str(config))
    try:
        otel_mindformers.instrument(**capture.providers())  # the class imports: built with the run's callback
        with pytest.raises(ConfigError) as refused:
            training.train([], steps=2)
    finally:
        otel_mindformers.uninstrument()
    assert refused.value.problems == [
        "monitor_config.custom_monitor_callback: building 'raising_monitor.Raising' raised RuntimeError: "
        "no licence for the metrics server"
    ]
    assert capture.runs() == []


def test_a_script_that_changes_directory_is_checked_where_it_trains(workdir, monkeypatch, caplog, capture):
    """Relative output paths and the custom monitor's module are checked at process start from
    the working directory of then; a run from another one is checked again there, not refused."""
    (workdir / "job").mkdir()
    (workdir / "job" / "job_dir_monitor.py").write_text(
        "from otel_mindformers import BaseMonitor\nclass Here(BaseMonitor):\n    pass\n"
    )
    config = workdir / "monitor.yaml"
    config.write_text(
        "monitor_config:\n  output_type: [json_file]\n  json_log_path: out/m.json\n"
        "  custom_monitor_callback: job_dir_monitor.Here\n"
    )
    monkeypatch.setenv("OTEL_PYTHON_MINDFORMERS_CONFIG", str(config))
    with caplog.at_level(logging.ERROR, logger="otel_mindformers"):
        try:
            otel_mindformers.instrument(**capture.providers())
            (said,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            monkeypatch.chdir(workdir / "job")
            training.train([], steps=2)
        finally:
            otel_mindformers.uninstrument()
            sys.modules.pop("job_dir_monitor", None)
    assert "cannot import module 'job_dir_monitor'" in said  # from workdir, at start
    assert len(capture.runs()) == 1 and (workdir / "job" / "out" / "m.json").exists()


def test_invalid_config_in_code_raises(workdir):
    with pytest.raises(ConfigError, match=r"monitor_config\.interval"):
        otel_mindformers.instrument({"interval": 0})
    assert not hasattr(Model.__dict__["train"], "__wrapped__")


def test_a_monitor_config_key_given_as_a_keyword_is_refused_not_dropped(workdir):
    # As `otel_mindformers.start(config, interval=5)` takes it: instrument() takes keys in `config`.
    try:
        with pytest.raises(TypeError, match="unexpected keyword argument 'interval'"):
            otel_mindformers.instrument(interval=5)
        assert not hasattr(Model.__dict__["train"], "__wrapped__")
    finally:
        otel_mindformers.uninstrument()


def test_resource_detector_names_the_rank(monkeypatch):
    for name, value in {
        "RANK_ID": "1",
        "RANK_SIZE": "2",
        "DEVICE_ID": "1",
        "MS_WORKER_NUM": "2",
        "MS_ROLE": "MS_WORKER",
        "MS_NODE_ID": "1",
    }.items():
        monkeypatch.setenv(name, value)
    attributes = dict(MindFormersResourceDetector().detect().attributes)
    assert attributes["service.name"] == "mindformers-train"
    assert (
        attributes[semconv.ATTR_RANK],
        attributes[semconv.ATTR_WORLD_SIZE],
        attributes[semconv.ATTR_DEVICE_ID],
        attributes[semconv.ATTR_LAUNCHER],
    ) == (1, 2, 1, "msrun")
    assert semconv.ATTR_NODE_RANK not in attributes  # MS_NODE_ID is the worker's id, not the machine's


def test_resource_detector_omits_a_rank_msrun_has_not_assigned_yet(monkeypatch):
    # Several nodes without --node_rank: msrun exports no RANK_ID; the rank comes at init().
    for name in ("RANK_ID", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MS_WORKER_NUM", "16")
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    attributes = dict(MindFormersResourceDetector().detect().attributes)
    assert semconv.ATTR_RANK not in attributes and "service.instance.id" not in attributes
    assert attributes[semconv.ATTR_WORLD_SIZE] == 16


# --- opentelemetry-instrument, end to end ------------------------------------------------------------


def test_opentelemetry_instrument_monitors_an_unmodified_script(workdir, otlp_receiver):
    env = child_env(
        otlp_receiver,
        OTEL_SERVICE_NAME="plain-train",
        TRACEPARENT=TRACEPARENT,
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment=ci",
    )
    result = run(instrumented("python", str(PLAIN_TRAIN), "--steps", "12"), env, workdir)
    assert "training finished" in result.stdout

    assert otlp_receiver.wait_for(lambda rx: rx.spans(semconv.SPAN_RUN) and rx.points(tm.instrument_name(tm.LOSS)))
    (run_span,) = otlp_receiver.spans(semconv.SPAN_RUN)
    assert (run_span.trace_id, run_span.parent_span_id) == (TRACE_ID, LAUNCHER_SPAN_ID)
    steps = otlp_receiver.spans(semconv.SPAN_STEP)
    assert sorted(s.attributes[semconv.ATTR_STEP] for s in steps) == [1, 10, 12]
    # Step-duration points carry exemplars that point at step spans.
    exemplars = {e for p in otlp_receiver.points(tm.instrument_name(tm.STEP_TIME)) for e in p.exemplars}
    assert exemplars and exemplars <= {(s.trace_id, s.span_id) for s in steps}
    # The resource is the SDK's, built from OTEL_* and the `mindformers` resource detector.
    resource = run_span.resource
    assert (resource["service.name"], resource["deployment.environment"]) == ("plain-train", "ci")
    assert (resource[semconv.ATTR_RANK], resource[semconv.ATTR_WORLD_SIZE]) == (0, 1)
    # Built at start-up, before the job ledger is read: the ledger's job id is on the run span
    # only (docs/distributed.md), and the rank's instance id is the same on both.
    assert run_span.attributes["service.instance.id"] == resource["service.instance.id"]
    assert run_span.attributes[semconv.ATTR_JOB_ID].startswith("local-") and semconv.ATTR_JOB_ID not in resource
    assert {p.metric for p in otlp_receiver.points()} >= {
        tm.instrument_name(tm.LOSS),
        tm.instrument_name(tm.LEARNING_RATE),
        tm.instrument_name(tm.STEP_TIME),
        tm.STEPS.name,
    }
    # The monitor's default local outputs, beside the export.
    local = (workdir / "output" / "train_metric.json").read_text().splitlines()
    assert [json.loads(line)["step"] for line in local] == [1, 10, 12]


def test_disabled_instrumentation_sends_nothing(workdir, otlp_receiver):
    env = child_env(otlp_receiver, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="mindformers")
    result = run(instrumented("python", str(PLAIN_TRAIN), "--steps", "4"), env, workdir)
    assert "training finished" in result.stdout
    assert otlp_receiver.spans() == [] and otlp_receiver.points() == []
    assert not (workdir / "output" / "train_metric.json").exists()


START = "the script starts"  # printed by the script's first line: what came before is process start


def started(env, workdir, *command):
    """`opentelemetry-instrument COMMAND` (default: python -c <print START>): its output, in order."""
    command = command or ("python", "-c", f"print({START!r})")
    result = subprocess.run(
        instrumented(*command), env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert result.returncode == 0, result.stdout
    return result.stdout


@pytest.mark.parametrize(
    ("dotted", "problem"),
    [
        ("no_such_module_xyz.Monitor", "cannot import module 'no_such_module_xyz' (ModuleNotFoundError:"),
        ("json.NoSuchMonitor", "module 'json' has no class 'NoSuchMonitor'"),
        ("json.JSONDecoder", "'json.JSONDecoder' is not a subclass of otel_mindformers.BaseMonitor"),
    ],
)
def test_a_custom_monitor_that_cannot_be_loaded_is_said_at_process_start(workdir, dotted, problem):
    """Before the script runs (it would build its data and network first), not at Model.train."""
    config = workdir / "monitor.yaml"
    config.write_text(f"monitor_config:\n  custom_monitor_callback: {dotted}\n")
    output = started(child_env(OTEL_PYTHON_MINDFORMERS_CONFIG=str(config), OTEL_TRACES_EXPORTER="none"), workdir)
    said = f"otel_mindformers: OTEL_PYTHON_MINDFORMERS_CONFIG={config} is invalid, so training is refused"
    assert said in output and f"monitor_config.custom_monitor_callback: {problem}" in output
    assert output.index(said) < output.index(START)


def test_an_output_path_that_cannot_be_written_is_said_at_process_start(workdir):
    (workdir / "a_file").write_text("")
    config = workdir / "monitor.yaml"
    config.write_text("monitor_config:\n  output_type: [json_file]\n  json_log_path: a_file/m.json\n")
    output = started(child_env(OTEL_PYTHON_MINDFORMERS_CONFIG=str(config), OTEL_TRACES_EXPORTER="none"), workdir)
    problem = "monitor_config.json_log_path: cannot create 'a_file/m.json': 'a_file' is not a directory"
    assert f"{config} is invalid, so training is refused" in output and problem in output
    assert output.index(problem) < output.index(START)


def test_a_custom_monitor_beside_the_script_is_found_at_process_start(workdir):
    (workdir / "job").mkdir()
    (workdir / "job" / "my_monitor.py").write_text(
        "from otel_mindformers import BaseMonitor\nclass Mine(BaseMonitor):\n    pass\n"
    )
    (workdir / "job" / "train.py").write_text(f"print({START!r})\n")
    config = workdir / "monitor.yaml"
    config.write_text("monitor_config:\n  custom_monitor_callback: my_monitor.Mine\n")
    env = child_env(OTEL_PYTHON_MINDFORMERS_CONFIG=str(config), OTEL_TRACES_EXPORTER="none")
    output = started(env, workdir, "python", str(workdir / "job" / "train.py"))
    assert output.strip() == START


def test_a_config_given_by_the_flag_is_named_by_the_flag(workdir):
    bad = workdir / "monitor.yaml"
    bad.write_text("monitor_config:\n  intervl: 5\n")
    env = child_env(OTEL_TRACES_EXPORTER="none")
    output = started(env, workdir, f"--mindformers_config={bad}", "python", "-c", f"print({START!r})")
    assert f"otel_mindformers: opentelemetry-instrument --mindformers_config {bad} is invalid" in output
    assert "OTEL_PYTHON_MINDFORMERS_CONFIG=" not in output
    assert output.index("is invalid") < output.index(START)
