"""One attempt of a restarted job whose training is a custom loop (tests/support/custom_loop.py)
monitored through the run API, resumed the way such a loop resumes: load the checkpoint, skip
the batches it holds, `otel_mindformers.start(..., initial_step=<its step>)`.

    python -m tests.support.custom_loop_attempt '<json spec>'

Spec keys: `config` (monitor_config mapping), `steps` (the job's steps), `checkpoint_dir`,
`save_every` (a checkpoint every so many steps, said with `run.checkpoint_saved`), `resume`
(the step of the checkpoint to resume from, or null), `kill_at` (a job step: SIGKILL itself
once that step ended).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"loop_step_{step}.ckpt"


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    import mindspore as ms

    import otel_mindformers
    from tests.support import custom_loop

    loop = custom_loop.build()
    resume = int(spec.get("resume") or 0)
    if resume:
        ms.load_checkpoint(str(checkpoint_path(spec["checkpoint_dir"], resume)), net=loop.network)
    with otel_mindformers.start(spec["config"], optimizer=loop.optimizer, initial_step=resume) as run:
        for step, (x, y) in enumerate(custom_loop.Data(int(spec["steps"])).batches(), start=1):
            if step <= resume:
                continue  # the checkpoint holds these steps
            with run.step(step):
                loss, grads = loop.train_step(x, y)
                run.log(loss=loss, grads=grads)
            if step % int(spec["save_every"]) == 0:
                began = time.perf_counter()
                ms.save_checkpoint(loop.network, str(checkpoint_path(spec["checkpoint_dir"], step)))
                run.checkpoint_saved(step, time.perf_counter() - began)
            if step == spec.get("kill_at"):
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
