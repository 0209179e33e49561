"""A small function compiled once by MindSpore's graph compiler and run straight from its
compiled phase, without `mindspore.jit`'s per-call wrapper.

The run API computes the gradients' global norm on sampled steps in one graph
(runtime/logged_values.py). Under `mindspore.jit`, each call goes through MindSpore's Python
wrapper first (the arguments' key, `mutable`, the compile-cache look-up, the signature, the
context), which on a small graph costs the training thread more than the graph's run
(docs/performance.md, custom loops). Here the function is compiled once per signature of its
inputs (each tensor's shape and dtype: a phase compiled for other shapes would read them
wrongly) by MindSpore's own `_JitExecutor`, as `jit` compiles it, and later calls run that
phase with the graph executor, as MindSpore's own predict path does. A phase MindSpore let go
(`mindspore.ms_memory_recycle()` frees every compiled graph, as between two models in one
process) is compiled again at the next call, as `jit` does. Both names are private:
where the release lacks them, `compiled` returns the plain `jit` call (slower, the same
values). tests/test_run_api_norm.py checks them on every release of the matrix (`mindspore_api`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from otel_mindformers.compat import lookup, mindspore_tensor

# Where MindSpore keeps it: graph.api from 2.9 (common.api, deprecated there, re-exports it), common.api before.
JIT_EXECUTORS = ("mindspore.graph.api:_JitExecutor", "mindspore.common.api:_JitExecutor")
NEEDED_FOR = "the run API's gradient norm without jit's per-call wrapper"


class CompiledGraph:
    """`graph(tensors)`: `fn(tensors)` run as a compiled graph, `tensors` a tuple of tensors."""

    def __init__(self, fn: Callable[[Any], Any], executor_type: type) -> None:
        self._fn = fn
        self._executor_type = executor_type
        self._signature: list[tuple[Any, Any]] | None = None
        self._phase = ""
        self._graph_executor: Any = None  # MindSpore's C++ executor, which holds the phase

    def __call__(self, tensors: Sequence[Any]) -> Any:
        signature = list(map(mindspore_tensor.shape_and_dtype, tensors))  # no frame per gradient
        if signature != self._signature:
            self._compile(tuple(tensors))
            self._signature = signature
        try:
            return self._graph_executor((tuple(tensors),), self._phase)
        except RuntimeError:
            if self._graph_executor.has_compiled(self._phase):
                raise
            # The phase was let go: the graph is compiled again and run.
            self._compile(tuple(tensors))
            return self._graph_executor((tuple(tensors),), self._phase)

    def _compile(self, tensors: tuple[Any, ...]) -> None:
        from mindspore import mutable

        executor = self._executor_type(self._fn, time.time_ns())
        # `mutable`: the tensors are the graph's inputs, not constants folded into it.
        self._phase = executor.compile(self._fn.__name__, mutable(tensors))
        self._graph_executor = executor._graph_executor


class _JitCall:
    """The public path: `mindspore.jit(fn)` called with the tuple made `mutable`."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        import mindspore

        self._jitted = mindspore.jit(fn)
        self._mutable = mindspore.mutable

    def __call__(self, tensors: Sequence[Any]) -> Any:
        return self._jitted(self._mutable(tuple(tensors)))


def compiled(fn: Callable[[Any], Any]) -> Callable[[Sequence[Any]], Any]:
    """`fn` (taking one tuple of tensors) as a graph compiled once per input signature."""
    for path in JIT_EXECUTORS:
        try:
            return CompiledGraph(fn, lookup.find(path, package="mindspore", needed_for=NEEDED_FOR))
        except lookup.ApiNotFound:
            continue
    return _JitCall(fn)


__all__ = ["JIT_EXECUTORS", "CompiledGraph", "compiled"]
