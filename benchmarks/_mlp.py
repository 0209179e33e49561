"""What bench_overhead.py and bench_peers.py train: one MLP on random data, and the log
redirection both use while a variant trains (as under a job scheduler)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mindspore import nn
from mindspore.train import Model

FEATURES, CLASSES, BATCH = 256, 10, 64
# The Callback hooks a benchmark times.
HOOKS = (
    "on_train_begin",
    "on_train_epoch_begin",
    "on_train_step_begin",
    "on_train_step_end",
    "on_train_epoch_end",
    "on_train_end",
)
HIDDEN = {"default": 1024, "small": 128}  # small: 3-5 ms graph-mode steps on 2 cores; default ~15 ms


class Redirected:
    """stdout and stderr, file descriptors included, into `path` (loggers keep their streams)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __enter__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self._log = open(self._path, "ab")
        os.dup2(self._log.fileno(), 1)
        os.dup2(self._log.fileno(), 2)

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self._saved):
            os.dup2(saved, fd)
            os.close(saved)
        self._log.close()


def build_parts(hidden: int) -> tuple[nn.Cell, nn.Cell, nn.Optimizer]:
    """The network, its loss and its optimizer (a custom loop puts them together itself)."""
    net = nn.SequentialCell(
        nn.Dense(FEATURES, hidden), nn.ReLU(), nn.Dense(hidden, hidden), nn.ReLU(), nn.Dense(hidden, CLASSES)
    )
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    return net, loss, optimizer


def build_model(hidden: int) -> Model:
    net, loss, optimizer = build_parts(hidden)
    return Model(nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer))
