"""Which sources to read, for one training rank or for a whole node."""

from __future__ import annotations

import shutil
import sys
from types import ModuleType

from otel_mindformers.config import DeviceConfig
from otel_mindformers.config.extras import import_optional, install_hint
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.devices.ascend import AscendSource
from otel_mindformers.devices.hccn import HccnSource, locate_hccn_tool
from otel_mindformers.devices.mindspore_memory import MindSporeMemorySource
from otel_mindformers.devices.nvidia import NvmlSource
from otel_mindformers.devices.source import Source, physical_device
from otel_mindformers.job.identity import Identity
from otel_mindformers.names import semconv

_logger = get_logger(__name__)


def build_sources(config: DeviceConfig, identity: Identity | None) -> list[Source]:
    """Sources for `identity`'s rank: its own device, its process, and the node's host
    series on local rank 0 only. With no identity (the `devices` command), every device
    of the node and the host."""
    wanted = set(config.sources)
    auto = "auto" in wanted
    target = identity.device_target if identity is not None else None
    if identity is not None:
        rank_attrs: dict | None = identity.point_attributes()
        device_attrs = {**identity.point_attributes(), semconv.ATTR_DEVICE_ID: identity.device_id}
        # The rank is on node series too: every point names the rank that reported it.
        node_attrs = {**identity.point_attributes(), **identity.node_attributes()} if identity.local_rank == 0 else None
    else:  # the node's devices and host; this process's own series mean nothing there
        rank_attrs, device_attrs, node_attrs = None, {}, {}

    sources: list[Source] = []
    if "ascend" in wanted or (auto and (target == "Ascend" or shutil.which(config.npu_smi_path))):
        own = _ascend_device(identity)
        ascend = AscendSource(
            config.npu_smi_path, config.command_timeout, None if own is None else [own], own, device_attrs
        )
        # The RoCE ports of the chips npu-smi listed: the rank's own, or the node's.
        ports = (lambda: ascend.devices_seen) if own is None else (lambda: [own])
        sources += [ascend, HccnSource(locate_hccn_tool(), config.command_timeout, ports, own, device_attrs)]
    if "nvidia" in wanted or (auto and (identity is None or target == "GPU")):
        nvml = _optional_module("pynvml", required="nvidia" in wanted or target == "GPU")
        if nvml is not None:
            own_gpu = None if identity is None else physical_device(identity.device_id, "CUDA_VISIBLE_DEVICES")
            sources.append(NvmlSource(nvml, None if own_gpu is None else [own_gpu], own_gpu, device_attrs))
    if ("host" in wanted or auto) and _optional_module("psutil", required=True) is not None:
        from otel_mindformers.devices.host import HostSource  # imports psutil, an optional extra

        sources.append(HostSource(rank_attrs, node_attrs))
    if rank_attrs is not None and (
        "mindspore" in wanted or (auto and target in ("Ascend", "GPU") and "mindspore" in sys.modules)
    ):
        runtime = _optional_module("mindspore.runtime", required=True)
        if runtime is not None:
            sources.append(MindSporeMemorySource(runtime.memory_stats, rank_attrs))
    return sources


def _ascend_device(identity: Identity | None) -> int | None:
    if identity is None:
        return None
    physical = physical_device(identity.device_id, "ASCEND_RT_VISIBLE_DEVICES")
    return int(physical) if physical.isdigit() else identity.device_id


def _optional_module(name: str, required: bool) -> ModuleType | None:
    """The module, or None (with one warning if `required`) when it is missing or fails on
    import, whatever it raises."""
    module, problem = import_optional(name)
    if problem is not None and required:
        _logger.warning(
            "otel_mindformers: device readings from %s are off: %s %s; %s", name, name, problem, install_hint(name)
        )
    return module
