"""One worker of a 2-rank msrun job for the straggler tests: real data-parallel Model.train.

    msrun --worker_num=2 ... straggler_worker.py CONFIG.yaml STOP_FILE [--slow-rank R --sleep S]
                                                 [--busy-rank R --busy-after K]

- `--slow-rank R --sleep S`: rank R's dataset source sleeps S seconds per sample;
- `--busy-rank R --busy-after K`: from step K, a thread on rank R spins in Python (holding
  the GIL most of the time), so that rank's compute slows with no data wait;
- the run stops at the step written in STOP_FILE (the test writes it once it has seen what
  it waits for), the same step on both ranks, so neither is left alone in a collective.
  MAX_STEPS bounds a run whose test never writes it.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.dataset import GeneratorDataset
from mindspore.train import Callback, Model

from otel_mindformers import MonitorCallback

FEATURES, BATCH = 8, 4
MAX_STEPS = 2000


class _Source:
    def __init__(self, samples: int, sleep: float) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((samples, FEATURES)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.sleep = sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if self.sleep:
            time.sleep(self.sleep)
        return self.x[index], self.y[index]


class _StopAtWrittenStep(Callback):
    """Stops at the step in `path` once it exists; starts the busy thread at `busy_after`."""

    def __init__(self, path: str, busy_after: int | None) -> None:
        self._path = path
        self._stop_at: int | None = None
        self._busy_after = busy_after
        self._spinning = threading.Event()

    def on_train_step_end(self, run_context):
        step = run_context.original_args()["cur_step_num"]
        if self._busy_after is not None and step == self._busy_after:
            self._spinning.set()
            threading.Thread(target=self._spin, name="busy", daemon=True).start()
        if self._stop_at is None and os.path.exists(self._path):
            text = Path(self._path).read_text().strip()
            self._stop_at = int(text) if text else None
        if step >= MAX_STEPS or (self._stop_at is not None and step >= self._stop_at):
            run_context.request_stop()

    def on_train_end(self, run_context):
        self._spinning.clear()

    def _spin(self) -> None:
        count = 0
        while self._spinning.is_set():
            count += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("stop_file")
    parser.add_argument("--slow-rank", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--busy-rank", type=int)
    parser.add_argument("--busy-after", type=int)
    args = parser.parse_args()

    ms.set_context(mode=ms.PYNATIVE_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    # A short prefetch: the batches a slow source makes during start-up do not hide its pace.
    ms.dataset.config.set_prefetch_size(2)
    source = _Source(MAX_STEPS * BATCH * world, args.sleep if rank == args.slow_rank else 0.0)
    dataset = GeneratorDataset(source, column_names=["x", "y"], shuffle=False, num_shards=world, shard_id=rank)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    busy_after = args.busy_after if rank == args.busy_rank else None
    callbacks = [MonitorCallback(args.config), _StopAtWrittenStep(args.stop_file, busy_after)]
    model.train(1, dataset.batch(BATCH), callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main()
