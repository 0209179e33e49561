"""A MindSpore custom training loop (the quick start's shape) monitored through the run API.

    python examples/custom_loop.py [--jit] [--steps N] [--config train_config.yaml]

`value_and_grad` over a forward function, a `train_step` that calls `optimizer(grads)`, a
Python `for` over the dataset; `--jit` compiles the step with `mindspore.jit`. The run writes
what `examples/train_config.yaml` (or `--config`) asks for; docs/custom_loops.md says more.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.dataset import GeneratorDataset

import otel_mindformers


def dataset(steps: int, batch: int = 16) -> GeneratorDataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * batch, 8)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    return GeneratorDataset(list(zip(x, y, strict=True)), column_names=["x", "y"], shuffle=False).batch(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jit", action="store_true", help="compile the train step with mindspore.jit")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--config", default=str(Path(__file__).with_name("train_config.yaml")))
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)

    network = nn.SequentialCell(nn.Dense(8, 32), nn.ReLU(), nn.Dense(32, 1))
    loss_fn = nn.MSELoss()
    optimizer = nn.SGD(network.trainable_params(), learning_rate=0.01)

    def forward(x, y):
        return loss_fn(network(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        return loss, grads

    if args.jit:
        train_step = ms.jit(train_step)

    data = dataset(args.steps)
    # The loop's length (one epoch): its last step is sampled with its gradients (and an ETA).
    length = {"epochs": 1, "steps_per_epoch": data.get_dataset_size()}
    with otel_mindformers.start(args.config, optimizer=optimizer, network=network, dataset=data, **length) as run:
        for step, (x, y) in enumerate(data.create_tuple_iterator(), start=1):
            with run.step(step):  # the step's clock and span; the time between steps is data wait
                loss, grads = train_step(x, y)
                run.log(loss=loss, grads=grads)  # read back on sampled steps only
            if run.should_stop:  # an alert with stop, stop_on_nonfinite
                break


if __name__ == "__main__":
    main()
