"""`otel-mindformers report --html` on a large job: size, build time, time to open.

    .venv/bin/python benchmarks/bench_html_report.py [RANKS] [STEPS] [INTERVAL]   # defaults: 64 10000 10

Writes, in a temporary folder, the logs and ledgers a RANKS-rank, STEPS-step job leaves
(every rank logs every INTERVAL-th step, as `report_ranks: all` with `device_monitor: true`
does: training values, step time, throughput, MFU, NPU readings, `time`, `sections` and
`job`; rank 17's data turns slow at 40 % of the run; attempt 1 crashes at 62 % and attempt 2
resumes from the checkpoint before it). Then it builds the page with the command in a fresh
process and opens it in headless Chromium, and prints:

- the page's size (budget 5 MB) and the command's wall time, the fastest of three builds
  (budget 10 s), with each build's CPU time and the load average;
- the time to open: navigation start to the load event with style and layout done, as the
  page measures it (`data-open-ms`, budget 3 s), and Chromium's wall time for the page
  beside its wall time for an empty page.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from otel_mindformers.restarts.ledger_file import ledger_path, new_ledger, write_ledger  # noqa: E402

START = 1_796_000_000.0
JOB = "bench-job-1"
SLOW_RANK = 17
BUDGET_MB, BUDGET_BUILD_S, BUDGET_OPEN_S = 5.0, 10.0, 3.0
BUILDS = 3  # the fastest counts: the development machine is shared


def _sampled(first: int, last: int, interval: int) -> list[int]:
    steps = sorted({first, *range((first // interval + 1) * interval, last + 1, interval), last})
    return [s for s in steps if first <= s <= last]


def _write_logs(folder: Path, ranks: int, steps: int, interval: int) -> None:
    """One attempt crashed at 62 % of the steps, one resumed from the checkpoint before."""
    crash = int(steps * 0.62)
    resume = crash - crash % 500
    slow_from = int(steps * 0.4)
    attempts = [(1, 1, crash, START), (2, resume + 1, steps, START + crash * 0.21 + 240.0)]
    for rank in range(ranks):
        rng = random.Random(rank)
        lines = []
        for attempt, first, last, begin in attempts:
            wall = 30.0
            previous = first - 1
            for step in _sampled(first, last, interval):
                window = step - previous
                slow = rank == SLOW_RANK and step >= slow_from
                in_step = 0.18 * window * (1 + rng.random() * 0.05)
                data_wait = (0.09 if slow else 0.002) * window
                checkpoint = 1.5 if step % 500 == 0 else 0.0
                step_ms = (in_step + data_wait) / window * 1000 * (12 if step == first else 1)
                wall += in_step + data_wait + checkpoint
                loss = 9.0 * math.exp(-step / 2500) + 1.2 + rng.random() * 0.05
                line = {
                    "time_stamp": begin + 30.0 + (step - first) * 0.21,
                    "step": step,
                    "epoch": 1 + step // 1000,
                    "rank": rank,
                    "world_size": ranks,
                    "loss": loss,
                    "learning_rate": 3e-4 * min(1.0, step / 500) * (0.5 + 0.5 * math.cos(math.pi * step / steps)),
                    "grad_norm": 1.0 + rng.random() * 0.3 + (8.0 if step == 3000 else 0.0),
                    "train_per_step_time": step_ms,
                    "overflow": step == 3000,
                    "samples_per_second": 8 / (step_ms / 1000),
                    "tokens_per_second": 8 * 4096 / (step_ms / 1000),
                    "goodput": 0.8,
                    "mfu": 0.41 * 180 / max(step_ms, 1),
                    "npu_utilization": 88.0 + rng.random() * 6 - (30 if slow else 0),
                    "npu_hbm_used_mb": 52000 + rng.random() * 500,
                    "npu_temperature_c": 55 + rng.random() * 4,
                    "npu_power_w": 310 + rng.random() * 20,
                    "time": {"wall": wall, "productive": wall - 30.0 - data_wait, "startup": 28.0, "compile": 2.0},
                    "sections": {
                        "data_wait": data_wait,
                        "in_step": in_step,
                        **({"checkpoint": checkpoint} if checkpoint else {}),
                        "window": in_step + data_wait + checkpoint,
                        "steps": float(window),
                    },
                    "job": {"id": JOB, "attempt": attempt, "goodput": 0.8},
                }
                if step == 3000:
                    line["alerts"] = ["grad_norm_spike"]
                lines.append(json.dumps(line))
                previous = step
        log = folder / f"train_metric_rank_{rank}.json"
        log.write_text("\n".join(lines) + "\n")
        _write_ledger(log.with_name("train_metric.json"), rank, attempts, crash, resume)


def _write_ledger(json_log: Path, rank: int, attempts, crash: int, resume: int) -> None:
    ledger = new_ledger(JOB)
    for attempt, first, last, begin in attempts:
        end = begin + 30.0 + (last - first) * 0.21
        ledger["attempts"].append(
            {
                "attempt_id": f"a{attempt}r{rank}",
                "pid": 1000 + rank,
                "host": f"node{rank // 8}",
                "rank": rank,
                "process_start": begin,
                "train_begin": begin + 28.0,
                "resume_step": first - 1,
                "last_step": last,
                "last_step_time": end,
                "last_heartbeat": end,
                "durable_step": resume if attempt == 1 else last,
                "durable_time": end,
                "checkpoint_save_seconds": 1.5 * (last - first) / 500,
                "checkpoint_load_seconds": 0 if attempt == 1 else 4.0,
                "data_wait_seconds": 0.09 * (last - first) if rank == SLOW_RANK else 0.002 * (last - first),
                "heartbeat_interval": 10.0,
                "outcome": "crashed" if attempt == 1 else "completed",
                "attempt": attempt,
                "first_step_begin": begin + 30.0,
                "first_step_end": begin + 32.0,
                "data_wait_step": last,
                "reason": f"RuntimeError: HCCL timeout at step {crash}" if attempt == 1 else None,
                "end": end,
            }
        )
    write_ledger(ledger_path(str(json_log), rank), ledger)


def _build(folder: Path, page: Path) -> tuple[float, float]:
    """The command in a fresh process: its wall seconds and its CPU seconds (user + system;
    on a shared machine the wall time grows with the others' load, the CPU time much less)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "otel_mindformers.cli", "report", str(folder), "--html", str(page)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    built = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert built.returncode == 0, built.stderr[-3000:]
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _open(browser: str, page: Path) -> tuple[float, str]:
    """Chromium's wall seconds for loading `page` and dumping its DOM, and the DOM."""
    command = [browser, "--headless=new", "--disable-gpu", "--no-sandbox", "--dump-dom", page.as_uri()]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return time.perf_counter() - began, done.stdout


def main() -> int:
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    interval = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    with tempfile.TemporaryDirectory(prefix="bench-html-") as temp:
        folder = Path(temp) / "output"
        folder.mkdir()
        began = time.perf_counter()
        _write_logs(folder, ranks, steps, interval)
        logs_mb = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        print(
            f"logs: {ranks} ranks x {steps} steps, every {interval}th logged: {logs_mb:.0f} MB written in {time.perf_counter() - began:.1f} s"
        )
        page = Path(temp) / "run.html"
        builds = [_build(folder, page) for _ in range(BUILDS)]
        build_s = min(wall for wall, _ in builds)
        size_mb = page.stat().st_size / 1e6
        each = ", ".join(f"{wall:.1f} s ({cpu:.1f} s CPU)" for wall, cpu in builds)
        print(
            f"page: {size_mb:.2f} MB (budget {BUDGET_MB} MB), built in {build_s:.1f} s, the fastest of {BUILDS} "
            f"(budget {BUDGET_BUILD_S} s): {each}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        )
        ok = size_mb <= BUDGET_MB and build_s <= BUDGET_BUILD_S
        browser = _chromium()
        if browser is None:
            print("open: no chromium on PATH, not measured")
            return 0 if ok else 1
        blank = Path(temp) / "blank.html"
        blank.write_text("<!DOCTYPE html><title>blank</title>")
        runs = [(_open(browser, blank)[0], *_open(browser, page)) for _ in range(3)]
        opened = [float(m[1]) for _, _, dom in runs if (m := re.search(r'data-open-ms="([\d.]+)"', dom))]
        errors = [re.search(r'<pre id="page-errors"[^>]*>([^<]*)</pre>', dom) for _, _, dom in runs]
        assert opened and all(e is not None and not e[1] for e in errors), "the page did not open cleanly"
        open_s = max(opened) / 1000
        walls = ", ".join(f"{page_s:.2f} s (empty page {blank_s:.2f} s)" for blank_s, page_s, _ in runs)
        print(
            f"open: {open_s:.2f} s to the load event with layout, slowest of 3 (budget {BUDGET_OPEN_S} s); chromium wall: {walls}"
        )
        ok = ok and open_s <= BUDGET_OPEN_S
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
