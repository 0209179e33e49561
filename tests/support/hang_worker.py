"""One rank of the hang test, started by msrun: trains on its own (no collective, so the
other rank runs ahead) with a MonitorCallback; rank `--block-rank` blocks in its data at
step `--block-at` until the test opens the FIFO `--release` for writing. With FAULT_LOG_DIR
set, a fatal signal leaves every thread's Python stack there (tests/support/fault_log.py)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import fault_log  # noqa: E402

fault_log.enable()  # before MindSpore registers its exit handlers: the log's mark comes after them

from mindspore.communication import get_rank, init  # noqa: E402

from otel_mindformers import MonitorCallback  # noqa: E402
from tests.support.blocking_data import train_blocking, use_cpu  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--block-rank", type=int, required=True)
    parser.add_argument("--block-at", type=int, required=True)
    parser.add_argument("--release", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    use_cpu()
    init()
    rank = get_rank()

    def release() -> None:
        with open(args.release) as fifo:  # blocks until the test opens it for writing
            fifo.read()

    callback = MonitorCallback(
        {
            "interval": 1,
            "grad_monitor": False,
            "output_type": ["json_file"],
            "json_log_path": str(Path(args.output) / "train_metric.json"),
            "report_ranks": "all",
            # The blocked rank's watchdog fires at 1 s; the other rank's never in the test (a
            # loaded host can hold one of its steps past a second: a dump it was not to have).
            "alert_config": {"enable_alert": True, "stall_timeout": 1.0 if rank == args.block_rank else 600.0},
        }
    )
    block_at = args.block_at if rank == args.block_rank else None
    train_blocking([callback], steps=args.steps, block_at_step=block_at, release=release)


if __name__ == "__main__":
    main()
