"""monitor_config loading: the article's keys, aliases, assignment, and one clear error per problem."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otel_mindformers import ConfigError, MonitorConfig, load_monitor_config

REPO = Path(__file__).resolve().parent.parent
ARTICLE_YAML = REPO / "examples" / "train_config.yaml"


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


def test_file_that_is_the_section_itself(tmp_path):
    path = tmp_path / "monitor.yaml"
    path.write_text("interval: 3\noutput_type: stdout\n")
    cfg = load_monitor_config(path)
    assert (cfg.interval, cfg.output_type) == (3, ["stdout"])


def test_mindformers_native_keys_are_aliases_and_kept(tmp_path):
    cfg = load_monitor_config(
        {"monitor_config": {"monitor_on": True, "step_interval": 4, "dump_path": "./dump",
                            "local_loss_format": None, "output_type": ["stdout"]}}
    )
    assert cfg.enable is True and cfg.interval == 4
    assert cfg.mindformers_native == {"dump_path": "./dump", "local_loss_format": None}


def test_otlp_settings_default_to_standard_env(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
    cfg = load_monitor_config({"output_type": ["otlp"]})
    assert cfg.otlp.resolved_protocol() == "http/protobuf"
    assert cfg.otlp.resolved_export_interval() == 2.5
    cfg = load_monitor_config({"otlp": {"protocol": "grpc", "export_interval": 1,
                                        "headers": "api-key=abc,tenant=t1"}})
    assert cfg.otlp.resolved_protocol() == "grpc"
    assert cfg.otlp.headers == {"api-key": "abc", "tenant": "t1"}


BAD_CONFIGS = [
    ({"intervall": 3}, "monitor_config.intervall: unknown key (did you mean 'interval'?)"),
    ({"interval": 0}, "monitor_config.interval: must be >= 1, got 0"),
    ({"interval": "10"}, "monitor_config.interval: expected an integer, got '10'"),
    ({"enable": "yes"}, "monitor_config.enable: expected true or false, got 'yes'"),
    ({"output_type": ["stdout", "jsonfile"]}, "unknown value 'jsonfile' (did you mean 'json_file'?)"),
    ({"monitored_metrics": ["los"]}, "monitor_config.monitored_metrics: unknown value 'los' (did you mean 'loss'?)"),
    ({"alert_config": {"loss_treshold": 1}}, "monitor_config.alert_config.loss_treshold: unknown key (did you mean 'loss_threshold'?)"),
    ({"alert_config": []}, "monitor_config.alert_config: expected a mapping"),
    ({"otlp": {"protocol": "udp"}}, "monitor_config.otlp.protocol: unknown value 'udp'"),
    ({"report_ranks": [-1]}, "monitor_config.report_ranks: expected 'all' or a list of ranks"),
    ({"custom_monitor_callback": "nomodule"}, "monitor_config.custom_monitor_callback: expected 'module.ClassName', got 'nomodule'"),
    ({"custom_monitor_callback": "no_such_module_xyz.Monitor"}, "cannot import module 'no_such_module_xyz'"),
    ({"custom_monitor_callback": "json.NoSuchClass"}, "module 'json' has no class 'NoSuchClass'"),
    ({"output_type": ["json_file"], "json_log_path": "/proc/no/such/m.json"}, "monitor_config.json_log_path: cannot create directory '/proc/no/such'"),
    ({"output_type": ["tensorboard"], "tensorboard_path": "/proc/tb"}, "monitor_config.tensorboard_path: cannot create directory '/proc/tb'"),
]


@pytest.mark.parametrize("section, message", BAD_CONFIGS, ids=[m[:40] for _, m in BAD_CONFIGS])
def test_bad_config_gives_one_clear_error(section, message, workdir):
    with pytest.raises(ConfigError) as info:
        load_monitor_config({"monitor_config": section})
    assert message in str(info.value)


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("monitor_config: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_monitor_config(path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read config file '.*nope.yaml'"):
        load_monitor_config(tmp_path / "nope.yaml")


def test_defaults_are_usable_without_a_file(workdir):
    cfg = load_monitor_config(None)
    assert isinstance(cfg, MonitorConfig) and cfg.enable and cfg.interval == 10


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "otel_mindformers.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_cli_validate_ok_and_error(tmp_path):
    ok = _cli("validate", str(ARTICLE_YAML), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "valid; monitoring enabled, every 10 steps" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""
        monitor_config:
          enable: True
          interval: -2
    """))
    result = _cli("validate", str(bad), cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == "invalid: monitor_config.interval: must be >= 1, got -2"
