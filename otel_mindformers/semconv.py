"""Every telemetry name this package emits, in one table.

The README's name table, the collector rules' consistency test and the instruments
themselves all read from here, so a rename happens in exactly one place.

Dimensionless training scalars (loss, learning rate, grad norm, loss scale) carry an
empty unit on purpose: with unit ``1`` the OTel Collector's Prometheus translator appends
``_ratio`` while the Python Prometheus exporter does not, and alert rules would need two
spellings of every name. With no unit, both paths produce the same Prometheus name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

INSTRUMENTATION_NAME = "otel_mindformers"


class Kind(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    OBSERVABLE_GAUGE = "observable_gauge"
    OBSERVABLE_COUNTER = "observable_counter"
    OBSERVABLE_UP_DOWN_COUNTER = "observable_up_down_counter"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    unit: str
    description: str


# --- resource / point attribute keys -------------------------------------------------
# No OTel semantic convention exists yet for distributed-training identity; these keys
# live under one `training.` namespace so they never collide with semconv ones.
ATTR_RANK = "training.rank"
ATTR_WORLD_SIZE = "training.world_size"
ATTR_LOCAL_RANK = "training.local_rank"
ATTR_NODE_RANK = "training.node_rank"
ATTR_DEVICE_ID = "training.device.id"
ATTR_DEVICE_TARGET = "training.device.target"
ATTR_JOB_ID = "training.job.id"
ATTR_LAUNCHER = "training.launcher"
ATTR_STEP = "training.step"
ATTR_EPOCH = "training.epoch"

# Step-span attributes carrying the sampled values (names mirror the JSON keys).
ATTR_LOSS = "training.loss"
ATTR_LEARNING_RATE = "training.learning_rate"
ATTR_GRAD_NORM = "training.grad_norm"
ATTR_OVERFLOW = "training.overflow"
ATTR_LOSS_SCALE = "training.loss_scale"
ATTR_STEP_TIME = "training.step_time"
ATTR_STEPS_IN_WINDOW = "training.steps_in_window"

# Attribute on the non-finite counter naming which value was NaN/Inf.
ATTR_METRIC = "training.metric"

# --- span names ------------------------------------------------------------------------
SPAN_RUN = "mindformers.train"
SPAN_EPOCH = "mindformers.train.epoch"
SPAN_STEP = "mindformers.train.step"

# --- training metrics ------------------------------------------------------------------
LOSS = MetricSpec("mindformers.train.loss", Kind.GAUGE, "", "Training loss of the sampled step.")
LEARNING_RATE = MetricSpec(
    "mindformers.train.learning_rate", Kind.GAUGE, "", "Learning rate the sampled step used."
)
GRAD_NORM = MetricSpec(
    "mindformers.train.grad_norm", Kind.GAUGE, "", "Global gradient norm of the sampled step."
)
LOSS_SCALE = MetricSpec(
    "mindformers.train.loss_scale", Kind.GAUGE, "", "Loss scale in use at the sampled step."
)
OVERFLOW = MetricSpec(
    "mindformers.train.overflow",
    Kind.GAUGE,
    "",
    "1 when the sampled step overflowed (its update was skipped), else 0.",
)
OVERFLOW_STEPS = MetricSpec(
    "mindformers.train.overflow.steps",
    Kind.COUNTER,
    "{step}",
    "Sampled steps that overflowed.",
)
STEP_DURATION = MetricSpec(
    "mindformers.train.step.duration",
    Kind.HISTOGRAM,
    "s",
    "Wall time per training step, averaged over the steps since the previous sample.",
)
STEPS = MetricSpec("mindformers.train.steps", Kind.COUNTER, "{step}", "Training steps completed.")
SAMPLES_RATE = MetricSpec(
    "mindformers.train.samples.rate", Kind.GAUGE, "{sample}/s", "Training throughput in samples."
)
TOKENS_RATE = MetricSpec(
    "mindformers.train.tokens.rate", Kind.GAUGE, "{token}/s", "Training throughput in tokens."
)
NONFINITE = MetricSpec(
    "mindformers.train.nonfinite",
    Kind.COUNTER,
    "{value}",
    "NaN/Inf values seen (the SDK drops non-finite measurements, so they are counted here).",
)

TRAINING_METRICS: tuple[MetricSpec, ...] = (
    LOSS,
    LEARNING_RATE,
    GRAD_NORM,
    LOSS_SCALE,
    OVERFLOW,
    OVERFLOW_STEPS,
    STEP_DURATION,
    STEPS,
    SAMPLES_RATE,
    TOKENS_RATE,
    NONFINITE,
)

# Seconds-scaled buckets: the SDK defaults (0, 5, 10, 25, ...) suit milliseconds, not
# training steps that last from a few milliseconds (tiny CPU models) to minutes.
STEP_DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


# --- alerts (alerts/) ------------------------------------------------------------------
ATTR_ALERT_RULE = "training.alert.rule"
ATTR_ALERT_SEVERITY = "training.alert.severity"
ATTR_ALERT_STATUS = "training.alert.status"  # "firing" or "resolved"
ATTR_ALERT_VALUE = "training.alert.value"
ATTR_ALERT_THRESHOLD = "training.alert.threshold"
ATTR_NOTIFIER = "training.alert.notifier"
ATTR_NOTIFICATION_OUTCOME = "training.alert.outcome"  # "delivered", "failed" or "dropped"
# On the run span when an alert rule asked training to stop.
ATTR_STOP_REASON = "training.stop_reason"
# Span event on the step span, and event name of the alert log record.
EVENT_ALERT = "mindformers.alert"

ALERTS = MetricSpec(
    "mindformers.alerts",
    Kind.COUNTER,
    "{alert}",
    "Anomalies found by the in-process alert rules (sampled steps and stalls), by rule and severity.",
)
ALERT_NOTIFICATIONS = MetricSpec(
    "mindformers.alert.notifications",
    Kind.COUNTER,
    "{notification}",
    "Alert notifications by notifier and outcome (delivered, failed after retries, dropped).",
)

ALERT_METRICS: tuple[MetricSpec, ...] = (ALERTS, ALERT_NOTIFICATIONS)


# --- devices (devices/) ------------------------------------------------------------------
# Hardware series follow the OTel hardware semantic conventions (hw.*). Ascend NPUs have no
# convention yet: hw.npu.* mirrors hw.gpu.* as proposed upstream (semantic-conventions
# issue 2415), with hw.type "npu". docs/devices.md maps each name to npu-exporter's.
ATTR_HW_ID = "hw.id"
ATTR_HW_TYPE = "hw.type"
ATTR_HW_VENDOR = "hw.vendor"
ATTR_HW_MODEL = "hw.model"
ATTR_HW_STATE = "hw.state"  # ok, degraded, failed
ATTR_HW_GPU_TASK = "hw.gpu.task"
ATTR_HW_NPU_TASK = "hw.npu.task"  # aicore, aivector, aicpu, ctrlcpu, overall
ATTR_HW_NPU_MEMORY_TYPE = "hw.npu.memory.type"  # hbm, ddr
ATTR_SYSTEM_MEMORY_STATE = "system.memory.state"
ATTR_ERROR_TYPE = "error.type"
ATTR_DEVICE_SOURCE = "mindformers.device.source"  # npu-smi, nvml, psutil, mindspore

HW_NPU_UTILIZATION = "hw.npu.utilization"
HW_NPU_MEMORY_USAGE = "hw.npu.memory.usage"
HW_NPU_MEMORY_LIMIT = "hw.npu.memory.limit"
HW_NPU_MEMORY_UTILIZATION = "hw.npu.memory.utilization"
HW_GPU_UTILIZATION = "hw.gpu.utilization"
HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"
HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"
HW_GPU_MEMORY_UTILIZATION = "hw.gpu.memory.utilization"
HW_TEMPERATURE = "hw.temperature"
HW_POWER = "hw.power"
HW_STATUS = "hw.status"
HW_ERRORS = "hw.errors"
SYSTEM_CPU_UTILIZATION = "system.cpu.utilization"
SYSTEM_MEMORY_USAGE = "system.memory.usage"
SYSTEM_MEMORY_LIMIT = "system.memory.limit"
PROCESS_CPU_UTILIZATION = "process.cpu.utilization"
PROCESS_MEMORY_USAGE = "process.memory.usage"
DEVICE_PROCESS_MEMORY = "mindformers.device.process.memory.usage"
DEVICE_MEMORY_ALLOCATED = "mindformers.device.memory.allocated"
DEVICE_MEMORY_RESERVED = "mindformers.device.memory.reserved"
DEVICE_MEMORY_MAX_ALLOCATED = "mindformers.device.memory.max_allocated"
DEVICE_MEMORY_MAX_RESERVED = "mindformers.device.memory.max_reserved"
DEVICE_POLL_FAILURES = "mindformers.device.poll.failures"

_GAUGE, _UPDOWN = Kind.OBSERVABLE_GAUGE, Kind.OBSERVABLE_UP_DOWN_COUNTER
DEVICE_METRICS: tuple[MetricSpec, ...] = tuple(
    MetricSpec(name, kind, unit, description)
    for name, kind, unit, description in (
        (HW_NPU_UTILIZATION, _GAUGE, "1", "Fraction of time the NPU unit named by hw.npu.task was busy."),
        (HW_NPU_MEMORY_USAGE, _UPDOWN, "By", "NPU memory in use, by hw.npu.memory.type."),
        (HW_NPU_MEMORY_LIMIT, _UPDOWN, "By", "Size of the NPU memory, by hw.npu.memory.type."),
        (HW_NPU_MEMORY_UTILIZATION, _GAUGE, "1", "Fraction of NPU memory used, by hw.npu.memory.type."),
        (HW_GPU_UTILIZATION, _GAUGE, "1", "Fraction of time the GPU was busy."),
        (HW_GPU_MEMORY_USAGE, _UPDOWN, "By", "GPU memory in use."),
        (HW_GPU_MEMORY_LIMIT, _UPDOWN, "By", "Size of the GPU memory."),
        (HW_GPU_MEMORY_UTILIZATION, _GAUGE, "1", "Fraction of GPU memory used."),
        (HW_TEMPERATURE, _GAUGE, "Cel", "Device temperature (hw.type npu or gpu)."),
        (HW_POWER, _GAUGE, "W", "Device power draw (hw.type npu or gpu)."),
        (HW_STATUS, _UPDOWN, "1", "1 for the device's current hw.state (ok, degraded, failed), 0 for the others."),
        (HW_ERRORS, Kind.OBSERVABLE_COUNTER, "{error}", "ECC errors since the driver loaded, by error.type."),
        (SYSTEM_CPU_UTILIZATION, _GAUGE, "1", "Fraction of the node's CPU time not idle (one rank per node)."),
        (SYSTEM_MEMORY_USAGE, _UPDOWN, "By", "Node memory by system.memory.state (one rank per node)."),
        (SYSTEM_MEMORY_LIMIT, _UPDOWN, "By", "Node memory installed (one rank per node)."),
        (PROCESS_CPU_UTILIZATION, _GAUGE, "1", "This rank's CPU time over wall time, divided by its usable CPUs."),
        (PROCESS_MEMORY_USAGE, _UPDOWN, "By", "This rank's resident set size."),
        (DEVICE_PROCESS_MEMORY, _UPDOWN, "By", "Device memory this rank holds, as the driver reports it."),
        (DEVICE_MEMORY_ALLOCATED, _UPDOWN, "By", "Device memory MindSpore's allocator has handed to tensors."),
        (DEVICE_MEMORY_RESERVED, _UPDOWN, "By", "Device memory MindSpore's memory pool holds."),
        (DEVICE_MEMORY_MAX_ALLOCATED, _GAUGE, "By", "Peak of mindformers.device.memory.allocated."),
        (DEVICE_MEMORY_MAX_RESERVED, _GAUGE, "By", "Peak of mindformers.device.memory.reserved."),
        (DEVICE_POLL_FAILURES, Kind.COUNTER, "{poll}", "Device polls that failed, by source and error.type."),
    )
)  # fmt: skip


def all_metrics() -> tuple[MetricSpec, ...]:
    """Every metric the package can emit (training, device, alert and self metrics)."""
    return TRAINING_METRICS + ALERT_METRICS + DEVICE_METRICS
