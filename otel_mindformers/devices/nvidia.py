"""NVIDIA GPU readings through NVML (the `pynvml` module of nvidia-ml-py)."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable, Collection, Mapping

from otel_mindformers import semconv
from otel_mindformers.devices.base import MIB, AttributeValue, Point, Readings, SourceError

VENDOR = "NVIDIA"


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
        except nvml.NVMLError as exc:
            raise SourceError(type(exc).__name__, f"NVML: {exc}") from None
        return Readings(tuple(points), snapshot)

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
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
        attrs = {
            **self._attributes,
            semconv.ATTR_HW_ID: f"gpu-{index}",
            semconv.ATTR_HW_TYPE: "gpu",
            semconv.ATTR_HW_VENDOR: VENDOR,
            semconv.ATTR_HW_MODEL: _text(nvml.nvmlDeviceGetName(handle)),
        }
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        temperature = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        processes = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        own = [p.usedGpuMemory for p in processes if p.pid == os.getpid() and p.usedGpuMemory is not None]

        points = [
            Point(semconv.HW_GPU_MEMORY_USAGE, float(memory.used), attrs),
            Point(semconv.HW_GPU_MEMORY_LIMIT, float(memory.total), attrs),
        ]
        snapshot = {"gpu_memory_used_mb": memory.used / MIB, "gpu_memory_total_mb": memory.total / MIB}
        if memory.total:
            points.append(Point(semconv.HW_GPU_MEMORY_UTILIZATION, memory.used / memory.total, attrs))
        if utilization is not None:
            points.append(Point(semconv.HW_GPU_UTILIZATION, utilization.gpu / 100.0,
                                {**attrs, semconv.ATTR_HW_GPU_TASK: "general"}))
            snapshot["gpu_utilization"] = float(utilization.gpu)
        if temperature is not None:
            points.append(Point(semconv.HW_TEMPERATURE, float(temperature), attrs))
            snapshot["gpu_temperature_c"] = float(temperature)
        if power_mw is not None:
            points.append(Point(semconv.HW_POWER, power_mw / 1000.0, attrs))
            snapshot["gpu_power_w"] = power_mw / 1000.0
        if own:
            points.append(Point(semconv.DEVICE_PROCESS_MEMORY, float(sum(own)), attrs))
            snapshot["gpu_process_memory_mb"] = sum(own) / MIB
        for error_type, counter in (("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                    ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            count = self._optional(nvml.nvmlDeviceGetTotalEccErrors, handle, counter, nvml.NVML_AGGREGATE_ECC)
            if count is not None:
                error_attrs = {**attrs, semconv.ATTR_ERROR_TYPE: error_type}
                points.append(Point(semconv.HW_ERRORS, float(count), error_attrs))
        return points, snapshot

    def _optional(self, call: Callable[..., Any], *args: Any) -> Any:
        """A reading some boards lack (power, ECC on consumer GPUs): None when unsupported."""
        try:
            return call(*args)
        except self._nvml.NVMLError_NotSupported:
            return None


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes.
    return value.decode() if isinstance(value, bytes) else value
