"""`monitor_config`: parse, validate and default the YAML section.

Each section is a dataclass, so `cfg.alert_config.loss_threshold` and
`cfg.grad_monitor = False` work as the article writes them. Parsing is driven by the
dataclass fields' types; a field's metadata may add `aliases` (MindFormers' native names)
and a `check` callable for value rules. Every problem becomes one `ConfigError` naming the
dotted key and the offending value.
"""

from __future__ import annotations

import dataclasses
import difflib
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

from otel_mindformers import record

OUTPUT_TYPES = ("stdout", "json_file", "tensorboard", "otlp", "prometheus")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
OTLP_TEMPORALITIES = ("cumulative", "delta")
DEVICE_SOURCES = ("auto", "ascend", "nvidia", "host", "mindspore")
NOTIFIER_TYPES = ("webhook", "wecom", "dingtalk", "feishu", "slack")
# Platforms whose robots verify an HMAC signature made with a per-robot secret.
SIGNED_NOTIFIER_TYPES = ("dingtalk", "feishu")

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
    """Invalid monitor configuration; the message names the key and the problem."""


def _key(*, default: Any = dataclasses.MISSING, aliases: tuple[str, ...] = (),
         check: Callable[[str, Any], None] | None = None, factory: Any = dataclasses.MISSING,
         repr: bool = True):
    """`repr=False` keeps a secret (a webhook URL, a signing key) out of the config's repr."""
    metadata = {"aliases": aliases, "check": check}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata, repr=repr)
    return dataclasses.field(default=default, metadata=metadata, repr=repr)


# --- value checks ------------------------------------------------------------------------

def _at_least(minimum: float) -> Callable[[str, Any], None]:
    def check(key: str, value: Any) -> None:
        if value is not None and value < minimum:
            raise ConfigError(f"{key}: must be >= {minimum}, got {value!r}")

    return check


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


def _unexpanded_variable(value: str) -> str | None:
    """The first `${VAR}` left in a value after expansion (the variable is not set)."""
    match = re.search(r"\$\{([^}]*)\}", value)
    return match.group(1) if match else None


def _check_notifiers(key: str, notifiers: list["NotifierConfig"]) -> None:
    # URLs and secrets carry tokens: messages name the key and the variable, never the value.
    for index, notifier in enumerate(notifiers):
        item = f"{key}[{index}]"
        if notifier.type is None:
            raise ConfigError(f"{item}.type: required; one of {', '.join(NOTIFIER_TYPES)}")
        if not notifier.url:
            raise ConfigError(f"{item}.url: required for a {notifier.type!r} notifier")
        for name, value in (("url", notifier.url), ("secret", notifier.secret)):
            missing = value and _unexpanded_variable(value)
            if missing:
                raise ConfigError(f"{item}.{name}: environment variable {missing!r} is not set")
        if urllib.parse.urlsplit(notifier.url).scheme not in ("http", "https"):
            raise ConfigError(f"{item}.url: expected an http:// or https:// URL (value not shown)")
        if notifier.secret is not None and notifier.type not in SIGNED_NOTIFIER_TYPES:
            raise ConfigError(
                f"{item}.secret: {notifier.type!r} notifiers do not sign requests; "
                f"a secret is used by {', '.join(SIGNED_NOTIFIER_TYPES)}"
            )


# --- sections ------------------------------------------------------------------------------

@dataclasses.dataclass
class NotifierConfig:
    """One entry of `alert_config.notifiers`. `url` and `secret` may be `${VAR}` references."""

    type: Union[str, None] = _key(default=None, check=_one_of(NOTIFIER_TYPES))
    url: Union[str, None] = _key(default=None, repr=False)
    secret: Union[str, None] = _key(default=None, repr=False)


@dataclasses.dataclass
class SpikeRuleConfig:
    """A value more than `zscore` robust standard deviations above its rolling median."""

    enable: bool = _key(default=True)
    zscore: float = _key(default=6.0, check=_at_least(0.0))
    window: int = _key(default=100, check=_at_least(3))
    warmup: int = _key(default=20, check=_at_least(1))


@dataclasses.dataclass
class StepTimeRuleConfig:
    """Step time more than `factor` times its rolling median."""

    enable: bool = _key(default=True)
    factor: float = _key(default=2.0, check=_at_least(1.0))
    window: int = _key(default=100, check=_at_least(3))
    warmup: int = _key(default=20, check=_at_least(1))


@dataclasses.dataclass
class AlertConfig:
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
    stall_timeout: Union[float, None] = _key(default=1800.0, check=_at_least(0.001))
    stop_on_nonfinite: bool = _key(default=True)
    stop_after_anomalous_steps: Union[int, None] = _key(default=None, check=_at_least(1))
    notify_timeout: float = _key(default=5.0, check=_at_least(0.001))
    notify_retries: int = _key(default=2, check=_at_least(0))
    notifiers: list[NotifierConfig] = _key(factory=list, check=_check_notifiers)


@dataclasses.dataclass
class OtlpConfig:
    """`monitor_config.otlp`. Unset values fall back to the standard OTEL_EXPORTER_OTLP_* variables."""

    endpoint: Union[str, None] = _key(default=None)
    protocol: Union[str, None] = _key(default=None, check=_one_of(OTLP_PROTOCOLS))
    headers: dict[str, str] = _key(factory=dict, repr=False)
    timeout: Union[float, None] = _key(default=None, check=_at_least(0.001))
    export_interval: Union[float, None] = _key(default=None, check=_at_least(0.01))
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


@dataclasses.dataclass
class PrometheusConfig:
    """`monitor_config.prometheus`: the scrape endpoint of the `prometheus` output."""

    host: str = _key(default="127.0.0.1")
    port: int = _key(default=9464, check=_between(0, 65535))


@dataclasses.dataclass
class LogRotationConfig:
    """`monitor_config.log_rotation`: bound what a long run leaves on disk.

    `json_file` rolls over before a line would take it past `max_bytes`, keeping
    `file.json.1` (newest) … `file.json.N` (oldest), as logging's RotatingFileHandler names
    them. TensorBoard keeps at most `tensorboard_max_files` event files per rank folder,
    starting a new one past `max_bytes`. 0 means unbounded.
    """

    max_bytes: int = _key(default=0, check=_at_least(0))
    backup_count: int = _key(default=5, check=_at_least(1))
    tensorboard_max_files: int = _key(default=0, check=_at_least(0))


@dataclasses.dataclass
class DeviceConfig:
    """`monitor_config.device_config`: what `device_monitor` reads, and how often (docs/devices.md).

    `sources: [auto]` reads the Ascend tools when `device_target` is Ascend or `npu-smi` is
    on PATH, NVML when it is GPU, MindSpore's allocator on either, and the host always.
    """

    poll_interval: float = _key(default=5.0, check=_at_least(0.1))
    command_timeout: float = _key(default=5.0, check=_at_least(0.1))
    npu_smi_path: str = _key(default="npu-smi")
    sources: list[str] = _key(factory=lambda: ["auto"], check=_one_of(DEVICE_SOURCES))


@dataclasses.dataclass
class MonitorConfig:
    """The `monitor_config` section. Field names are the YAML keys."""

    enable: bool = _key(default=True, aliases=("monitor_on",))
    interval: int = _key(default=10, aliases=("step_interval",), check=_at_least(1))
    output_type: list[str] = _key(
        factory=lambda: ["stdout", "json_file"], check=_one_of(OUTPUT_TYPES)
    )
    tensorboard_path: str = _key(default="./output/tensorboard_log")
    json_log_path: str = _key(default="./output/train_metric.json")
    monitored_metrics: list[str] = _key(
        factory=lambda: list(record.KNOWN_METRICS), check=_one_of(record.KNOWN_METRICS)
    )
    grad_monitor: bool = _key(default=True)
    device_monitor: bool = _key(default=False)
    alert_config: AlertConfig = _key(factory=AlertConfig)
    custom_monitor_callback: Union[str, None] = _key(default=None, check=_check_dotted_path)
    # Extensions beyond the article's keys.
    service_name: Union[str, None] = _key(default=None)
    report_ranks: Union[str, list[int]] = _key(factory=lambda: [0], check=_check_report_ranks)
    tokens_per_sample: Union[int, None] = _key(default=None, check=_at_least(1))
    shutdown_timeout: float = _key(default=5.0, check=_at_least(0.0))
    # Which sampled steps get a span: true (all), false (none), or N (steps that are
    # multiples of N, plus the last and any with a NaN/Inf value).
    step_spans: Union[bool, int] = _key(default=True, check=_check_step_spans)
    otlp: OtlpConfig = _key(factory=OtlpConfig)
    prometheus: PrometheusConfig = _key(factory=PrometheusConfig)
    device_config: DeviceConfig = _key(factory=DeviceConfig)
    log_rotation: LogRotationConfig = _key(factory=LogRotationConfig)
    mindformers_native: dict[str, Any] = _key(factory=dict)
    # Directory of the YAML file it came from: custom monitors may live beside it.
    source_dir: Union[str, None] = _key(default=None)

    def reports_training_metrics(self, rank: int) -> bool:
        """The article's policy: rank 0 reports training metrics unless configured otherwise."""
        return self.report_ranks == "all" or rank in self.report_ranks

    def validate(self) -> "MonitorConfig":
        """Re-check after attribute assignment (the article assigns in code before training)."""
        _parse_section(MonitorConfig, dataclasses.asdict(self), "monitor_config")
        return self


# --- parsing -------------------------------------------------------------------------------

_INTERNAL_FIELDS = frozenset({"mindformers_native", "source_dir"})


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
        return [_coerce(f"{key}[{i}]", item_tp, item) for i, item in enumerate(value)]
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
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return os.path.expandvars(value) if "${" in value else value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _parse_kv_list(key: str, text: str) -> dict[str, str]:
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, val = item.partition("=")
        if not sep:
            raise ConfigError(f"{key}: expected 'name=value' pairs, got an entry without '='")
        pairs[name.strip()] = val.strip()
    return pairs


def _parse_section(cls: type, raw: Any, path: str):
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: expected a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    alias_of = {a: f.name for f in fields.values() for a in f.metadata.get("aliases", ())}
    values: dict[str, Any] = {}
    native: dict[str, Any] = {}
    for raw_key, value in raw.items():
        name = alias_of.get(raw_key, raw_key)
        if name not in fields:
            if cls is MonitorConfig and raw_key in MINDFORMERS_NATIVE_KEYS:
                native[raw_key] = value
                continue
            known = list(fields) + list(alias_of)
            raise ConfigError(
                f"{path}.{raw_key}: unknown key{_suggest(raw_key, known)}"
            )
        if name in values:
            raise ConfigError(f"{path}.{raw_key}: given twice (also as {name!r})")
        field = fields[name]
        key = f"{path}.{raw_key}"
        hints = typing.get_type_hints(cls)
        try:
            coerced = _coerce(key, hints[name], value)
            check = field.metadata.get("check")
            if check is not None:
                check(key, coerced)
        except ConfigError as exc:
            if field.repr:
                raise
            # A secret never reaches a message: keep what was expected, drop what was given
            # (every message ends in ", got <value>").
            raise ConfigError(f"{str(exc).split(', got ')[0]} (value not shown)") from None
        values[name] = coerced
    if native:
        values["mindformers_native"] = {**values.get("mindformers_native", {}), **native}
    return cls(**values)


def parse_monitor_config(section: Mapping[str, Any] | None, source_dir: str | None = None) -> MonitorConfig:
    """Validate a `monitor_config` mapping (already extracted from its YAML file)."""
    config = _parse_section(MonitorConfig, section, "monitor_config")
    if source_dir is not None:
        config.source_dir = source_dir
    return config


def _section_from_yaml(path: Path) -> Mapping[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: not UTF-8 (byte {exc.start})") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # The problem and its position only: the parser's excerpt of the line could show a secret.
        where = getattr(exc, "problem_mark", None)
        position = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML{position}: {problem}") from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(document).__name__}")
    if "monitor_config" in document:
        return document["monitor_config"]
    return document  # the file is the section itself


def load_monitor_config(source: Any = None) -> MonitorConfig:
    """Load and validate a monitor configuration.

    `source` may be a YAML path (a file with a top-level `monitor_config:` section, or a file
    that is the section itself), a mapping, a MindFormers `MindFormerConfig` (or its
    `monitor_config` entry), an existing `MonitorConfig` (re-validated), or None for defaults.
    Raises `ConfigError` naming the key and the problem.
    """
    if source is None:
        config = MonitorConfig()
    elif isinstance(source, MonitorConfig):
        config = source.validate()
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        config = parse_monitor_config(
            _section_from_yaml(path), source_dir=str(path.resolve().parent)
        )
    elif isinstance(source, Mapping):
        section = source.get("monitor_config", source) if "monitor_config" in source else source
        config = parse_monitor_config(_plain(section))
    else:
        raise ConfigError(
            f"monitor_config: expected a YAML path, a mapping or a MonitorConfig, got {type(source).__name__}"
        )
    check_paths(config)
    from otel_mindformers.monitor import load_monitor_class  # imports config: load late

    load_monitor_class(config)
    return config


def _plain(value: Any) -> Any:
    """MindFormerConfig is a dict subclass with attribute access: turn it into plain dicts."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def check_paths(config: MonitorConfig) -> None:
    """Fail before training if an enabled output cannot create its directory."""
    if not config.enable:
        return
    targets = []
    if "json_file" in config.output_type:
        targets.append(("monitor_config.json_log_path", Path(config.json_log_path).parent))
    if "tensorboard" in config.output_type:
        targets.append(("monitor_config.tensorboard_path", Path(config.tensorboard_path)))
    for key, directory in targets:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot create directory {str(directory)!r}: {exc.strerror}") from None
        if not os.access(directory, os.W_OK):
            raise ConfigError(f"{key}: directory {str(directory)!r} is not writable")
