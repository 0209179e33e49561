"""Tiny real MindSpore training loops for tests.

Three train-cell shapes cover what MonitorCallback must read:
- "scalar": `nn.TrainOneStepCell` returns the loss tensor;
- "tuple3": `(loss, overflow, loss_scale)` as `TrainOneStepWithLossScaleCell` returns
  (that cell itself cannot run on CPU, see environment.md, so a TrainOneStepCell subclass
  computes the same tuple);
- "tuple5": MindFormers' `MFTrainOneStepCell` shape `(loss, overflow, scale, lr, global_norm)`.

Faults are injected through the data, not the network, so the callback sees what a real
run would: a NaN label makes the loss NaN, a scaled label makes it spike, a slow
generator makes a step stall, and an infinite loss scale (a third column the tuple cells
feed to the backward pass) overflows a step as fp16 loss scaling does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

FEATURES = 8
BATCH = 4


class _Regressor(nn.Cell):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.body = nn.SequentialCell(nn.Dense(FEATURES, hidden), nn.ReLU(), nn.Dense(hidden, 1))

    def construct(self, x):
        return self.body(x)


class _TupleTrainCell(nn.TrainOneStepCell):
    """TrainOneStepCell that also reports overflow, scale (and lr, global norm for tuple5)."""

    def __init__(self, network, optimizer, width: int, scale: float = 1.0) -> None:
        super().__init__(network, optimizer)
        self.width = width
        self.scale = ms.Parameter(ms.Tensor(scale, ms.float32), name="loss_scale")

    def construct(self, *inputs):
        # A third column, when the data has one, is the loss scale of the step (the
        # sensitivity fed to the backward pass): `inf` overflows it as fp16 scaling does.
        data = inputs[:2]
        loss = self.network(*data)
        sens = ops.ones_like(loss) if len(inputs) < 3 else ops.ones_like(loss) * inputs[2][0]
        grads = self.grad(self.network, self.weights)(*data, sens)
        overflow = ops.zeros((), ms.bool_)
        for g in grads:
            overflow = ops.logical_or(overflow, ops.logical_not(ops.isfinite(g)).any())
        global_norm = ops.sqrt(sum(ops.reduce_sum(ops.square(g)) for g in grads)).reshape((1,))
        lr = self.optimizer.get_lr()
        if len(inputs) >= 3:  # with a loss scale, as a loss-scale cell: an overflow updates nothing
            grads = tuple(ops.where(overflow, ops.zeros_like(g), g) for g in grads)
        loss = ops.depend(loss, self.optimizer(grads))
        if self.width == 3:
            return loss.reshape((1,)), overflow, self.scale
        return loss.reshape((1,)), overflow, self.scale, lr, global_norm


@dataclass
class Faults:
    """Data faults keyed by 1-based step number."""

    nan_at: set[int] = field(default_factory=set)
    spike_at: dict[int, float] = field(default_factory=dict)  # step -> label multiplier
    sleep_at: dict[int, float] = field(default_factory=dict)  # step -> seconds
    # Steps whose loss scale is inf (tuple shapes): overflow, an infinite grad norm, a
    # finite loss, no update — fp16 loss scaling at work.
    overflow_at: set[int] = field(default_factory=set)


class _Source:
    """`steps * BATCH` samples; a fault on step k touches every sample of batch k."""

    def __init__(self, steps: int, faults: Faults, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((steps * BATCH, FEATURES)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.faults = faults

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        step = index // BATCH + 1
        if step in self.faults.sleep_at and index % BATCH == 0:
            time.sleep(self.faults.sleep_at[step])
        y = self.y[index].copy()
        if step in self.faults.nan_at:
            y[:] = np.nan
        if step in self.faults.spike_at:
            y *= self.faults.spike_at[step]
        if not self.faults.overflow_at:
            return self.x[index], y
        scale = np.float32(np.inf if step in self.faults.overflow_at else 1.0)
        return self.x[index], y, np.array(scale, dtype=np.float32)


def build_model(shape: str = "scalar", lr=0.01, model_config: Any = None) -> Model:
    """`model_config`: set as the network's `config`, as a MindFormers model carries its
    LlamaConfig (what MFU and tokens per sample are read from)."""
    net = _Regressor()
    if model_config is not None:
        net.config = model_config
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    if shape == "scalar":
        train_net = nn.TrainOneStepCell(loss_net, optimizer)
    elif shape == "tuple3":
        train_net = _TupleTrainCell(loss_net, optimizer, width=3, scale=1024.0)
    elif shape == "tuple5":
        train_net = _TupleTrainCell(loss_net, optimizer, width=5)
    else:
        raise ValueError(shape)
    return Model(train_net)


def build_dataset(steps: int, faults: Faults | None = None):
    """`steps` batches of BATCH samples."""
    faults = faults or Faults()
    columns = ["x", "y", "loss_scale"] if faults.overflow_at else ["x", "y"]
    return GeneratorDataset(_Source(steps, faults), column_names=columns, shuffle=False).batch(BATCH)


def train(
    callbacks: list,
    *,
    steps: int = 20,
    epochs: int = 1,
    shape: str = "scalar",
    mode: int = ms.PYNATIVE_MODE,
    faults: Faults | None = None,
    lr=0.01,
    sink_size: int | None = None,
    model_config: Any = None,
) -> Model:
    """Run a real training of `steps` steps per epoch with the given callbacks; with
    `sink_size`, in data-sink mode (MindSpore then reports `batch_num = sink_size`)."""
    ms.set_context(mode=mode)
    ms.set_device("CPU")
    model = build_model(shape, lr=lr, model_config=model_config)
    dataset = build_dataset(steps, faults)
    if sink_size is None:
        model.train(epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    else:
        model.train(epochs, dataset, callbacks=callbacks, dataset_sink_mode=True, sink_size=sink_size)
    return model
