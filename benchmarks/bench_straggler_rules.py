"""The PromQL cost of the straggler rules (collector-config/rules/mindformers-straggler-rules.yaml)
on a real Prometheus holding generated series for a large job.

    .venv/bin/python benchmarks/bench_straggler_rules.py              # 4,096 ranks
    .venv/bin/python benchmarks/bench_straggler_rules.py --ranks 512 --repeat 9

What it does:
1. writes OpenMetrics text for `--ranks` ranks of one job as the `prometheus` output names
   them: `mindformers_rank_section_time_seconds_total` (data_wait and in_step) and
   `mindformers_rank_section_steps_total`, every 15 s over the last 10 minutes, plus the
   recorded `...in_step_seconds_per_step:mean5m` every 30 s over the last 65 minutes (what the
   individual score reads over an hour); one rank waits for its data, one slowed down;
2. turns it into TSDB blocks with `promtool tsdb create-blocks-from openmetrics`;
3. starts Prometheus on those blocks (127.0.0.1, an ephemeral port) with the shipped rule
   file evaluated every 5 s, and reads each rule's own `evaluationTime` from /api/v1/rules
   over `--repeat` evaluations (median and maximum, ms), with the series each one returns.

Prometheus is the Debian package's (`apt-get install prometheus`); this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "collector-config" / "rules" / "mindformers-straggler-rules.yaml"
JOB = "bench-llama"
RAW_SECONDS, RAW_STEP = 600, 15
HISTORY_SECONDS, HISTORY_STEP = 3900, 30
STEPS_PER_SECOND = 5.0


def write_openmetrics(path: Path, ranks: int, end: int) -> int:
    """The generated series; returns the number of samples."""
    samples = 0
    recorded = "job_training_rank:mindformers_rank_in_step_seconds_per_step:mean5m"
    with path.open("w") as out:
        out.write("# TYPE mindformers_rank_section_time_seconds counter\n")
        for rank in range(ranks):
            data_share = 0.5 if rank == 3 else 0.01
            labels = f'job="{JOB}",instance="node-{rank // 8}:{9464 + rank % 8}",training_rank="{rank}"'
            for section, share in (("data_wait", data_share), ("in_step", 1.0 - data_share)):
                for t in range(end - RAW_SECONDS, end + 1, RAW_STEP):
                    value = (t - end + RAW_SECONDS) * share
                    out.write(
                        f'mindformers_rank_section_time_seconds_total{{{labels},training_section="{section}"}} {value:.3f} {t}\n'
                    )
                    samples += 1
        out.write("# TYPE mindformers_rank_section_steps counter\n")
        for rank in range(ranks):
            labels = f'job="{JOB}",instance="node-{rank // 8}:{9464 + rank % 8}",training_rank="{rank}"'
            for t in range(end - RAW_SECONDS, end + 1, RAW_STEP):
                out.write(
                    f"mindformers_rank_section_steps_total{{{labels}}} {(t - end + RAW_SECONDS) * STEPS_PER_SECOND:.0f} {t}\n"
                )
                samples += 1
        out.write(f"# TYPE {recorded} gauge\n")
        for rank in range(ranks):
            for t in range(end - HISTORY_SECONDS, end + 1, HISTORY_STEP):
                slowed = rank == 5 and t > end - 900
                value = 0.396 if slowed else 0.198
                out.write(f'{recorded}{{job="{JOB}",training_rank="{rank}"}} {value} {t}\n')
                samples += 1
        out.write("# EOF\n")
    return samples


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=120) as response:
        return json.load(response)["data"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for tool in ("promtool", "prometheus"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (apt-get install -y prometheus)")
    end = int(time.time()) - 30  # rules evaluate at now: the series end just before
    with tempfile.TemporaryDirectory(prefix="bench-straggler-") as tmp:
        work = Path(tmp)
        text = work / "series.om"
        started = time.perf_counter()
        samples = write_openmetrics(text, args.ranks, end)
        print(f"{args.ranks} ranks: {samples:,} samples, {text.stat().st_size / 1e6:.0f} MB of OpenMetrics "
              f"({time.perf_counter() - started:.1f} s)")  # fmt: skip
        data = work / "data"
        started = time.perf_counter()
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(text), str(data)],
            check=True, capture_output=True,
        )  # fmt: skip
        print(f"blocks written in {time.perf_counter() - started:.1f} s")
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"evaluation_interval": "5s"}, "rule_files": [str(RULES)]}))
        address = f"127.0.0.1:{free_port()}"
        log = (work / "prometheus.log").open("wb")
        server = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}", f"--web.listen-address={address}",
             "--storage.tsdb.retention.time=100y"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://{address}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("Prometheus did not become ready")
                time.sleep(0.5)
            timings: dict[str, list[float]] = {}
            returned: dict[str, int] = {}
            group_times: list[float] = []
            seen: set[str] = set()
            while min((len(t) for t in timings.values()), default=0) < args.repeat:
                for group in get(f"{url}/api/v1/rules")["groups"]:
                    stamp = group["lastEvaluation"]
                    if stamp in seen or stamp.startswith("0001"):
                        continue
                    seen.add(stamp)
                    group_times.append(group["evaluationTime"] * 1000)
                    for rule in group["rules"]:
                        timings.setdefault(rule["name"], []).append(rule["evaluationTime"] * 1000)
                time.sleep(1.0)
            for name in timings:
                selector = name if ":" in name else f'ALERTS{{alertname="{name}"}}'
                returned[name] = len(get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': selector})}")["result"])
            print("\n| rule | series | median ms | max ms |\n|---|---:|---:|---:|")
            for name, values in timings.items():
                print(f"| `{name}` | {returned[name]:,} | {statistics.median(values):.1f} | {max(values):.1f} |")
            print(
                f"\nper evaluation, both groups: {sum(group_times) / len(group_times) * 2:.0f} ms (mean group time x 2)"
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
            log.close()


if __name__ == "__main__":
    main()
