"""Device telemetry: NPU, GPU, host and allocator readings, polled off the training thread.

A daemon thread polls each source every `device_config.poll_interval` seconds into a
cache; observable instruments read the cache on the metric reader's thread, and sampled
steps take `snapshot()` from it. Nothing here ever runs a device tool on the training
thread. Names and their mapping to npu-exporter are in docs/devices.md.
"""

from __future__ import annotations

from otel_mindformers.config import DeviceConfig
from otel_mindformers.devices import device_gauges as instruments
from otel_mindformers.devices.cache import ReadingCache
from otel_mindformers.devices.poller import Poller
from otel_mindformers.devices.selection import build_sources
from otel_mindformers.job.identity import Identity
from otel_mindformers.telemetry.observables import RunObservables

__all__ = ["DeviceTelemetry"]

# Sources that run a tool (npu-smi, hccn_tool). A tool that times out fails its source's
# poll at once, so a poll waits for at most one timeout per tool.
_TOOLS_PER_POLL = 2


class DeviceTelemetry:
    def __init__(self, cache: ReadingCache, poller: Poller) -> None:
        self._cache = cache
        self._poller = poller

    @classmethod
    def start(
        cls, device_config: DeviceConfig, identity: Identity, observables: RunObservables | None
    ) -> DeviceTelemetry | None:
        """Start polling `device_config`'s sources for `identity`'s rank (the caller decides
        whether `device_monitor` is on); None when there is nothing to read. The readings are
        observed on `observables`' meter until it closes (None: no instruments)."""
        sources = build_sources(device_config, identity)
        if not sources:
            return None
        # Readings survive one late poll (an interval plus every tool at its timeout), not
        # two: a poll thread stuck in a driver call reads as missing data.
        cache = ReadingCache(max_age=2 * device_config.poll_interval + _TOOLS_PER_POLL * device_config.command_timeout)
        failures = instruments.register(observables, cache) if observables is not None else None
        poller = Poller(sources, cache, device_config.poll_interval, failures)
        poller.start()
        return cls(cache, poller)

    def snapshot(self) -> dict[str, float]:
        """This rank's latest readings under flat JSON keys; never polls, never waits."""
        return self._cache.snapshot()

    def shutdown(self, timeout: float = 1.0) -> None:
        """Stop polling. The last readings stay observable until they age out or the run's
        observables close (after the final metric export, which still carries them)."""
        self._poller.stop(timeout)
