"""Ascend NPU readings from `npu-smi`.

Each poll runs the plain table (health, power, temperature, AI Core, HBM and DDR use, the
process table, the driver version) and, per NPU, `-t usages` (vector, AI CPU, control CPU
and overall use, memory capacities), `-t common` (AI Core clocks; temperature and power the
table left blank, as it does for the second chip of an A3 NPU) and `-t ecc`; per chip
`-t health` (error codes). `-t board` (chip name, firmware) is read once per chip.

When two sources print the same field, the first wins, in that order: table, `-t usages`,
`-t common`, then `-t health` for the health state. The table is one snapshot of every chip,
so its values agree with each other and with the process table.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from functools import partial
from typing import TypeVar

from otel_mindformers.cluster.fault_levels import level_of
from otel_mindformers.devices import npu_smi as smi
from otel_mindformers.devices.command import Queries, run_tool
from otel_mindformers.devices.energy import EnergyIntegrator
from otel_mindformers.devices.source import MIB, AttributeValue, Point, Readings
from otel_mindformers.names import cluster_names, semconv

_T = TypeVar("_T")

VENDOR = "Huawei"

# npu-smi's Health column -> hw.state. Warning is a minor alarm; Alarm and Critical are the
# major and critical ones, for which the chip is not usable for training. No npu-smi health
# value predicts a failure; the state is listed so every device kind has the same series.
_HEALTH_STATES = {"ok": "ok", "warning": "degraded", "alarm": "failed", "critical": "failed"}
STATES = ("ok", "degraded", "predicted_failure", "failed")

_TASKS = ((smi.AICORE, "aicore"), (smi.AIVECTOR, "aivector"), (smi.AICPU, "aicpu"),
          (smi.CTRLCPU, "ctrlcpu"), (smi.OVERALL, "overall"))  # fmt: skip

TABLE, USAGES, COMMON = "npu-smi info", "npu-smi info -t usages", "npu-smi info -t common"
ECC, HEALTH, BOARD = "npu-smi info -t ecc", "npu-smi info -t health", "npu-smi info -t board"


def device_of(chip: smi.NpuChip) -> int:
    """The device id training code uses for a chip: its own column where printed (A3),
    else the NPU id (one chip per NPU)."""
    return chip.device_id if chip.device_id is not None else chip.npu_id


def status_points(state: str | None, attrs: Mapping[str, AttributeValue], tool: str) -> list[Point]:
    """hw.status: 1 for `state`, 0 for the others; nothing when the state is unknown."""
    if state is None:
        return []
    return [
        Point(semconv.HW_STATUS, 1.0 if s == state else 0.0, {**attrs, semconv.ATTR_HW_STATE: s}, tool) for s in STATES
    ]


class AscendSource:
    """Reads `devices` (driver device ids; None for every chip) and keeps `own_device`'s
    readings in the snapshot. `devices_seen` lists the chips of the last poll (the RoCE
    ports hccn_tool reads belong to them)."""

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
        self._boards: dict[tuple[int, int], smi.ChipBoard] = {}  # read once: it does not change
        self._energy = EnergyIntegrator()
        self.devices_seen: list[int] = []

    def read(self) -> Readings:
        table = smi.parse_table(self._run("info"))
        chips = [c for c in table.chips if self._devices is None or device_of(c) in self._devices]
        missing = set(self._devices or ()) - {device_of(c) for c in chips}
        if missing:
            raise smi.NpuSmiParseError(f"device {sorted(missing)} not in the `npu-smi info` table")
        queries = Queries()
        per_npu: dict[int, tuple[list, list, list]] = {}
        points: list[Point] = []
        snapshot: dict[str, float] = {}
        for chip in chips:
            if chip.npu_id not in per_npu:
                per_npu[chip.npu_id] = (
                    queries.run(USAGES, partial(self._blocks, "usages", chip.npu_id)) or [],
                    queries.run(COMMON, partial(self._blocks, "common", chip.npu_id)) or [],
                    queries.run(ECC, partial(self._parsed, smi.parse_ecc, "ecc", chip.npu_id)) or [],
                )
            usages, common, ecc = per_npu[chip.npu_id]
            values, origin = _merge(
                (TABLE, chip.values),
                (USAGES, _block_of(usages, chip.chip_id)),
                (COMMON, _block_of(common, chip.chip_id)),
            )
            health = queries.run(HEALTH, partial(self._parsed, smi.parse_health, "health", chip.npu_id, chip.chip_id))
            board = self._board(chip, queries)
            process_mb = _process_memory(table.processes, chip)
            attrs = self._device_attributes(chip, board, table.driver_version)
            points += _chip_points(values, origin, attrs, process_mb)
            points += _health_points(chip, health, attrs)
            points += _ecc_points(_block_of(ecc, chip.chip_id), attrs)
            if smi.POWER in values:
                joules = self._energy.add(device_of(chip), values[smi.POWER])
                points.append(Point(semconv.HW_ENERGY, joules, attrs, origin[smi.POWER]))
            if device_of(chip) == self._own_device:
                snapshot = _snapshot(values, process_mb)
        self.devices_seen = [device_of(c) for c in chips]
        return Readings(tuple(points), snapshot, tuple(queries.problems))

    def close(self) -> None:
        """Nothing is held between polls."""

    def _run(self, *args: str) -> str:
        return run_tool([self._npu_smi, *args], self._timeout)

    def _info(self, kind: str, npu_id: int, chip_id: int | None = None) -> str:
        chip = () if chip_id is None else ("-c", str(chip_id))
        return self._run("info", "-t", kind, "-i", str(npu_id), *chip)

    def _parsed(self, parse: Callable[[str], _T], kind: str, npu_id: int, chip_id: int | None = None) -> _T:
        return parse(self._info(kind, npu_id, chip_id))

    def _blocks(self, kind: str, npu_id: int) -> list[smi.ChipBlock]:
        return smi.parse_chip_blocks(self._info(kind, npu_id), f"npu-smi info -t {kind}")

    def _board(self, chip: smi.NpuChip, queries: Queries) -> smi.ChipBoard:
        """The chip's board fields, read on the first poll; a board that cannot tell is not
        asked again (a timeout, which fails the poll, is retried with it)."""
        key = (chip.npu_id, chip.chip_id)
        if key not in self._boards:
            board = queries.run(BOARD, lambda: smi.parse_board(self._info("board", chip.npu_id, chip.chip_id)))
            self._boards[key] = board or smi.ChipBoard()
        return self._boards[key]

    def _device_attributes(
        self, chip: smi.NpuChip, board: smi.ChipBoard, driver_version: str | None
    ) -> dict[str, AttributeValue]:
        attrs: dict[str, AttributeValue] = {
            **self._attributes,
            semconv.ATTR_HW_ID: f"npu-{device_of(chip)}",
            semconv.ATTR_HW_TYPE: "npu",
            semconv.ATTR_HW_VENDOR: VENDOR,
            # The chip as npu-smi addresses it (`-i 1 -c 0`), for the operator who goes there.
            semconv.ATTR_HW_NAME: f"NPU {chip.npu_id} chip {chip.chip_id}",
        }
        optional = ((semconv.ATTR_HW_MODEL, chip.model), (semconv.ATTR_HW_DRIVER_VERSION, driver_version),
                    (semconv.ATTR_HW_FIRMWARE_VERSION, board.firmware_version),
                    (semconv.ATTR_HW_SERIAL_NUMBER, board.serial_number))  # fmt: skip
        attrs.update((key, value) for key, value in optional if value)
        return attrs


def _chip_points(
    values: dict[str, float], origin: dict[str, str], attrs: dict[str, AttributeValue], process_mb: float | None
) -> list[Point]:
    points = [
        Point(
            semconv.HW_NPU_UTILIZATION, values[field] / 100.0, {**attrs, semconv.ATTR_HW_NPU_TASK: task}, origin[field]
        )
        for field, task in _TASKS
        if field in values
    ]
    for memory, used, total, usage in (
        ("hbm", smi.HBM_USED, smi.HBM_TOTAL, smi.HBM_USAGE),
        ("ddr", smi.DDR_USED, smi.DDR_TOTAL, smi.DDR_USAGE),
    ):
        if not values.get(total):
            continue  # `0 / 0`: this board does not expose that memory
        memory_attrs = {**attrs, semconv.ATTR_HW_NPU_MEMORY_TYPE: memory}
        points.append(Point(semconv.HW_NPU_MEMORY_LIMIT, values[total] * MIB, memory_attrs, origin[total]))
        if used in values:
            points.append(Point(semconv.HW_NPU_MEMORY_USAGE, values[used] * MIB, memory_attrs, origin[used]))
            points.append(
                Point(semconv.HW_NPU_MEMORY_UTILIZATION, values[used] / values[total], memory_attrs, origin[used])
            )
        elif usage in values:
            points.append(Point(semconv.HW_NPU_MEMORY_UTILIZATION, values[usage] / 100.0, memory_attrs, origin[usage]))
    for field, metric, scale, extra in (
        (smi.TEMPERATURE, semconv.HW_TEMPERATURE, 1.0, {}),
        (smi.POWER, semconv.HW_POWER, 1.0, {}),
        (smi.AICORE_CURRENT_MHZ, semconv.HW_NPU_SPEED, 1e6, {}),
        (smi.AICORE_RATED_MHZ, semconv.HW_NPU_SPEED_LIMIT, 1e6, {semconv.ATTR_HW_LIMIT_TYPE: "max"}),
    ):
        if field in values:
            points.append(Point(metric, values[field] * scale, {**attrs, **extra}, origin[field]))
    if process_mb is not None:
        points.append(Point(semconv.DEVICE_PROCESS_MEMORY, process_mb * MIB, attrs, TABLE))
    return points


def _health_points(chip: smi.NpuChip, health: smi.ChipHealth | None, attrs: dict[str, AttributeValue]) -> list[Point]:
    text, tool = chip.health, TABLE
    if text is None and health is not None:
        text, tool = health.status, HEALTH
    points = status_points(_HEALTH_STATES.get((text or "").lower()), attrs, tool)
    for code in health.error_codes if health is not None else ():
        # The level MindCluster gives the code, so a rule can say "any SeparateNPU".
        labels = {**attrs, semconv.ATTR_HW_NPU_ERROR_CODE: code, cluster_names.ATTR_FAULT_LEVEL: level_of(code)}
        points.append(Point(semconv.HW_NPU_ERROR_CODE, 1.0, labels, HEALTH))
    return points


def _ecc_points(ecc: Mapping[tuple[str, str, str], float], attrs: dict[str, AttributeValue]) -> list[Point]:
    """hw.errors from the lifetime (aggregate) counters where the driver keeps them, else the
    counts since the driver loaded; isolated pages as hw.npu.memory.isolated_pages."""
    points = []
    for memory in ("hbm", "ddr"):
        for error_type in ("corrected", "uncorrected"):
            labels = {**attrs, semconv.ATTR_ERROR_TYPE: error_type, semconv.ATTR_HW_NPU_MEMORY_TYPE: memory}
            count = ecc.get((memory, error_type, smi.ECC_AGGREGATE), ecc.get((memory, error_type, smi.ECC_COUNT)))
            if count is not None:
                points.append(Point(semconv.HW_ERRORS, count, labels, ECC))
            pages = ecc.get((memory, error_type, smi.ECC_ISOLATED_PAGES))
            if pages is not None:
                points.append(Point(semconv.HW_NPU_MEMORY_ISOLATED_PAGES, pages, labels, ECC))
    return points


def _process_memory(processes: tuple[smi.NpuProcess, ...], chip: smi.NpuChip) -> float | None:
    """This process's memory on `chip`; None when the table does not list it (for example
    under a container's own pid namespace)."""
    own = [
        p.memory_mb for p in processes if p.pid == os.getpid() and (p.npu_id, p.chip_id) == (chip.npu_id, chip.chip_id)
    ]
    return sum(own) if own else None


def _block_of(blocks: list, chip_id: int) -> dict:
    for block in blocks:
        if block.chip_id == chip_id or (block.chip_id is None and len(blocks) == 1):
            return block.values
    return {}


def _merge(*sources: tuple[str, Mapping[str, float]]) -> tuple[dict[str, float], dict[str, str]]:
    """Fields of every source, the first source printing a field winning; with the tool
    each value came from."""
    values: dict[str, float] = {}
    origin: dict[str, str] = {}
    for tool, fields in sources:
        for field, value in fields.items():
            if field not in values:
                values[field], origin[field] = value, tool
    return values, origin


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
