"""One worker of a 2-rank msrun job for the straggler tests: real data-parallel Model.train.

    msrun --worker_num=2 ... straggler_worker.py CONFIG.yaml STOP_FILE [--slow-rank R --sleep S]
                                                 [--slow-step-rank R --slow-step-after K --slow-step S]

- `--slow-rank R --sleep S`: rank R's dataset source sleeps S seconds per sample;
- `--slow-step-rank R --slow-step-after K --slow-step S`: from step K, rank R's network
  sleeps S seconds in its forward pass (PyNative runs it in Python each step), so that rank's
  compute slows, before the gradient all-reduce, with no data wait. A busy thread was tried
  first: on a host already loaded by other work it did not double the step reliably;
- the run stops at the step written in STOP_FILE (the test writes it once it has seen what
  it waits for), the same step on both ranks, so neither is left alone in a collective
  (msrun_job.StopAtWrittenStep).
  MAX_STEPS bounds a run whose test never writes it.
"""

from __future__ import annotations

import argparse
import threading
import time

import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model

from otel_mindformers import MonitorCallback
from tests.support.msrun_job import BATCH, SleepySource, StopAtWrittenStep, regressor, sharded, start_data_parallel

MAX_STEPS = 2000


class _SlowForward(nn.Cell):
    """The network, sleeping `seconds` in its forward pass once `slow` is set."""

    def __init__(self, net: nn.Cell, seconds: float) -> None:
        super().__init__()
        self.net = net
        self.seconds = seconds
        self.slow = threading.Event()

    def construct(self, x):
        if self.slow.is_set():
            time.sleep(self.seconds)
        return self.net(x)


class _SlowFrom(Callback):
    """Slows `network` from step `slow_after`."""

    def __init__(self, network: _SlowForward, slow_after: int | None) -> None:
        self._network = network
        self._slow_after = slow_after

    def on_train_step_end(self, run_context):
        if self._slow_after is not None and run_context.original_args()["cur_step_num"] == self._slow_after:
            self._network.slow.set()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("stop_file")
    parser.add_argument("--slow-rank", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--slow-step-rank", type=int)
    parser.add_argument("--slow-step-after", type=int)
    parser.add_argument("--slow-step", type=float, default=1.0)
    args = parser.parse_args()

    rank, world = start_data_parallel()
    # A short prefetch: the batches a slow source makes during start-up do not hide its pace.
    ms.dataset.config.set_prefetch_size(2)
    source = SleepySource(MAX_STEPS * BATCH * world, args.sleep if rank == args.slow_rank else 0.0)
    dataset = sharded(source, rank, world)
    net = _SlowForward(regressor(), args.slow_step)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    slow_after = args.slow_step_after if rank == args.slow_step_rank else None
    callbacks = [
        StopAtWrittenStep(args.stop_file, MAX_STEPS), MonitorCallback(args.config), _SlowFrom(net, slow_after),
    ]  # fmt: skip
    model.train(1, dataset.batch(BATCH), callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main()
