"""Per-parameter gradient norms for plain MindSpore (no MindFormers).

`LocalNormTrainOneStepCell(network, optimizer)` trains like `nn.TrainOneStepCell` and
returns MindFormers' 7-tuple `(loss, overflow, scale, lr, global_norm, local_norm, size)`,
so MonitorCallback reads the same per-layer norms it reads under MindFormers: the squared
norms are computed on the device inside the step, and read back only on sampled steps.

A train cell of your own can append the same two outputs with `local_norms(grads)`.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import nn, ops


def local_norms(grads: Any) -> tuple[Any, Any]:
    """Per-gradient squared L2 norms (one float32 vector) and element counts, on the device."""
    squares = ops.stack([ops.reduce_sum(ops.square(ops.cast(g, ms.float32))) for g in grads])
    sizes = ops.stack([ops.scalar_to_tensor(ops.size(g), ms.int32) for g in grads])
    return squares, sizes


class LocalNormTrainOneStepCell(nn.TrainOneStepCell):
    """`nn.TrainOneStepCell` that also returns the global and per-parameter gradient norms
    in MindFormers' 7-tuple layout (overflow is always False and the scale 1: no loss scaling)."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, sens: float = 1.0) -> None:
        super().__init__(network, optimizer, sens)
        self._scale = ms.Tensor(1.0, ms.float32)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        squares, sizes = local_norms(grads)
        global_norm = ops.sqrt(ops.reduce_sum(squares)).reshape((1,))
        lr = self.optimizer.get_lr()
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, ops.zeros((), ms.bool_), self._scale, lr, global_norm, squares, sizes
