"""Every telemetry name this package emits outside the training-metric table.

Span names, resource / point / span attribute keys (the job's layout and software versions
among them), and the alert and device metrics live here; the training metrics live in
`names.training.TABLE`, the phase names in `names.phases`. `all_metrics()` is the union
docs/telemetry.md's name tables and the collector rules' consistency test read.
"""

from __future__ import annotations

from otel_mindformers.names import capture_names, cluster_names, phase_names, straggler_names
from otel_mindformers.names import model_state as model_state_specs
from otel_mindformers.names import training as training_metrics
from otel_mindformers.names.capture_names import CAPTURE_METRICS
from otel_mindformers.names.cluster_names import CLUSTER_METRICS
from otel_mindformers.names.diagnosis import DIAGNOSIS_METRICS
from otel_mindformers.names.job import JOB_INFO, JOB_METRICS  # noqa: F401  (JOB_INFO: semconv's name for it)
from otel_mindformers.names.phase_names import PHASE_DURATION
from otel_mindformers.names.spec import Kind, MetricSpec
from otel_mindformers.names.straggler_names import STRAGGLER_METRICS

INSTRUMENTATION_NAME = "otel_mindformers"
# `service.name` when neither monitor_config nor OTEL_SERVICE_NAME gives one.
DEFAULT_SERVICE_NAME = "mindformers-train"

# The phase of a phase span and of `mindformers.phase.duration` points (names/phase_names.py).
ATTR_PHASE = phase_names.ATTR_PHASE
# Model-state attributes (names/model_state.py): the layer, kind and parameter of a reading.
ATTR_LAYER = model_state_specs.ATTR_LAYER
ATTR_KIND = model_state_specs.ATTR_KIND
ATTR_PARAMETER = model_state_specs.ATTR_PARAMETER
ATTR_LOSS = model_state_specs.ATTR_LOSS
# Capture attributes (names/capture_names.py): the kind, folder, trigger and outcome of a capture.
ATTR_CAPTURE_KIND = capture_names.ATTR_CAPTURE_KIND
ATTR_CAPTURE_PATH = capture_names.ATTR_CAPTURE_PATH
ATTR_CAPTURE_TRIGGER = capture_names.ATTR_CAPTURE_TRIGGER
ATTR_CAPTURE_OUTCOME = capture_names.ATTR_CAPTURE_OUTCOME
ATTR_CAPTURE_STEPS = capture_names.ATTR_CAPTURE_STEPS
# The section of a rank's section time and straggler signal (names/straggler_names.py).
ATTR_SECTION = straggler_names.ATTR_SECTION
ATTR_STRAGGLER_SCORE = straggler_names.ATTR_SCORE
# MindCluster's faults, the public faults told to it, MindSpore's SDC lines (names/cluster_names.py).
ATTR_CLUSTER_FAULT_LEVEL = cluster_names.ATTR_FAULT_LEVEL
ATTR_CLUSTER_VERDICT = cluster_names.ATTR_VERDICT
ATTR_CLUSTER_ASSERTION = cluster_names.ATTR_ASSERTION
ATTR_CLUSTER_OUTCOME = cluster_names.ATTR_OUTCOME
ATTR_ASD_KIND = cluster_names.ATTR_ASD_KIND


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
# The job's parallel layout and software versions (resource attributes, job.identity).
ATTR_PARALLEL_MODE = "training.parallel.mode"  # MindSpore's: stand_alone, data_parallel, semi_auto_parallel
ATTR_PARALLEL_DEVICES = "training.parallel.devices"
ATTR_PARALLEL_DATA = "training.parallel.data"
ATTR_PARALLEL_TENSOR = "training.parallel.tensor"
ATTR_PARALLEL_PIPELINE = "training.parallel.pipeline"
ATTR_PARALLEL_EXPERT = "training.parallel.expert"
ATTR_PARALLEL_CONTEXT = "training.parallel.context"
ATTR_MICRO_BATCHES = "training.micro_batches"
ATTR_GLOBAL_BATCH_SIZE = "training.global_batch_size"
ATTR_SEQUENCE_LENGTH = "training.sequence_length"
ATTR_MINDSPORE_VERSION = "training.software.mindspore.version"
ATTR_MINDFORMERS_VERSION = "training.software.mindformers.version"
ATTR_CANN_VERSION = "training.software.cann.version"
ATTR_DRIVER_VERSION = "training.software.driver.version"
ATTR_FIRMWARE_VERSION = "training.software.firmware.version"
ATTR_STEP = "training.step"
ATTR_EPOCH = "training.epoch"
ATTR_STEPS_IN_WINDOW = "training.steps_in_window"
# On a step span a later process recovered from a dead run's flight ring (flight_recorder/).
ATTR_RECOVERED = "training.step.recovered"
# On the log record that says how many records of a logger the rate limit dropped (telemetry/log_bridge.py).
ATTR_LOGS_DROPPED = "training.logs.dropped"
# On a shipped log record whose body or attributes were cut to the bridge's bounds: the
# characters left out in all (telemetry/log_bridge.py).
ATTR_LOG_TRUNCATED = "training.logs.truncated_chars"

# --- span names ------------------------------------------------------------------------
SPAN_RUN = "mindformers.train"
SPAN_EPOCH = "mindformers.train.epoch"
SPAN_STEP = "mindformers.train.step"
# The root of a job step's trace: the parent of every rank's step span of that sampled step
# (telemetry/step_ids.py), emitted by one rank (telemetry/export_ranks.py).
SPAN_JOB_STEP = "mindformers.job.step"

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

ALERT_METRICS: tuple[MetricSpec, ...] = (ALERTS, ALERT_NOTIFICATIONS, *CAPTURE_METRICS)


# --- devices (devices/) ------------------------------------------------------------------
# Hardware series follow the OTel hardware semantic conventions (hw.*). Ascend NPUs have no
# convention yet: hw.npu.* mirrors hw.gpu.* as proposed upstream (semantic-conventions
# issue 2415), with hw.type "npu". docs/devices.md maps each name to npu-exporter's.
ATTR_HW_ID = "hw.id"
ATTR_HW_TYPE = "hw.type"
ATTR_HW_VENDOR = "hw.vendor"
ATTR_HW_MODEL = "hw.model"
ATTR_HW_STATE = "hw.state"  # ok, degraded, predicted_failure, failed
ATTR_HW_NAME = "hw.name"
ATTR_HW_PARENT = "hw.parent"  # a NIC or NVLink's device: npu-1, gpu-0
ATTR_HW_DRIVER_VERSION = "hw.driver_version"
ATTR_HW_FIRMWARE_VERSION = "hw.firmware_version"
ATTR_HW_SERIAL_NUMBER = "hw.serial_number"
ATTR_HW_LIMIT_TYPE = "hw.limit_type"  # max, high.critical, low.critical
ATTR_NETWORK_IO_DIRECTION = "network.io.direction"  # transmit, receive
# Extensions (no convention yet): an Ascend chip's active error codes, NVIDIA's clock
# throttle reasons, and the lane of a multi-lane optical module.
ATTR_HW_NPU_ERROR_CODE = "hw.npu.error_code"  # 0x80E01801
ATTR_HW_GPU_THROTTLE_REASON = "hw.gpu.throttle.reason"  # sw_power_cap, hw_slowdown, ...
ATTR_HW_NETWORK_OPTICAL_LANE = "hw.network.optical.lane"
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
HW_ENERGY = "hw.energy"
HW_NETWORK_UP = "hw.network.up"
HW_NETWORK_PACKETS = "hw.network.packets"
HW_NETWORK_IO = "hw.network.io"
HW_NETWORK_OPTICAL_POWER = "hw.network.optical.power"
HW_NETWORK_OPTICAL_POWER_LIMIT = "hw.network.optical.power.limit"
HW_NPU_SPEED = "hw.npu.speed"
HW_NPU_SPEED_LIMIT = "hw.npu.speed.limit"
HW_NPU_ERROR_CODE = "hw.npu.error_code"
HW_NPU_MEMORY_ISOLATED_PAGES = "hw.npu.memory.isolated_pages"
HW_GPU_MEMORY_REMAPPED_ROWS = "hw.gpu.memory.remapped_rows"
HW_GPU_THROTTLED = "hw.gpu.throttled"
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
        (HW_TEMPERATURE, _GAUGE, "Cel", "Device temperature (hw.type npu, gpu, or network: optical module)."),
        (HW_POWER, _GAUGE, "W", "Device power draw (hw.type npu or gpu)."),
        (HW_STATUS, _UPDOWN, "1",
         "1 for the current hw.state (ok, degraded, predicted_failure, failed), 0 for the others."),
        (HW_ERRORS, Kind.OBSERVABLE_COUNTER, "{error}",
         "Errors by error.type: ECC, XID, and link errors (hw.type network) by network.io.direction."),
        (HW_ENERGY, Kind.OBSERVABLE_COUNTER, "J", "Device energy since the run started (integrated from hw.power "
                                                   "where the driver has no energy counter)."),
        (HW_NETWORK_UP, _UPDOWN, "1", "1 while the link (RoCE port, NVLink) is up, 0 while it is down."),
        (HW_NETWORK_PACKETS, Kind.OBSERVABLE_COUNTER, "{packet}", "Packets through the port by network.io.direction."),
        (HW_NETWORK_IO, Kind.OBSERVABLE_COUNTER, "By", "Bytes through the port by network.io.direction."),
        (HW_NETWORK_OPTICAL_POWER, _GAUGE, "W", "Optical module power by network.io.direction (and lane)."),
        (HW_NETWORK_OPTICAL_POWER_LIMIT, _GAUGE, "W", "The optical module's power thresholds, by hw.limit_type."),
        (HW_NPU_SPEED, _GAUGE, "Hz", "Current AI Core clock."),
        (HW_NPU_SPEED_LIMIT, _GAUGE, "Hz", "Rated AI Core clock (hw.limit_type max)."),
        (HW_NPU_ERROR_CODE, _UPDOWN, "1", "1 for each error code the chip reports now (hw.npu.error_code)."),
        (HW_NPU_MEMORY_ISOLATED_PAGES, _UPDOWN, "{page}", "Memory pages isolated after ECC errors, by error.type."),
        (HW_GPU_MEMORY_REMAPPED_ROWS, _UPDOWN, "{row}", "Memory rows remapped after ECC errors, by error.type."),
        (HW_GPU_THROTTLED, _UPDOWN, "1", "1 while the clock is held down for hw.gpu.throttle.reason, else 0."),
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
    return (
        training_metrics.INSTRUMENTS
        + (PHASE_DURATION,)
        + DIAGNOSIS_METRICS
        + STRAGGLER_METRICS
        + ALERT_METRICS
        + JOB_METRICS
        + CLUSTER_METRICS
        + DEVICE_METRICS
    )


def markdown_table() -> str:
    """docs/telemetry.md's table of the metrics beside the training table (diagnosis, alert,
    device, host and self metrics), generated from the specs above."""
    lines = ["| metric | kind | unit | meaning |", "|---|---|---|---|"]
    for spec in (
        (PHASE_DURATION,)
        + DIAGNOSIS_METRICS
        + STRAGGLER_METRICS
        + ALERT_METRICS
        + JOB_METRICS
        + CLUSTER_METRICS
        + DEVICE_METRICS
    ):
        unit = f"`{spec.unit}`" if spec.unit else ""
        lines.append(f"| `{spec.name}` | {spec.kind.value.replace('_', ' ')} | {unit} | {spec.description} |")
    return "\n".join(lines)
