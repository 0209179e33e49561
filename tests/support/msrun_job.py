"""What the msrun worker scripts share: a data-parallel start on CPU, a small regressor, a
data source that can be told to sleep, sharded by rank, and a stop that every rank takes at
the same step."""

from __future__ import annotations

import os
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init
from mindspore.dataset import GeneratorDataset
from mindspore.train import Callback

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


class StopAtWrittenStep(Callback):
    """Stops every rank at the first step end where any rank is at or past the step written in
    `path` (an empty file: at once), or at `max_steps`. The ranks decide together, by an
    all-reduce at each step end: a rank that read the file a step later than the other, or
    after the written step, would otherwise go on alone into a collective that never ends.
    Put it before MonitorCallback: a rank's wait for the other in that all-reduce then lies in
    its step, as its wait in the gradients' does, not between steps, where it would read as a
    data wait (the stragglers' signal)."""

    def __init__(self, path: str, max_steps: int) -> None:
        self._path = path
        self._max_steps = max_steps
        self._stop_at: int | None = None
        self._sum = ops.AllReduce(ops.ReduceOp.SUM)  # the only reduction on CPU

    def on_train_step_end(self, run_context):
        step = run_context.original_args()["cur_step_num"]
        if self._stop_at is None and os.path.exists(self._path):
            text = Path(self._path).read_text().strip()
            self._stop_at = int(text) if text else 0
        here = step >= self._max_steps or (self._stop_at is not None and step >= self._stop_at)
        if float(self._sum(ms.Tensor([float(here)], ms.float32)).asnumpy()[0]) > 0:
            run_context.request_stop()
