"""ClusterD's `FaultMsgSignal` read as faults: one `HeardFault` per node and device.

ClusterD's fault service (component/clusterd/pkg/application/fault/publish_fault_plugin.go)
sends the job's whole fault picture on every change: `signalType` `fault` with the faulty
nodes (`NodeFaultInfo`: name, IP, SN, the node's state) and their devices
(`DeviceFaultInfo`: id, type, `faultCodes` with one level per code in `faultLevels`, and
`faultLevel`, ClusterD's summary state Healthy / SubHealthy / UnHealthy), or `normal` once
the job's faults are gone. The signal carries no time: a fault's time is when it was heard.

A message that breaks the contract (too many nodes or devices, oversized strings, codes
without levels) is cut to bounds, never trusted to size anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from otel_mindformers.cluster.fault_levels import level_of, most_severe, normalized, severity
from otel_mindformers.names import cluster_names as names

SIGNAL_FAULT = "fault"
SIGNAL_NORMAL = "normal"

# Bounds on what one signal may put into telemetry (a 4,096-NPU job's worst case fits).
MAX_FAULTS_PER_SIGNAL = 1024
MAX_CODES = 32
MAX_TEXT = 256


def _text(value: Any) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in str(value)[:MAX_TEXT])


def _texts(values: Any) -> tuple[str, ...]:
    return tuple(_text(v) for v in list(values)[:MAX_CODES])


@dataclasses.dataclass(frozen=True)
class HeardFault:
    """One node's (and, when ClusterD names one, one device's) fault, as heard at `time`."""

    time: float  # Unix seconds, when this process heard it
    node: str
    node_ip: str
    device: str | None  # ClusterD's device id (the NPU's physical id), None for a node-wide fault
    device_type: str | None
    level: str  # the most severe level of its codes, else ClusterD's state for it
    state: str  # ClusterD's Healthy / SubHealthy / UnHealthy
    codes: tuple[str, ...]
    types: tuple[str, ...]
    reasons: tuple[str, ...]

    def attributes(self) -> dict[str, Any]:
        """Span-event / log-record attributes."""
        attributes: dict[str, Any] = {
            names.ATTR_FAULT_LEVEL: self.level,
            names.ATTR_FAULT_STATE: self.state,
            names.ATTR_NODE_NAME: self.node,
            names.ATTR_FAULT_CODES: list(self.codes),
        }
        if self.node_ip:
            attributes[names.ATTR_NODE_IP] = self.node_ip
        if self.device is not None:
            attributes[names.ATTR_DEVICE_ID] = self.device
        if self.device_type:
            attributes[names.ATTR_DEVICE_TYPE] = self.device_type
        if self.types:
            attributes[names.ATTR_FAULT_TYPES] = list(self.types)
        if self.reasons:
            attributes[names.ATTR_FAULT_REASONS] = list(self.reasons)
        return attributes

    def describe(self) -> str:
        """`node worker-3, NPU 3, SeparateNPU, 80E21007`: the report's words."""
        parts = [f"node {self.node or self.node_ip or '?'}"]
        if self.device is not None:
            parts.append(f"{self.device_type or 'NPU'} {self.device}")
        parts.append(self.level)
        if self.codes:
            parts.append(",".join(self.codes))
        return ", ".join(parts)

    def ledger_fields(self) -> dict[str, Any]:
        """What the attempt's ledger entry keeps (restarts/): JSON-ready."""
        return {
            "time": round(self.time, 3),
            "node": self.node,
            "node_ip": self.node_ip,
            "device": self.device,
            "device_type": self.device_type,
            "level": self.level,
            "codes": list(self.codes),
        }


@dataclasses.dataclass(frozen=True)
class Signal:
    kind: str  # fault / normal / whatever else ClusterD sent (kept, never trusted)
    uuid: str
    job_id: str
    faults: tuple[HeardFault, ...]

    @property
    def worst(self) -> HeardFault | None:
        """The most severe fault of the signal (the one an attempt is said to have ended by)."""
        return max(self.faults, key=lambda fault: severity(fault.level), default=None)


def _device_level(device: Any) -> str:
    """The most severe of the levels ClusterD sent with the codes, else the table's level of
    each code, else ClusterD's summary state."""
    levels = [_text(level) for level in list(device.faultLevels)[:MAX_CODES] if level]
    if not levels:
        levels = [level_of(code) for code in list(device.faultCodes)[:MAX_CODES]]
    return most_severe(levels) or _text(device.faultLevel) or "unknown"


def read_signal(message: Any, heard_at: float) -> Signal:
    """A `fault_pb2.FaultMsgSignal` as a Signal (bounded)."""
    faults: list[HeardFault] = []
    for node in list(message.nodeFaultInfo)[:MAX_FAULTS_PER_SIGNAL]:
        node_name, node_ip, state = _text(node.nodeName), _text(node.nodeIP), _text(node.faultLevel)
        devices = list(node.faultDevice)[: MAX_FAULTS_PER_SIGNAL - len(faults)]
        if not devices:
            faults.append(HeardFault(heard_at, node_name, node_ip, None, None, state or "unknown", state, (), (), ()))
        for device in devices:
            faults.append(
                HeardFault(
                    time=heard_at,
                    node=node_name,
                    node_ip=node_ip,
                    device=_text(device.deviceId),
                    device_type=_text(device.deviceType) or None,
                    level=_device_level(device),
                    state=_text(device.faultLevel),
                    codes=tuple(normalized(code) for code in _texts(device.faultCodes)),
                    types=_texts(device.faultType),
                    reasons=_texts(device.faultReason),
                )
            )
        if len(faults) >= MAX_FAULTS_PER_SIGNAL:
            break
    return Signal(_text(message.signalType), _text(message.uuid), _text(message.jobId), tuple(faults))


__all__ = ["SIGNAL_FAULT", "SIGNAL_NORMAL", "HeardFault", "Signal", "read_signal"]
