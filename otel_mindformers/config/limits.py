"""What a `monitor_config` may hold: the allowed values of its enumerated keys, and the bounds
on what a configuration file may make the loader and the run do."""

from __future__ import annotations

OUTPUT_TYPES = ("stdout", "json_file", "tensorboard", "otlp", "prometheus")
# The Prometheus exporter's port (the registered default the SDK's exporter, opentelemetry-configuration's
# pull reader and our `prometheus` output all use); each rank of a node adds its local rank.
PROMETHEUS_PORT = 9464
OTLP_PROTOCOLS = ("grpc", "http/protobuf", "http/json")
OTLP_TEMPORALITIES = ("cumulative", "delta")
DEVICE_SOURCES = ("auto", "ascend", "nvidia", "host", "mindspore")
# `export_ranks.spans` / `.metrics` by name (a list of ranks and a fraction are the others).
EXPORT_RANK_STRATEGIES = ("all", "report_ranks", "first_per_node")
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
# Log records queued for OTLP export (`otlp.logs_queue_size`). The SDK's default of 2048
# lost half of a burst of 8192 bridged lines against a healthy collector. The documented
# burst (LOGS_BURST) arrives whole, with one export batch (512) of headroom for the run's own
# records queued beside it while the export thread waits for a core; with it, 1,000
# records/s sustained on every protocol (docs/logs.md, measured with
# benchmarks/bench_logs.py --carry). A queued record takes ~1.1 KB (a line of text) and
# ~138 KB (a body and a traceback at the log bridge's caps): past a million records a value
# is a mistake.
LOGS_BURST = 8192
LOGS_QUEUE_SIZE = LOGS_BURST + 512
MAX_LOGS_QUEUE_SIZE = 1 << 20


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

# The most steps one capture profiles (`alert_config.capture.profile_steps`, `capture --steps`,
# an on-demand request's `steps`): a profile of the rest of a long job is a typo, not a wish.
MAX_PROFILE_STEPS = 1000
