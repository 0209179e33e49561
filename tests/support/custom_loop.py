"""A real MindSpore custom training loop, in the shape of MindSpore's quick start:
`value_and_grad` over a forward function, a `train_step` that calls `optimizer(grads)`, a
Python `for` over the dataset; the step in PyNative or under `mindspore.jit`. Faults come
through the data (a NaN label at `nan_at`), as the callback's tests inject them."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn

from tests.support.training import BATCH, FEATURES, _Regressor


@dataclass
class Loop:
    network: nn.Cell
    optimizer: nn.Optimizer
    train_step: Callable[..., Any]  # (x, y) -> (loss, grads)
    grad_fn: Callable[..., Any]


def build(jit: bool = False, lr: float = 0.01) -> Loop:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    network = _Regressor()
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(network.trainable_params(), learning_rate=lr)

    def forward(x: Any, y: Any) -> Any:
        return loss_fn(network(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def train_step(x: Any, y: Any) -> Any:
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss, grads

    return Loop(network, optimizer, ms.jit(train_step) if jit else train_step, grad_fn)


@dataclass
class Data:
    steps: int
    nan_at: set[int] = field(default_factory=set)

    def batches(self) -> Iterator[tuple[Any, Any]]:
        rng = np.random.default_rng(0)
        for step in range(1, self.steps + 1):
            x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
            y = x.sum(axis=1, keepdims=True).astype(np.float32)
            if step in self.nan_at:
                y[0, 0] = np.nan
            yield ms.Tensor(x), ms.Tensor(y)


def train(
    run: Any, steps: int = 12, *, jit: bool = False, nan_at: set[int] | None = None, stop: bool = True,
    loop: Loop | None = None,
) -> int:  # fmt: skip
    """Train `steps` steps through `run` (the run API), with `loop` (else a new one); returns
    the last step run."""
    loop = loop or build(jit=jit)
    last = 0
    for step, (x, y) in enumerate(Data(steps, nan_at or set()).batches(), start=1):
        with run.step(step):
            loss, grads = loop.train_step(x, y)
            run.log(loss=loss, grads=grads)
        last = step
        if stop and run.should_stop:
            break
    return last


def print_a_handled_error_as_c_code_does() -> None:
    """What a C extension does with an error it handles (MindSpore 2.10 with numpy's
    ImportError at its first operation): PyErr_Print prints it and leaves it in
    `sys.last_value`, raised deep inside, and the program goes on."""
    try:
        _import_fails()
    except ImportError as error:
        sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
        traceback.print_exception(error)


def _import_fails() -> None:
    raise ImportError("an error a C extension printed and handled")
