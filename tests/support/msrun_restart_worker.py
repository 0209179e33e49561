"""One rank of a 2-rank msrun job that is restarted together (tests/test_restarts_msrun.py):
data-parallel training with a ModelCheckpoint per rank and MonitorCallback.

    msrun --worker_num=2 ... tests/support/msrun_restart_worker.py '<json spec>'

Spec keys: `config` (monitor_config), `epochs`, `steps` (per epoch and rank),
`initial_epoch` (resume from `ckpt/rank_<r>/` newest checkpoint when > 0), `crash_at` (a job
step at which every rank raises, after the step's gradients were averaged; a rank leaves only
once every rank's training ended, see `crashed_together`), `slow_rank` and
`sleep` (that rank's data source sleeps `sleep` seconds per sample: its data is slow),
`kill_at` and `kill_rank` (that rank SIGKILLs itself once every callback of that step returned).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import mindspore as ms
from mindspore import nn
from mindspore.train import Model
from mindspore.train.callback import Callback, CheckpointConfig, ModelCheckpoint

from otel_mindformers import MonitorCallback
from tests.support.msrun_job import BATCH, SleepySource, regressor, sharded, start_data_parallel


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


def crashed_together(rank: int, world: int, timeout: float = 120.0) -> None:
    """Say this rank's training ended (its callbacks' ends ran: ledger, logs and exports
    written), then wait until every rank's did. msrun SIGKILLs the other ranks within a second
    of the first rank's exit: without the wait, a rank a moment behind loses its end."""
    ended = Path("crashed") / str(os.getppid())  # msrun's: this job's ranks, not an earlier job's
    ended.mkdir(parents=True, exist_ok=True)
    (ended / f"rank_{rank}").touch()
    deadline = time.monotonic() + timeout
    while len(list(ended.glob("rank_*"))) < world and time.monotonic() < deadline:
        time.sleep(0.05)


def main(spec: dict) -> None:
    rank, world = start_data_parallel()
    steps, initial_epoch = int(spec["steps"]), int(spec.get("initial_epoch") or 0)
    sleep = float(spec.get("sleep") or 0.0) if rank == spec.get("slow_rank") else 0.0
    dataset = sharded(SleepySource(steps * BATCH * world, sleep), rank, world).batch(BATCH)
    net = regressor()
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
    try:
        model.train(
            int(spec["epochs"]), dataset, callbacks=callbacks, dataset_sink_mode=False, initial_epoch=initial_epoch
        )
    except RuntimeError:
        if spec.get("crash_at") is not None:
            crashed_together(rank, world)
        raise
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
