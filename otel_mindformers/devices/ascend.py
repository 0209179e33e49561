"""Ascend NPU readings from `npu-smi`.

Each poll runs the plain table (health, power, temperature, AI Core, HBM and DDR use, the
process table) and `-t usages` per NPU (vector, AI CPU, control CPU and overall use, memory
capacities); `-t common` only when the table left temperature or power blank, as it does
for the second chip of an A3 NPU on some drivers. Fields are merged in that order: the first
source to print a value wins.
"""

from __future__ import annotations

import os
from typing import Collection, Mapping

from otel_mindformers import semconv
from otel_mindformers.devices import npu_smi as smi
from otel_mindformers.devices.base import MIB, AttributeValue, Point, Readings, SourceError
from otel_mindformers.devices.command import run_tool

VENDOR = "Huawei"

# npu-smi's Health column -> hw.state. Warning is a minor alarm; Alarm and Critical are the
# major and critical ones, for which the chip is not usable for training.
_HEALTH_STATES = {"ok": "ok", "warning": "degraded", "alarm": "failed", "critical": "failed"}
_STATES = ("ok", "degraded", "failed")

_TASKS = ((smi.AICORE, "aicore"), (smi.AIVECTOR, "aivector"), (smi.AICPU, "aicpu"),
          (smi.CTRLCPU, "ctrlcpu"), (smi.OVERALL, "overall"))  # fmt: skip


def device_of(chip: smi.NpuChip) -> int:
    """The device id training code uses for a chip: its own column where printed (A3),
    else the NPU id (one chip per NPU)."""
    return chip.device_id if chip.device_id is not None else chip.npu_id


class AscendSource:
    """Reads `devices` (driver device ids; None for every chip) and keeps `own_device`'s
    readings in the snapshot."""

    name = "npu-smi"

    def __init__(
        self,
        npu_smi: str,
        timeout: float,
        devices: Collection[int] | None,
        own_device: int | None,
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        self._npu_smi = npu_smi
        self._timeout = timeout
        self._devices = devices
        self._own_device = own_device
        self._attributes = dict(attributes)

    def read(self) -> Readings:
        table = smi.parse_table(self._run("info"))
        chips = [c for c in table.chips if self._devices is None or device_of(c) in self._devices]
        missing = set(self._devices or ()) - {device_of(c) for c in chips}
        if missing:
            raise smi.NpuSmiParseError(f"device {sorted(missing)} not in the `npu-smi info` table")
        usages: dict[int, list[smi.ChipBlock]] = {}
        points: list[Point] = []
        snapshot: dict[str, float] = {}
        for chip in chips:
            if chip.npu_id not in usages:
                usages[chip.npu_id] = self._blocks("usages", chip.npu_id)
            values = _merge(chip.values, _block_of(usages[chip.npu_id], chip.chip_id))
            if smi.TEMPERATURE not in values or smi.POWER not in values:
                values = _merge(values, _block_of(self._blocks("common", chip.npu_id), chip.chip_id))
            process_mb = _process_memory(table.processes, chip)
            points.extend(self._points(chip, values, process_mb))
            if device_of(chip) == self._own_device:
                snapshot = _snapshot(values, process_mb)
        return Readings(tuple(points), snapshot)

    def close(self) -> None:
        """Nothing is held between polls."""

    def _run(self, *args: str) -> str:
        return run_tool([self._npu_smi, *args], self._timeout)

    def _blocks(self, kind: str, npu_id: int) -> list[smi.ChipBlock]:
        return smi.parse_chip_blocks(self._run("info", "-t", kind, "-i", str(npu_id)))

    def _points(self, chip: smi.NpuChip, values: dict[str, float], process_mb: float | None) -> list[Point]:
        attrs = {
            **self._attributes,
            semconv.ATTR_HW_ID: f"npu-{device_of(chip)}",
            semconv.ATTR_HW_TYPE: "npu",
            semconv.ATTR_HW_VENDOR: VENDOR,
        }
        if chip.model:
            attrs[semconv.ATTR_HW_MODEL] = chip.model
        points = [
            Point(semconv.HW_NPU_UTILIZATION, values[field] / 100.0, {**attrs, semconv.ATTR_HW_NPU_TASK: task})
            for field, task in _TASKS
            if field in values
        ]
        for memory, used, total, usage in (("hbm", smi.HBM_USED, smi.HBM_TOTAL, smi.HBM_USAGE),
                                           ("ddr", smi.DDR_USED, smi.DDR_TOTAL, smi.DDR_USAGE)):
            if not values.get(total):
                continue  # `0 / 0`: this board does not expose that memory
            memory_attrs = {**attrs, semconv.ATTR_HW_NPU_MEMORY_TYPE: memory}
            points.append(Point(semconv.HW_NPU_MEMORY_LIMIT, values[total] * MIB, memory_attrs))
            if used in values:
                points.append(Point(semconv.HW_NPU_MEMORY_USAGE, values[used] * MIB, memory_attrs))
                fraction = values[used] / values[total]
                points.append(Point(semconv.HW_NPU_MEMORY_UTILIZATION, fraction, memory_attrs))
            elif usage in values:
                points.append(Point(semconv.HW_NPU_MEMORY_UTILIZATION, values[usage] / 100.0, memory_attrs))
        if smi.TEMPERATURE in values:
            points.append(Point(semconv.HW_TEMPERATURE, values[smi.TEMPERATURE], attrs))
        if smi.POWER in values:
            points.append(Point(semconv.HW_POWER, values[smi.POWER], attrs))
        state = _HEALTH_STATES.get((chip.health or "").lower())
        if state is not None:
            points.extend(
                Point(semconv.HW_STATUS, 1.0 if s == state else 0.0, {**attrs, semconv.ATTR_HW_STATE: s})
                for s in _STATES
            )
        if process_mb is not None:
            points.append(Point(semconv.DEVICE_PROCESS_MEMORY, process_mb * MIB, attrs))
        return points


def _process_memory(processes: tuple[smi.NpuProcess, ...], chip: smi.NpuChip) -> float | None:
    """This process's memory on `chip`; None when the table does not list it (for example
    under a container's own pid namespace)."""
    own = [
        p.memory_mb for p in processes
        if p.pid == os.getpid() and (p.npu_id, p.chip_id) == (chip.npu_id, chip.chip_id)
    ]
    return sum(own) if own else None


def _block_of(blocks: list[smi.ChipBlock], chip_id: int) -> dict[str, float]:
    for block in blocks:
        if block.chip_id == chip_id or (block.chip_id is None and len(blocks) == 1):
            return block.values
    return {}


def _merge(first: Mapping[str, float], then: Mapping[str, float]) -> dict[str, float]:
    return {**then, **first}


def _snapshot(values: Mapping[str, float], process_mb: float | None) -> dict[str, float]:
    keys = {
        "npu_utilization": smi.AICORE,
        "npu_hbm_used_mb": smi.HBM_USED,
        "npu_hbm_total_mb": smi.HBM_TOTAL,
        "npu_temperature_c": smi.TEMPERATURE,
        "npu_power_w": smi.POWER,
    }
    snapshot = {key: values[field] for key, field in keys.items() if field in values}
    if process_mb is not None:
        snapshot["npu_process_memory_mb"] = process_mb
    return snapshot
