"""A training run in a child process, for captures that must fail there: a capture path
the process may not write (root's overrides dropped, tests/support/permissions.py), or a
MindSpore without the profiler's `profile` API (`--no-profiler`).

    python capture_train.py CONFIG_JSON [--no-profiler] [--spike-at STEP]

Prints one JSON line last: the rules that fired (from the JSON log), the number of lines,
and every warning otel_mindformers logged.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--no-profiler", action="store_true")
    parser.add_argument("--spike-at", type=int, default=15)
    args = parser.parse_args()
    if args.no_profiler:
        # MindSpore itself imports mindspore.profiler (model.train does), so the package
        # stays; what goes is the step-scheduled API, as in a MindSpore that predates it.
        import mindspore.profiler

        for name in ("profile", "schedule", "tensorboard_trace_handler"):
            delattr(mindspore.profiler, name)
    warnings = Warnings()
    logging.getLogger("otel_mindformers").addHandler(warnings)

    from otel_mindformers import MonitorCallback
    from tests.support.training import Faults, train

    config = json.loads(Path(args.config).read_text())
    callback = MonitorCallback(config)
    train([callback], steps=30, faults=Faults(spike_at={args.spike_at: 6.0}), lr=0.003)
    lines = [json.loads(line) for line in Path(config["json_log_path"]).read_text().splitlines()]
    fired = [(line["step"], rule) for line in lines for rule in line.get("alerts", [])]
    print(json.dumps({"lines": len(lines), "fired": fired, "warnings": warnings.messages}))


if __name__ == "__main__":
    main()
