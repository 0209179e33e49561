"""`monitor_config`'s schema: one dataclass per section, field names are the YAML keys.

Each section is a dataclass, so `cfg.alert_config.loss_threshold` and
`cfg.grad_monitor = False` work as the monitor_config article writes them. A field's metadata may add
`aliases` (MindFormers' native names), a `check` callable for value rules (checks.py), and
`secret` (never shown, whitespace stripped). Parsing is driven by the fields' types
(coercion.py); reading a file is loading.py's.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Callable
from typing import Any, ClassVar, Union

from otel_mindformers.config.checks import (
    _at_least,
    _between,
    _check_dotted_path,
    _check_endpoint,
    _check_file_path,
    _check_headers,
    _check_host,
    _check_job_id,
    _check_node_name,
    _check_notifiers,
    _check_output_path,
    _check_public_fault_code,
    _check_rank_strategy,
    _check_report_ranks,
    _check_resource,
    _check_server,
    _check_step_spans,
    _one_of,
    _seconds,
)
from otel_mindformers.config.coercion import keys_of, parse_section
from otel_mindformers.config.errors import ConfigError, suggestion
from otel_mindformers.config.limits import (
    DEVICE_SOURCES,
    LOGS_QUEUE_SIZE,
    MAX_LOGS_QUEUE_SIZE,
    MAX_PROFILE_STEPS,
    MAX_SECONDS,
    MINDFORMERS_NATIVE_KEYS,
    NOTIFIER_TYPES,
    OTLP_PROTOCOLS,
    OTLP_TEMPORALITIES,
    OUTPUT_TYPES,
    PROMETHEUS_PORT,
)
from otel_mindformers.config.redaction import redact_url
from otel_mindformers.names import capture_names
from otel_mindformers.names.training import KNOWN_METRICS, MFU, SAMPLES_PER_SECOND, TOKENS_PER_SECOND


def _key(
    *,
    default: Any = dataclasses.MISSING,
    aliases: tuple[str, ...] = (),
    check: Callable[[str, Any], None] | None = None,
    factory: Any = dataclasses.MISSING,
    secret: bool = False,
    url: bool = False,
    path: bool = False,
):
    """`secret=True`: a token (a webhook URL, a header, a signing key). It is left out of the
    config's repr and of every message, and stripped of surrounding whitespace (what
    `$(cat file)` leaves: a trailing newline). `url=True`: shown without its credentials.
    `path=True`: a leading `~` is the user's home, as in a shell."""
    metadata = {"aliases": aliases, "check": check, "secret": secret, "url": url, "path": path}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class _Section:
    """A repr that shows no secret field, and URLs (`otlp.endpoint`) without credentials.
    Assigning a key in code (`cfg.grad_monitor = False`, as the monitor_config article
    does) accepts the section's keys and their aliases, and refuses any other name."""

    # How messages name the section; the class name where one class serves several keys.
    KEY_PATH: ClassVar[str | None] = None

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):
            fields = dataclasses.fields(self)  # type: ignore[arg-type]  # every section is a dataclass
            if name not in {f.name for f in fields}:
                aliases = {a: f.name for f in fields for a in f.metadata.get("aliases", ())}
                if name not in aliases:
                    # A misspelt key would be a new attribute that nothing reads: the
                    # override would be lost without a word.
                    known = [f.name for f in fields if f.name not in getattr(self, "INTERNAL_FIELDS", ())]
                    path = self.KEY_PATH or type(self).__name__
                    raise ConfigError(f"{path}.{name}: unknown key{suggestion(name, [*known, *aliases])}")
                name = aliases[name]  # MindFormers' `step_interval` is our `interval`
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        shown = []
        for field in dataclasses.fields(self):  # type: ignore[arg-type]  # every section is a dataclass
            if field.metadata.get("secret"):
                continue
            value = getattr(self, field.name)
            if field.metadata.get("url") and isinstance(value, str):
                value = redact_url(value)
            shown.append(f"{field.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


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
    """Step time more than `factor` times its rolling median, and more than `min_increase`
    seconds above it: a few milliseconds of jitter on millisecond steps is no regression."""

    enable: bool = _key(default=True)
    factor: float = _key(default=2.0, check=_at_least(1.0))
    min_increase: float = _key(default=0.05, check=_at_least(0.0, MAX_SECONDS))
    window: int = _key(default=100, check=_at_least(3, 1_000_000))
    warmup: int = _key(default=20, check=_at_least(1))


@dataclasses.dataclass(repr=False)
class SpikeScoreRuleConfig(_Section):
    """OLMo 2's spike score: the share of the last `window` sampled losses that were more
    than `sigma` standard deviations above the rolling mean of the `window` before them.
    Exported as `mindformers.train.loss.spike_score`; the rule fires when the score rises
    above `threshold` and resolves when it falls back to it."""

    enable: bool = _key(default=False)
    sigma: float = _key(default=7.0, check=_at_least(0.1))
    window: int = _key(default=100, check=_at_least(3, 1_000_000))
    warmup: int = _key(default=20, check=_at_least(2))
    threshold: float = _key(default=0.0, check=_at_least(0.0, 1.0))


@dataclasses.dataclass(repr=False)
class CoSpikeRuleConfig(_Section):
    """Loss and grad norm both spiking (`zscore` robust sigma above their rolling medians)
    within `within` sampled steps of each other."""

    enable: bool = _key(default=False)
    zscore: float = _key(default=6.0, check=_at_least(0.0))
    window: int = _key(default=100, check=_at_least(3, 1_000_000))
    warmup: int = _key(default=20, check=_at_least(1))
    within: int = _key(default=0, check=_at_least(0, 1000))


THROUGHPUT_METRICS = (SAMPLES_PER_SECOND, TOKENS_PER_SECOND, MFU)


@dataclasses.dataclass(repr=False)
class ThroughputDropRuleConfig(_Section):
    """`metric` more than `drop` (a fraction) below the run's own baseline: the median of its
    first `baseline` sampled values after `warmup` (compile and warm-up steps) were skipped.
    The baseline stays fixed, so a slow decline is seen (a rolling median would follow it)."""

    enable: bool = _key(default=False)
    metric: str = _key(default=SAMPLES_PER_SECOND, check=_one_of(THROUGHPUT_METRICS))
    drop: float = _key(default=0.3, check=_at_least(0.01, 0.99))
    baseline: int = _key(default=10, check=_at_least(1, 100_000))
    warmup: int = _key(default=3, check=_at_least(0))


CAPTURE_ANALYSIS = ("async", "deferred")


@dataclasses.dataclass(repr=False)
class CaptureConfig(_Section):
    """`alert_config.capture`: evidence taken when a rule in `rules` fires, or on demand
    (`otel-mindformers capture` writes a request into `path`, which `on_demand` watches).
    See docs/captures.md."""

    rules: list[str] = _key(factory=list, check=_one_of((*capture_names.BUILTIN_RULES, capture_names.ALL_RULES)))
    kinds: list[str] = _key(factory=lambda: list(capture_names.KINDS), check=_one_of(capture_names.KINDS))
    profile_steps: int = _key(default=5, check=_at_least(1, MAX_PROFILE_STEPS))
    cooldown_steps: int = _key(default=200, check=_at_least(0))
    max_captures: int = _key(default=10, check=_at_least(1))
    max_bytes: int = _key(default=2_000_000_000, check=_at_least(0))
    path: str = _key(default="./output/captures", check=_check_output_path, path=True)
    on_demand: bool = _key(default=False)
    # async: the profiler's analysis runs in its own process as the capture ends; deferred:
    # raw data only, analysed later by `otel-mindformers capture --analyse`.
    analysis: str = _key(default="async", check=_one_of(CAPTURE_ANALYSIS))
    batch_crc32: bool = _key(default=False)

    @property
    def enabled(self) -> bool:
        return bool(self.rules) or self.on_demand


@dataclasses.dataclass(repr=False)
class AlertConfig(_Section):
    """`monitor_config.alert_config`: in-process anomaly rules (see docs/alerts.md).

    The monitor_config article's keys keep their meaning: `loss_threshold` fires on loss above it and
    `alert_interval` is the minimum number of steps between two notifications of one rule.
    Counts of "steps" in rules (warm-up, windows, streaks) are sampled steps.
    """

    SWITCH: ClassVar[str] = "enable_alert"  # `alert_config: true` (the monitor_config article's switch)
    KEY_PATH: ClassVar[str | None] = "monitor_config.alert_config"

    enable_alert: bool = _key(default=False)
    loss_threshold: Union[float, None] = _key(default=None, check=_at_least(0.0))
    alert_interval: int = _key(default=50, check=_at_least(1))
    grad_norm_threshold: Union[float, None] = _key(default=None, check=_at_least(0.0))
    nonfinite: bool = _key(default=True)
    loss_spike: SpikeRuleConfig = _key(factory=SpikeRuleConfig)
    grad_norm_spike: SpikeRuleConfig = _key(factory=SpikeRuleConfig)
    overflow_streak: Union[int, None] = _key(default=10, check=_at_least(1))
    step_time_regression: StepTimeRuleConfig = _key(factory=StepTimeRuleConfig)
    loss_spike_score: SpikeScoreRuleConfig = _key(factory=SpikeScoreRuleConfig)
    co_spike: CoSpikeRuleConfig = _key(factory=CoSpikeRuleConfig)
    throughput_drop: ThroughputDropRuleConfig = _key(factory=ThroughputDropRuleConfig)
    capture: CaptureConfig = _key(factory=CaptureConfig)
    stall_timeout: Union[float, None] = _key(default=1800.0, check=_seconds(0.001))
    stop_on_nonfinite: bool = _key(default=True)
    stop_after_anomalous_steps: Union[int, None] = _key(default=None, check=_at_least(1))
    notify_timeout: float = _key(default=5.0, check=_seconds(0.001))
    notify_retries: int = _key(default=2, check=_at_least(0, 100))
    notifiers: list[NotifierConfig] = _key(factory=list, check=_check_notifiers)
    # A notice when the run ends (completed / stopped early / crashed), see docs/alerts.md.
    notify_run_end: bool = _key(default=False)

    def ignored_while_off(self, stall_used: bool = False) -> str | None:
        """The settings only the alert engine reads, given while it is off (the stall dumps'
        SIGUSR1 works either way): one sentence naming them, for the run's log and `validate`.
        `stall_used`: `cluster.tell` reads `stall_timeout` too."""
        if self.enable_alert:
            return None
        defaults = type(self)()
        ignored = [
            key
            for key in ("notify_run_end", "stall_timeout", "notifiers", "stop_after_anomalous_steps", "loss_threshold")
            if getattr(self, key) != getattr(defaults, key) and not (key == "stall_timeout" and stall_used)
        ]
        if not ignored:
            return None
        verb = "has" if len(ignored) == 1 else "have"
        return f"alert_config.{', alert_config.'.join(ignored)} {verb} no effect while alert_config.enable_alert is off"


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
    # Log records the SDK's batch processor holds before export; None: OTEL_BLRP_MAX_QUEUE_SIZE,
    # else LOGS_QUEUE_SIZE (docs/logs.md: the burst and rate it carries, the memory it bounds).
    logs_queue_size: Union[int, None] = _key(default=None, check=_at_least(1, MAX_LOGS_QUEUE_SIZE))

    def resolved_protocol(self) -> str:
        """`protocol`, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc. A variable that names no
        protocol is refused, as the SDK refuses it, rather than sent as HTTP/protobuf."""
        if self.protocol:
            return self.protocol
        variable = os.environ.get(PROTOCOL_VARIABLE, "").strip()
        if variable and variable not in OTLP_PROTOCOLS:
            raise ConfigError(
                f"{PROTOCOL_VARIABLE}: unknown value {variable!r}{suggestion(variable, OTLP_PROTOCOLS)}; "
                f"allowed: {', '.join(OTLP_PROTOCOLS)}"
            )
        return variable or "grpc"

    def resolved_logs_queue_size(self) -> int:
        """`logs_queue_size`, else a valid OTEL_BLRP_MAX_QUEUE_SIZE, else LOGS_QUEUE_SIZE."""
        if self.logs_queue_size is not None:
            return self.logs_queue_size
        variable = os.environ.get("OTEL_BLRP_MAX_QUEUE_SIZE", "").strip()
        if variable.isdigit() and 1 <= int(variable) <= MAX_LOGS_QUEUE_SIZE:
            return int(variable)
        return LOGS_QUEUE_SIZE

    def resolved_export_interval(self) -> float:
        """Seconds between metric exports: `export_interval`, else OTEL_METRIC_EXPORT_INTERVAL
        (ms), else 10 s. A variable that is no number of ms from 10 ms to a day counts as
        unset, as the SDK's reader treats it (`export_interval_warning` names it)."""
        if self.export_interval is not None:
            return self.export_interval
        millis = _export_interval_millis(os.environ.get(EXPORT_INTERVAL_VARIABLE, ""))
        return (millis if millis is not None else DEFAULT_EXPORT_INTERVAL_MS) / 1000.0

    def export_interval_warning(self) -> str | None:
        """The warning a run logs (and `validate` prints) when OTEL_METRIC_EXPORT_INTERVAL
        decides the interval but is not usable; None when it is usable or not read."""
        value = os.environ.get(EXPORT_INTERVAL_VARIABLE, "")
        if self.export_interval is None and value.strip() and _export_interval_millis(value) is None:
            return (
                f"{EXPORT_INTERVAL_VARIABLE}={value!r} is not a number of milliseconds from 10 to "
                f"{MAX_SECONDS * 1000:.0f}; metrics are exported every {self.resolved_export_interval():g} s"
            )
        return None


PROTOCOL_VARIABLE = "OTEL_EXPORTER_OTLP_PROTOCOL"
EXPORT_INTERVAL_VARIABLE = "OTEL_METRIC_EXPORT_INTERVAL"
DEFAULT_EXPORT_INTERVAL_MS = 10_000.0


def _export_interval_millis(value: str) -> float | None:
    """`value` as milliseconds between exports, None when blank or out of `export_interval`'s range."""
    try:
        millis = float(value)
    except ValueError:
        return None
    return millis if math.isfinite(millis) and 10.0 <= millis <= MAX_SECONDS * 1000.0 else None


@dataclasses.dataclass(repr=False)
class PrometheusConfig(_Section):
    """`monitor_config.prometheus`: the scrape endpoint of the `prometheus` output."""

    host: str = _key(default="127.0.0.1", check=_check_host)
    port: int = _key(default=PROMETHEUS_PORT, check=_between(0, 65535))


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
    npu_smi_path: str = _key(default="npu-smi", check=_check_output_path, path=True)
    sources: list[str] = _key(factory=lambda: ["auto"], check=_one_of(DEVICE_SOURCES))


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclasses.dataclass(repr=False)
class LogsConfig(_Section):
    """`monitor_config.logs`: Python logging shipped as OTel log records while a run goes on
    (telemetry/log_bridge.py). `enable` unset follows the standard
    OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED. At most `rate_limit_per_logger` records
    of one logger per `rate_limit_window` seconds are sent; `loggers` names (or prefixes of)
    loggers that do not propagate to the root logger, MindFormers' and MindSpore's by default.
    """

    enable: Union[bool, None] = _key(default=None)
    level: str = _key(default="INFO", check=_one_of(LOG_LEVELS))
    rate_limit_per_logger: int = _key(default=100, check=_at_least(1))
    rate_limit_window: float = _key(default=60.0, check=_seconds(0.001))
    loggers: list[str] = _key(factory=lambda: ["mindformers", "ME"])


@dataclasses.dataclass(repr=False)
class StragglerConfig(_Section):
    """`monitor_config.stragglers`: per-rank section times and the in-process straggler signal
    (docs/stragglers.md). `section_series`: `rank` (every rank's sections under its
    `training.rank`), `node` (under the node's attributes instead: one series per node and
    section once a backend drops the instance), `off` (no section series; the JSON line and
    the in-process signal stay). The signal fires after `windows` consecutive sampled windows
    in which the rank waited for its data more than `data_share` of the window's wall time,
    or its in-step time per step exceeded `step_rise` times its own baseline (the median of
    its earlier windows)."""

    section_series: str = _key(default="rank", check=_one_of(("rank", "node", "off")))
    signal: bool = _key(default=True)
    data_share: float = _key(default=0.2, check=_between(0.0, 1.0))
    step_rise: float = _key(default=2.0, check=_at_least(1.0))
    windows: int = _key(default=3, check=_at_least(1, 1000))


@dataclasses.dataclass(repr=False)
class RestartsConfig(_Section):
    """`monitor_config.restarts`: the job's life across restarts (docs/restarts.md).

    Each rank keeps a small ledger of the job's attempts beside the JSON log; a background
    thread writes it on phase and checkpoint events and every `heartbeat_interval` seconds
    while the step moves (the last heartbeat of an attempt that was killed). The no-progress
    alert fires when `no_progress_attempts` consecutive attempts ended without passing the
    furthest step reached before them.
    """

    enable: bool = _key(default=True)
    heartbeat_interval: float = _key(default=5.0, check=_seconds(0.01))
    no_progress_attempts: int = _key(default=3, check=_at_least(1, 1000))


@dataclasses.dataclass(repr=False)
class PublicFaultCodesConfig(_Section):
    """`cluster.codes`: the public fault code each verdict is told with. User-defined codes
    by MindCluster's rules (type, default level, 00, 1 = user-defined, four digits): a chip
    SubHealthFault, a node SubHealthFault, a chip SubHealthFault. The cluster admin lists
    them, with a level, in ClusterD's publicCustomization.json (docs/mindcluster.md)."""

    sdc_suspect: str = _key(default="010011001", check=_check_public_fault_code)
    slow_node: str = _key(default="110011002", check=_check_public_fault_code)
    stalled_rank: str = _key(default="010011003", check=_check_public_fault_code)


@dataclasses.dataclass(repr=False)
class ClusterConfig(_Section):
    """`monitor_config.cluster`: MindCluster's ClusterD, heard and told (docs/mindcluster.md).

    `listen` (unset: on when MINDX_TASK_ID and MINDX_SERVER_IP are set, as the Ascend Operator
    sets them): rank `listen_rank` subscribes to ClusterD's fault service for the job, under
    `role`. `server` (unset: MINDX_SERVER_IP, else MINDX_SERVER_DOMAIN) and `port` say where
    ClusterD listens. `tell`: this rank's verdicts become public faults (`resource` is the
    sender ClusterD must allow; `node_name`, unset: NODE_NAME), at most one `occur` per verdict
    per `min_interval` seconds, each with a `recover` once it clears for `recover_after`
    sampled steps. `sdc_strikes`: episodes of a non-finite own loss within `sdc_window`
    sampled steps that make this rank's device an SDC suspect. `asd_logs`: the logs where
    MindSpore writes its silent-data-corruption detection lines (empty: its own log file, else
    this process's stderr when that is a file). `preflight`: MindSpore's stress test of the
    device before the first step.
    """

    listen: Union[bool, None] = _key(default=None)
    server: Union[str, None] = _key(default=None, check=_check_server)
    port: int = _key(default=8899, check=_between(1, 65535))
    role: str = _key(default="otel-mindformers", check=_check_resource)
    listen_rank: int = _key(default=0, check=_at_least(0))
    timeout: float = _key(default=5.0, check=_seconds(0.001))
    retry_max: float = _key(default=60.0, check=_seconds(0.01))
    tell: bool = _key(default=False)
    resource: str = _key(default="otel-mindformers", check=_check_resource)
    node_name: Union[str, None] = _key(default=None, check=_check_node_name)
    codes: PublicFaultCodesConfig = _key(factory=PublicFaultCodesConfig)
    min_interval: float = _key(default=300.0, check=_seconds(0.0))
    recover_after: int = _key(default=3, check=_at_least(1, 1_000_000))
    sdc_strikes: int = _key(default=3, check=_at_least(1, 1000))
    sdc_window: int = _key(default=100, check=_at_least(1, 1_000_000))
    asd_logs: list[str] = _key(factory=list)
    preflight: bool = _key(default=False)


@dataclasses.dataclass(repr=False)
class ExportRanksConfig(_Section):
    """`monitor_config.export_ranks`: which ranks send their step spans (`spans`) and their
    training metrics (`metrics`) over OTLP / Prometheus (telemetry/export_ranks.py). Each is
    `all`, `report_ranks`, `first_per_node` (local rank 0), a list of ranks, or a fraction
    of the ranks (0 < f < 1, chosen by a hash of the rank). Every rank keeps sending its run
    span, its anomalous steps' spans, its hardware, straggler and heartbeat series; local
    outputs are not affected."""

    spans: Union[str, list[int], float] = _key(default="all", check=_check_rank_strategy)
    metrics: Union[str, list[int], float] = _key(default="all", check=_check_rank_strategy)


class GradNorm(enum.Enum):
    """`grad_monitor` resolved (`MonitorConfig.grad_norm`): where the global gradient norm comes from."""

    # unset: the norm the train network returns, read where it does, silently
    IF_RETURNED = "if_returned"
    # true: that, else measured by the gradient-norm probe (model_state/grad_norm_probe.py);
    # where neither can, said once
    MEASURED = "measured"
    # false: never read (nor MindFormers' per-parameter local norms)
    OFF = "off"


_GRAD_NORM = {None: GradNorm.IF_RETURNED, True: GradNorm.MEASURED, False: GradNorm.OFF}


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

    # Fields that are not YAML keys, and MindFormers' own keys the section may hold.
    INTERNAL_FIELDS: ClassVar[frozenset[str]] = frozenset({"mindformers_native", "source_dir"})
    KEY_PATH: ClassVar[str | None] = "monitor_config"
    NATIVE_KEYS: ClassVar[frozenset[str]] = MINDFORMERS_NATIVE_KEYS

    enable: bool = _key(default=True, aliases=("monitor_on",))
    interval: int = _key(default=10, aliases=("step_interval",), check=_at_least(1))
    output_type: list[str] = _key(factory=lambda: ["stdout", "json_file"], check=_one_of(OUTPUT_TYPES))
    tensorboard_path: str = _key(default="./output/tensorboard_log", check=_check_output_path, path=True)
    json_log_path: str = _key(default="./output/train_metric.json", check=_check_file_path, path=True)
    monitored_metrics: list[str] = _key(factory=lambda: list(KNOWN_METRICS), check=_one_of(KNOWN_METRICS))
    # None (unset): report the global norm where the train network returns it, silently;
    # true: measure it where it does not, and say once where it cannot; false: never.
    # The run reads it resolved, as `grad_norm` (GradNorm).
    grad_monitor: Union[bool, None] = _key(default=None)
    device_monitor: bool = _key(default=False)
    alert_config: AlertConfig = _key(factory=AlertConfig)
    custom_monitor_callback: Union[str, None] = _key(default=None, check=_check_dotted_path)
    # Extensions beyond the monitor_config article's keys.
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
    # The job this run is an attempt of (docs/restarts.md); unset: the launcher's job id
    # (MINDX_TASK_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID, ...), else the ledger's.
    job_id: Union[str, None] = _key(default=None, check=_check_job_id)
    restarts: RestartsConfig = _key(factory=RestartsConfig)
    # Which sampled steps get a span: true (all), false (none), or N (steps that are
    # multiples of N, plus the last and any with a NaN/Inf value).
    step_spans: Union[bool, int] = _key(default=True, check=_check_step_spans)
    export_ranks: ExportRanksConfig = _key(factory=ExportRanksConfig)
    otlp: OtlpConfig = _key(factory=OtlpConfig)
    prometheus: PrometheusConfig = _key(factory=PrometheusConfig)
    device_config: DeviceConfig = _key(factory=DeviceConfig)
    log_rotation: LogRotationConfig = _key(factory=LogRotationConfig)
    logs: LogsConfig = _key(factory=LogsConfig)
    stragglers: StragglerConfig = _key(factory=StragglerConfig)
    cluster: ClusterConfig = _key(factory=ClusterConfig)
    mindformers_native: dict[str, Any] = _key(factory=dict)
    # Directory of the YAML file it came from: custom monitors may live beside it.
    source_dir: Union[str, None] = _key(default=None)

    def reports_training_metrics(self, rank: int) -> bool:
        """The monitor_config article's policy: rank 0 reports training metrics unless configured otherwise."""
        return self.report_ranks == "all" or rank in self.report_ranks

    @property
    def grad_norm(self) -> GradNorm:
        """`grad_monitor` (None, true, false) as what it asks of the global gradient norm."""
        return _GRAD_NORM[self.grad_monitor]

    @property
    def telemetry(self) -> TelemetryConfig:
        """What the OTel providers are built from: the service name, the `otlp` and
        `prometheus` outputs and their sections."""
        return TelemetryConfig(self.service_name, self.output_type, self.otlp, self.prometheus)

    @property
    def outputs(self) -> OutputsConfig:
        """The local outputs' keys as one section (the monitor_config article keeps them at the top level)."""
        return OutputsConfig(self.output_type, self.json_log_path, self.tensorboard_path, self.log_rotation)

    def validate(self) -> MonitorConfig:
        """Re-check after attribute assignment (the monitor_config article assigns in code before training)."""
        parse_section(MonitorConfig, keys_of(self), "monitor_config")
        return self

    def with_overrides(self, **overrides: Any) -> MonitorConfig:
        """A validated copy with some keys replaced (`source_dir` may be one: this is code)."""
        source_dir = overrides.pop("source_dir", self.source_dir)
        aliases = {a: f.name for f in dataclasses.fields(self) for a in f.metadata.get("aliases", ())}
        overrides = {aliases.get(key, key): value for key, value in overrides.items()}
        config = parse_section(MonitorConfig, {**keys_of(self), **overrides}, "monitor_config")
        config.mindformers_native = {**self.mindformers_native, **config.mindformers_native}
        config.source_dir = source_dir
        return config
