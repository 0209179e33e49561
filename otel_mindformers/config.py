"""`monitor_config`: parse, validate and default the YAML section.

Each section is a dataclass, so `cfg.alert_config.loss_threshold` and
`cfg.grad_monitor = False` work as the article writes them. Parsing is driven by the
dataclass fields' types; a field's metadata may add `aliases` (MindFormers' native names),
a `check` callable for value rules, and `secret` (never shown, whitespace stripped).
Every problem names the dotted key; one `ConfigError` lists all of a file's problems.

Parsing is pure: it reads the YAML and the environment (`${VAR}`), and creates or imports
nothing. Output folders are created at run start (`outputs.paths.prepare_output_paths`), the
custom monitor class imported then too (`monitor.load_monitor_class`).
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
import types
import typing
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Union

import yaml

from otel_mindformers.training_metrics import KNOWN_METRICS

OUTPUT_TYPES = ("stdout", "json_file", "tensorboard", "otlp", "prometheus")
OTLP_PROTOCOLS = ("grpc", "http/protobuf", "http/json")
OTLP_TEMPORALITIES = ("cumulative", "delta")
DEVICE_SOURCES = ("auto", "ascend", "nvidia", "host", "mindspore")
NOTIFIER_TYPES = ("webhook", "wecom", "dingtalk", "feishu", "slack")
# Platforms whose robots verify an HMAC signature made with a per-robot secret.
SIGNED_NOTIFIER_TYPES = ("dingtalk", "feishu")

# Bounds on what a configuration file may make the loader do (a hostile or broken YAML
# answers with a ConfigError, not minutes of CPU and gigabytes of memory).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_YAML_NODES = 100_000  # values in the document, counting every expansion of an alias
MAX_NESTING = 64
# Durations reach threading and socket timeouts; past a day a value is a mistake (1e12
# overflows `threading.TIMEOUT_MAX` and raised at the end of training).
MAX_SECONDS = 86_400.0
# Integers reach C sizes (deque lengths, ranges): a Py_ssize_t holds them.
MAX_INTEGER = 2**63 - 1

# MindFormers' own `monitor_config` keys. They configure MindFormers' TrainingStateMonitor,
# not us: accepted so one section serves both, and kept untouched in `mindformers_native`.
MINDFORMERS_NATIVE_KEYS = frozenset(
    {
        "dump_path",
        "target",
        "invert",
        "local_loss_format",
        "device_local_loss_format",
        "local_norm_format",
        "device_local_norm_format",
        "optimizer_state_format",
        "weight_state_format",
        "max_attention_logit_format",
        "throughput_baseline",
        "print_struct",
        "check_for_global_norm",
        "global_norm_spike_threshold",
        "global_norm_spike_count_threshold",
        "stable_rank_config",
        "health_checkpoint",
    }
)


class ConfigError(ValueError):
    """Invalid monitor configuration. Each of `problems` names a key and what is wrong with
    it; the message is the one problem, or all of them, one per line."""

    def __init__(self, *problems: str) -> None:
        self.problems = list(problems) or ["invalid monitor configuration"]
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems:\n" + "\n".join(f"  {p}" for p in self.problems)
        super().__init__(message)


def _key(*, default: Any = dataclasses.MISSING, aliases: tuple[str, ...] = (),
         check: Callable[[str, Any], None] | None = None, factory: Any = dataclasses.MISSING,
         secret: bool = False, url: bool = False):
    """`secret=True`: a token (a webhook URL, a header, a signing key). It is left out of the
    config's repr and of every message, and stripped of surrounding whitespace (what
    `$(cat file)` leaves: a trailing newline). `url=True`: shown without its credentials."""
    metadata = {"aliases": aliases, "check": check, "secret": secret, "url": url}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# --- redaction -----------------------------------------------------------------------------

def redact_url(url: str) -> str:
    """`url` without what carries a credential: user info, query and fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    userinfo = "***@" if "@" in parts.netloc else ""
    query = "?***" if parts.query else ""
    fragment = "#***" if parts.fragment else ""
    return urllib.parse.urlunsplit((parts.scheme, f"{userinfo}{host}{port}", parts.path, "", "")) + query + fragment


class _Section:
    """A repr that shows no secret field, and URLs (`otlp.endpoint`) without credentials."""

    def __repr__(self) -> str:
        shown = []
        for field in dataclasses.fields(self):
            if field.metadata.get("secret"):
                continue
            value = getattr(self, field.name)
            if field.metadata.get("url") and isinstance(value, str):
                value = redact_url(value)
            shown.append(f"{field.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


# --- value checks ------------------------------------------------------------------------

def _at_least(minimum: float, maximum: float | None = None) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if value is not None and value < minimum:
            raise ConfigError(f"{key}: must be >= {minimum}, got {value!r}")
        if value is not None and maximum is not None and value > maximum:
            raise ConfigError(f"{key}: must be <= {maximum}, got {value!r}")

    return check


def _seconds(minimum: float) -> Callable[[str, Any], None]:
    return _at_least(minimum, MAX_SECONDS)


def _one_of(allowed: tuple[str, ...]) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        values = value if isinstance(value, list) else [value]
        for item in values:
            if item is not None and item not in allowed:
                hint = _suggest(item, allowed)
                raise ConfigError(
                    f"{key}: unknown value {item!r}{hint}; allowed: {', '.join(allowed)}"
                )

    return check


def _between(low: int, high: int) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if not low <= value <= high:
            raise ConfigError(f"{key}: must be between {low} and {high}, got {value!r}")

    return check


def _check_step_spans(key: str, value: Any) -> None:
    if not isinstance(value, bool) and value < 1:
        raise ConfigError(f"{key}: expected true, false or a step count >= 1, got {value!r}")


def _check_report_ranks(key: str, value: Any) -> None:
    if value == "all":
        return
    if not isinstance(value, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in value
    ):
        raise ConfigError(f"{key}: expected 'all' or a list of ranks >= 0, got {value!r}")


def _check_dotted_path(key: str, value: Any) -> None:
    if value is not None and (
        "." not in value or not all(part.isidentifier() for part in value.split("."))
    ):
        raise ConfigError(f"{key}: expected 'module.ClassName', got {value!r}")


def _check_output_path(key: str, value: Any) -> None:
    """What can be told of a path without the file system (that is checked at run start)."""
    if not value.strip():
        raise ConfigError(f"{key}: must name a path, got {value!r}")
    if "\0" in value:
        raise ConfigError(f"{key}: contains a NUL character")


def _check_file_path(key: str, value: Any) -> None:
    _check_output_path(key, value)
    if value.endswith(("/", os.sep)) or Path(value).name in ("", ".", ".."):
        raise ConfigError(f"{key}: must name a file, got the directory {value!r}")


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _check_host(key: str, value: Any) -> None:
    """An IP address or a host name (RFC 1123); resolving it is left to `validate`."""
    try:
        ipaddress.ip_address(value)
        return
    except ValueError:
        pass
    if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in value.rstrip(".").split(".")):
        raise ConfigError(f"{key}: expected an IP address or a host name, got {value!r}")


def _url_problem(url: str, schemes: tuple[str, ...]) -> str | None:
    """Why `url` cannot be used (None: it can). Never quotes the URL."""
    if any(ch.isspace() for ch in url):
        return "contains whitespace"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # raises on a port out of range or not a number
    except ValueError as exc:
        return f"does not parse as a URL ({str(exc).split(':')[0]})"
    if parts.scheme not in schemes:
        return f"expected an {' or '.join(s + '://' for s in schemes)} URL"
    if not parts.hostname:
        return "the URL names no host"
    return None


def _check_endpoint(key: str, value: Any) -> None:
    """`http(s)://host:port[/path]`, or `host:port` (gRPC); credentials in it stay unprinted."""
    if value is None:
        return
    url = value if "://" in value else f"http://{value}"
    problem = _url_problem(url, ("http", "https"))
    if problem:
        raise ConfigError(f"{key}: {problem} (value not shown)")


# Header names are HTTP tokens; values must not carry line breaks (they would end the header).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _check_headers(key: str, headers: dict[str, str]) -> None:
    for name, value in headers.items():
        if not _HEADER_NAME.match(name):
            raise ConfigError(f"{key}: {name!r} is not a valid header name")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ConfigError(f"{key}.{name}: contains a control character such as a line break (value not shown)")


def _check_notifiers(key: str, notifiers: list["NotifierConfig"]) -> None:
    # URLs and secrets carry tokens: messages name the key, never the value.
    problems = []
    for index, notifier in enumerate(notifiers):
        item = f"{key}[{index}]"
        if notifier.type is None:
            problems.append(f"{item}.type: required; one of {', '.join(NOTIFIER_TYPES)}")
        if not notifier.url:
            problems.append(f"{item}.url: required for a {notifier.type!r} notifier")
        else:
            problem = _url_problem(notifier.url, ("http", "https"))
            if problem:
                problems.append(f"{item}.url: {problem} (value not shown)")
        if notifier.secret is not None and any(ch.isspace() for ch in notifier.secret):
            problems.append(f"{item}.secret: contains whitespace (value not shown)")
        if notifier.secret is not None and notifier.type not in SIGNED_NOTIFIER_TYPES:
            problems.append(
                f"{item}.secret: {notifier.type!r} notifiers do not sign requests; "
                f"a secret is used by {', '.join(SIGNED_NOTIFIER_TYPES)}"
            )
    if problems:
        raise ConfigError(*problems)


# --- sections ------------------------------------------------------------------------------

@dataclasses.dataclass(repr=False)
class NotifierConfig(_Section):
    """One entry of `alert_config.notifiers`. `url` and `secret` may be `${VAR}` references."""

    type: Union[str, None] = _key(default=None, check=_one_of(NOTIFIER_TYPES))
    url: Union[str, None] = _key(default=None, secret=True)
    secret: Union[str, None] = _key(default=None, secret=True)


@dataclasses.dataclass(repr=False)
class SpikeRuleConfig(_Section):
    """A value more than `zscore` robust standard deviations above its rolling median."""

    enable: bool = _key(default=True)
    zscore: float = _key(default=6.0, check=_at_least(0.0))
    window: int = _key(default=100, check=_at_least(3, 1_000_000))
    warmup: int = _key(default=20, check=_at_least(1))


@dataclasses.dataclass(repr=False)
class StepTimeRuleConfig(_Section):
    """Step time more than `factor` times its rolling median."""

    enable: bool = _key(default=True)
    factor: float = _key(default=2.0, check=_at_least(1.0))
    window: int = _key(default=100, check=_at_least(3, 1_000_000))
    warmup: int = _key(default=20, check=_at_least(1))


@dataclasses.dataclass(repr=False)
class AlertConfig(_Section):
    """`monitor_config.alert_config`: in-process anomaly rules (see docs/alerts.md).

    The article's keys keep their meaning: `loss_threshold` fires on loss above it and
    `alert_interval` is the minimum number of steps between two notifications of one rule.
    Counts of "steps" in rules (warm-up, windows, streaks) are sampled steps.
    """

    enable_alert: bool = _key(default=False)
    loss_threshold: Union[float, None] = _key(default=None, check=_at_least(0.0))
    alert_interval: int = _key(default=50, check=_at_least(1))
    grad_norm_threshold: Union[float, None] = _key(default=None, check=_at_least(0.0))
    nonfinite: bool = _key(default=True)
    loss_spike: SpikeRuleConfig = _key(factory=SpikeRuleConfig)
    grad_norm_spike: SpikeRuleConfig = _key(factory=SpikeRuleConfig)
    overflow_streak: Union[int, None] = _key(default=10, check=_at_least(1))
    step_time_regression: StepTimeRuleConfig = _key(factory=StepTimeRuleConfig)
    stall_timeout: Union[float, None] = _key(default=1800.0, check=_seconds(0.001))
    stop_on_nonfinite: bool = _key(default=True)
    stop_after_anomalous_steps: Union[int, None] = _key(default=None, check=_at_least(1))
    notify_timeout: float = _key(default=5.0, check=_seconds(0.001))
    notify_retries: int = _key(default=2, check=_at_least(0, 100))
    notifiers: list[NotifierConfig] = _key(factory=list, check=_check_notifiers)
    # A notice when the run ends (completed / stopped early / crashed), see docs/alerts.md.
    notify_run_end: bool = _key(default=False)


@dataclasses.dataclass(repr=False)
class OtlpConfig(_Section):
    """`monitor_config.otlp`. Unset values fall back to the standard OTEL_EXPORTER_OTLP_* variables."""

    endpoint: Union[str, None] = _key(default=None, check=_check_endpoint, url=True)
    protocol: Union[str, None] = _key(default=None, check=_one_of(OTLP_PROTOCOLS))
    headers: dict[str, str] = _key(factory=dict, check=_check_headers, secret=True)
    timeout: Union[float, None] = _key(default=None, check=_seconds(0.001))
    export_interval: Union[float, None] = _key(default=None, check=_seconds(0.01))
    insecure: Union[bool, None] = _key(default=None)
    # None: OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE decides (cumulative by default).
    temporality: Union[str, None] = _key(default=None, check=_one_of(OTLP_TEMPORALITIES))

    def resolved_protocol(self) -> str:
        return (
            self.protocol
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc"
        )

    def resolved_export_interval(self) -> float:
        """Seconds between metric exports (OTEL_METRIC_EXPORT_INTERVAL is in ms)."""
        if self.export_interval is not None:
            return self.export_interval
        return float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "10000")) / 1000.0


@dataclasses.dataclass(repr=False)
class PrometheusConfig(_Section):
    """`monitor_config.prometheus`: the scrape endpoint of the `prometheus` output."""

    host: str = _key(default="127.0.0.1", check=_check_host)
    port: int = _key(default=9464, check=_between(0, 65535))


@dataclasses.dataclass(repr=False)
class LogRotationConfig(_Section):
    """`monitor_config.log_rotation`: bound what a long run leaves on disk.

    `json_file` rolls over before a line would take it past `max_bytes`, keeping
    `file.json.1` (newest) … `file.json.N` (oldest), as logging's RotatingFileHandler names
    them. TensorBoard keeps at most `tensorboard_max_files` event files per rank folder,
    starting a new one past `max_bytes`. 0 means unbounded.
    """

    max_bytes: int = _key(default=0, check=_at_least(0))
    # Every rollover renames each backup: a bound keeps that loop short.
    backup_count: int = _key(default=5, check=_at_least(1, 1000))
    tensorboard_max_files: int = _key(default=0, check=_at_least(0))


@dataclasses.dataclass(repr=False)
class DeviceConfig(_Section):
    """`monitor_config.device_config`: what `device_monitor` reads, and how often (docs/devices.md).

    `sources: [auto]` reads the Ascend tools when `device_target` is Ascend or `npu-smi` is
    on PATH, NVML when it is GPU, MindSpore's allocator on either, and the host always.
    """

    poll_interval: float = _key(default=5.0, check=_seconds(0.1))
    command_timeout: float = _key(default=5.0, check=_seconds(0.1))
    npu_smi_path: str = _key(default="npu-smi", check=_check_output_path)
    sources: list[str] = _key(factory=lambda: ["auto"], check=_one_of(DEVICE_SOURCES))


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclasses.dataclass(repr=False)
class LogsConfig(_Section):
    """`monitor_config.logs`: Python logging shipped as OTel log records while a run goes on
    (otel_mindformers/logs.py). `enable` unset follows the standard
    OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED. At most `rate_limit_per_logger` records
    of one logger per `rate_limit_window` seconds are sent; `loggers` names (or prefixes of)
    loggers that do not propagate to the root logger, MindFormers' and MindSpore's by default.
    """

    enable: Union[bool, None] = _key(default=None)
    level: str = _key(default="INFO", check=_one_of(LOG_LEVELS))
    rate_limit_per_logger: int = _key(default=100, check=_at_least(1))
    rate_limit_window: float = _key(default=60.0, check=_seconds(0.001))
    loggers: list[str] = _key(factory=lambda: ["mindformers", "ME"])


@dataclasses.dataclass(frozen=True)
class TelemetryConfig:
    """`service_name`, `output_type`, `otlp` and `prometheus`, for the OTel providers."""

    service_name: Union[str, None]
    output_type: list[str]
    otlp: OtlpConfig
    prometheus: PrometheusConfig


@dataclasses.dataclass(frozen=True)
class OutputsConfig:
    """`output_type`, `json_log_path`, `tensorboard_path` and `log_rotation`, for the outputs."""

    output_type: list[str]
    json_log_path: str
    tensorboard_path: str
    log_rotation: LogRotationConfig


@dataclasses.dataclass(repr=False)
class MonitorConfig(_Section):
    """The `monitor_config` section. Field names are the YAML keys.

    `mindformers_native` and `source_dir` are not keys: the first collects MindFormers' own
    keys of the section, the second is the YAML file's folder (set by the loader, or in code
    through `load_monitor_config(..., source_dir=...)` / `with_overrides(source_dir=...)`).
    """

    enable: bool = _key(default=True, aliases=("monitor_on",))
    interval: int = _key(default=10, aliases=("step_interval",), check=_at_least(1))
    output_type: list[str] = _key(
        factory=lambda: ["stdout", "json_file"], check=_one_of(OUTPUT_TYPES)
    )
    tensorboard_path: str = _key(default="./output/tensorboard_log", check=_check_output_path)
    json_log_path: str = _key(default="./output/train_metric.json", check=_check_file_path)
    monitored_metrics: list[str] = _key(
        factory=lambda: list(KNOWN_METRICS), check=_one_of(KNOWN_METRICS)
    )
    # None (unset): report the global norm where the train network returns it, silently;
    # true: the user asked for it, so its absence is worth one warning; false: never.
    grad_monitor: Union[bool, None] = _key(default=None)
    device_monitor: bool = _key(default=False)
    alert_config: AlertConfig = _key(factory=AlertConfig)
    custom_monitor_callback: Union[str, None] = _key(default=None, check=_check_dotted_path)
    # Extensions beyond the article's keys.
    service_name: Union[str, None] = _key(default=None)
    report_ranks: Union[str, list[int]] = _key(factory=lambda: [0], check=_check_report_ranks)
    # `all_ranks`: every rank checks its own loss / grad norm on sampled steps and records its
    # first NaN/Inf (docs/hangs.md); `reporting_ranks`: only the ranks of `report_ranks`.
    nonfinite_check: str = _key(default="reporting_ranks", check=_one_of(("reporting_ranks", "all_ranks")))
    tokens_per_sample: Union[int, None] = _key(default=None, check=_at_least(1))
    # MFU (docs/time.md): the device's peak TFLOPS (default: the table for the detected
    # device) and the model's training FLOPs per token (default: from a MindFormers model config).
    peak_tflops: Union[float, None] = _key(default=None, check=_at_least(1e-6))
    flops_per_token: Union[float, None] = _key(default=None, check=_at_least(1.0))
    shutdown_timeout: float = _key(default=5.0, check=_seconds(0.0))
    # Which sampled steps get a span: true (all), false (none), or N (steps that are
    # multiples of N, plus the last and any with a NaN/Inf value).
    step_spans: Union[bool, int] = _key(default=True, check=_check_step_spans)
    otlp: OtlpConfig = _key(factory=OtlpConfig)
    prometheus: PrometheusConfig = _key(factory=PrometheusConfig)
    device_config: DeviceConfig = _key(factory=DeviceConfig)
    log_rotation: LogRotationConfig = _key(factory=LogRotationConfig)
    logs: LogsConfig = _key(factory=LogsConfig)
    mindformers_native: dict[str, Any] = _key(factory=dict)
    # Directory of the YAML file it came from: custom monitors may live beside it.
    source_dir: Union[str, None] = _key(default=None)

    def reports_training_metrics(self, rank: int) -> bool:
        """The article's policy: rank 0 reports training metrics unless configured otherwise."""
        return self.report_ranks == "all" or rank in self.report_ranks

    @property
    def telemetry(self) -> "TelemetryConfig":
        """What the OTel providers are built from: the service name, the `otlp` and
        `prometheus` outputs and their sections."""
        return TelemetryConfig(self.service_name, self.output_type, self.otlp, self.prometheus)

    @property
    def outputs(self) -> "OutputsConfig":
        """The local outputs' keys as one section (the article keeps them at the top level)."""
        return OutputsConfig(self.output_type, self.json_log_path, self.tensorboard_path, self.log_rotation)

    def validate(self) -> "MonitorConfig":
        """Re-check after attribute assignment (the article assigns in code before training)."""
        _parse_section(MonitorConfig, _keys_of(self), "monitor_config")
        return self

    def with_overrides(self, **overrides: Any) -> "MonitorConfig":
        """A validated copy with some keys replaced (`source_dir` may be one: this is code)."""
        source_dir = overrides.pop("source_dir", self.source_dir)
        aliases = {a: f.name for f in dataclasses.fields(self) for a in f.metadata.get("aliases", ())}
        overrides = {aliases.get(key, key): value for key, value in overrides.items()}
        config = _parse_section(MonitorConfig, {**_keys_of(self), **overrides}, "monitor_config")
        config.mindformers_native = {**self.mindformers_native, **config.mindformers_native}
        config.source_dir = source_dir
        return config


# --- parsing -------------------------------------------------------------------------------

# Fields that are not YAML keys (see MonitorConfig).
_INTERNAL_FIELDS = frozenset({"mindformers_native", "source_dir"})


def _keys_of(config: MonitorConfig) -> dict[str, Any]:
    """The config as the mapping of YAML keys it stands for."""
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in _INTERNAL_FIELDS}


def _suggest(name: str, candidates) -> str:
    match = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check `value` against the annotation `tp`, allowing the obvious widenings."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        errors = []
        for option in typing.get_args(tp):
            if option is type(None):
                continue
            try:
                return _coerce(key, option, value)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[-1] if len(errors) == 1 else ConfigError(
            f"{key}: expected {' or '.join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))}, "
            f"got {value!r}"
        )
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            value = dataclasses.asdict(value)
        return _parse_section(tp, value, key)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            value = [value]  # `output_type: stdout` means a list of one
        if isinstance(value, Mapping) and dataclasses.is_dataclass(item_tp):
            value = [value]  # `notifiers: {type: slack, url: ...}` too (and its URL stays unprinted)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        items, problems = [], []
        for i, item in enumerate(value):
            try:
                items.append(_coerce(f"{key}[{i}]", item_tp, item))
            except ConfigError as exc:
                problems += exc.problems
        if problems:
            raise ConfigError(*problems)
        return items
    if origin is dict:
        if isinstance(value, str):  # OTEL_EXPORTER_OTLP_HEADERS style "k=v,k2=v2"
            value = _parse_kv_list(key, value)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        _, value_tp = typing.get_args(tp)
        return {str(k): _coerce(f"{key}.{k}", value_tp, v) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > MAX_INTEGER:
                raise ConfigError(f"{key}: must be <= {MAX_INTEGER}, got {value!r}")
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(f"{key}: expected a finite number, got {value!r}") from None
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return _expand_variables(key, value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _expand_variables(key: str, value: str) -> str:
    """`${VAR}` → its value; an unset variable is an error, not a literal `${VAR}` sent on."""
    if "${" not in value:
        return value
    expanded = os.path.expandvars(value)
    missing = re.search(r"\$\{([^}]*)\}", expanded)
    if missing:
        raise ConfigError(f"{key}: environment variable {missing.group(1)!r} is not set")
    return expanded


def _parse_kv_list(key: str, text: str) -> dict[str, str]:
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, val = item.partition("=")
        if not sep:
            raise ConfigError(f"{key}: expected 'name=value' pairs, got an entry without '='")
        pairs[name.strip()] = val.strip()
    return pairs


def _strip_secret(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {k: _strip_secret(v) for k, v in value.items()}
    return value


def _hide_value(problem: str) -> str:
    """A secret never reaches a message: keep what was expected, drop what was given
    (every message that quotes a value ends in ", got <value>")."""
    head, sep, _ = problem.partition(", got ")
    return f"{head} (value not shown)" if sep else problem


def _parse_section(cls: type, raw: Any, path: str):
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        # The type only: a notifier written as a bare URL string must not be echoed.
        raise ConfigError(f"{path}: expected a mapping of keys, got a {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    alias_of = {a: f.name for f in fields.values() for a in f.metadata.get("aliases", ())}
    known = [name for name in fields if name not in _INTERNAL_FIELDS] + list(alias_of)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    native: dict[str, Any] = {}
    problems: list[str] = []
    for raw_key, value in raw.items():
        name = alias_of.get(raw_key, raw_key)
        key = f"{path}.{raw_key}"
        if raw_key in alias_of and name in raw:
            # `monitor_on` beside `enable` (or `step_interval` beside `interval`): ours
            # configures us, MindFormers' own configures its TrainingStateMonitor.
            native[raw_key] = value
            continue
        if name not in fields or name in _INTERNAL_FIELDS:
            if cls is MonitorConfig and raw_key in MINDFORMERS_NATIVE_KEYS:
                native[raw_key] = value
                continue
            problems.append(f"{key}: unknown key{_suggest(raw_key, known)}")
            continue
        field = fields[name]
        try:
            coerced = _coerce(key, hints[name], value)
            if field.metadata.get("secret"):
                coerced = _strip_secret(coerced)
            check = field.metadata.get("check")
            if check is not None:
                check(key, coerced)
        except ConfigError as exc:
            hide = field.metadata.get("secret") or field.metadata.get("url")
            problems += [_hide_value(p) for p in exc.problems] if hide else exc.problems
            continue
        values[name] = coerced
    if problems:
        raise ConfigError(*problems)
    if native:
        values["mindformers_native"] = native
    return cls(**values)


def parse_monitor_config(section: Mapping[str, Any] | None, source_dir: str | None = None) -> MonitorConfig:
    """Validate a `monitor_config` mapping (already extracted from its YAML file)."""
    config = _parse_section(MonitorConfig, _plain(section, "monitor_config"), "monitor_config")
    config.source_dir = source_dir
    return config


# --- reading ---------------------------------------------------------------------------------

# libyaml when it is there: the pure-Python parser takes minutes over a file of megabytes.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> Any:
    """The document in `path`, read within the bounds above, with no duplicate key."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; not read as a configuration")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: not UTF-8 (byte {exc.start})") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node_graph(path, node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        # The problem and its position only: the parser's excerpt of the line could show a secret.
        where = getattr(exc, "problem_mark", None)
        position = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML{position}: {problem}") from None
    finally:
        loader.dispose()


def _check_node_graph(path: Path, root: yaml.Node) -> None:
    """Before anything is built from the document: no nesting past MAX_NESTING, no more than
    MAX_YAML_NODES values once aliases are expanded (an "alias bomb" of a few lines stands
    for billions), and no key given twice in one mapping (PyYAML keeps the last silently)."""
    expanded: dict[int, int] = {}  # node id → its size with aliases expanded
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        if depth > MAX_NESTING:
            raise ConfigError(f"{path}: nested more than {MAX_NESTING} levels deep at line {node.start_mark.line + 1}")
        children = _children(node)
        if children_done:
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child in children)
            if expanded[id(node)] > MAX_YAML_NODES:
                raise ConfigError(
                    f"{path}: more than {MAX_YAML_NODES} values once its aliases are expanded "
                    f"(line {node.start_mark.line + 1}); not read as a configuration"
                )
            continue
        if id(node) in expanded:
            continue  # an alias of a node already measured
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(path, node)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children if id(child) not in expanded)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _refuse_duplicate_keys(path: Path, node: yaml.MappingNode) -> None:
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in seen:
            raise ConfigError(
                f"{path}: line {line}: key {key_node.value!r} given twice in one mapping "
                f"(first at line {seen[key_node.value]}); remove one"
            )
        seen[key_node.value] = line


def _own_keys() -> frozenset[str]:
    fields = dataclasses.fields(MonitorConfig)
    return frozenset(f.name for f in fields if f.name not in _INTERNAL_FIELDS) | frozenset(
        alias for f in fields for alias in f.metadata.get("aliases", ())
    )


def _section_from_yaml(path: Path) -> Mapping[str, Any] | None:
    document = _read_yaml(path)
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(document).__name__}")
    if "monitor_config" in document:
        return document["monitor_config"]
    if document and not _own_keys() & {k for k in document if isinstance(k, str)}:
        # A training YAML without the section, not a section with only unknown keys.
        top = ", ".join(sorted(str(k) for k in document)[:8])
        raise ConfigError(f"{path}: no monitor_config section (its top-level keys: {top})")
    return document  # the file is the section itself


def load_monitor_config(source: Any = None, *, source_dir: str | None = None) -> MonitorConfig:
    """Load and validate a monitor configuration; nothing is created or imported.

    `source` may be a YAML path (a file with a top-level `monitor_config:` section, or a file
    that is the section itself), a mapping, a MindFormers `MindFormerConfig` (or its
    `monitor_config` entry), an existing `MonitorConfig` (re-validated), or None for defaults.
    `source_dir` is where a custom monitor module may live (default: the YAML file's folder).
    Raises `ConfigError` listing every problem, each naming its key.
    """
    if source is None:
        config = MonitorConfig()
    elif isinstance(source, MonitorConfig):
        config = source.validate()
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        config = parse_monitor_config(_section_from_yaml(path), source_dir=str(path.resolve().parent))
    elif isinstance(source, Mapping):
        section = source.get("monitor_config", source) if "monitor_config" in source else source
        config = parse_monitor_config(section)
    else:
        raise ConfigError(
            f"monitor_config: expected a YAML path, a mapping or a MonitorConfig, got {type(source).__name__}"
        )
    if source_dir is not None:
        config.source_dir = source_dir
    return config


def _plain(value: Any, path: str) -> Any:
    """Plain dicts and lists of `value` (MindFormerConfig is a dict subclass with attribute
    access), within the bounds a YAML file has: shared objects (what a YAML alias becomes)
    are counted each time they are reached, so an alias bomb stops here too."""
    budget = [MAX_YAML_NODES]

    def copy(item: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise ConfigError(f"{path}: more than {MAX_YAML_NODES} values (counting repeated references)")
        if depth > MAX_NESTING:
            raise ConfigError(f"{path}: nested more than {MAX_NESTING} levels deep")
        if isinstance(item, Mapping):
            return {k: copy(v, depth + 1) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [copy(v, depth + 1) for v in item]
        return item

    return copy(value, 1)
