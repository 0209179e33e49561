"""Counting what a callback's hook does inside a real training loop, deterministically:
Python calls and C calls (sys.setprofile), bytecodes executed and `with` blocks entered
(sys.settrace with opcode events), calls into the OpenTelemetry SDK, lock acquisitions
called as functions, read and write system calls (the kernel's count for the thread: what
the profile cannot see, a C function calling `pwrite`), and memory allocated (tracemalloc's
peak over the hook). Counts, not times: they do not depend on how loaded the machine is.

Tracing and tracemalloc run on alternate calls (a tracer allocates), on the training
thread only; `counts[hook]` maps each counted step to a `HookCount`.
"""

from __future__ import annotations

import dis
import os
import sys
import tracemalloc
from dataclasses import dataclass
from typing import Any

_BEFORE_WITH = dis.opmap.get("BEFORE_WITH", -1)
_LOCK_CALLS = {"lock.acquire", "RLock.acquire", "lock.acquire_lock", "Condition.acquire"}


@dataclass
class HookCount:
    python_calls: int = 0  # the hook itself is one
    c_calls: int = 0
    opcodes: int = 0
    with_blocks: int = 0
    lock_calls: int = 0
    sdk_calls: int = 0  # Python calls into opentelemetry's own code
    io_calls: int = -1  # read and write system calls of the training thread (-1: not measured)
    allocated_bytes: int = -1  # peak traced memory over the hook less before it (-1: not measured)
    kept_bytes: int = -1  # traced memory after the hook less before it

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in vars(self).items())


class HookCounter:
    """Wraps `hooks` of `callback`; step `s` is counted with tracing when `trace(s)`, with
    tracemalloc when `allocations(s)` (the caller keeps them apart)."""

    def __init__(self, callback: Any, hooks: tuple[str, ...], trace: Any, allocations: Any) -> None:
        self.counts: dict[str, dict[int, HookCount]] = {hook: {} for hook in hooks}
        for hook in hooks:
            setattr(callback, hook, self._wrap(getattr(callback, hook), self.counts[hook], trace, allocations))

    def _wrap(self, method: Any, per_step: dict[int, HookCount], trace: Any, allocations: Any) -> Any:
        def counted(run_context: Any) -> None:
            step = run_context.original_args()["cur_step_num"]
            if trace(step):
                per_step[step] = count = HookCount()
                _traced(method, run_context, count)
            elif allocations(step):
                per_step[step] = count = HookCount()
                _measured(method, run_context, count)
            else:
                method(run_context)

        return counted


def traced(method: Any, *args: Any, **kwargs: Any) -> tuple[HookCount, Any]:
    """One call of `method(*args, **kwargs)` counted as a hook's; the count and its result.
    The count holds this harness's own lambda: one Python call, one C call (the append) and
    its bytecodes, the same on every call (budgets are set with them in)."""
    count = HookCount()
    result: list[Any] = []
    _traced(lambda _: result.append(method(*args, **kwargs)), None, count)
    return count, result[0]


def _traced(method: Any, run_context: Any, count: HookCount) -> None:
    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            frame.f_trace_opcodes = True
            count.python_calls += 1
            if "opentelemetry" in frame.f_code.co_filename.replace("otel_mindformers", ""):
                count.sdk_calls += 1
        elif event == "opcode":
            count.opcodes += 1
            if frame.f_code.co_code[frame.f_lasti] == _BEFORE_WITH:
                count.with_blocks += 1
        return tracer

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            count.c_calls += 1
            if getattr(arg, "__qualname__", "") in _LOCK_CALLS:
                count.lock_calls += 1

    saved_trace, saved_profile = sys.gettrace(), sys.getprofile()
    reading = _io_calls()
    before = _io_calls()
    sys.settrace(tracer)
    sys.setprofile(profiler)
    try:
        method(run_context)
    finally:
        sys.setprofile(saved_profile)
        sys.settrace(saved_trace)
        after = _io_calls()
    count.c_calls -= 1  # the setprofile call that ends the count
    count.io_calls = (after - before) - (before - reading)  # less what one reading costs


def _io_calls() -> int:
    """The calling thread's read and write system calls so far (/proc/thread-self/io)."""
    fd = os.open("/proc/thread-self/io", os.O_RDONLY)
    try:
        text = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    fields = dict(line.split(": ") for line in text.splitlines())
    return int(fields["syscr"]) + int(fields["syscw"])


def _measured(method: Any, run_context: Any, count: HookCount) -> None:
    """Net of what measuring a hook that does nothing shows (the readings' own objects).
    tracemalloc sees every thread: a background thread that allocates while the hook runs
    adds to one reading, so callers take the minimum over several steps."""
    idle_allocated, idle_kept = _allocations(_nothing, run_context)
    allocated, kept = _allocations(method, run_context)
    count.allocated_bytes, count.kept_bytes = allocated - idle_allocated, kept - idle_kept


def _nothing(run_context: Any) -> None:
    pass


def _allocations(method: Any, run_context: Any) -> tuple[int, int]:
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    method(run_context)
    after, peak = tracemalloc.get_traced_memory()
    return peak - before, after - before
