"""Telemetry names of the MindCluster bridge (docs/mindcluster.md): the faults ClusterD tells
the job, the public faults the job tells ClusterD, MindSpore's silent-data-corruption
detection and the pre-flight check.

Attribute keys under `mindcluster.` carry MindCluster's own vocabulary (its fault levels,
codes, node names); `mindspore.asd.*` describes MindSpore's feature-value detection switches.
"""

from __future__ import annotations

from otel_mindformers.names.spec import Kind, MetricSpec

# --- a fault ClusterD sent (its FaultMsgSignal, one event per node and device) -----------------
EVENT_FAULT = "mindcluster.fault"
EVENT_FAULT_CLEARED = "mindcluster.fault.cleared"  # a `normal` signal: the job's faults are gone
ATTR_SIGNAL_TYPE = "mindcluster.signal.type"  # fault / normal
ATTR_SIGNAL_UUID = "mindcluster.signal.uuid"
ATTR_FAULT_LEVEL = "mindcluster.fault.level"  # SeparateNPU, RestartNPU, ... (the most severe of the codes')
ATTR_FAULT_STATE = "mindcluster.fault.state"  # Healthy / SubHealthy / UnHealthy (ClusterD's summary)
ATTR_FAULT_CODES = "mindcluster.fault.codes"
ATTR_FAULT_TYPES = "mindcluster.fault.types"
ATTR_FAULT_REASONS = "mindcluster.fault.reasons"
ATTR_NODE_NAME = "mindcluster.node.name"
ATTR_NODE_IP = "mindcluster.node.ip"
ATTR_DEVICE_ID = "mindcluster.device.id"  # ClusterD's device id: the NPU's physical id
ATTR_DEVICE_TYPE = "mindcluster.device.type"

# --- a verdict told to ClusterD as a public fault ------------------------------------------
EVENT_PUBLIC_FAULT = "mindcluster.public_fault"
ATTR_VERDICT = "mindcluster.verdict"  # sdc_suspect / slow_node / stalled_rank
ATTR_ASSERTION = "mindcluster.assertion"  # occur / recover
ATTR_FAULT_CODE = "mindcluster.fault.code"
ATTR_FAULT_ID = "mindcluster.fault.id"
ATTR_OUTCOME = "mindcluster.outcome"  # sent / refused / failed

VERDICT_SDC_SUSPECT = "sdc_suspect"
VERDICT_SLOW_NODE = "slow_node"
VERDICT_STALLED_RANK = "stalled_rank"
VERDICTS = (VERDICT_SDC_SUSPECT, VERDICT_SLOW_NODE, VERDICT_STALLED_RANK)

# --- MindSpore's silent-data-corruption detection ------------------------------------------
ATTR_ASD_ENABLED = "mindspore.asd.enabled"  # resource: feature-value detection on (either switch)
ATTR_ASD_NPU_ASD_ENABLE = "mindspore.asd.npu_asd_enable"  # resource: NPU_ASD_ENABLE as set
ATTR_ASD_CONFIG = "mindspore.asd.config"  # resource: MS_NPU_ASD_CONFIG as set
ATTR_ASD_CHECKSUM = "mindspore.asd.checksum"  # resource: MS_NPU_ASD_CONFIG's with_checksum
EVENT_ASD = "mindspore.asd.detection"
ATTR_ASD_KIND = "mindspore.asd.kind"  # strike / strikeout / checksum_error / sdc_error / feature_abnormal
ATTR_ASD_RANK = "mindspore.asd.rank"  # the rank the line names (else the rank that logged it)
ALERT_RULE_SDC = "sdc_detected"

# --- the pre-flight check ------------------------------------------------------------------
SPAN_PREFLIGHT = "mindformers.preflight"
ATTR_PREFLIGHT_RESULT = "mindformers.preflight.result"  # passed / failed / not_available
ATTR_PREFLIGHT_DETAIL = "mindformers.preflight.detail"

CLUSTER_FAULTS = MetricSpec(
    "mindformers.cluster.faults",
    Kind.COUNTER,
    "{fault}",
    "Faults ClusterD reported to this job (one per node and device of a fault signal), by mindcluster.fault.level.",
)
PUBLIC_FAULTS = MetricSpec(
    "mindformers.cluster.public_faults",
    Kind.COUNTER,
    "{fault}",
    "Public faults this rank told ClusterD, by mindcluster.verdict, mindcluster.assertion and mindcluster.outcome.",
)
ASD_DETECTIONS = MetricSpec(
    "mindformers.asd.detections",
    Kind.COUNTER,
    "{detection}",
    "MindSpore's silent-data-corruption detection lines found in the log, by mindspore.asd.kind.",
)
CLUSTER_METRICS: tuple[MetricSpec, ...] = (CLUSTER_FAULTS, PUBLIC_FAULTS, ASD_DETECTIONS)
