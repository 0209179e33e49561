"""One data-parallel msrun worker that watches for on-demand capture requests.

    msrun --worker_num=2 ... capture_worker.py CONFIG_YAML --steps N

Each step's data waits `--sleep` seconds, so the job runs long enough for a person (the
test) to ask for a capture while it goes on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402
from mindspore.dataset import GeneratorDataset  # noqa: E402
from mindspore.train import Model  # noqa: E402

FEATURES, BATCH = 8, 4


class Slow:
    def __init__(self, samples: int, sleep: float) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.sleep = sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if index % BATCH == 0:
            time.sleep(self.sleep)
        return self.x[index], self.y[index]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sleep", type=float, default=0.05)
    args = parser.parse_args()

    from otel_mindformers import MonitorCallback

    ms.set_context(mode=ms.PYNATIVE_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    data = GeneratorDataset(
        Slow(args.steps * BATCH * world, args.sleep), ["x", "y"], shuffle=False, num_shards=world, shard_id=rank
    ).batch(BATCH)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    model.train(1, data, callbacks=[MonitorCallback(args.config)], dataset_sink_mode=False)
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main()
