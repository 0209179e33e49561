"""A training script run under `opentelemetry-instrument` by tests/test_correlation_e2e.py.

It knows nothing of monitoring beyond `otel_mindformers.phase` and `trace_environment`: it
logs through its own logger and MindFormers' as each step begins, and at step `--upload-at`
it "uploads" inside `phase("upload")`: a span of its own, an HTTP call to `--url` (the
requests instrumentation makes the client span), and two child processes that print the
TRACEPARENT they see (one started plainly, one with `trace_environment()`).

Usage: correlated_train.py --steps N --upload-at K --url http://127.0.0.1:PORT/
"""

import argparse
import logging
import os
import subprocess
import sys

import requests
from mindformers.tools.logger import logger as mindformers_logger
from mindspore.train import Callback
from opentelemetry import trace

import otel_mindformers
from tests.support.training import train

script_logger = logging.getLogger("train_script")
PRINT_TRACEPARENT = [sys.executable, "-c", "import os; print(os.environ.get('TRACEPARENT'))"]


class ScriptCallback(Callback):
    def __init__(self, upload_at: int, url: str) -> None:
        self.upload_at, self.url = upload_at, url

    def on_train_step_begin(self, run_context):
        step = run_context.original_args()["cur_step_num"]
        script_logger.warning("script: step %d begins", step, extra={"test_step": step})
        mindformers_logger.info("mindformers: step %d begins", step, extra={"test_step": step})
        if step == self.upload_at:
            self.upload()

    def upload(self):
        with otel_mindformers.phase("upload", bytes=1024):
            with trace.get_tracer("train_script").start_as_current_span("user.upload.part"):
                pass
            requests.get(self.url, timeout=10).raise_for_status()
            script_logger.warning("script: uploaded", extra={"test_step": -1})
            plain = subprocess.run(PRINT_TRACEPARENT, capture_output=True, text=True, check=True)
            helped = subprocess.run(
                PRINT_TRACEPARENT,
                env={**os.environ, **otel_mindformers.trace_environment()},
                capture_output=True,
                text=True,
                check=True,
            )
        print(f"CHILD_TRACEPARENT plain={plain.stdout.strip()} helper={helped.stdout.strip()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--upload-at", type=int, required=True)
    parser.add_argument("--url", required=True)
    args = parser.parse_args()
    script_logger.setLevel(logging.INFO)
    train([ScriptCallback(args.upload_at, args.url)], steps=args.steps)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
