"""One data-parallel msrun worker that watches for on-demand capture requests.

    msrun --worker_num=2 ... capture_worker.py CONFIG_YAML --steps N [--stop-file PATH]

Each step's data waits `--sleep` seconds, so the job runs long enough for a person (the
test) to ask for a capture while it goes on. With `--stop-file`, the job runs until that
file exists (N steps at most), every rank stopping at the same step (msrun_job.StopAtWrittenStep).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mindspore import nn  # noqa: E402
from mindspore.train import Model  # noqa: E402

from tests.support.msrun_job import (  # noqa: E402
    BATCH,
    SleepySource,
    StopAtWrittenStep,
    regressor,
    sharded,
    start_data_parallel,
)


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
    callbacks = [StopAtWrittenStep(args.stop_file, args.steps)] if args.stop_file else []
    callbacks.append(MonitorCallback(args.config))
    model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank}/{world}: training finished")


if __name__ == "__main__":
    main()
