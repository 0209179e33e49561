"""Counting device→host readbacks: every `Tensor.asnumpy` call, and every `Tensor._item` call,
through which `item()`, `float()` and `bool()` of a tensor read it."""

from __future__ import annotations

from typing import Any

from mindspore import Tensor

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
    return steps
