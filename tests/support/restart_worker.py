"""One attempt of a restarted job: a real MindSpore training with `ModelCheckpoint`,
resumed the way a user resumes (`load_checkpoint` + `Model.train(..., initial_epoch=E)`).

    python -m tests.support.restart_worker '<json spec>'

Spec keys: `config` (monitor_config mapping), `epochs` (the job's epochs), `steps` (steps
per epoch), `checkpoint_dir`, `save_steps` (ModelCheckpoint's save_checkpoint_steps),
`resume` (a checkpoint path, or null), `initial_epoch`, `step_sleep` (seconds added to each
step, after the callbacks' step end), `pause_at` (a job step: at it, write `paused` to the
clock file and wait to be killed), `kill_at` (a job step: SIGKILL itself there, once every
other callback of the step returned), `crash_at` (a job step: raise RuntimeError there),
`clock` (a JSON-lines file the worker appends its own clock readings to: `{"step": job
step, "t": time.time()}` per step, `{"event": "returned", "t": ...}` after training).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import reliability_worker


def spawn(spec: dict, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start one attempt in `cwd` (`env` adds to this process's environment)."""
    return reliability_worker.spawn(spec, cwd, env, module="tests.support.restart_worker")


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    """A folder of the test's own, outside pytest's basetemp: a concurrent pytest session of
    the same user prunes old basetemps, and a job's attempts outlive a few of them."""
    path = Path(tempfile.mkdtemp(prefix="otel-mindformers-restarts-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def reaped(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Kill the attempt if the test leaves it running (a paused one waits forever)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def wait_for_ledger_step(ledger: Path, step: int, process: subprocess.Popen, timeout: float = 300) -> None:
    """Until the attempt's heartbeat in `ledger` says it finished `step` (the process is
    paused there), or fail with the process's output if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the attempt ended (rc {process.returncode}) before step {step}:\n{err[-4000:]}")
        try:
            attempts = json.loads(ledger.read_text())["attempts"]
            if attempts[-1]["pid"] == process.pid and attempts[-1]["last_step"] == step:
                return
        except (OSError, ValueError, KeyError, IndexError):
            pass  # not written yet
        time.sleep(0.05)
    raise AssertionError(f"no heartbeat at step {step} in {ledger} within {timeout} s")


def wait_for_line(path: Path, step: int, timeout: float = 60.0) -> None:
    """Until the JSON log at `path` holds the line of `step` (a paused attempt's last lines
    are written within MAX_QUIET of the pause; a SIGKILL before that loses them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if any(json.loads(line).get("step") == step for line in lines if line.endswith("}")):
            return
        time.sleep(0.02)
    raise AssertionError(f"no line for step {step} in {path} within {timeout} s")


def kill(process: subprocess.Popen) -> float:
    """SIGKILL the attempt; the time it was sent (the test's clock)."""
    sent = time.time()
    process.send_signal(signal.SIGKILL)
    process.communicate()
    return sent


def read_clock(path: Path) -> list[dict]:
    """The worker's own clock readings (every attempt appends to the same file)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def latest_checkpoint(directory: Path) -> Path:
    """The newest `.ckpt` ModelCheckpoint wrote in `directory`."""
    return max(directory.glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns)


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    import mindspore as ms
    from mindspore.train.callback import Callback, CheckpointConfig, ModelCheckpoint

    from otel_mindformers import MonitorCallback
    from tests.support.training import build_dataset, build_model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    clock_path = Path(spec["clock"])
    initial_epoch = int(spec.get("initial_epoch") or 0)
    steps = int(spec["steps"])

    def note(entry: dict) -> None:
        with open(clock_path, "a") as stream:
            stream.write(json.dumps(entry) + "\n")

    class UserClock(Callback):
        """The test's own clock: after MonitorCallback and ModelCheckpoint in the list."""

        def on_train_step_end(self, run_context):
            cb_params = run_context.original_args()
            step = initial_epoch * steps + int(cb_params.cur_step_num)
            note({"step": step, "t": time.time(), "pid": os.getpid()})
            if step == spec.get("kill_at"):
                os.kill(os.getpid(), signal.SIGKILL)
            if step == spec.get("crash_at"):
                raise RuntimeError(f"injected crash at step {step}")
            if step == spec.get("pause_at"):
                note({"event": "paused", "step": step, "t": time.time(), "pid": os.getpid()})
                while True:
                    time.sleep(1.0)
            if spec.get("step_sleep"):
                time.sleep(float(spec["step_sleep"]))

    model = build_model()
    if spec.get("resume"):
        ms.load_checkpoint(spec["resume"], net=model.train_network)
    checkpoint = ModelCheckpoint(
        prefix="job",
        directory=spec["checkpoint_dir"],
        config=CheckpointConfig(save_checkpoint_steps=int(spec["save_steps"]), keep_checkpoint_max=20),
    )

    class StepEdges(Callback):
        """Where MonitorCallback sees a step begin and end: the callback just before it
        notes the begin, the one just after it the end."""

        def __init__(self, edge: str) -> None:
            self.edge = edge

        def _note(self, run_context) -> None:
            step = initial_epoch * steps + int(run_context.original_args().cur_step_num)
            note({self.edge: step, "t": time.time(), "pid": os.getpid()})

        def on_train_step_begin(self, run_context):
            if self.edge == "step_begin":
                self._note(run_context)

        def on_train_step_end(self, run_context):
            if self.edge == "step_end":
                self._note(run_context)

    callbacks = [
        StepEdges("step_begin"),
        MonitorCallback(spec["config"]),
        StepEdges("step_end"),
        checkpoint,
        UserClock(),
    ]
    model.train(
        int(spec["epochs"]),
        build_dataset(steps),
        callbacks=callbacks,
        dataset_sink_mode=False,
        initial_epoch=initial_epoch,
    )
    note({"event": "returned", "t": time.time(), "pid": os.getpid()})


if __name__ == "__main__":
    main(sys.argv[1:])
