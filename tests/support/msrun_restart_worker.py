"""One rank of a 2-rank msrun job that is restarted together (tests/test_restarts_msrun.py):
data-parallel training with a ModelCheckpoint per rank and MonitorCallback.

    msrun --worker_num=2 ... tests/support/msrun_restart_worker.py '<json spec>'

Spec keys: `config` (monitor_config), `epochs`, `steps` (per epoch and rank),
`initial_epoch` (resume from `ckpt/rank_<r>/` newest checkpoint when > 0), `crash_at` (a job
step at which every rank raises, after the step's gradients were averaged), `kill_at` and
`kill_rank` (that rank SIGKILLs itself once every callback of that step returned).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model
from mindspore.train.callback import Callback, CheckpointConfig, ModelCheckpoint

from otel_mindformers import MonitorCallback

FEATURES, BATCH = 8, 4


class CrashAt(Callback):
    def __init__(self, step: int | None, offset: int) -> None:
        self.step, self.offset = step, offset

    def on_train_step_end(self, run_context):
        step = self.offset + run_context.original_args().cur_step_num
        if step == self.step:
            raise RuntimeError(f"injected crash at step {step}")


class KillAt(Callback):
    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(spec: dict) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    rank, world = get_rank(), get_group_size()
    steps, initial_epoch = int(spec["steps"]), int(spec.get("initial_epoch") or 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * BATCH * world, FEATURES)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32) * 0.5
    dataset = GeneratorDataset(
        list(zip(x, y)), column_names=["x", "y"], shuffle=False, num_shards=world, shard_id=rank
    ).batch(BATCH)
    net = nn.SequentialCell(nn.Dense(FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    directory = Path("ckpt") / f"rank_{rank}"
    if initial_epoch:
        newest = max(directory.glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns)
        ms.load_checkpoint(str(newest), net=model.train_network)
    checkpoint = ModelCheckpoint(
        prefix="dp",
        directory=str(directory),
        config=CheckpointConfig(save_checkpoint_steps=steps, keep_checkpoint_max=10),
    )
    callbacks = [MonitorCallback(spec["config"]), checkpoint, CrashAt(spec.get("crash_at"), initial_epoch * steps)]
    if spec.get("kill_rank") == rank:
        callbacks.append(KillAt(spec["kill_at"]))
    model.train(int(spec["epochs"]), dataset, callbacks=callbacks, dataset_sink_mode=False, initial_epoch=initial_epoch)
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
