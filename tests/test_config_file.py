"""OTel's declarative configuration (`OTEL_CONFIG_FILE`, telemetry/config_file.py): through
each door (zero-code, `instrument()`, `MonitorCallback`) the file's providers, exporters,
resource and propagators are used, `OTEL_*` of the environment are not; our resource
attributes join the file's; our options live in the file; a file that cannot be used is one
error, before training.

The end-to-end tests train in real processes exporting to real OTLP receivers: the file's,
and the one `OTEL_EXPORTER_OTLP_ENDPOINT` names, which must get nothing."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from otel_mindformers import ConfigError
from otel_mindformers.names import semconv
from otel_mindformers.telemetry import config_file
from otel_mindformers.telemetry.export_errors import ExportErrorReporter
from otel_mindformers.telemetry.providers import sdk_destination
from tests.support.hidden import absent
from tests.support.instrumented import LAUNCHER_SPAN_ID, TRACE_ID, TRACEPARENT, child_env, free_ports, instrumented
from tests.support.jsonl import json_lines
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.paths import PLAIN_TRAIN

DOOR_SCRIPTS = {
    # `opentelemetry-instrument python examples/plain_train.py`: nothing in the script.
    "opentelemetry-instrument": None,
    "instrument()": f"""
import runpy, sys
import otel_mindformers
otel_mindformers.instrument()
sys.argv = [{str(PLAIN_TRAIN)!r}, "--steps", "4"]
runpy.run_path(sys.argv[0], run_name="__main__")
""",
    "MonitorCallback": """
import json, logging, sys
import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.dataset import GeneratorDataset
from mindspore.train import Callback, Model
from otel_mindformers import MonitorCallback


class Say(Callback):  # a log record per step, for the log bridge (`logs: true`)
    def on_train_step_end(self, run_context):
        logging.getLogger("door").warning("a step ended")


callback = MonitorCallback(json.loads(sys.argv[1]))
rng = np.random.default_rng(0)
x = rng.standard_normal((16, 8)).astype(np.float32)
data = GeneratorDataset(list(zip(x, x.sum(axis=1, keepdims=True))), column_names=["x", "y"], shuffle=False).batch(4)
net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))
model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.Momentum(net.trainable_params(), 0.01, 0.9))
model.train(1, data, callbacks=[callback, Say()], dataset_sink_mode=False)
""",
}
# What the run is told to do: in the file's entry, or (MonitorCallback) in its own config.
MONITOR = {"interval": 2, "output_type": ["json_file", "otlp"], "json_log_path": "./output/m.json"}


def declared_file(
    folder: Path, endpoint: str, *, service: str | None, entry: dict | None, propagators: str, detectors: list[str] = ()
) -> Path:
    """A declarative configuration exporting spans and metrics (no logs) to `endpoint` over
    OTLP/gRPC, its resource from `service`, `detectors` and an attribute of its own."""
    resource = [{"name": "deployment.environment.name", "value": "ci"}]
    if service is not None:
        resource.append({"name": "service.name", "value": service})
    document: dict = {
        "file_format": "1.0",
        "resource": {"attributes": resource},
        "propagator": {"composite_list": propagators},
        "tracer_provider": {
            "processors": [{"batch": {"schedule_delay": 100, "exporter": {"otlp_grpc": {"endpoint": endpoint}}}}]
        },
        "meter_provider": {
            "readers": [{"periodic": {"interval": 200, "exporter": {"otlp_grpc": {"endpoint": endpoint}}}}]
        },
    }
    if detectors:
        document["resource"]["detection/development"] = {"detectors": [{name: {}} for name in detectors]}
    if entry is not None:
        document["instrumentation/development"] = {"python": {config_file.NAME: entry}}
    path = folder / "otel-config.yaml"
    path.write_text(json.dumps(document))  # YAML is a superset of JSON
    return path


def train(door: str, folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = DOOR_SCRIPTS[door]
    if script is None:
        command = instrumented("python", str(PLAIN_TRAIN), "--steps", "4")
    else:
        (folder / "door.py").write_text(script)
        config = {**MONITOR, "service_name": "from-config", "job_id": "job-from-config", "logs": True}
        command = [sys.executable, "door.py", json.dumps(config)]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


CASES = [
    # door, the file's service.name and resource detectors, what the resource says, the file's propagators
    ("opentelemetry-instrument", "from-file", [], "from-file", "tracecontext,baggage"),
    # The file's `service` detector reads OTEL_SERVICE_NAME: the file sets it, over our entry's.
    ("instrument()", None, ["service"], "from-env", "tracecontext,baggage"),
    ("MonitorCallback", None, [], "from-config", "baggage"),
]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.mindspore_api
@pytest.mark.parametrize(
    ("door", "service", "detectors", "named", "propagators"), CASES, ids=[case[0] for case in CASES]
)
def test_the_files_sdk_exports_to_its_endpoint_with_its_resource(workdir, door, service, detectors, named, propagators):
    """The file's exporters, never the environment's endpoint, and nothing for a signal the
    file leaves out (logs); the file's resource with ours added (a service.name the file sets,
    or its detectors find, wins over ours); the file's propagators (without tracecontext,
    TRACEPARENT is not read); our options from the file's entry."""
    with OtlpReceiver() as declared, OtlpReceiver() as environment:
        entry = None if door == "MonitorCallback" else {**MONITOR, "service_name": "from-entry", "enabled": True}
        path = declared_file(
            workdir, declared.grpc_endpoint, service=service, entry=entry, propagators=propagators, detectors=detectors
        )
        env = child_env(
            environment, OTEL_CONFIG_FILE=str(path), OTEL_SERVICE_NAME="from-env", TRACEPARENT=TRACEPARENT,
            OTEL_PROPAGATORS="tracecontext", OTEL_PYTHON_MINDFORMERS_CONFIG=str(workdir / "not-read.yaml"),
        )  # fmt: skip
        done = train(door, workdir, env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert [line["step"] for line in json_lines(workdir / "output" / "m.json")] == [1, 2, 4]

        steps = declared.spans(semconv.SPAN_STEP)
        assert sorted(s.attributes[semconv.ATTR_STEP] for s in steps) == [1, 2, 4]
        (run,) = declared.spans(semconv.SPAN_RUN)
        resource = run.resource
        assert resource["service.name"] == named
        assert resource["deployment.environment.name"] == "ci"  # the file's
        assert resource[semconv.ATTR_RANK] == 0 and resource[semconv.ATTR_LAUNCHER] == "none"  # ours
        if door == "MonitorCallback":  # the SDK is configured as the callback is built: its job id is the resource's
            assert resource[semconv.ATTR_JOB_ID] == "job-from-config"
        if "tracecontext" in propagators:
            assert (run.trace_id, run.parent_span_id) == (TRACE_ID, LAUNCHER_SPAN_ID)
        else:
            assert run.trace_id != TRACE_ID and run.parent_span_id == ""
        unread = [line for line in done.stderr.splitlines() if f"TRACEPARENT={TRACEPARENT} is ignored" in line]
        assert len(unread) == (0 if "tracecontext" in propagators else 1), done.stderr[-3000:]
        assert {p.metric for p in declared.points()} >= {"mindformers.train.step.duration", "mindformers.train.steps"}
        assert environment.spans() == [] and environment.points() == [] and environment.log_count() == 0
        assert declared.log_count() == 0  # the file configures no logger provider: no logs, none of ours either
        ignored = [line for line in done.stderr.splitlines() if "OTEL_PYTHON_MINDFORMERS_CONFIG is ignored" in line]
        assert len(ignored) == (0 if door == "MonitorCallback" else 1), done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.mindspore_api
def test_a_second_rank_on_the_node_trains_beside_the_files_prometheus_pull_reader(workdir):
    """msrun's rank 1 of 2 on a node whose rank 0 already listens on the file's port: it
    listens on port + 1 and trains (it was refused: Address already in use)."""
    port = free_ports(2)
    with socket.socket() as rank_0:
        rank_0.bind(("127.0.0.1", port))
        rank_0.listen()
        path = workdir / "otel-config.yaml"
        path.write_text(
            json.dumps(
                {
                    "file_format": "1.0",
                    "meter_provider": {
                        "readers": [
                            {"pull": {"exporter": {"prometheus/development": {"host": "127.0.0.1", "port": port}}}}
                        ]
                    },
                    "instrumentation/development": {"python": {config_file.NAME: MONITOR}},
                }
            )
        )
        env = child_env(OTEL_CONFIG_FILE=str(path), RANK_ID="1", RANK_SIZE="2", DEVICE_ID="1")
        done = train("opentelemetry-instrument", workdir, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line["step"] for line in json_lines(workdir / "output" / "m_rank_1.json")] == [1, 2, 4]


def _refused(done: subprocess.CompletedProcess) -> str:
    """The one error line of ours; the run was refused before its first step."""
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("otel_mindformers:")]
    assert len(ours) == 1, done.stderr[-3000:]
    assert "Failed to auto initialize" not in done.stderr and "Failed to parse" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == f"otel_mindformers.config.errors.ConfigError: {ours[0]}"
    return ours[0]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.mindspore_api
def test_a_bad_key_in_the_files_entry_is_one_error_naming_it_and_refuses_training(workdir):
    with OtlpReceiver() as declared:
        entry = {**MONITOR, "intervl": 3}
        path = declared_file(workdir, declared.grpc_endpoint, service=None, entry=entry, propagators="tracecontext")
        done = train("opentelemetry-instrument", workdir, child_env(OTEL_CONFIG_FILE=str(path)))
    line = _refused(done)
    assert f"OTEL_CONFIG_FILE={path} is invalid, so training is refused before its first step" in line
    assert line.endswith(
        "instrumentation/development.python.mindformers.intervl: unknown key (did you mean 'interval'?)"
    )
    assert not (workdir / "output").exists()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.mindspore_api
def test_without_opentelemetry_configuration_one_error_names_the_extra_and_refuses_training(workdir):
    path = declared_file(workdir, "http://127.0.0.1:1", service=None, entry=MONITOR, propagators="tracecontext")
    env = child_env(OTEL_CONFIG_FILE=str(path))
    env["PYTHONPATH"] = f"{absent(workdir / 'shim', config_file.MODULE)}:{env['PYTHONPATH']}"
    line = _refused(train("opentelemetry-instrument", workdir, env))
    assert line.endswith(
        f"OTEL_CONFIG_FILE={path}: OpenTelemetry's declarative configuration needs opentelemetry-configuration, "
        "which is not installed: pip install 'otel-mindformers[file-configuration]'"
    )


# --- in process: the file's problems, one ConfigError each ---------------------------------


@pytest.fixture
def fresh(monkeypatch):
    """config_file's process state, as in a process that has not read a file yet."""
    monkeypatch.setattr(config_file, "_applied", None)
    monkeypatch.setattr(config_file, "_problem", None)
    return monkeypatch


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            'file_format: "1.0"\ntracer_provider: {processors: [{batch: {exporter: {otlp_grpc: {endpointt: x}}}}]}\n',
            "Configuration does not match schema: Additional properties are not allowed ('endpointt' was unexpected)",
        ),
        (
            'file_format: "1.0"\ntracer_provider: [\n',
            "not valid YAML at line 3, column 1: did not find expected node content",
        ),
        ('file_format: "2.0"\n', "Unsupported file_format '2.0'"),
        (None, "Configuration file not found"),
        (
            'file_format: "1.0"\ninstrumentation/development: {python: {mindformers: [1]}}\n',
            "[1] is not of type 'object' (at instrumentation/development -> python -> mindformers)",
        ),
    ],
)
def test_a_file_that_does_not_load_is_one_config_error_naming_it(tmp_path, fresh, caplog, text, problem):
    path = tmp_path / "otel.yaml"
    if text is not None:
        path.write_text(text)
    fresh.setenv(config_file.VARIABLE, str(path))
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError) as raised:
        config_file.configure()
    (message,) = raised.value.problems
    assert message.startswith(f"OTEL_CONFIG_FILE={path}: ") and problem in message, message
    assert "\n" not in message
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")], "the package's own traceback"
    with pytest.raises(ConfigError) as again:  # kept: every door reports the same one
        config_file.configure()
    assert again.value is raised.value


HEADER_FROM_ENV = (
    'file_format: "1.0"\n'
    "tracer_provider:\n"
    "  processors:\n"
    "    - batch:\n"
    "        exporter:\n"
    "          otlp_http:\n"
    "            headers:\n"
    "              - name: authorization\n"
    "                value: ${env:OTLP_TOKEN}\n"
)


@pytest.mark.parametrize(
    ("text", "secret", "problem"),
    [
        # A numeric token: the loader types it an int, and its schema error quoted the value.
        (HEADER_FROM_ENV, "90817263545", "*** is not of type 'string', 'null' (at tracer_provider -> processors"),
        # A token written in the file, on a line the parser cannot read: it quoted the line.
        (
            'file_format: "1.0"\ntracer_provider: {processors: [{batch: {exporter: {otlp_http: '
            '{headers_list: "authorization=Bearer tok-9c1f7e" : x}}}}]}\n',
            "tok-9c1f7e",
            "not valid YAML at line 2, column",
        ),
    ],
)
def test_a_config_error_does_not_quote_a_secret(tmp_path, fresh, text, secret, problem):
    """Headers hold tokens: what the loader says of a value, or of a line, is not repeated."""
    path = tmp_path / "otel.yaml"
    path.write_text(text)
    fresh.setenv(config_file.VARIABLE, str(path))
    fresh.setenv("OTLP_TOKEN", secret)
    with pytest.raises(ConfigError) as raised:
        config_file.configure()
    assert problem in str(raised.value) and secret not in str(raised.value), str(raised.value)


@pytest.mark.slow
def test_a_setting_the_sdk_refuses_is_not_quoted_when_it_comes_from_a_variable(tmp_path):
    """Applying the file (in a child process: it sets the process's SDK): the SDK's error quotes
    the value it refuses, which here is a variable's."""
    path = tmp_path / "otel.yaml"
    path.write_text(
        'file_format: "1.0"\n'
        "tracer_provider:\n"
        "  processors:\n"
        "    - batch:\n"
        "        exporter:\n"
        "          otlp_grpc:\n"
        "            endpoint: http://127.0.0.1:9\n"
        "            compression: ${env:OTLP_SETTING}\n"
    )
    script = "from otel_mindformers.telemetry import config_file\nconfig_file.configure({})\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env(OTEL_CONFIG_FILE=str(path), OTLP_SETTING="tok-6d2e-do-not-print"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "cannot apply it: Unsupported compression value '***'" in done.stderr, done.stderr
    assert "tok-6d2e-do-not-print" not in done.stderr + done.stdout


ALIAS_BOMB = 'file_format: "1.0"\na: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8)
)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: path.write_text(ALIAS_BOMB), "more than 100000 values once its aliases are expanded"),
        (lambda path: path.write_text("a: 1\n" + "#" * (5 << 20)), "not a regular file of at most 4 MiB"),
        (os.mkfifo, "not a regular file of at most 4 MiB"),  # it blocked the process until someone wrote
        (lambda path: path.write_text('file_format: "1.0"\nfile_format: "1.0"\n'), "key 'file_format' given twice"),
    ],
)
def test_a_file_is_read_within_the_configurations_bounds(tmp_path, fresh, make, problem):
    """A ten-line alias bomb stands for 387 million values, which the loader would build and
    validate one by one; a FIFO or a huge file would stall every rank before training."""
    path = tmp_path / "otel.yaml"
    make(path)
    fresh.setenv(config_file.VARIABLE, str(path))
    with pytest.raises(ConfigError) as raised:
        config_file.configure()
    assert str(raised.value).startswith(f"OTEL_CONFIG_FILE={path}: ") and problem in str(raised.value), raised.value


def test_the_specs_env_prefixed_references_are_substituted(tmp_path, fresh):
    """The spec's `${env:VAR}` (its getting-started example's spelling) reads the variable as
    `${VAR}` does, defaults included; `$$` still escapes. opentelemetry-configuration 0.66b2
    leaves `${env:...}` as written: an endpoint `${env:COLLECTOR}/v1/traces` then fails at
    every export, after training started."""
    path = tmp_path / "otel.yaml"
    path.write_text(
        'file_format: "1.0"\n'
        "tracer_provider: {processors: [{batch: {exporter: {otlp_http: {endpoint: '${env:COLLECTOR}/v1/traces'}}}}]}\n"
        "instrumentation/development:\n"
        "  python:\n"
        "    mindformers: {service_name: '${env:SERVICE:-fallback}', job_id: '${env:JOB}',\n"
        "                  tensorboard_path: '$${env:JOB}/${env:9}'}\n"  # no variable is named 9: left as written
    )
    fresh.setenv(config_file.VARIABLE, str(path))
    fresh.setenv("COLLECTOR", "http://127.0.0.1:4318")
    fresh.setenv("JOB", "llama-7b")
    fresh.delenv("SERVICE", raising=False)
    model, declared, _ = config_file._load(str(path))
    assert model.tracer_provider.processors[0].batch.exporter.otlp_http.endpoint == "http://127.0.0.1:4318/v1/traces"
    assert declared.options == {
        "service_name": "fallback",
        "job_id": "llama-7b",
        "tensorboard_path": "${env:JOB}/${env:9}",
    }


PULL_READERS = (
    'file_format: "1.0"\n'
    "meter_provider:\n"
    "  readers:\n"
    "    - pull: {exporter: {prometheus/development: {host: 127.0.0.1, port: 19464}}}\n"
    "    - pull: {exporter: {prometheus/development: {}}}\n"
    "    - pull: {exporter: {prometheus/development: {port: 0}}}\n"
)


@pytest.mark.parametrize(
    ("environment", "listens"),
    [
        ({"RANK_ID": "3", "RANK_SIZE": "4", "DEVICE_ID": "1"}, ["127.0.0.1:19465", "localhost:9465", "localhost:0"]),
        ({"DEVICE_ID": "1"}, ["127.0.0.1:19464", "localhost:9464", "localhost:0"]),  # a process alone keeps its port
    ],
)
def test_the_files_prometheus_pull_readers_get_a_port_per_local_rank(tmp_path, fresh, environment, listens):
    """Two ranks on a node, one file: its pull reader's port would be taken by the first and
    refuse the second rank's training. As the `prometheus` output, local rank r listens on
    port + r."""
    from otel_mindformers.job.identity import detect_identity

    path = tmp_path / "otel.yaml"
    path.write_text(PULL_READERS)
    for name in ("RANK_ID", "RANK_SIZE", "DEVICE_ID", "MS_WORKER_NUM", "LOCAL_RANK"):
        fresh.delenv(name, raising=False)
    for name, value in environment.items():
        fresh.setenv(name, value)
    model, _, _ = config_file._load(str(path))
    assert config_file._rank_ports(model, detect_identity()) == listens


def test_a_pull_readers_port_taken_is_named_in_the_refusal(tmp_path, fresh, sdk_globals):
    """Another process holds local rank 1's port (file port + 1): the refusal says where the
    rank's pull reader listens, not only the SDK's 'Address already in use'."""
    port = free_ports(2)
    path = tmp_path / "otel.yaml"
    path.write_text(
        'file_format: "1.0"\n'
        f"meter_provider: {{readers: [{{pull: {{exporter: {{prometheus/development: {{host: 127.0.0.1, port: {port}}}}}}}}}]}}\n"
    )
    fresh.setenv(config_file.VARIABLE, str(path))
    for name, value in {"RANK_ID": "1", "RANK_SIZE": "2", "DEVICE_ID": "1"}.items():
        fresh.setenv(name, value)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        with pytest.raises(ConfigError) as refused:
            config_file.configure()
    (message,) = refused.value.problems
    assert message.endswith(f"(its Prometheus pull readers listen on 127.0.0.1:{port + 1})"), message


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_otel_config_file_is_unset(tmp_path, fresh, value):
    """`export OTEL_CONFIG_FILE=` (how a shell unsets it for a child) configures nothing and
    refuses nothing: the environment's OTEL_* variables apply."""
    fresh.setenv(config_file.VARIABLE, value)
    assert config_file.path() is None
    assert config_file.configure() is None and config_file.read() is None and config_file.applied() is None


@pytest.fixture
def sdk_globals(monkeypatch):
    """The API's global providers as a fresh process has them, put back after the test."""
    from opentelemetry import _logs, metrics, trace
    from opentelemetry._logs import _internal as logs_internal
    from opentelemetry.metrics import _internal as metrics_internal
    from opentelemetry.util._once import Once

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(logs_internal, "_LOGGER_PROVIDER", None)
    monkeypatch.setattr(logs_internal, "_LOGGER_PROVIDER_SET_ONCE", Once())
    return trace, metrics, _logs


def test_an_sdk_configured_for_one_signal_already_is_left_as_it_is(tmp_path, fresh, sdk_globals):
    """Someone set an SDK tracer provider (a configurator before ours); metrics and logs are
    the API's no-ops: the file configures none of them, and is read for our options only."""
    from opentelemetry.sdk.trace import TracerProvider

    trace, metrics, _logs = sdk_globals
    theirs = TracerProvider()
    trace.set_tracer_provider(theirs)
    path = tmp_path / "otel.yaml"
    path.write_text(
        'file_format: "1.0"\n'
        "tracer_provider: {processors: [{simple: {exporter: {console: {}}}}]}\n"
        "meter_provider: {readers: [{periodic: {interval: 60000, exporter: {console: {}}}}]}\n"
        "instrumentation/development: {python: {mindformers: {interval: 3}}}\n"
    )
    fresh.setenv(config_file.VARIABLE, str(path))
    try:
        declared = config_file.configure()
    finally:
        theirs.shutdown()
    assert declared == config_file.FileConfiguration(str(path), {"interval": 3})
    assert trace.get_tracer_provider() is theirs
    assert not type(metrics.get_meter_provider()).__module__.startswith("opentelemetry.sdk")
    assert not type(_logs.get_logger_provider()).__module__.startswith("opentelemetry.sdk")


@pytest.mark.parametrize(("argv0", "role"), [("/opt/venv/bin/msrun", "MS_WORKER"), ("worker.py", "MS_SCHED")])
def test_msruns_launcher_and_scheduler_leave_the_sdk_unconfigured(tmp_path, fresh, sdk_globals, argv0, role):
    """`opentelemetry-instrument msrun ...` runs the configurator in msrun itself and in its
    scheduler: neither trains, and the file's Prometheus pull reader there took the port
    that local rank 0 then could not listen on (its training refused, the job stopped)."""
    trace, metrics, _logs = sdk_globals
    path = tmp_path / "otel.yaml"
    path.write_text(
        'file_format: "1.0"\n'
        "tracer_provider: {processors: [{simple: {exporter: {console: {}}}}]}\n"
        "instrumentation/development: {python: {mindformers: {interval: 3}}}\n"
    )
    fresh.setenv(config_file.VARIABLE, str(path))
    fresh.setenv("MS_ROLE", role)
    fresh.setattr(sys, "argv", [argv0, "--worker_num=2"])
    assert config_file.configure() == config_file.FileConfiguration(str(path), {"interval": 3})
    assert not type(trace.get_tracer_provider()).__module__.startswith("opentelemetry.sdk")


@pytest.mark.parametrize(("argv0", "role"), [("/opt/venv/bin/msrun", "MS_WORKER"), ("worker.py", "MS_SCHED")])
def test_msruns_launcher_and_scheduler_leave_the_sdk_unconfigured_without_a_file_too(
    fresh, sdk_globals, monkeypatch, argv0, role
):
    """The same under plain OTEL_* variables (`OTEL_METRICS_EXPORTER=prometheus` advised for a
    scrape endpoint): the distro's configurator there configures nothing."""
    from otel_mindformers.integration.distro import MindFormersConfigurator

    trace, metrics, _logs = sdk_globals
    fresh.delenv(config_file.VARIABLE, raising=False)
    monkeypatch.setattr(sys, "argv", [argv0, "--worker_num=2"])
    environment = {"MS_ROLE": role, "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    MindFormersConfigurator()._configure()
    assert not type(trace.get_tracer_provider()).__module__.startswith("opentelemetry.sdk")


@pytest.mark.parametrize(
    ("argv0", "role", "patched"),
    [("/opt/venv/bin/msrun", None, False), ("worker.py", "MS_SCHED", False), ("worker.py", "MS_WORKER", True)],
    ids=["launcher", "scheduler", "worker"],
)
def test_msruns_launcher_and_scheduler_are_left_alone_by_the_instrumentor_its_workers_monitored(
    workdir, fresh, argv0, role, patched
):
    """The instrumentor, as the configurator above: `opentelemetry-instrument msrun ...` loads
    it in msrun itself, its scheduler and its workers; the first two never train. The launcher
    was patched, and read and checked the configuration, as a worker."""
    from mindspore.train import Model

    import otel_mindformers
    from tests.support.in_memory import Capture

    fresh.setattr(sys, "argv", [argv0, "--worker_num=2"])
    if role is None:
        fresh.delenv("MS_ROLE", raising=False)
    else:
        fresh.setenv("MS_ROLE", role)
    original = Model.__dict__["train"]
    entry = {"interval": 5, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json")}
    try:
        otel_mindformers.instrument(entry, **Capture().providers())
        assert (Model.__dict__["train"] is not original) == patched
    finally:
        otel_mindformers.uninstrument()


def test_monitor_callback_without_the_package_raises_at_construction_naming_the_extra(tmp_path, fresh):
    path = tmp_path / "otel.yaml"
    path.write_text('file_format: "1.0"\n')
    fresh.setenv(config_file.VARIABLE, str(path))
    fresh.setitem(sys.modules, config_file.MODULE, None)
    from otel_mindformers.runtime.callback import MonitorCallback

    with pytest.raises(ConfigError) as raised:
        MonitorCallback({"output_type": ["json_file"], "json_log_path": str(tmp_path / "m.json")})
    assert str(raised.value) == (
        f"OTEL_CONFIG_FILE={path}: OpenTelemetry's declarative configuration needs opentelemetry-configuration, "
        "which is not installed: pip install 'otel-mindformers[file-configuration]'"
    )
    # Providers of the caller's own: the file is not needed.
    from tests.support.in_memory import Capture

    assert Capture().callback({"output_type": ["json_file"], "json_log_path": str(tmp_path / "m.json")})


@pytest.mark.slow
@pytest.mark.mindspore_api
@pytest.mark.parametrize("enabled", [True, False])
def test_instrument_with_its_own_providers_takes_only_its_options_from_the_file(workdir, fresh, enabled):
    """The caller's providers are used, the SDK's globals are left alone, and the file's
    entry configures the run; `enabled: false` there leaves training unpatched."""
    from mindspore.train import Model
    from opentelemetry import trace

    import otel_mindformers
    from tests.support import training
    from tests.support.in_memory import Capture

    entry = {"interval": 3, "output_type": ["json_file"], "json_log_path": str(workdir / "m.json"), "enabled": enabled}
    path = declared_file(workdir, "http://127.0.0.1:1", service=None, entry=entry, propagators="tracecontext")
    fresh.setenv(config_file.VARIABLE, str(path))
    capture = Capture()
    try:
        otel_mindformers.instrument(**capture.providers())
        assert hasattr(Model.__dict__["train"], "__wrapped__") == enabled
        training.train([], steps=6)
    finally:
        otel_mindformers.uninstrument()
    assert config_file.applied() is None and type(trace.get_tracer_provider()).__module__.startswith(
        "opentelemetry.trace"
    )
    if enabled:
        assert [line["step"] for line in json_lines(workdir / "m.json")] == [1, 3, 6]
        assert sorted(s.attributes[semconv.ATTR_STEP] for s in capture.finished(semconv.SPAN_STEP)) == [1, 3, 6]
    else:
        assert capture.finished() == [] and not (workdir / "m.json").exists()


def test_the_run_api_with_its_own_providers_leaves_the_sdks_globals_alone(workdir, fresh):
    """`otel_mindformers.start(..., tracer_provider=...)`, as MonitorCallback given providers:
    the file named by OTEL_CONFIG_FILE configures no SDK of the process's."""
    from opentelemetry import trace

    import otel_mindformers
    from tests.support.in_memory import Capture

    path = declared_file(workdir, "http://127.0.0.1:1", service=None, entry=None, propagators="tracecontext")
    fresh.setenv(config_file.VARIABLE, str(path))
    config = {"output_type": ["json_file"], "json_log_path": str(workdir / "m.json")}
    otel_mindformers.start(config, **Capture().providers()).end()
    assert config_file.applied() is None and type(trace.get_tracer_provider()).__module__.startswith(
        "opentelemetry.trace"
    )


@pytest.mark.parametrize(
    ("environment", "named"),
    [
        ({"OTEL_CONFIG_FILE": "/etc/otel.yaml"}, "the endpoints of OTEL_CONFIG_FILE=/etc/otel.yaml"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9"},
            "the endpoints of OTEL_EXPORTER_OTLP_*_ENDPOINT",
        ),
    ],
    ids=["file", "per-signal"],
)
def test_the_sdks_export_failure_is_one_warning_naming_where_it_really_exports(monkeypatch, caplog, environment, named):
    """Under `opentelemetry-instrument` the SDK's exporters send where the file (or a
    per-signal variable) says, not to OTEL_EXPORTER_OTLP_ENDPOINT: their failure is taken as
    ours (collapsed into one warning) and the warning does not name the ignored endpoint."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    reporter = ExportErrorReporter(sdk_destination())
    failure = "Transient error StatusCode.UNAVAILABLE encountered while exporting traces to 127.0.0.1:9, retrying"
    with caplog.at_level(logging.WARNING, logger="otel_mindformers.telemetry"):
        swallowed = not reporter.filter(logging.makeLogRecord({"msg": failure, "levelno": logging.WARNING}))
    assert swallowed and reporter.failing
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith(f"otel_mindformers: OTLP export to {named} is failing") and "4317" not in warning


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.mindspore_api
def test_the_files_unreachable_collector_is_one_warning_naming_the_file(workdir):
    """The file exports to a port nobody listens on, while OTEL_EXPORTER_OTLP_ENDPOINT (which
    the SDK ignores) names a live receiver: training finishes, and stderr has one warning of
    ours naming the file, none of the SDK's per-retry lines, and not the ignored endpoint."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with OtlpReceiver() as environment:
        path = declared_file(workdir, dead, service=None, entry=None, propagators="tracecontext")
        done = train("opentelemetry-instrument", workdir, child_env(environment, OTEL_CONFIG_FILE=str(path)))
    assert done.returncode == 0, done.stderr[-3000:]
    # Export lines only: a MindSpore release's own start-up notices (2.10 under numpy 2) are not ours.
    lines = [line for line in done.stderr.splitlines() if "export" in line.lower()]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"otel_mindformers: OTLP export to the endpoints of OTEL_CONFIG_FILE={path} is failing")
    assert environment.grpc_endpoint not in lines[0]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.mindspore_api
def test_the_files_custom_monitor_is_found_beside_the_file_from_another_folder(workdir):
    """`custom_monitor_callback` in the file's entry names a module beside the file, as beside
    any monitor_config YAML: a run started elsewhere finds it, as `validate` does (it refused
    the training before: the module was looked for in the working directory only)."""
    configs = workdir / "configs"
    configs.mkdir()
    (configs / "beside_otel.py").write_text(
        "from pathlib import Path\nfrom otel_mindformers import BaseMonitor\n\n"
        "class Mine(BaseMonitor):\n"
        "    def on_train_step_end(self, run_context):\n"
        "        Path('seen_by_mine').write_text('step')\n"
    )
    path = configs / "otel.yaml"
    entry = {"output_type": ["json_file"], "custom_monitor_callback": "beside_otel.Mine"}
    path.write_text(
        json.dumps({"file_format": "1.0", "instrumentation/development": {"python": {"mindformers": entry}}})
    )
    run_in = workdir / "elsewhere"
    run_in.mkdir()
    command = instrumented("python", str(PLAIN_TRAIN), "--steps", "4")
    done = subprocess.run(
        command, cwd=run_in, env=child_env(OTEL_CONFIG_FILE=str(path)), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "training finished" in done.stdout, done.stderr[-3000:]
    assert (run_in / "seen_by_mine").read_text() == "step", done.stderr[-3000:]
