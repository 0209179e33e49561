"""One data-parallel msrun worker that watches for on-demand capture requests.

    msrun --worker_num=2 ... capture_worker.py CONFIG_YAML --steps N [--stop-file PATH]

Each step's data waits `--sleep` seconds, so the job runs long enough for a person (the
test) to ask for a capture while it goes on. With `--stop-file`, the job runs until that
file exists (N steps at most): the ranks agree on the step through an all-reduce, so neither
is left alone in a collective, however late one of them sees the file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402
from mindspore.train import Callback, Model  # noqa: E402

from tests.support.msrun_job import BATCH, SleepySource, regressor, sharded, start_data_parallel  # noqa: E402


class _StopWhenAsked(Callback):
    """Stops every rank at the first step end where any rank saw `path`."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._any = ops.AllReduce(ops.ReduceOp.SUM)  # the only reduction on CPU

    def on_train_step_end(self, run_context):
        asked = ms.Tensor([float(os.path.exists(self._path))], ms.float32)
        if float(self._any(asked).asnumpy()[0]) > 0:
            run_context.request_stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--stop-file")
    args = parser.parse_args()

    from otel_mindformers import MonitorCallback

    rank, world = start_data_parallel()
    # Every batch's first sample waits `--sleep`: the job runs long enough to be asked.
    data = sharded(SleepySource(args.steps * BATCH * world, args.sleep, every=BATCH), rank, world).batch(BATCH)
    net = regressor()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer)
    callbacks = [MonitorCallback(args.config)] + ([_StopWhenAsked(args.stop_file)] if args.stop_file else [])
    model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main()
