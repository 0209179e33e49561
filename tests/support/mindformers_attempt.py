"""One attempt of a MindFormers tiny-LLaMA job (tests/test_restarts_mindformers.py): the
YAML's CheckpointMonitor saves every few steps; `resume` resumes through MindFormers' own
path, `Trainer.train(resume_from_checkpoint=..., resume_training=True)` (meta.json names the
checkpoint); `pause_at` writes {"event": "paused"} to the clock file at that job step and
waits to be killed.

    python -m tests.support.mindformers_cpu tests/support/mindformers_attempt.py '<json spec>'
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mindformers import MindFormerConfig, Trainer
from mindspore.dataset import GeneratorDataset
from mindspore.train.callback import Callback

import otel_mindformers  # noqa: F401  (monitor_config in the MindFormers YAML)
from otel_mindformers.job.resume import mindformers_initial_step


class PauseAt(Callback):
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.offset: int | None = None

    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        if self.offset is None:  # MindFormers' resumed step, as its own callbacks hold it
            self.offset = mindformers_initial_step(cb_params.list_callback) or 0
        step = self.offset + cb_params.cur_step_num
        with open(self.spec["clock"], "a") as stream:
            stream.write(json.dumps({"step": step, "t": time.time()}) + "\n")
        if step == self.spec.get("pause_at"):
            with open(self.spec["clock"], "a") as stream:
                stream.write(json.dumps({"event": "paused", "step": step, "t": time.time()}) + "\n")
            while True:
                time.sleep(1.0)


def main(spec: dict) -> None:
    config = MindFormerConfig(spec["yaml"])
    rows = np.random.default_rng(0).integers(0, 64, size=(2 * spec["steps"], 17), dtype=np.int32)
    dataset = GeneratorDataset([(r,) for r in rows], column_names=["input_ids"], shuffle=False).batch(2)
    trainer = Trainer(args=config, train_dataset=dataset, callbacks=[PauseAt(spec)])
    if spec.get("resume"):
        trainer.train(resume_from_checkpoint=spec["checkpoints"], resume_training=True)
    else:
        trainer.train()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
