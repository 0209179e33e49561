"""One rank of a training that loses time to every built-in phase, run as a child process
(a process of its own: its start-up is its own, as on a real job).

It loads a real MindSpore checkpoint before training (`checkpoint.load`), its dataset sleeps
before each batch (`data_wait`), `Model.fit` evaluates after each epoch (`evaluation`) and
`ModelCheckpoint` saves every few steps (`checkpoint.save`). It writes what it timed itself,
with its own clocks, to `--measured` (JSON) for the test to compare with the report.

    python -m tests.support.timed_fit --checkpoint CKPT --json-log LOG --measured OUT --sleep S \
        --save-dir DIR [--steps 6 --epochs 2 --save-every 3]
"""

from __future__ import annotations

import argparse
import json
import time

import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
from mindspore.train.callback import CheckpointConfig, ModelCheckpoint

# otel_mindformers first: importing it wraps MindSpore's load_checkpoint (a checkpoint.load phase).
from otel_mindformers.runtime.callback import MonitorCallback
from tests.support import training
from tests.support.training import Faults


def build_net() -> nn.Cell:
    return nn.SequentialCell(nn.Dense(training.FEATURES, 16), nn.ReLU(), nn.Dense(16, 1))


class TimedCheckpoint(ModelCheckpoint):
    """ModelCheckpoint noting each save: (wall start, wall end, file)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.saves: list[tuple[float, float, str]] = []

    def _save_ckpt(self, cb_params, force_to_save=False):
        before, started = self._latest_ckpt_file_name, time.time()
        super()._save_ckpt(cb_params, force_to_save)
        if self._latest_ckpt_file_name != before:
            self.saves.append((started, time.time(), self._latest_ckpt_file_name))


class PhaseTimes(Callback):
    """Each step's begin and end (perf_counter), the last step's end (wall) and each
    evaluation's wall window."""

    def __init__(self) -> None:
        super().__init__()
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.last_end_wall = 0.0
        self.evaluations: list[list[float]] = []

    def on_train_step_begin(self, run_context):
        self.begins.append(time.perf_counter())

    def on_train_step_end(self, run_context):
        self.ends.append(time.perf_counter())
        self.last_end_wall = time.time()

    def on_eval_begin(self, run_context):
        self.evaluations.append([time.time()])

    def on_eval_end(self, run_context):
        self.evaluations[-1].append(time.time())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--json-log", required=True)
    parser.add_argument("--measured", required=True)
    parser.add_argument("--sleep", type=float, required=True)
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--steps", type=int, default=6, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=3, help="steps between checkpoints")
    args = parser.parse_args()

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    net = build_net()
    load_begin = time.time()
    ms.load_checkpoint(args.checkpoint, net)
    load_end = time.time()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=optimizer, metrics={"mae"})
    checkpoint = TimedCheckpoint(
        prefix="net", directory=args.save_dir,
        config=CheckpointConfig(save_checkpoint_steps=args.save_every, keep_checkpoint_max=20),
    )  # fmt: skip
    times = PhaseTimes()
    monitor = MonitorCallback({"interval": 2, "output_type": ["json_file"], "json_log_path": args.json_log})
    faults = Faults(sleep_at={step: args.sleep for step in range(2, args.steps + 1)})
    # Ours after ModelCheckpoint, so the save at train end is inside the run.
    model.fit(
        args.epochs,
        training.build_dataset(args.steps, faults),
        valid_dataset=training.build_dataset(3),
        callbacks=[checkpoint, monitor, times],
        dataset_sink_mode=False,
        valid_dataset_sink_mode=False,
    )
    with open(args.measured, "w", encoding="utf-8") as out:
        json.dump({
            "load": [load_begin, load_end], "saves": checkpoint.saves, "evaluations": times.evaluations,
            "begins": times.begins, "ends": times.ends, "last_end_wall": times.last_end_wall,
        }, out)  # fmt: skip


if __name__ == "__main__":
    main()
