"""A real MindSpore training with MonitorCallback in a child process, for backend tests.

A child process gets a clean OpenTelemetry state (no global providers left by other tests)
and lets a test keep a training, and so its `prometheus` scrape endpoint, alive while real
backends evaluate rules: the training runs until a stop file appears (checked at each step
end, then `run_context.request_stop()`; the dataset's N steps come round again meanwhile, as
many epochs as it takes: how fast a loaded machine trains sets no deadline), or for N steps.

    python -m tests.support.trainer_process CONFIG --steps N [--stop-file F] [--nan-at K]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import pythonpath_with_repo


def spawn(
    config: Path,
    workdir: Path,
    *,
    steps: int,
    stop_file: Path | None = None,
    nan_at: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start the training in `workdir` (MindFormers and MindSpore write ./output there);
    its output goes to workdir/trainer.log. `env` adds variables (RANK_ID, ...); the
    parent's OTEL_* variables are not passed on, so only `config` decides the exporters."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    child_env.update(env or {})
    child_env["PYTHONPATH"] = pythonpath_with_repo(child_env.get("PYTHONPATH"))
    child_env.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
    argv = [sys.executable, "-m", "tests.support.trainer_process", str(config), "--steps", str(steps)]
    if stop_file is not None:
        argv += ["--stop-file", str(stop_file)]
    if nan_at is not None:
        argv += ["--nan-at", str(nan_at)]
    with (workdir / "trainer.log").open("wb") as log:
        return subprocess.Popen(argv, cwd=workdir, env=child_env, stdout=log, stderr=subprocess.STDOUT)


def log_tail(workdir: Path, lines: int = 40) -> str:
    path = workdir / "trainer.log"
    if not path.exists():
        return "(no trainer log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


_UNTIL_STOPPED = 1000  # epochs: the stop file ends the training long before


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", help="monitor_config YAML")
    parser.add_argument(
        "--steps", type=int, required=True, help="steps in the dataset (the most it trains without --stop-file)"
    )
    parser.add_argument("--stop-file", help="stop at the first step end after this file exists")
    parser.add_argument("--nan-at", type=int, help="a NaN label at this step: the loss is NaN from there on")
    args = parser.parse_args(argv)

    from mindspore.train import Callback

    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import Faults, train

    class StopWhenFileExists(Callback):
        def __init__(self, path: str) -> None:
            super().__init__()
            self.path = path

        def on_train_step_end(self, run_context) -> None:
            if os.path.exists(self.path):
                run_context.request_stop()

    callbacks = [MonitorCallback(args.config)]
    if args.stop_file:
        callbacks.append(StopWhenFileExists(args.stop_file))
    faults = Faults(nan_at={args.nan_at}) if args.nan_at else None
    epochs = _UNTIL_STOPPED if args.stop_file else 1
    train(callbacks, steps=args.steps, epochs=epochs, shape="tuple5", faults=faults)
    print(f"trained to step {callbacks[0].progress.step}", flush=True)


if __name__ == "__main__":
    main()
