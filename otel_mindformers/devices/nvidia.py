"""NVIDIA GPU readings through NVML (the `pynvml` module of nvidia-ml-py).

Besides use, memory, temperature and power: ECC counts, remapped memory rows, XID critical
errors (drained from an NVML event set each poll, never waited for), NVLink state and error
counters, clock throttle reasons, and energy (NVML's counter, else integrated from power),
as DCGM's exporter reports them (docs/devices.md maps the names).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from types import ModuleType
from typing import Any

from otel_mindformers.devices.ascend import status_points
from otel_mindformers.devices.energy import EnergyIntegrator
from otel_mindformers.devices.source import MIB, AttributeValue, Point, Readings, SourceError
from otel_mindformers.names import semconv

VENDOR = "NVIDIA"
TOOL = "nvml"

# Throttle reasons that slow training (idle, application clocks and display are not faults),
# by the bit NVML's clock event / throttle reason mask uses for each.
THROTTLE_REASONS = {
    "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
}  # fmt: skip
# NVLink error counters (NVML_NVLINK_ERROR_DL_*) -> error.type.
_NVLINK_ERRORS = (
    ("NVML_NVLINK_ERROR_DL_REPLAY", "replay"),
    ("NVML_NVLINK_ERROR_DL_RECOVERY", "recovery"),
    ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "crc_flit"),
    ("NVML_NVLINK_ERROR_DL_CRC_DATA", "crc_data"),
)
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
_MAX_EVENTS_PER_POLL = 64  # a storm of XIDs must not keep the poll thread draining


class NvmlSource:
    """Reads `devices` (NVML indexes or UUIDs, as CUDA_VISIBLE_DEVICES names them; None for
    every GPU) and keeps `own_device`'s readings in the snapshot.

    NVML is initialised on the first poll, on the poll thread: `nvmlInit` can take seconds
    on a node without the persistence daemon, and must not delay training's start.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType,
        devices: Collection[str] | None,
        own_device: str | None,
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        self._nvml = nvml
        self._devices = devices
        self._own_device = own_device
        self._attributes = dict(attributes)
        self._initialised = False
        self._identity: dict[int, dict[str, AttributeValue]] = {}  # per GPU, read once
        self._xid_sets: dict[int, Any] = {}  # per GPU; None where XID events are unsupported
        self._xids: dict[tuple[int, int], int] = {}  # (GPU, XID) -> count since the run started
        self._energy = EnergyIntegrator()

    def read(self) -> Readings:
        nvml = self._nvml
        try:
            if not self._initialised:
                nvml.nvmlInit()
                self._initialised = True
            selectors = self._devices
            if selectors is None:
                selectors = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
            points: list[Point] = []
            snapshot: dict[str, float] = {}
            for selector in selectors:
                gpu_points, gpu_snapshot = self._read_gpu(selector)
                points.extend(gpu_points)
                if selector == self._own_device:
                    snapshot = gpu_snapshot
        except getattr(nvml, "NVMLError_LibraryNotFound", ()):
            # No NVIDIA driver on this node (an Ascend or CPU one): the source's tool is absent,
            # as a missing npu-smi is, and the poller stops asking.
            raise SourceError("not_found", "no NVIDIA driver on this node") from None
        except nvml.NVMLError as exc:
            raise SourceError(type(exc).__name__, f"NVML: {exc}") from None
        return Readings(tuple(points), snapshot)

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            for event_set in filter(None, self._xid_sets.values()):
                self._optional(self._nvml.nvmlEventSetFree, event_set)
            self._xid_sets.clear()
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass  # the library is going away with the process anyway

    def _read_gpu(self, selector: str) -> tuple[list[Point], dict[str, float]]:
        nvml = self._nvml
        if selector.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(selector))
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(selector)
        index = nvml.nvmlDeviceGetIndex(handle)
        attrs = {**self._attributes, **self._gpu_identity(index, handle)}
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        temperature = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        processes = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        own = [p.usedGpuMemory for p in processes if p.pid == os.getpid() and p.usedGpuMemory is not None]

        points = [
            Point(semconv.HW_GPU_MEMORY_USAGE, float(memory.used), attrs, TOOL),
            Point(semconv.HW_GPU_MEMORY_LIMIT, float(memory.total), attrs, TOOL),
        ]
        snapshot = {"gpu_memory_used_mb": memory.used / MIB, "gpu_memory_total_mb": memory.total / MIB}
        if memory.total:
            points.append(Point(semconv.HW_GPU_MEMORY_UTILIZATION, memory.used / memory.total, attrs, TOOL))
        if utilization is not None:
            points.append(
                Point(
                    semconv.HW_GPU_UTILIZATION,
                    utilization.gpu / 100.0,
                    {**attrs, semconv.ATTR_HW_GPU_TASK: "general"},
                    TOOL,
                )
            )
            snapshot["gpu_utilization"] = float(utilization.gpu)
        if temperature is not None:
            points.append(Point(semconv.HW_TEMPERATURE, float(temperature), attrs, TOOL))
            snapshot["gpu_temperature_c"] = float(temperature)
        if power_mw is not None:
            points.append(Point(semconv.HW_POWER, power_mw / 1000.0, attrs, TOOL))
            snapshot["gpu_power_w"] = power_mw / 1000.0
        if own:
            points.append(Point(semconv.DEVICE_PROCESS_MEMORY, float(sum(own)), attrs, TOOL))
            snapshot["gpu_process_memory_mb"] = sum(own) / MIB
        points += self._energy_points(index, handle, power_mw, attrs)
        points += self._memory_error_points(handle, attrs)
        points += self._xid_points(index, handle, attrs)
        points += self._throttle_points(handle, attrs)
        points += self._nvlink_points(index, handle, attrs)
        return points, snapshot

    def _gpu_identity(self, index: int, handle: Any) -> dict[str, AttributeValue]:
        if index not in self._identity:
            nvml = self._nvml
            identity: dict[str, AttributeValue] = {
                semconv.ATTR_HW_ID: f"gpu-{index}",
                semconv.ATTR_HW_TYPE: "gpu",
                semconv.ATTR_HW_VENDOR: VENDOR,
                semconv.ATTR_HW_MODEL: _text(nvml.nvmlDeviceGetName(handle)),
                semconv.ATTR_HW_NAME: f"GPU {index}",
            }
            for key, call, args in (
                (semconv.ATTR_HW_DRIVER_VERSION, nvml.nvmlSystemGetDriverVersion, ()),
                (semconv.ATTR_HW_FIRMWARE_VERSION, nvml.nvmlDeviceGetVbiosVersion, (handle,)),
                (semconv.ATTR_HW_SERIAL_NUMBER, nvml.nvmlDeviceGetSerial, (handle,)),
            ):
                value = self._optional(call, *args)
                if value:
                    identity[key] = _text(value)
            self._identity[index] = identity
        return self._identity[index]

    def _energy_points(self, index: int, handle: Any, power_mw: float | None, attrs: dict) -> list[Point]:
        """NVML's energy counter (mJ since the driver loaded, Volta and later), else power
        integrated over the polls."""
        energy_mj = self._optional(self._nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        if energy_mj is not None:
            return [Point(semconv.HW_ENERGY, energy_mj / 1000.0, attrs, TOOL)]
        if power_mw is not None:
            return [Point(semconv.HW_ENERGY, self._energy.add(index, power_mw / 1000.0), attrs, "nvml power")]
        return []

    def _memory_error_points(self, handle: Any, attrs: dict) -> list[Point]:
        nvml = self._nvml
        points = []
        for error_type, counter in (
            ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            count = self._optional(nvml.nvmlDeviceGetTotalEccErrors, handle, counter, nvml.NVML_AGGREGATE_ECC)
            if count is not None:
                points.append(
                    Point(semconv.HW_ERRORS, float(count), {**attrs, semconv.ATTR_ERROR_TYPE: error_type}, TOOL)
                )
        remap = self._optional(nvml.nvmlDeviceGetRemappedRows, handle)  # Ampere and later
        if remap is not None:
            corrected, uncorrected, pending, failed = remap
            for error_type, rows in (("corrected", corrected), ("uncorrected", uncorrected)):
                points.append(
                    Point(
                        semconv.HW_GPU_MEMORY_REMAPPED_ROWS,
                        float(rows),
                        {**attrs, semconv.ATTR_ERROR_TYPE: error_type},
                        TOOL,
                    )
                )
            # A failed remap: the GPU is to be replaced. Rows waiting for the next reset: it
            # works but will meet the same uncorrectable error until reset.
            state = "failed" if failed else "degraded" if pending else "ok"
            points += status_points(state, attrs, TOOL)
        return points

    def _xid_points(self, index: int, handle: Any, attrs: dict) -> list[Point]:
        """Critical XIDs since the run started, one hw.errors series per XID seen."""
        nvml = self._nvml
        if index not in self._xid_sets:
            event_set = None
            try:
                event_set = nvml.nvmlEventSetCreate()
                nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL, event_set)
            except self._unsupported():
                if event_set is not None:
                    self._optional(nvml.nvmlEventSetFree, event_set)
                event_set = None
            self._xid_sets[index] = event_set
        event_set = self._xid_sets[index]
        if event_set is None:
            return []
        timeout = getattr(nvml, "NVMLError_Timeout", ())
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                event = nvml.nvmlEventSetWait_v2(event_set, 0)
            except timeout:
                break
            key = (index, int(event.eventData))
            self._xids[key] = self._xids.get(key, 0) + 1
        return [
            Point(semconv.HW_ERRORS, float(count), {**attrs, semconv.ATTR_ERROR_TYPE: f"xid_{xid}"}, "nvml events")
            for (gpu, xid), count in sorted(self._xids.items())
            if gpu == index
        ]

    def _throttle_points(self, handle: Any, attrs: dict) -> list[Point]:
        nvml = self._nvml
        reasons = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._optional(reasons, handle)
        if mask is None:
            return []
        return [
            Point(
                semconv.HW_GPU_THROTTLED,
                1.0 if mask & bit else 0.0,
                {**attrs, semconv.ATTR_HW_GPU_THROTTLE_REASON: reason},
                TOOL,
            )
            for reason, bit in THROTTLE_REASONS.items()
        ]

    def _nvlink_points(self, index: int, handle: Any, attrs: dict) -> list[Point]:
        """Each NVLink the GPU has, as a port of hw.type network whose parent is the GPU."""
        nvml = self._nvml
        points = []
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0)):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:  # not supported, or past the GPU's last link
                break
            link_attrs = {
                **attrs,
                semconv.ATTR_HW_ID: f"gpu-{index}-nvlink-{link}",
                semconv.ATTR_HW_TYPE: "network",
                semconv.ATTR_HW_NAME: f"NVLink {link} of GPU {index}",
                semconv.ATTR_HW_PARENT: f"gpu-{index}",
            }
            points.append(
                Point(semconv.HW_NETWORK_UP, 1.0 if state == nvml.NVML_FEATURE_ENABLED else 0.0, link_attrs, TOOL)
            )
            for constant, error_type in _NVLINK_ERRORS:
                count = self._optional(nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, getattr(nvml, constant))
                if count is not None:
                    points.append(
                        Point(
                            semconv.HW_ERRORS, float(count), {**link_attrs, semconv.ATTR_ERROR_TYPE: error_type}, TOOL
                        )
                    )
        return points

    def _optional(self, call: Callable[..., Any], *args: Any) -> Any:
        """A reading some boards or drivers lack (power, ECC, NVLink, energy): None when
        unsupported. A lost GPU still raises: the whole poll is then a failure."""
        try:
            return call(*args)
        except self._unsupported():
            return None

    def _unsupported(self) -> tuple[type[Exception], ...]:
        # An old driver lacks newer entry points (FunctionNotFound); a board lacks features.
        return tuple(
            getattr(self._nvml, name)
            for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
            if hasattr(self._nvml, name)
        )


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes.
    return value.decode() if isinstance(value, bytes) else value
