"""`alert_config` parsing: the article's keys, per-rule settings, notifiers, secrets."""

import logging

import pytest

from otel_mindformers.config import ConfigError, load_monitor_config

SECRET_URL = "https://oapi.dingtalk.com/robot/send?access_token=tok-8c1f"
SECRET = "SEC-51b2e9"


def _alerts(section):
    return load_monitor_config({"output_type": [], "alert_config": section}).alert_config


def test_article_keys_keep_their_meaning():
    alerts = _alerts({"enable_alert": True, "loss_threshold": 8.0, "alert_interval": 50})
    assert (alerts.enable_alert, alerts.loss_threshold, alerts.alert_interval) == (True, 8.0, 50)


def test_per_rule_settings_parse():
    alerts = _alerts(
        {
            "loss_spike": {"zscore": 4, "window": 50, "warmup": 5},
            "grad_norm_spike": {"enable": False},
            "overflow_streak": 3,
            "step_time_regression": {"factor": 3.0},
            "stall_timeout": 120,
            "stop_after_anomalous_steps": 4,
        }
    )
    assert (alerts.loss_spike.zscore, alerts.loss_spike.window, alerts.loss_spike.warmup) == (4.0, 50, 5)
    assert alerts.grad_norm_spike.enable is False
    assert alerts.overflow_streak == 3
    assert alerts.step_time_regression.factor == 3.0
    assert alerts.stall_timeout == 120.0
    assert alerts.stop_after_anomalous_steps == 4


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ({"loss_threshold": -1.0}, "alert_config.loss_threshold", "-1.0"),
        ({"grad_norm_threshold": -0.5}, "alert_config.grad_norm_threshold", "-0.5"),
        ({"alert_interval": 0}, "alert_config.alert_interval", "0"),
        ({"stall_timeout": -3}, "alert_config.stall_timeout", "-3"),
        ({"loss_spike": {"window": 1}}, "alert_config.loss_spike.window", "1"),
        ({"notifiers": [{"type": "dingding", "url": "https://x"}]}, "alert_config.notifiers[0].type", "'dingding'"),
    ],
)
def test_bad_values_name_the_key_and_value(section, key, value):
    with pytest.raises(ConfigError) as info:
        _alerts(section)
    assert f"monitor_config.{key}" in str(info.value)
    assert value in str(info.value)


def test_unknown_notifier_type_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"did you mean 'dingtalk'"):
        _alerts({"notifiers": [{"type": "dingtalkk", "url": "https://x"}]})


@pytest.mark.parametrize(
    ("notifier", "message"),
    [
        ({"type": "slack"}, r"notifiers\[0\]\.url: required"),
        ({"url": "https://x"}, r"notifiers\[0\]\.type: required"),
        ({"type": "wecom", "url": "ftp://x"}, r"notifiers\[0\]\.url: expected an http"),
        ({"type": "slack", "url": "https://x", "secret": "s"}, r"notifiers\[0\]\.secret: 'slack'"),
    ],
)
def test_incomplete_notifiers_are_refused(notifier, message):
    with pytest.raises(ConfigError, match=message):
        _alerts({"notifiers": [notifier]})


def test_url_and_secret_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ROBOT_URL", SECRET_URL)
    monkeypatch.setenv("ROBOT_SECRET", SECRET)
    alerts = _alerts({"notifiers": [{"type": "dingtalk", "url": "${ROBOT_URL}", "secret": "${ROBOT_SECRET}"}]})
    assert (alerts.notifiers[0].url, alerts.notifiers[0].secret) == (SECRET_URL, SECRET)


def test_unset_variable_is_named(monkeypatch):
    monkeypatch.delenv("NO_SUCH_ROBOT", raising=False)
    with pytest.raises(ConfigError, match=r"notifiers\[0\]\.url: environment variable 'NO_SUCH_ROBOT' is not set"):
        _alerts({"notifiers": [{"type": "feishu", "url": "${NO_SUCH_ROBOT}"}]})


def test_secrets_stay_out_of_repr_errors_and_logs(caplog):
    caplog.set_level(logging.DEBUG)
    config = load_monitor_config(
        {"output_type": [], "alert_config": {"notifiers": [{"type": "dingtalk", "url": SECRET_URL, "secret": SECRET}]}}
    )
    shown = repr(config) + str(config) + caplog.text
    assert "tok-8c1f" not in shown and SECRET not in shown
    assert "dingtalk" in repr(config)
    with pytest.raises(ConfigError) as info:
        _alerts({"notifiers": [{"type": "wecom", "url": "gopher://tok-8c1f"}]})
    assert "tok-8c1f" not in str(info.value)


def test_validate_after_assignment_keeps_notifiers():
    config = load_monitor_config(
        {"output_type": [], "alert_config": {"notifiers": [{"type": "slack", "url": "https://hooks.example/T1"}]}}
    )
    config.alert_config.loss_threshold = 3.0
    assert config.validate().alert_config.notifiers[0].url == "https://hooks.example/T1"
    config.alert_config.loss_threshold = -3.0
    with pytest.raises(ConfigError, match="alert_config.loss_threshold"):
        config.validate()


def test_a_single_notifier_mapping_means_a_list_of_one():
    alerts = _alerts({"notifiers": {"type": "slack", "url": "https://hooks.example/T1/secret-path"}})
    assert [n.type for n in alerts.notifiers] == ["slack"]


def test_secret_of_the_wrong_type_is_not_echoed():
    with pytest.raises(ConfigError) as info:
        _alerts({"notifiers": [{"type": "dingtalk", "url": "https://x", "secret": 9876543210}]})
    assert "notifiers[0].secret" in str(info.value) and "9876543210" not in str(info.value)
