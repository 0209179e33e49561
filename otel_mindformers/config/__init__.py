"""`monitor_config`: the schema (schema.py), parsing by type (coercion.py), value rules
(checks.py), the hardened YAML reader (yaml_loader.py) and loading (loading.py); the
optional packages each output needs (extras.py) and secret redaction (redaction.py)."""

from otel_mindformers.config.errors import ConfigError
from otel_mindformers.config.limits import OTLP_PROTOCOLS
from otel_mindformers.config.loading import load_monitor_config, parse_monitor_config
from otel_mindformers.config.schema import (
    AlertConfig,
    DeviceConfig,
    GradNorm,
    LogRotationConfig,
    LogsConfig,
    MonitorConfig,
    NotifierConfig,
    OtlpConfig,
    OutputsConfig,
    PrometheusConfig,
    RestartsConfig,
    SpikeRuleConfig,
    StepTimeRuleConfig,
    TelemetryConfig,
)

__all__ = [
    "AlertConfig",
    "ConfigError",
    "DeviceConfig",
    "GradNorm",
    "LogRotationConfig",
    "LogsConfig",
    "RestartsConfig",
    "MonitorConfig",
    "NotifierConfig",
    "OTLP_PROTOCOLS",
    "OtlpConfig",
    "OutputsConfig",
    "PrometheusConfig",
    "SpikeRuleConfig",
    "StepTimeRuleConfig",
    "TelemetryConfig",
    "load_monitor_config",
    "parse_monitor_config",
]
