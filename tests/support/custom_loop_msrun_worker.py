"""One worker of a 2-rank msrun job for the run API's data-parallel test: a real PyNative
custom loop (MindSpore's quick-start shape) with `init()`, MindSpore's data-parallel context
and `nn.DistributedGradReducer` averaging the gradients before `optimizer(grads)`.

    msrun --worker_num=2 ... custom_loop_msrun_worker.py CONFIG.yaml STEPS
                             [--slow-rank R --sleep S] [--nan-rank R --nan-at K]

- `--slow-rank R --sleep S`: rank R's dataset source sleeps S seconds per sample, so that
  rank waits for its data between steps and the other waits for it in the all-reduce;
- `--nan-rank R --nan-at K`: rank R's batch of step K has a NaN label. The loop logs each
  rank's own gradients (before the all-reduce), so rank R is bad at K and the other rank
  only from K+1, when the averaged NaN gradients reached its weights.

Both ranks run STEPS steps: neither is left alone in a collective.
"""

from __future__ import annotations

import argparse

import mindspore as ms
import numpy as np
from mindspore import nn

import otel_mindformers
from tests.support.msrun_job import BATCH, SleepySource, regressor, sharded, start_data_parallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("steps", type=int)
    parser.add_argument("--slow-rank", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--nan-rank", type=int)
    parser.add_argument("--nan-at", type=int)
    args = parser.parse_args()

    rank, world = start_data_parallel()
    ms.dataset.config.set_prefetch_size(2)  # a slow source's start-up batches do not hide its pace
    source = SleepySource(args.steps * BATCH * world, args.sleep if rank == args.slow_rank else 0.0)
    dataset = sharded(source, rank, world).batch(BATCH)

    network = regressor()
    loss_fn = nn.MSELoss()
    optimizer = nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9)
    reducer = nn.DistributedGradReducer(optimizer.parameters, mean=True, degree=world)

    def forward(x, y):
        return loss_fn(network(x), y)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        optimizer(reducer(grads))
        return loss, grads  # this rank's own gradients: where a NaN started

    nan_at = args.nan_at if rank == args.nan_rank else None
    with otel_mindformers.start(args.config, optimizer=optimizer, network=network, dataset=dataset) as run:
        for step, (x, y) in enumerate(dataset.create_tuple_iterator(num_epochs=1), start=1):
            if step == nan_at:
                label = y.asnumpy().copy()
                label[0, 0] = np.nan
                y = ms.Tensor(label)
            with run.step(step):
                loss, grads = train_step(x, y)
                run.log(loss=loss, grads=grads)
    print(f"rank {rank}/{world}: training finished at step {step}")


if __name__ == "__main__":
    main()
