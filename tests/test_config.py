"""monitor_config loading: the article's keys, aliases, assignment, and one clear error per problem."""

import dataclasses
import logging
import os
import re
import sys
import tempfile
import textwrap
import typing
from pathlib import Path

import pytest
import yaml

from otel_mindformers import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.cli import main as cli_main
from otel_mindformers.config import OTLP_PROTOCOLS, GradNorm, parse_monitor_config
from otel_mindformers.integration.instrumentor import _config_from_environment
from otel_mindformers.job.identity import detect_identity
from otel_mindformers.outputs import build_sinks
from otel_mindformers.outputs.paths import check_output_paths, prepare_output_paths
from otel_mindformers.runtime.custom_monitors import load_monitor_class
from tests.support.cli import cli
from tests.support.paths import MINDFORMERS_YAML, REPO
from tests.support.paths import TRAIN_CONFIG_YAML as ARTICLE_YAML


def test_article_yaml_loads_every_key_as_written():
    cfg = load_monitor_config(ARTICLE_YAML)
    assert cfg.enable is True
    assert cfg.interval == 10
    assert cfg.output_type == ["stdout", "tensorboard", "json_file"]
    assert cfg.tensorboard_path == "./output/tensorboard_log"
    assert cfg.json_log_path == "./output/train_metric.json"
    assert cfg.monitored_metrics == ["loss", "learning_rate", "grad_norm", "train_per_step_time", "overflow"]
    assert cfg.grad_monitor is True
    assert cfg.alert_config.loss_threshold == 8.0
    assert cfg.alert_config.alert_interval == 50
    assert cfg.custom_monitor_callback == "custom_monitor.CustomMetricMonitor"
    assert cfg.source_dir == str(ARTICLE_YAML.parent)


def test_attribute_assignment_nested_then_revalidated():
    cfg = load_monitor_config(ARTICLE_YAML)
    cfg.grad_monitor = False  # the article's line
    cfg.alert_config.loss_threshold = 3.5
    assert load_monitor_config(cfg).alert_config.loss_threshold == 3.5
    cfg.interval = 0
    with pytest.raises(ConfigError, match=r"monitor_config.interval: must be >= 1, got 0"):
        load_monitor_config(cfg)


def test_a_misspelt_key_assigned_in_code_is_refused_not_ignored():
    """The article overrides keys by assignment; a typo there would be an attribute nothing reads."""
    cfg = load_monitor_config(ARTICLE_YAML)
    with pytest.raises(
        ConfigError, match=re.escape("monitor_config.intervall: unknown key (did you mean 'interval'?)")
    ):
        cfg.intervall = 5
    with pytest.raises(
        ConfigError,
        match=re.escape("monitor_config.alert_config.loss_treshold: unknown key (did you mean 'loss_threshold'?)"),
    ):
        cfg.alert_config.loss_treshold = 2.0
    with pytest.raises(
        ConfigError, match=re.escape("monitor_config.monitor_onn: unknown key (did you mean 'monitor_on'?)")
    ):
        cfg.monitor_onn = True  # a misspelt MindFormers alias gets the alias
    cfg.step_interval = 4  # MindFormers' name, as in the YAML
    assert (cfg.interval, cfg.alert_config.loss_threshold) == (4, 8.0)
    assert not hasattr(cfg, "intervall") and not hasattr(cfg, "step_interval")


def test_a_misspelt_mindformers_key_gets_a_suggestion_too():
    """MindFormers' own keys are valid in the section; a typo in one was an unknown key with no hint."""
    with pytest.raises(ConfigError) as raised:
        parse_monitor_config({"monitor_on": True, "dump_pathh": "./dump", "weight_state_formatt": ["log"]})
    assert raised.value.problems == [
        "monitor_config.dump_pathh: unknown key (did you mean 'dump_path'?)",
        "monitor_config.weight_state_formatt: unknown key (did you mean 'weight_state_format'?)",
    ]


def test_grad_monitor_is_resolved_once_and_follows_an_assignment():
    """None / true / false read as what they ask of the norm (`grad_norm`), also after the
    article's `cfg.grad_monitor = False`."""
    assert MonitorConfig().grad_norm is GradNorm.IF_RETURNED
    cfg = parse_monitor_config({"grad_monitor": True})
    assert cfg.grad_norm is GradNorm.MEASURED
    cfg.grad_monitor = False
    assert cfg.grad_norm is GradNorm.OFF
    assert parse_monitor_config({"grad_monitor": None}).grad_norm is GradNorm.IF_RETURNED


def test_only_the_config_reads_grad_monitor_as_none_true_or_false():
    """The run reads `grad_norm`; no module tests `grad_monitor` against None, True or False."""
    tested = re.compile(r"grad_monitor\s*(?:is\s+(?:not\s+)?(?:None|True|False)|==|!=)")
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in (REPO / "otel_mindformers").rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if tested.search(line)
    ]
    assert found == []


def test_file_that_is_the_section_itself(tmp_path):
    path = tmp_path / "monitor.yaml"
    path.write_text("interval: 3\noutput_type: stdout\n")
    cfg = load_monitor_config(path)
    assert (cfg.interval, cfg.output_type) == (3, ["stdout"])


def test_mindformers_native_keys_are_aliases_and_kept(tmp_path):
    cfg = load_monitor_config(
        {
            "monitor_config": {
                "monitor_on": True,
                "step_interval": 4,
                "dump_path": "./dump",
                "local_loss_format": None,
                "output_type": ["stdout"],
            }
        }
    )
    assert cfg.enable is True and cfg.interval == 4
    assert cfg.mindformers_native == {"dump_path": "./dump", "local_loss_format": None}


@pytest.mark.parametrize("value", ["10s", "0", "nan", "-1000"])
def test_an_unusable_metric_export_interval_variable_is_the_default_with_one_warning(
    monkeypatch, caplog, otlp_receiver, value
):
    """The SDK's reader warns and keeps its default for such a value; ours raised ValueError
    when the run built its providers, and the training never started."""
    from otel_mindformers.job.identity import Identity
    from otel_mindformers.telemetry.providers import build_telemetry

    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", value)
    config = load_monitor_config(
        {"output_type": ["otlp"], "otlp": {"endpoint": otlp_receiver.grpc_endpoint, "protocol": "grpc"}}
    )
    assert config.otlp.resolved_export_interval() == 10.0
    telemetry = build_telemetry(config.telemetry, Identity(rank=0, world_size=1))
    telemetry.meter.create_counter("interval.counter").add(1)
    assert telemetry.close(5.0)
    assert len(otlp_receiver.points("interval.counter")) == 1
    warnings = [r.getMessage() for r in caplog.records if "OTEL_METRIC_EXPORT_INTERVAL" in r.getMessage()]
    assert warnings == [
        f"otel_mindformers: OTEL_METRIC_EXPORT_INTERVAL={value!r} is not a number of milliseconds "
        "from 10 to 86400000; metrics are exported every 10 s"
    ]


@pytest.mark.parametrize(
    ("value", "seconds"), [("10", 0.01), ("86400000", 86400.0), ("9.99", 10.0), ("86400001", 10.0)]
)
def test_the_metric_export_interval_variable_is_used_from_10_ms_to_a_day(monkeypatch, value, seconds):
    """The range `export_interval` allows, both ends included, in ms; past it the default."""
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", value)
    otlp = load_monitor_config({"output_type": ["otlp"]}).otlp
    assert otlp.resolved_export_interval() == seconds
    warning = otlp.export_interval_warning()
    assert (warning is None) if seconds != 10.0 else (f"={value!r} is not a number of milliseconds" in warning)


def test_an_otlp_protocol_variable_naming_no_protocol_is_refused_before_training(workdir, monkeypatch):
    """The SDK refuses it too; ours sent it as HTTP/protobuf (to the gRPC port), and the only
    word was a failing export, after the run had entered the job's ledger."""
    from otel_mindformers import MonitorCallback

    section = {
        "output_type": ["otlp", "json_file"],
        "json_log_path": "out/m.json",
        "otlp": {"endpoint": "http://127.0.0.1:9"},
    }
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grcp")
    with pytest.raises(ConfigError) as raised:
        MonitorCallback(section)
    assert str(raised.value) == (
        "OTEL_EXPORTER_OTLP_PROTOCOL: unknown value 'grcp' (did you mean 'grpc'?); allowed: grpc, http/protobuf, http/json"
    )
    assert not (workdir / "out").exists()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", " http/json ")
    assert MonitorCallback(section).config.otlp.resolved_protocol() == "http/json"


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "5s", "ValueError: could not convert string to float: '5s'"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zip", 'Invalid value "zip" for compression envvar'),
    ],
)
def test_an_otlp_variable_the_exporters_refuse_is_a_config_error_before_training(
    workdir, monkeypatch, variable, value, said
):
    """The SDK's exporters raised these when the run built them: out of Model.train, after
    the run had entered the job's ledger, without a word of which setting."""
    from otel_mindformers import MonitorCallback

    section = {
        "output_type": ["otlp", "json_file"],
        "json_log_path": "out/m.json",
        "otlp": {"endpoint": "http://127.0.0.1:9"},
    }
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match="the OTLP exporters refuse their settings") as raised:
        MonitorCallback(section)
    assert "OTEL_EXPORTER_OTLP_*" in str(raised.value) and said in str(raised.value)
    assert not (workdir / "out").exists()


@pytest.mark.slow  # `otel-mindformers validate` in child processes, each with its environment
def test_cli_validate_checks_the_otel_variables_a_run_here_would_read(tmp_path):
    """validate said "valid" where the run then refused these variables at callback build."""
    path = tmp_path / "otlp.yaml"
    path.write_text("monitor_config:\n  output_type: [otlp, stdout]\n  otlp: {endpoint: 'http://127.0.0.1:9'}\n")
    refused = [
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grcp"},
            "invalid: OTEL_EXPORTER_OTLP_PROTOCOL: unknown value 'grcp' (did you mean 'grpc'?); "
            "allowed: grpc, http/protobuf, http/json",
        ),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "5s"}, "ValueError: could not convert string to float: '5s'"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zip"}, 'Invalid value "zip" for compression envvar'),
    ]
    for env, said in refused:
        result = cli("validate", str(path), cwd=tmp_path, env=env)
        assert result.returncode == 1, (env, result.stdout)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("invalid: ") and said in line, (env, result.stderr)
    warned = cli("validate", str(path), cwd=tmp_path, env={"OTEL_METRIC_EXPORT_INTERVAL": "10s"})
    assert warned.returncode == 0, warned.stderr
    assert (
        "warning: OTEL_METRIC_EXPORT_INTERVAL='10s' is not a number of milliseconds from 10 to 86400000; "
        "metrics are exported every 10 s"
    ) in warned.stderr.splitlines()
    # Without an otlp output, with monitoring off, or where OTEL_CONFIG_FILE names the
    # exporters (the spec has the other variables ignored then), a run reads none of them.
    bad = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grcp", "OTEL_METRIC_EXPORT_INTERVAL": "10s"}
    declared = tmp_path / "otel.yaml"
    declared.write_text(
        'file_format: "1.0"\ninstrumentation/development: {python: {mindformers: {output_type: [otlp]}}}\n'
    )
    # A monitor_config under OTEL_CONFIG_FILE, and that file itself, which the run is to be given.
    for validated, variable in ((path, {"OTEL_CONFIG_FILE": str(declared)}), (declared, {})):
        filed = cli("validate", str(validated), cwd=tmp_path, env={**bad, **variable})
        assert filed.returncode == 0 and "OTEL_" not in filed.stderr, filed.stderr
    path.write_text("monitor_config:\n  output_type: [stdout]\n")
    quiet = cli("validate", str(path), cwd=tmp_path, env=bad)
    assert quiet.returncode == 0 and "OTEL_" not in quiet.stderr, quiet.stderr
    path.write_text("monitor_config:\n  enable: false\n  output_type: [otlp]\n")
    off = cli("validate", str(path), cwd=tmp_path, env=bad)
    assert off.returncode == 0 and "OTEL_" not in off.stderr, off.stderr


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
@pytest.mark.parametrize(
    ("variable", "value", "place"),
    [
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization: Bearer hdr-51c0-do-not-print", "entry 1 of 1"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", 'x-team=a, "api-key"=hdr-51c0-do-not-print', "entry 2 of 2"),
    ],
)
def test_a_malformed_otlp_header_variable_is_a_config_error_that_does_not_show_it(
    workdir, monkeypatch, caplog, capfd, protocol, variable, value, place
):
    """`authorization: Bearer <token>` (a colon, not `=`): the SDK's exporters logged the whole
    entry, token included, once per exporter on every rank, dropped it, and every export was
    then refused by the collector."""
    from otel_mindformers import MonitorCallback

    section = {"output_type": ["otlp"], "otlp": {"endpoint": "http://127.0.0.1:9", "protocol": protocol}}
    monkeypatch.setenv(variable, value)
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError) as raised:
        MonitorCallback(section)
    assert f"{variable}: {place} is not name=value" in str(raised.value), raised.value
    said = str(raised.value) + caplog.text + "".join(capfd.readouterr())
    assert "hdr-51c0-do-not-print" not in said


def test_an_sdk_configured_for_traces_only_leaves_our_metrics_and_logs_exporters_checked(workdir, monkeypatch):
    """Someone set an SDK tracer provider, not a meter or logger provider: the run builds our
    own OTLP exporters for those, and a protocol they refuse is still one error before training."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.util._once import Once

    from otel_mindformers import MonitorCallback

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    theirs = TracerProvider()
    trace.set_tracer_provider(theirs)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grcp")
    try:
        with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL: unknown value 'grcp'"):
            MonitorCallback({"output_type": ["otlp"], "otlp": {"endpoint": "http://127.0.0.1:9"}})
    finally:
        theirs.shutdown()


def test_a_signal_turned_off_leaves_its_exporter_unbuilt_by_the_check(workdir, monkeypatch):
    """OTEL_LOGS_EXPORTER=none: the check before training builds the span and metric
    exporters only, and the callback is made."""
    from otel_mindformers import MonitorCallback

    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "none")
    callback = MonitorCallback({"output_type": ["otlp"], "otlp": {"endpoint": "http://127.0.0.1:9"}})
    assert callback.config.output_type == ["otlp"]


def test_exporters_checked_but_unused_by_the_run_are_shut_down():
    """Every provider passed in (the instrumentor's, a test's): the run builds none of its
    own, so the exporters the check built are shut down, not left with their channels open."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_mindformers.telemetry.providers import build_telemetry

    checked = InMemorySpanExporter()
    config = load_monitor_config({"output_type": ["otlp"], "otlp": {"endpoint": "http://127.0.0.1:9"}})
    theirs = {
        "tracer_provider": TracerProvider(),
        "meter_provider": MeterProvider(),
        "logger_provider": LoggerProvider(),
    }
    telemetry = build_telemetry(config.telemetry, detect_identity(), **theirs, checked_exporters=(checked, None, None))
    try:
        assert checked.export([]) == SpanExportResult.FAILURE  # shut down
    finally:
        telemetry.close(1.0)


@pytest.mark.slow  # forks a child
def test_checked_exporters_are_taken_once_and_never_in_a_forked_child():
    """A gRPC channel does not outlive a fork: a run in a forked child builds its own."""
    from otel_mindformers.telemetry.providers import CheckedExporters

    exporters = (object(), None, None)
    checked = CheckedExporters(exporters)  # what they are does not matter here
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report whether it got them, and leave
        os.write(write, b"taken" if checked.take() is not None else b"none")
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read, "rb") as answer:
        assert answer.read() == b"none"
    assert checked.take() is exporters and checked.take() is None


def test_otlp_settings_default_to_standard_env(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
    cfg = load_monitor_config({"output_type": ["otlp"]})
    assert cfg.otlp.resolved_protocol() == "http/protobuf"
    assert cfg.otlp.resolved_export_interval() == 2.5
    cfg = load_monitor_config({"otlp": {"protocol": "grpc", "export_interval": 1, "headers": "api-key=abc,tenant=t1"}})
    assert cfg.otlp.resolved_protocol() == "grpc"
    assert cfg.otlp.headers == {"api-key": "abc", "tenant": "t1"}


BAD_CONFIGS = [
    ({"intervall": 3}, "monitor_config.intervall: unknown key (did you mean 'interval'?)"),
    ({"interval": 0}, "monitor_config.interval: must be >= 1, got 0"),
    ({"interval": "10"}, "monitor_config.interval: expected an integer, got '10'"),
    ({"enable": "yes"}, "monitor_config.enable: expected true or false, got 'yes'"),
    ({"output_type": ["stdout", "jsonfile"]}, "unknown value 'jsonfile' (did you mean 'json_file'?)"),
    ({"monitored_metrics": ["los"]}, "monitor_config.monitored_metrics: unknown value 'los' (did you mean 'loss'?)"),
    (
        {"alert_config": {"loss_treshold": 1}},
        "monitor_config.alert_config.loss_treshold: unknown key (did you mean 'loss_threshold'?)",
    ),
    ({"alert_config": []}, "monitor_config.alert_config: expected a mapping"),
    # A key of a sub-section written one level up (docs name `stop_on_nonfinite` on its own).
    (
        {"stop_on_nonfinite": False},
        "monitor_config.stop_on_nonfinite: unknown key here; it is a key of monitor_config.alert_config: "
        "write it there",
    ),
    ({"endpoint": "http://c:4317"}, "monitor_config.endpoint: unknown key here; it is a key of monitor_config.otlp"),
    ({"otlp": {"protocol": "udp"}}, "monitor_config.otlp.protocol: unknown value 'udp'"),
    ({"report_ranks": [-1]}, "monitor_config.report_ranks: expected 'all' or a list of ranks"),
    ({"job_id": "   "}, "monitor_config.job_id: must name a job, got '   '"),
    ({"job_id": "j" * 129}, "monitor_config.job_id: at most 128 characters, got 129"),
    ({"job_id": "a\nb"}, "monitor_config.job_id: contains a control character: 'a\\nb'"),
    (
        {"custom_monitor_callback": "nomodule"},
        "monitor_config.custom_monitor_callback: expected 'module.ClassName', got 'nomodule'",
    ),
    ({"shutdown_timeout": 1e12}, "monitor_config.shutdown_timeout: must be <= 86400.0, got 1000000000000.0"),
    ({"json_log_path": ""}, "monitor_config.json_log_path: must name a path, got ''"),
    ({"json_log_path": "./output/"}, "monitor_config.json_log_path: must name a file, got the directory './output/'"),
    ({"tensorboard_path": " "}, "monitor_config.tensorboard_path: must name a path"),
    (
        {"prometheus": {"host": "not a host!"}},
        "monitor_config.prometheus.host: expected an IP address or a host name, got 'not a host!'",
    ),
    (
        {"alert_config": {"loss_spike": {"window": 2**62}}},
        "monitor_config.alert_config.loss_spike.window: must be <= 1000000",
    ),
    ({"log_rotation": {"backup_count": 10**9}}, "monitor_config.log_rotation.backup_count: must be <= 1000"),
    ({"tokens_per_sample": 2**70}, f"monitor_config.tokens_per_sample: must be <= {2**63 - 1}"),
    (
        {"alert_config": {"notifiers": [{"type": "slack", "url": "https://[::1/hook"}]}},
        "monitor_config.alert_config.notifiers[0].url: does not parse as a URL",
    ),
    (
        {"alert_config": {"notifiers": [{"type": "slack", "url": "https://h:99999/x"}]}},
        "monitor_config.alert_config.notifiers[0].url: does not parse as a URL (Port out of range 0-65535)",
    ),
    (
        {"alert_config": {"notifiers": [{"type": "slack", "url": "https:///x"}]}},
        "monitor_config.alert_config.notifiers[0].url: the URL names no host",
    ),
    ({"source_dir": "/tmp"}, "monitor_config.source_dir: unknown key"),
    ({"mindformers_native": {}}, "monitor_config.mindformers_native: unknown key"),
]


@pytest.mark.parametrize("section, message", BAD_CONFIGS, ids=[m[:40] for _, m in BAD_CONFIGS])
def test_bad_config_gives_one_clear_error(section, message, workdir):
    with pytest.raises(ConfigError) as info:
        load_monitor_config({"monitor_config": section})
    assert message in str(info.value)
    assert len(info.value.problems) == 1


def test_every_problem_of_a_section_is_reported_at_once(workdir):
    with pytest.raises(ConfigError) as info:
        load_monitor_config(
            {
                "intervall": 3,
                "enable": "yes",
                "alert_config": {"loss_treshold": 1, "notify_retries": -1},
                "otlp": {"protocol": "udp"},
            }
        )
    assert sorted(info.value.problems) == sorted(
        [
            "monitor_config.intervall: unknown key (did you mean 'interval'?)",
            "monitor_config.enable: expected true or false, got 'yes'",
            "monitor_config.alert_config.loss_treshold: unknown key (did you mean 'loss_threshold'?)",
            "monitor_config.alert_config.notify_retries: must be >= 0, got -1",
            f"monitor_config.otlp.protocol: unknown value 'udp'; allowed: {', '.join(OTLP_PROTOCOLS)}",
        ]
    )
    assert str(info.value).startswith("5 problems:\n")


def _sections(cls=MonitorConfig, path="monitor_config"):
    """(dotted path, section class, a mapping placing an entry there) for every section."""
    yield path, cls, lambda entry: entry
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        listed = typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0])
        inner = typing.get_args(tp)[0] if listed else tp
        if not dataclasses.is_dataclass(inner):
            continue
        for sub_path, sub_cls, place in _sections(inner, f"{path}.{field.name}{'[0]' if listed else ''}"):
            name = field.name
            yield (
                sub_path,
                sub_cls,
                (
                    lambda entry, place=place, name=name, listed=listed: {
                        name: [place(entry)] if listed else place(entry)
                    }
                ),
            )


SECTIONS = list(_sections())


def test_every_section_is_walked():
    assert {path for path, _, _ in SECTIONS} >= {
        "monitor_config",
        "monitor_config.alert_config",
        "monitor_config.alert_config.loss_spike",
        "monitor_config.alert_config.grad_norm_spike",
        "monitor_config.alert_config.step_time_regression",
        "monitor_config.alert_config.notifiers[0]",
        "monitor_config.otlp",
        "monitor_config.prometheus",
        "monitor_config.device_config",
        "monitor_config.log_rotation",
    }


@pytest.mark.parametrize("path, cls, place", SECTIONS, ids=[path for path, _, _ in SECTIONS])
def test_unknown_key_in_any_section_is_an_error_with_a_suggestion(workdir, path, cls, place):
    field = next(f.name for f in dataclasses.fields(cls) if len(f.name) > 3)
    typo = field[:-1] + field[-1].upper() + "x"
    with pytest.raises(ConfigError) as info:
        load_monitor_config(place({typo: 1}))
    assert f"{path}.{typo}: unknown key (did you mean {field!r}?)" in info.value.problems


def test_loading_creates_and_imports_nothing(workdir):
    """Parsing is pure: folders are made at run start, the custom monitor imported then."""
    sys.modules.pop("custom_monitor", None)
    cfg = load_monitor_config(ARTICLE_YAML)
    cfg = load_monitor_config(
        {
            "output_type": ["json_file", "tensorboard"],
            "json_log_path": "a/b/m.json",
            "tensorboard_path": "tb/x",
            "custom_monitor_callback": "no_such_module_xyz.Monitor",
        }
    )
    assert list(workdir.iterdir()) == []
    assert "custom_monitor" not in sys.modules and "no_such_module_xyz" not in sys.modules
    prepare_output_paths(cfg)
    assert (workdir / "a" / "b").is_dir() and (workdir / "tb" / "x" / "rank_0").is_dir()
    assert not (workdir / "a" / "b" / "m.json").exists()


def test_source_dir_is_set_from_code_only(tmp_path):
    assert load_monitor_config({"interval": 2}, source_dir=str(tmp_path)).source_dir == str(tmp_path)
    cfg = load_monitor_config({"interval": 2}).with_overrides(source_dir="/x", step_interval=4)
    assert (cfg.source_dir, cfg.interval) == ("/x", 4)
    assert cfg.validate() is cfg


def test_the_yaml_folder_a_mindformers_section_carries_gives_way_to_a_source_dir_from_code():
    """MindFormers' YAML reader notes the file's folder in its section (`YAML_FOLDER_KEY`, not a
    key of ours): the custom monitor is looked for there, unless code names the folder."""
    from otel_mindformers.config.loading import YAML_FOLDER_KEY

    section = {"custom_monitor_callback": "my_monitor.Monitor", YAML_FOLDER_KEY: "/yaml/folder"}
    assert parse_monitor_config(section).source_dir == "/yaml/folder"
    assert parse_monitor_config(section, source_dir="/from/code").source_dir == "/from/code"
    assert YAML_FOLDER_KEY in section  # the caller's section is left as it was


CLASS_ERRORS = [
    ("no_such_module_xyz.Monitor", "cannot import module 'no_such_module_xyz'"),
    ("json.NoSuchClass", "module 'json' has no class 'NoSuchClass'"),
    ("json.JSONDecoder", "'json.JSONDecoder' is not a subclass of otel_mindformers.BaseMonitor"),
]


@pytest.mark.parametrize("dotted, message", CLASS_ERRORS)
def test_custom_monitor_class_is_checked_when_loaded(workdir, dotted, message):
    cfg = load_monitor_config({"custom_monitor_callback": dotted})
    with pytest.raises(ConfigError, match="monitor_config.custom_monitor_callback: " + re.escape(message)):
        load_monitor_class(cfg)


def test_the_articles_base_class_import_is_answered_with_ours(workdir):
    """The article's custom monitor imports `mindformers.monitor`, which MindFormers lacks."""
    (workdir / "article_monitor.py").write_text(
        "from mindformers.monitor import BaseMonitor\n\nclass CustomMetricMonitor(BaseMonitor):\n    pass\n"
    )
    cfg = load_monitor_config({"custom_monitor_callback": "article_monitor.CustomMetricMonitor"})
    with pytest.raises(ConfigError) as raised:
        load_monitor_class(cfg)
    assert str(raised.value) == (
        "monitor_config.custom_monitor_callback: cannot import module 'article_monitor' "
        "(ModuleNotFoundError: No module named 'mindformers.monitor'); "
        "write `from otel_mindformers import BaseMonitor` there (docs/custom_monitors.md)"
    )


def test_custom_monitor_beside_the_yaml_is_found(workdir):
    assert load_monitor_class(load_monitor_config(ARTICLE_YAML)).__name__ == "CustomMetricMonitor"


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("monitor_config: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_monitor_config(path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read config file '.*nope.yaml'"):
        load_monitor_config(tmp_path / "nope.yaml")


@pytest.mark.slow  # a real training run
def test_a_path_under_home_is_written_where_the_user_meant(workdir, monkeypatch):
    """`~/...` in the YAML is the home folder, as in a shell; not a folder named `~` here."""
    from otel_mindformers import MonitorCallback
    from tests.support import training
    from tests.support.jsonl import json_lines

    home = workdir / "home"
    monkeypatch.setenv("HOME", str(home))
    path = workdir / "monitor.yaml"
    path.write_text(
        "monitor_config:\n  interval: 2\n  output_type: [json_file, tensorboard]\n"
        "  json_log_path: ~/runs/m.json\n  tensorboard_path: ~/runs/tb\n"
    )
    training.train([MonitorCallback(load_monitor_config(path))], steps=4)

    assert [line["step"] for line in json_lines(home / "runs" / "m.json")] == [1, 2, 4]
    assert list((home / "runs" / "tb").rglob("events.out.tfevents.*"))
    assert not (workdir / "~").exists()


def test_defaults_are_usable_without_a_file(workdir):
    cfg = load_monitor_config(None)
    assert isinstance(cfg, MonitorConfig) and cfg.enable and cfg.interval == 10


@pytest.mark.slow
def test_cli_validate_ok_and_error(tmp_path):
    ok = cli("validate", str(ARTICLE_YAML), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "valid; monitoring enabled, every 10 steps" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        textwrap.dedent("""
        monitor_config:
          enable: True
          interval: -2
    """)
    )
    result = cli("validate", str(bad), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == "invalid: monitor_config.interval: must be >= 1, got -2"


def test_cli_validate_says_what_the_run_would_warn_about_and_lists_outputs_once(tmp_path, capsys):
    path = tmp_path / "quiet.yaml"
    path.write_text("monitor_config:\n  output_type: [stdout, stdout]\n  alert_config:\n    loss_threshold: 8\n")
    assert cli_main(["validate", str(path)]) == 0
    said = capsys.readouterr()
    assert said.out.strip().endswith("outputs: stdout")
    assert (
        said.err.strip() == "warning: alert_config.loss_threshold has no effect while alert_config.enable_alert is off"
    )
    path.write_text("monitor_config:\n  output_type: []\n")
    assert cli_main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith("outputs: none")


@pytest.mark.parametrize(
    ("entry", "said", "code"),
    [
        (
            "instrumentation/development: {python: {mindformers: {interval: 5, output_type: [json_file]}}}\n",
            "valid; an OTEL_CONFIG_FILE, its monitor configuration: monitoring enabled, every 5 steps, outputs: json_file",
            0,
        ),
        (
            "instrumentation/development: {python: {mindformers: {enabled: false, interval: 5}}}\n",
            "valid; an OTEL_CONFIG_FILE, its monitor configuration: monitoring disabled (enable: false), every 5 steps",
            0,
        ),
        (  # the custom monitor beside the file, found from another working directory
            "instrumentation/development: {python: {mindformers: {custom_monitor_callback: beside_otel.Mine}}}\n",
            "valid; an OTEL_CONFIG_FILE, its monitor configuration: monitoring enabled",
            0,
        ),
        (
            "instrumentation/development: {python: {mindformers: {intervl: 5}}}\n",
            "invalid: instrumentation/development.python.mindformers.intervl: unknown key (did you mean 'interval'?)",
            1,
        ),
        (
            "tracer_provider: {processors: [{batch: {exporter: {otlp_grpc: {endpointt: x}}}}]}\n",
            "Additional properties are not allowed ('endpointt' was unexpected)",
            1,
        ),
    ],
)
def test_cli_validate_checks_an_otel_config_file_as_a_run_would_load_it(
    tmp_path, capsys, monkeypatch, entry, said, code
):
    """The file OTEL_CONFIG_FILE names refuses every rank's training when it or its
    `mindformers` entry is bad: `validate` checks it beforehand. It said "no monitor_config
    section" and exited 1 on every such file, good or bad."""
    path = tmp_path / "otel.yaml"
    path.write_text('file_format: "1.0"\n' + entry)
    (tmp_path / "beside_otel.py").write_text(
        "from otel_mindformers import BaseMonitor\n\nclass Mine(BaseMonitor):\n    pass\n"
    )
    monkeypatch.chdir(tmp_path.parent)
    assert cli_main(["validate", str(path)]) == code
    out = capsys.readouterr()
    assert said in (out.out if code == 0 else out.err), out


# --- configuration users already have: MindFormers YAMLs ------------------------------------


def _mindformers_yaml(tmp_path, enable, monitor_on):
    document = yaml.safe_load(MINDFORMERS_YAML.read_text())
    document["monitor_config"].update({"enable": enable, "monitor_on": monitor_on, "output_type": ["stdout"]})
    document["monitor_config"].pop("custom_monitor_callback")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.slow  # `otel-mindformers validate` in a child process
@pytest.mark.parametrize("enable, monitor_on", [(True, True), (True, False), (False, True)])
def test_enable_beside_monitor_on_works_everywhere_and_enable_wins(workdir, monkeypatch, enable, monitor_on):
    """`monitor_on` is MindFormers' switch for its TrainingStateMonitor: beside `enable` it is
    left to MindFormers, and `enable` configures us."""
    path = _mindformers_yaml(workdir, enable, monitor_on)
    monkeypatch.setenv("OTEL_PYTHON_MINDFORMERS_CONFIG", str(path))
    for cfg in (
        load_monitor_config(path),
        _config_from_environment(),
        load_monitor_config(yaml.safe_load(path.read_text())),
    ):
        assert cfg.enable is enable
        assert cfg.mindformers_native["monitor_on"] is monitor_on
    result = cli("validate", str(path), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert ("monitoring enabled" if enable else "monitoring disabled") in result.stdout


@pytest.mark.slow  # `otel-mindformers validate` in a child process
def test_shipped_mindformers_yaml_validates(tmp_path):
    result = cli("validate", str(MINDFORMERS_YAML), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == [], "validate creates nothing"


@pytest.mark.slow  # `otel-mindformers validate` in a child process
def test_training_yaml_without_the_section_says_it_is_missing(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("seed: 0\nrunner_config: {epochs: 1}\ncallbacks:\n  - type: MFLossMonitor\n")
    result = cli("validate", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"invalid: {path}: no monitor_config section (its top-level keys: callbacks, runner_config, seed)"
    )


@pytest.mark.slow
def test_cli_validate_reports_every_problem_at_once(tmp_path):
    path = tmp_path / "bad.yaml"
    (tmp_path / "a_dir.json").mkdir()
    path.write_text(
        textwrap.dedent("""
        monitor_config:
          intervall: 3
          alert_config: {loss_treshold: 1}
          prometheus: {hots: 127.0.0.1}
    """)
    )
    result = cli("validate", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "invalid: monitor_config.intervall: unknown key (did you mean 'interval'?)",
        "invalid: monitor_config.alert_config.loss_treshold: unknown key (did you mean 'loss_threshold'?)",
        "invalid: monitor_config.prometheus.hots: unknown key (did you mean 'host'?)",
    ]
    path.write_text(
        textwrap.dedent("""
        monitor_config:
          output_type: [json_file]
          json_log_path: a_dir.json
          custom_monitor_callback: json.JSONDecoder
    """)
    )
    result = cli("validate", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "invalid: monitor_config.json_log_path: 'a_dir.json' is a directory; name a file",
        "invalid: monitor_config.custom_monitor_callback: 'json.JSONDecoder' is not a subclass of "
        "otel_mindformers.BaseMonitor",
    ]


# --- output paths: checked without creating anything, created at run start -----------------


def _unusable_json_path(kind: str, root: Path) -> Path:
    if kind == "directory":
        (root / "out.json").mkdir()
    elif kind == "fifo":
        os.mkfifo(root / "out.json")
    elif kind == "read-only file":
        (root / "out.json").write_text("")
        (root / "out.json").chmod(0o444)
    elif kind == "under a file":
        (root / "file").write_text("")
        return root / "file" / "sub" / "out.json"
    elif kind == "read-only folder":
        (root / "ro").mkdir()
        (root / "ro").chmod(0o555)
        return root / "ro" / "new" / "out.json"
    elif kind == "dangling link":  # exists() is False for it, yet open() and mkdir() fail
        (root / "out.json").symlink_to(root / "gone" / "out.json")
    elif kind == "under a dangling link":
        (root / "logs").symlink_to(root / "unmounted")
        return root / "logs" / "out.json"
    return root / "out.json"


PATH_PROBLEMS = {
    "directory": "is a directory; name a file",
    "fifo": "is not a regular file (a FIFO, socket or device)",
    "read-only file": "is not writable",
    "under a file": "is not a directory",
    "read-only folder": "is not writable",
    "dangling link": "is a symbolic link to",
    "under a dangling link": "is a symbolic link to",
}


def _check_as_nobody(cfg: MonitorConfig) -> list[str]:
    """Root writes through file permissions: the read-only cases are checked by a forked
    child that has become user `nobody`."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, check, report, exit without cleanup
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, "\n".join(check_output_paths(cfg)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        problems = pipe.read().splitlines()
    os.waitpid(pid, 0)
    return problems


@pytest.mark.parametrize(
    "kind",
    # Root checks the read-only cases in a forked child that has become `nobody`.
    [pytest.param(kind, marks=pytest.mark.slow) if kind.startswith("read-only") else kind for kind in PATH_PROBLEMS],
)
def test_unusable_json_log_path_is_named_before_training(workdir, kind):
    if os.geteuid() == 0 and kind.startswith("read-only"):
        # In a folder of its own right under the temporary folder, which `nobody` can reach
        # whatever mode another pytest session gives pytest's own folder meanwhile.
        with tempfile.TemporaryDirectory(prefix="otel-mindformers-nobody-") as folder:
            Path(folder).chmod(0o755)
            path = _unusable_json_path(kind, Path(folder))
            cfg = load_monitor_config({"output_type": ["json_file"], "json_log_path": str(path)})
            (problem,) = _check_as_nobody(cfg)
        assert problem.startswith("monitor_config.json_log_path: ") and PATH_PROBLEMS[kind] in problem
        return
    path = _unusable_json_path(kind, workdir)
    before = sorted(workdir.rglob("*"))
    cfg = load_monitor_config({"output_type": ["json_file"], "json_log_path": str(path)})
    (problem,) = check_output_paths(cfg)
    assert problem.startswith("monitor_config.json_log_path: ") and PATH_PROBLEMS[kind] in problem
    assert sorted(workdir.rglob("*")) == before, "checking creates nothing"
    with pytest.raises(ConfigError, match=re.escape(problem)):
        prepare_output_paths(cfg)  # a FIFO would otherwise block the JSON sink's open forever


def test_a_tensorboard_path_through_a_dangling_link_is_named(workdir):
    (workdir / "tb").symlink_to(workdir / "unmounted")
    cfg = load_monitor_config({"output_type": ["tensorboard"], "tensorboard_path": "tb"})
    (problem,) = check_output_paths(cfg)
    assert (
        problem
        == f"monitor_config.tensorboard_path: 'tb' is a symbolic link to {str(workdir / 'unmounted')!r}, which does not exist"
    )
    with pytest.raises(ConfigError, match=re.escape(problem)):
        prepare_output_paths(cfg)


def test_a_json_log_the_system_refuses_past_the_checks_is_named_at_run_start(workdir):
    # /proc passes the checks (a writable folder to root, whose access() ignores the mode
    # bits), but nothing can be created in it: the open itself fails.
    cfg = load_monitor_config({"output_type": ["stdout", "json_file"], "json_log_path": "/proc/train_metric.json"})
    identity = detect_identity()
    with pytest.raises(ConfigError, match=r"^monitor_config.json_log_path: cannot write '/proc/train_metric.json': "):
        build_sinks(cfg.outputs, identity, reports_training=True)


def test_tensorboard_path_that_is_a_file_is_named(workdir):
    (workdir / "tb").mkdir()
    (workdir / "tb" / "rank_0").write_text("")
    cfg = load_monitor_config({"output_type": ["tensorboard"], "tensorboard_path": "tb"})
    with pytest.raises(
        ConfigError, match=r"monitor_config.tensorboard_path: 'tb/rank_0' exists and is not a directory"
    ):
        prepare_output_paths(cfg)


def _sections(cls, path=()):
    """(YAML path, section class) of every nested section of `cls`."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            yield (*path, field.name), tp
            yield from _sections(tp, (*path, field.name))


def test_every_section_with_a_switch_takes_a_bool_for_it():
    """`logs: true` as the article writes its switches (`grad_monitor: True`): a section whose
    switch is `enable` (or its declared SWITCH, `alert_config.enable_alert`) reads a bool as
    that switch; a section without one still wants a mapping."""
    from otel_mindformers.config.coercion import switch_of

    switched = []
    for path, section in _sections(MonitorConfig):
        for value in (True, False):
            raw: dict = value
            for key in reversed(path):
                raw = {key: raw}
            switch = switch_of(section)
            if switch is None:
                with pytest.raises(ConfigError, match=rf"monitor_config\.{'.'.join(path)}: expected a mapping"):
                    parse_monitor_config(raw)
                continue
            parsed = parse_monitor_config(raw)
            for key in path:
                parsed = getattr(parsed, key)
            assert getattr(parsed, switch) is value, path
            switched.append(".".join(path))
    assert sorted(set(switched)) == [
        "alert_config",
        "alert_config.co_spike",
        "alert_config.grad_norm_spike",
        "alert_config.loss_spike",
        "alert_config.loss_spike_score",
        "alert_config.step_time_regression",
        "alert_config.throughput_drop",
        "logs",
        "restarts",
    ]
    assert parse_monitor_config(False).enable is False  # `monitor_config: false`


def test_logs_true_in_a_yaml_file(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("monitor_config:\n  logs: true\n  alert_config: {enable_alert: true, loss_spike: false}\n")
    config = load_monitor_config(str(path))
    assert config.logs.enable is True
    assert config.alert_config.enable_alert is True and config.alert_config.loss_spike.enable is False


def test_an_unquoted_number_as_job_id_is_the_job_named_by_it(tmp_path):
    config_file = tmp_path / "train.yaml"
    config_file.write_text("monitor_config:\n  enable: True\n  job_id: 12345\n")
    assert load_monitor_config(str(config_file)).job_id == "12345"


@pytest.mark.parametrize("value", ["job-1\nFindings\n  rank 7: holds the job back", "   ", "j" * 129])
def test_a_launcher_job_id_unfit_to_name_a_job_is_ignored_with_one_warning(value, caplog):
    from otel_mindformers.job import identity

    identity._refused_variables.clear()
    env = {"OTEL_MINDFORMERS_JOB_ID": value, "SLURM_JOB_ID": "4242"}
    with caplog.at_level("WARNING", logger="otel_mindformers"):
        assert identity.detect_identity(env).job_id == "4242"
        assert identity.detect_identity(env).job_id == "4242"
    (warning,) = [r.getMessage() for r in caplog.records if "job id" in r.getMessage()]
    assert "OTEL_MINDFORMERS_JOB_ID" in warning and "\n" not in warning
