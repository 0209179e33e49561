"""MindSpore's profiler: the public API a capture starts and steps, and the private CPU
parser `otel-mindformers capture --analyse` runs on a deferred profile.

MindSpore's `offline_analyse` cannot analyse a CPU-only profile (it wants the device's
`profiler_info.json`), so the command runs the CPU parser the profiler itself runs online,
from its internal modules, in a child process (`CPU_ANALYSIS`). Those modules are not a
versioned API: `check_cpu_analysis()` says which release moved them.
"""

from __future__ import annotations

from typing import Any

from otel_mindformers.compat import releases
from otel_mindformers.compat.lookup import ApiNotFound, find

PUBLIC = ("profile", "schedule", "tensorboard_trace_handler", "ProfilerActivity")
# The private names CPU_ANALYSIS imports.
CPU_ANALYSIS_NAMES = (
    "mindspore.profiler.common.log:ProfilerLogger",
    "mindspore.profiler.common.profiler_context:ProfilerContext",
    "mindspore.profiler.platform.cpu_profiler:CPUProfilerAnalysis.online_analyse",
)
# The CPU parser on one raw `*_ascend_ms` folder (argv[1]), in a process of its own (run
# after `check_cpu_analysis()`, which names the release that moved it).
CPU_ANALYSIS = """
import sys
from mindspore.profiler import ProfilerActivity
from mindspore.profiler.common.log import ProfilerLogger
from mindspore.profiler.common.profiler_context import ProfilerContext
from mindspore.profiler.platform.cpu_profiler import CPUProfilerAnalysis

context = ProfilerContext()
context.set_params(activities=[ProfilerActivity.CPU])
context.ascend_ms_dir = sys.argv[1]
ProfilerLogger.init(sys.argv[1])
CPUProfilerAnalysis.online_analyse()
"""


def load_profiler() -> Any:
    """The `mindspore.profiler` module with every name a capture uses, or ApiNotFound."""
    profiler = find("mindspore.profiler", package=releases.MINDSPORE, needed_for="profile captures")
    for name in PUBLIC:
        find(f"mindspore.profiler:{name}", package=releases.MINDSPORE, needed_for="profile captures")
    return profiler


def check_cpu_analysis() -> None:
    """ApiNotFound naming the release if a name CPU_ANALYSIS imports has moved."""
    for path in CPU_ANALYSIS_NAMES:
        find(path, package=releases.MINDSPORE, needed_for="`otel-mindformers capture --analyse` on a CPU profile")


__all__ = ["CPU_ANALYSIS", "ApiNotFound", "check_cpu_analysis", "load_profiler"]
