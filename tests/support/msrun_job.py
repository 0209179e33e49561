"""What the msrun worker scripts share: a data-parallel start on CPU, a small regressor, and a
data source that can be told to sleep, sharded by rank."""

from __future__ import annotations

import time

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.dataset import GeneratorDataset

FEATURES, BATCH = 8, 4


class SleepySource:
    """`samples` rows of a linear target; sleeps `sleep` seconds before every `every`-th row."""

    def __init__(self, samples: int, sleep: float, every: int = 1) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.sleep = sleep
        self.every = every

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if self.sleep and index % self.every == 0:
            time.sleep(self.sleep)
        return self.x[index], self.y[index]


def start_data_parallel() -> tuple[int, int]:
    """PyNative, communication up, data parallel with averaged gradients: (rank, world)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return get_rank(), get_group_size()


def sharded(source: SleepySource, rank: int, world: int) -> GeneratorDataset:
    """The rank's shard of `source`, in order (not batched)."""
    return GeneratorDataset(source, column_names=["x", "y"], shuffle=False, num_shards=world, shard_id=rank)


def regressor() -> nn.Cell:
    return nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
