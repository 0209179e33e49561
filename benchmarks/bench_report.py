"""`otel-mindformers report` at scale: many files, one large file.

    .venv/bin/python benchmarks/bench_report.py [FILES] [MEGABYTES]   # defaults: 10000 200

Writes, in a temporary folder, FILES per-rank logs of 5 lines each and one JSON-lines log
of about MEGABYTES, then runs `otel-mindformers report` on each in a fresh process and
prints its wall time and peak memory (ru_maxrss of the child).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _line(step: int, rank: int) -> str:
    return (
        json.dumps(
            {
                "time_stamp": 1.7e9 + step,
                "step": step,
                "epoch": 1,
                "rank": rank,
                "loss": 2.0 / step,
                "learning_rate": 1e-4,
                "grad_norm": 1.5,
                "train_per_step_time": 100.0 + step % 7,
            }
        )
        + "\n"
    )


def _many_files(folder: Path, count: int) -> Path:
    logs = folder / "many"
    logs.mkdir()
    for rank in range(count):
        (logs / f"train_metric_rank_{rank}.json").write_text("".join(_line(s, rank) for s in range(1, 51, 10)))
    return logs


def _large_file(folder: Path, megabytes: int) -> Path:
    path = folder / "large.json"
    with path.open("w") as handle:
        step = 0
        while handle.tell() < megabytes * 2**20:
            step += 1
            handle.write(_line(step, 0))
    return path


def _measure(target: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of a `report` of `target` in a fresh process."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "otel_mindformers.cli", "report", str(target)],
        cwd=os.environ.get("BENCH_CWD", REPO),
        stdout=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"report of {target} failed")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    files = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    megabytes = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if files:
            seconds, peak = _measure(_many_files(folder, files))
            print(f"report of {files} files: {seconds:.1f} s, peak {peak:.0f} MiB")
        if megabytes:
            seconds, peak = _measure(_large_file(folder, megabytes))
            print(f"report of a {megabytes} MB log: {seconds:.1f} s, peak {peak:.0f} MiB")


if __name__ == "__main__":
    main()
