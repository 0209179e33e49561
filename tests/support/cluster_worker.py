"""One training process for the MindCluster tests (tests/test_cluster_training.py): a real
MindSpore Model.train with MonitorCallback, paced so a test can act on ClusterD while it runs.

    python -m tests.support.cluster_worker CONFIG --stop-file F --pause-file P

Each step ends with a short sleep (the pace); while P exists the training waits at the end of
its step (a stalled rank, as a hung collective would make it); at the first step end after F
exists it stops. After training it prints the threads still alive, so a test can tell that
none of the package's is left behind.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

PACE = 0.05  # seconds added to each step
MAX_STEPS = 4000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config")
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--pause-file", required=True)
    args = parser.parse_args(argv)

    from mindspore.train import Callback

    from otel_mindformers.runtime.callback import MonitorCallback
    from tests.support.training import train

    class Paced(Callback):
        def on_train_step_end(self, run_context) -> None:
            time.sleep(PACE)
            while os.path.exists(args.pause_file):
                time.sleep(0.02)
            if os.path.exists(args.stop_file):
                run_context.request_stop()

    monitor = MonitorCallback(args.config)
    train([monitor, Paced()], steps=MAX_STEPS, shape="tuple5")
    print(f"trained to step {monitor.progress.step}", flush=True)
    print("threads after training: " + ", ".join(sorted(t.name for t in threading.enumerate())), flush=True)


if __name__ == "__main__":
    main()
