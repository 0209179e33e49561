"""One worker of a 2-rank msrun job for the grad-norm test: data-parallel Model.train with
`grad_monitor: True` on a plain MindSpore network, every rank reporting.

    msrun --worker_num=2 ... grad_norm_worker.py OUT_DIR STEPS

Each rank trains on its own shard; at each step's begin it saves the gradients of its own
batch under the weights before the update (`mindspore.grad`, before any all-reduce) as
OUT_DIR/grads_rank{R}_step{S}.npy, for the test to average across the ranks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.train import Callback, Model

from otel_mindformers import MonitorCallback
from tests.support.msrun_job import BATCH, SleepySource, regressor, sharded, start_data_parallel


class _LocalGradients(Callback):
    def __init__(self, loss_net: nn.Cell, weights: list, out: Path, rank: int) -> None:
        self._grad = ms.grad(loss_net, grad_position=None, weights=weights)
        self._out, self._rank = out, rank

    def on_train_step_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        x, y = cb_params.train_dataset_element
        flat = np.concatenate([g.asnumpy().astype(np.float64).reshape(-1) for g in self._grad(x, y)])
        np.save(self._out / f"grads_rank{self._rank}_step{cb_params.cur_step_num}.npy", flat)


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    rank, world = start_data_parallel()
    ms.set_seed(0)  # the same initial weights on both ranks
    net = regressor()
    weights = net.trainable_params()
    model = Model(net, nn.MSELoss(), nn.Momentum(weights, 0.01, 0.9))
    data = sharded(SleepySource(steps * BATCH * world, 0.0), rank, world).batch(BATCH)
    monitor = MonitorCallback(
        {
            "interval": 2,
            "grad_monitor": True,
            "report_ranks": "all",
            "output_type": ["json_file"],
            "json_log_path": str(out / f"rank{rank}.json"),
        }
    )
    local = _LocalGradients(nn.WithLossCell(net, nn.MSELoss()), weights, out, rank)
    model.train(1, data, callbacks=[local, monitor], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
