"""Host readings through the real psutil, and MindSpore's allocator through the real runtime."""

import threading
import time

import psutil
import pytest

from otel_mindformers.devices.host import CPU_WINDOW_S, HostSource
from otel_mindformers.devices.mindspore_memory import MindSporeMemorySource
from otel_mindformers.devices.source import MIB
from otel_mindformers.names import semconv

RANK = {semconv.ATTR_RANK: 2}
NODE = {semconv.ATTR_NODE_RANK: 0}


def values(readings):
    return {p.metric: p.value for p in readings.points}


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def windowed(process_attributes, node_attributes):
    """A HostSource whose first CPU window has passed (its clock is the test's)."""
    clock = Clock()
    source = HostSource(process_attributes, node_attributes, clock=clock)
    busy(0.3)  # some CPU time for the window to measure
    clock.now += CPU_WINDOW_S
    return source, clock


def test_host_readings_are_plausible():
    source, _clock = windowed(RANK, NODE)
    readings = source.read()
    got = values(readings)
    cores = psutil.cpu_count()
    assert got[semconv.PROCESS_MEMORY_USAGE] > 0
    assert 0.0 <= got[semconv.PROCESS_CPU_UTILIZATION] <= 1.0
    assert 0.0 <= got[semconv.SYSTEM_CPU_UTILIZATION] <= 1.0
    assert 0 < got[semconv.SYSTEM_MEMORY_USAGE] < got[semconv.SYSTEM_MEMORY_LIMIT]
    snapshot = readings.snapshot
    assert snapshot["host_rss_mb"] == got[semconv.PROCESS_MEMORY_USAGE] / MIB > 0
    assert 0.0 <= snapshot["process_cpu_percent"] <= 100.0 * cores
    assert 0.0 <= snapshot["host_cpu_percent"] <= 100.0
    assert 0.0 < snapshot["host_memory_percent"] < 100.0
    process_points = [p for p in readings.points if p.metric.startswith("process.")]
    assert all(p.attributes == RANK for p in process_points)
    (memory_used,) = [p for p in readings.points if p.metric == semconv.SYSTEM_MEMORY_USAGE]
    assert memory_used.attributes == {**NODE, semconv.ATTR_SYSTEM_MEMORY_STATE: "used"}


def test_first_cpu_reading_waits_for_a_whole_window_and_later_polls_repeat_it():
    # Issue 11 item 28: primed and read at once, psutil said process_cpu_percent 2045 on 2 cores.
    clock = Clock()
    source = HostSource(RANK, NODE, clock=clock)
    first = source.read()
    assert "process_cpu_percent" not in first.snapshot and "host_cpu_percent" not in first.snapshot
    assert not {semconv.PROCESS_CPU_UTILIZATION, semconv.SYSTEM_CPU_UTILIZATION} & set(values(first))
    assert first.snapshot["host_rss_mb"] > 0  # memory needs no window
    busy(0.3)
    clock.now += CPU_WINDOW_S
    measured = source.read()
    assert 0.0 < measured.snapshot["process_cpu_percent"] <= 100.0 * psutil.cpu_count()
    assert 0.0 <= values(measured)[semconv.PROCESS_CPU_UTILIZATION] <= 1.0
    clock.now += CPU_WINDOW_S / 10  # a poll inside the next window repeats the last measurement
    assert source.read().snapshot["process_cpu_percent"] == measured.snapshot["process_cpu_percent"]


def test_process_cpu_utilization_is_cpu_time_over_wall_time_and_the_processs_cpus():
    """process.cpu.utilization (OTel semantic conventions): CPU time over the elapsed time and
    the CPUs available to the process, so 1.0 is all of them busy; a busy thread of a
    two-core process is about 0.5, where psutil's percent says about 100."""
    process = psutil.Process()
    cpus = len(process.cpu_affinity())
    clock = Clock()
    cpu_before, wall_before = sum(process.cpu_times()[:2]), time.monotonic()
    source = HostSource(RANK, None, clock=clock)
    while sum(process.cpu_times()[:2]) - cpu_before < 0.3:  # CPU time, whatever the load: ticks are 10 ms
        sum(range(1000))
    clock.now += CPU_WINDOW_S
    readings = source.read()
    cpu_after, wall_after = sum(process.cpu_times()[:2]), time.monotonic()
    expected = (cpu_after - cpu_before) / (wall_after - wall_before) / cpus
    assert values(readings)[semconv.PROCESS_CPU_UTILIZATION] == pytest.approx(expected, rel=0.2)
    assert readings.snapshot["process_cpu_percent"] == pytest.approx(expected * cpus * 100, rel=0.2)


def test_node_cpu_is_measured_when_read_on_another_thread_than_built():
    # Built on the training thread, read on the poller's: psutil 7 keeps cpu_percent's
    # baseline per thread, so the node's first window read 0 % under a busy training.
    source, _clock = windowed(RANK, NODE)
    got = {}
    poller = threading.Thread(target=lambda: got.update(source.read().snapshot))
    poller.start()
    poller.join()
    assert got["host_cpu_percent"] > 0.0


def test_node_cpu_is_the_share_of_all_cores_busy_as_psutil_counts_it():
    """host_cpu_percent is 0..100 across the node's cores: psutil's own figure for the same
    window (read on this thread, where its baseline is), not a fraction of it."""
    clock = Clock()
    source = HostSource(RANK, NODE, clock=clock)
    psutil.cpu_percent(None)
    busy(0.3)
    clock.now += CPU_WINDOW_S
    ours = source.read()
    theirs = psutil.cpu_percent(None)
    assert ours.snapshot["host_cpu_percent"] == pytest.approx(theirs, abs=5.0)
    assert values(ours)[semconv.SYSTEM_CPU_UTILIZATION] == pytest.approx(theirs / 100, abs=0.05)


def test_node_series_only_on_the_rank_that_reports_the_node():
    got = values(windowed(RANK, None)[0].read())
    assert set(got) == {semconv.PROCESS_CPU_UTILIZATION, semconv.PROCESS_MEMORY_USAGE}


def test_devices_command_view_has_no_process_series():
    got = values(windowed(None, {})[0].read())
    assert set(got) == {semconv.SYSTEM_CPU_UTILIZATION, semconv.SYSTEM_MEMORY_USAGE, semconv.SYSTEM_MEMORY_LIMIT}


def test_mindspore_on_cpu_reports_zero_so_nothing_is_emitted():
    import mindspore as ms

    ms.set_device("CPU")
    (ms.Tensor([1.0, 2.0]) * 2).asnumpy()
    readings = MindSporeMemorySource(ms.runtime.memory_stats, RANK).read()
    assert readings.points == () and readings.snapshot == {}


def test_mindspore_pool_numbers_stub_stats_because_cpu_reports_zero():
    # The shape mindspore.runtime.memory_stats() returns on Ascend (its documented example).
    gib = 1 << 30
    stats = {
        "total_reserved_memory": gib,
        "total_allocated_memory": 1024,
        "total_idle_memory": gib - 1024,
        "total_eager_free_memory": 0,
        "max_reserved_memory": gib,
        "max_allocated_memory": 1536,
        "common_mem_pool_stats": {"block_unit_size": gib, "block_counts": 1, "blocks_info": {}},
    }
    readings = MindSporeMemorySource(lambda: stats, RANK).read()
    assert values(readings) == {
        semconv.DEVICE_MEMORY_ALLOCATED: 1024.0,
        semconv.DEVICE_MEMORY_RESERVED: gib,
        semconv.DEVICE_MEMORY_MAX_ALLOCATED: 1536.0,
        semconv.DEVICE_MEMORY_MAX_RESERVED: gib,
    }
    assert all(p.attributes == RANK for p in readings.points)
    assert readings.snapshot == {
        "device_memory_allocated_mb": 1024 / MIB,
        "device_memory_reserved_mb": 1024.0,
        "device_memory_max_allocated_mb": 1536 / MIB,
        "device_memory_max_reserved_mb": 1024.0,
    }
