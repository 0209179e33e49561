"""The ClusterD fault that ended an attempt, in `report`'s words.

An attempt's ledger entry keeps the last fault ClusterD reported during it (`cluster_fault`,
cluster/heard.py). An attempt that did not complete, with such a fault not cleared before
it ended, is said to have ended by it: "attempt 2 ended: node worker-3, NPU 3, SeparateNPU,
80E21007, 4 s before its last heartbeat" (a killed attempt ended at its last heartbeat).
"""

from __future__ import annotations

from typing import Any

from otel_mindformers.names import job as job_names


def fault_words(fault: dict[str, Any]) -> str:
    """`node worker-3, NPU 3, SeparateNPU, 80E21007`."""
    parts = [f"node {fault.get('node') or fault.get('node_ip') or '?'}"]
    if fault.get("device") is not None:
        parts.append(f"{fault.get('device_type') or 'NPU'} {fault['device']}")
    parts.append(str(fault.get("level") or "unknown level"))
    codes = fault.get("codes") or []
    if codes:
        parts.append(",".join(str(code) for code in codes))
    return ", ".join(parts)


def what_ended(row: dict[str, Any]) -> str | None:
    """The ClusterD fault that ended `row` (a `report` attempt row) and when, or None when
    no such fault did: `node worker-3, NPU 3, SeparateNPU, 80E21007, 4 s before its last heartbeat`."""
    fault = row.get("cluster_fault")
    if not isinstance(fault, dict) or fault.get("cleared") is not None:
        return None
    if row.get("outcome") in (job_names.OUTCOME_COMPLETED, job_names.OUTCOME_RUNNING):
        return None
    try:
        gap = float(row["end"]) - float(fault["time"])
    except (KeyError, TypeError, ValueError):
        return fault_words(fault)
    mark = "its last heartbeat" if row.get("outcome") == job_names.OUTCOME_KILLED else "it ended"
    return f"{fault_words(fault)}, {abs(gap):.0f} s {'before' if gap >= 0 else 'after'} {mark}"


def ended_by(row: dict[str, Any]) -> str | None:
    """`attempt 2 ended: node worker-3, ...`, or None (`what_ended`)."""
    what = what_ended(row)
    return None if what is None else f"attempt {row.get('attempt')} ended: {what}"


__all__ = ["ended_by", "fault_words", "what_ended"]
