"""Counting device→host readbacks: every `Tensor.asnumpy` call, and every `Tensor._item` call,
through which `item()`, `float()` and `bool()` of a tensor read it."""

from __future__ import annotations

from typing import Any, Callable

from mindspore import Tensor

READS = ("asnumpy", "_item")


def record_readbacks(monkeypatch: Any, step_now: Callable[[], Any]) -> list:
    """Patch the reads for the test; each call appends `step_now()` to the list returned."""
    steps: list = []
    for name in READS:
        real = getattr(Tensor, name)

        def counting(self, real=real):
            steps.append(step_now())
            return real(self)

        monkeypatch.setattr(Tensor, name, counting)
    return steps
