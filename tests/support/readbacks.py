"""Counting device→host readbacks: every `Tensor.asnumpy` call, every `Tensor._item` call,
through which `item()`, `float()` and `bool()` of a tensor read it, and every read through
the package's `compat.mindspore_tensor.read_scalar` (the C method, unbound)."""

from __future__ import annotations

from typing import Any

from mindspore import Tensor

from otel_mindformers.compat import mindspore_tensor

READS = ("asnumpy", "_item")


def record_readbacks(monkeypatch: Any, callback: Any) -> list:
    """Patch the reads for the test; each call appends the step `callback`'s run is at (None
    before its first run) to the list returned."""
    steps: list = []
    for name in READS:
        real = getattr(Tensor, name)

        def counting(self, real=real):
            steps.append(callback.progress.step if callback.progress is not None else None)
            return real(self)

        monkeypatch.setattr(Tensor, name, counting)
    real_read = mindspore_tensor.read_scalar

    def counting_read(tensor: Any) -> Any:
        steps.append(callback.progress.step if callback.progress is not None else None)
        return real_read(tensor)

    monkeypatch.setattr(mindspore_tensor, "read_scalar", counting_read)
    return steps
