"""One worker of the 2-rank msrun job of the MindCluster tests: real data-parallel Model.train
on CPU, in which rank 1's own loss goes NaN at chosen steps and recovers.

    msrun --worker_num=2 ... cluster_msrun_worker.py CONFIG STOP_FILE --nan-rank R --nan-at 4,7,10

The train cell follows loss scaling's rule without the scale: a step whose all-reduced
gradients are not all finite updates nothing. So rank R's NaN (its labels at those steps)
never reaches the parameters: its own loss is NaN at those steps and finite again after,
while the other rank's loss stays finite, as on a device that corrupts some of its steps.
Each step sleeps in its forward pass (compute, not data wait: no rank holds the other back).
The run stops at the step written in STOP_FILE, the same on both ranks (msrun_job.StopAtWrittenStep).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mindspore import nn, ops
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

from otel_mindformers import MonitorCallback
from tests.support.msrun_job import BATCH, FEATURES, StopAtWrittenStep, regressor, start_data_parallel

MAX_STEPS = 600
PACE = 0.05  # seconds of each step's forward pass


class _Paced(nn.Cell):
    def __init__(self, net: nn.Cell) -> None:
        super().__init__()
        self.net = net

    def construct(self, x):
        time.sleep(PACE)
        return self.net(x)


class _SkipNonFinite(nn.TrainOneStepCell):
    def construct(self, x, y):
        loss = self.network(x, y)
        grads = self.grad(self.network, self.weights)(x, y, ops.ones_like(loss))
        grads = self.grad_reducer(grads)
        finite = ops.stack([ops.isfinite(g).all() for g in grads]).all()
        self.optimizer(tuple(ops.where(finite, g, ops.zeros_like(g)) for g in grads))
        return loss


class _Source:
    """MAX_STEPS batches; NaN labels on the steps in `nan_at`."""

    def __init__(self, nan_at: set[int]) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((MAX_STEPS * BATCH, FEATURES)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.nan_at = nan_at

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        y = self.y[index].copy()
        if index // BATCH + 1 in self.nan_at:
            y[:] = np.nan
        return self.x[index], y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("stop_file")
    parser.add_argument("--nan-rank", type=int, required=True)
    parser.add_argument("--nan-at", default="")
    args = parser.parse_args()

    rank, _ = start_data_parallel()
    nan_at = {int(s) for s in args.nan_at.split(",") if s} if rank == args.nan_rank else set()
    dataset = GeneratorDataset(_Source(nan_at), column_names=["x", "y"], shuffle=False).batch(BATCH)
    net = nn.WithLossCell(_Paced(regressor()), nn.MSELoss())
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(_SkipNonFinite(net, optimizer))
    model.train(1, dataset, callbacks=[StopAtWrittenStep(args.stop_file, MAX_STEPS), MonitorCallback(args.config)],
                dataset_sink_mode=False)  # fmt: skip
    print(f"rank {rank}: training finished", flush=True)


if __name__ == "__main__":
    main()
