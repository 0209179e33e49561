"""One data-parallel worker of examples/msrun_train.sh: plain MindSpore, no monitoring code.

msrun starts one of these per rank (RANK_ID, RANK_SIZE, DEVICE_ID in the environment);
each trains the same tiny regressor on its shard of the data, gradients averaged across
ranks. `--steps N` sets the steps per rank (default 20).
"""

import argparse

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

FEATURES, BATCH = 8, 4


def shard(steps: int, rank: int, world: int) -> GeneratorDataset:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH * world, FEATURES)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32) * 0.5
    samples = list(zip(x, y))
    return GeneratorDataset(samples, column_names=["x", "y"], shuffle=False, num_shards=world, shard_id=rank).batch(
        BATCH
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    ms.set_context(mode=ms.PYNATIVE_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    model.train(1, shard(args.steps, rank, world), dataset_sink_mode=False)
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main()
