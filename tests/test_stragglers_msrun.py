"""Which rank holds the job back: real 2-rank msrun jobs, data-parallel Model.train on CPU.

Each job exports over OTLP to a test receiver and serves the `prometheus` output on one port
per rank, which a real Prometheus scrapes while evaluating the shipped straggler rules (their
windows shortened to the test's seconds, `for` dropped). The test waits for what it expects
(an alert, a signal, enough evaluations), then writes the step both ranks stop at.

- rank 1's dataset sleeps: the alert fires for rank 1 and data_wait, the in-process signal
  comes from rank 1 alone, and `report` names rank 1 and data_wait with the job's lost time
  within 20 % of what the sleeps explain;
- no slow rank: nothing fires, nothing is named;
- rank 1's forward pass sleeping 1 s a step from step 40: the individual score catches the
  rise (on rank 0 too, which waits for rank 1 in the all-reduce: host clocks cannot tell
  which one is slow, and the report says so).

What host clocks can promise in the healthy job on a shared host: no data signal, no
`MindformersRankHoldsJobBack`, no bottleneck. The machine's own load swings step times by
over 2x; when it does, both ranks' in-step times rise together, so an individual signal there
names every rank (a job-wide slowdown), never one.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

from otel_mindformers.names import straggler_names as names
from tests.support import prometheus as prom
from tests.support.instrumented import BIN, REPO, child_env, free_port
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.straggler_worker import BATCH

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.msrun_job]

RULES = REPO / "collector-config" / "rules" / "mindformers-straggler-rules.yaml"
JOB = "straggler-test"
SLEEP_PER_SAMPLE = 0.25  # rank 1's source: 1 s per batch of 4, well over a step's compute here
SLOW_STEP_AFTER = 40
ALERTS = ("MindformersRankHoldsJobBack", "MindformersRankStepTimeRose")
WAIT = 300.0


def rules_for_test(workdir: Path) -> Path:
    """The shipped straggler rules with the test's windows: 5m -> 30s, 1h -> 3m, no `for`."""
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
            rule["expr"] = re.sub(r"\[5m\]", "[30s]", rule["expr"])
            rule["expr"] = re.sub(r"\[1h\]", "[3m]", rule["expr"])
    path = workdir / "rules.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def wait_until(condition: Callable[[], object], what: str, job: subprocess.Popen, timeout: float = WAIT) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        assert job.poll() is None, f"the job exited ({job.returncode}) before {what}:\n{job.stdout.read()[-4000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


class Job:
    """One msrun job with its receiver and Prometheus; `stop()` ends it at a common step."""

    def __init__(self, workdir: Path, otlp: OtlpReceiver, server: prom.PrometheusServer, process, stop_file) -> None:
        self.workdir, self.otlp, self.prometheus, self.process, self._stop_file = (
            workdir, otlp, server, process, stop_file,
        )  # fmt: skip

    def wait(self, condition: Callable[[], object], what: str) -> object:
        return wait_until(condition, what, self.process)

    def firing(self) -> list[dict]:
        return [a for a in self.prometheus.alerts() if a["labels"]["alertname"] in ALERTS]

    def signals(self) -> set[tuple[int, str, str]]:
        """(rank, section, score) of the in-process signals the receiver got."""
        return {
            (p.attributes["training.rank"], p.attributes[names.ATTR_SECTION], p.attributes[names.ATTR_SCORE])
            for p in self.otlp.points(names.STRAGGLER_SIGNALS.name)
        }

    def step(self) -> int:
        result = self.prometheus.query("max(mindformers_progress_step)")
        return int(float(result[0]["value"][1])) if result else 0

    def stop(self) -> None:
        self._stop_file.write_text(str(self.step() + 10))
        output, _ = self.process.communicate(timeout=WAIT)
        assert self.process.returncode == 0, output[-4000:]

    def report(self) -> dict:
        command = [str(BIN / "otel-mindformers"), "report", str(self.workdir / "output"), "--json"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=child_env())
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def report_text(self) -> str:
        command = [str(BIN / "otel-mindformers"), "report", str(self.workdir / "output")]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=child_env()).stdout


def start_job(workdir: Path, otlp: OtlpReceiver, *worker_args: str):
    port = free_port()
    while free_port() == port + 1:  # rank 1 serves on port + 1 (local rank)
        port = free_port()
    config = workdir / "monitor.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "monitor_config": {
                    "interval": 5,
                    "output_type": ["json_file", "otlp", "prometheus"],
                    "json_log_path": str(workdir / "output" / "train_metric.json"),
                    "prometheus": {"host": "127.0.0.1", "port": port},
                    "service_name": JOB,
                }
            }
        )
    )
    stop_file = workdir / "stop_at"
    env = child_env(otlp, MSRUN_LOG_DIR=str(workdir / "msrun_log"))
    command = [
        str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}",
        "--join=True", f"--log_dir={workdir / 'msrun_log'}",
        str(REPO / "tests" / "support" / "straggler_worker.py"), str(config), str(stop_file), *worker_args,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return process, stop_file, [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]


def run_job(workdir: Path, *worker_args: str):
    """A context: the job running under a Prometheus that scrapes both ranks."""

    @contextmanager
    def running():
        workdir.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            otlp = stack.enter_context(OtlpReceiver())
            process, stop_file, targets = start_job(workdir, otlp, *worker_args)
            stack.callback(lambda: process.poll() is None and process.kill())
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules_for_test(workdir))],
                "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
            }
            server = stack.enter_context(prom.prometheus(config, workdir / "prometheus"))
            yield Job(workdir, otlp, server, process, stop_file)

    return running()


def test_the_rank_whose_data_is_slow_is_named_live_and_by_the_report(tmp_path):
    prom.require_binary(prom.PROMETHEUS)
    healthy_ms = _healthy_step_ms(tmp_path / "healthy")
    with run_job(tmp_path / "slow", "--slow-rank", "1", "--sleep", str(SLEEP_PER_SAMPLE)) as job:
        firing = job.wait(lambda: [a for a in job.firing() if a["state"] == "firing"], "alert firing for the slow rank")
        job.wait(lambda: job.signals(), "in-process signal")
        job.stop()
        # Live, in Prometheus: rank 1 and its data wait, nothing else.
        assert {
            (a["labels"]["alertname"], a["labels"]["training_rank"], a["labels"]["training_section"]) for a in firing
        } == {("MindformersRankHoldsJobBack", "1", "data_wait")}
        assert "Rank 1 holds straggler-test back: data wait" in firing[0]["annotations"]["summary"]
        # In process, over OTLP: the counter, the log record and the span event, from rank 1 alone.
        assert job.signals() == {(1, names.SECTION_DATA_WAIT, names.SCORE_RELATIVE)}
        logs = [log for log in job.otlp.logs() if names.ATTR_SECTION in log.attributes]
        assert logs and {(log.attributes["training.rank"], log.severity_text) for log in logs} == {(1, "WARN")}
        assert "rank 1 is input-bound" in logs[0].body and "it holds the job back" in logs[0].body
        events = [attrs for span in job.otlp.spans() for name, attrs in span.events if name == names.EVENT_STRAGGLER]
        assert events and {attrs["training.rank"] for attrs in events} == {1}
        report = job.report()
        text = job.report_text()
    print(f"the alert as it fired:\n{json.dumps(firing, indent=2)}\nthe report:\n{text}")  # for docs/stragglers.md (-s)
    verdict = report["bottleneck"]
    top = verdict["bottleneck"]
    assert (top["rank"], top["section"]) == (1, names.SECTION_DATA_WAIT)
    # One verdict in the JSON: the step times agree (the ranks move in step), the sections do not.
    assert report["holds_back"] == top["label"] and "stragglers" not in report and "slowest" not in report
    # Rank 0's wait for rank 1 is in its step, not a data wait of its own (on a loaded host it
    # may lose time in another section: its largest loss is listed too).
    over = [
        (loss["rank"], loss["section"]) for loss in verdict["losses"] if loss["share_of_job"] > verdict["threshold"]
    ]
    assert [rank for rank, section in over if section == names.SECTION_DATA_WAIT] == [1], verdict
    # The sleeps explain, per step, the batch's sleep less what rank 1's source slept while
    # rank 1 itself was inside its step (the prefetch overlaps the two).
    windows = [line["sections"] for line in _lines(tmp_path / "slow", 1) if "sections" in line]
    overlapped = sum(window[names.SECTION_IN_STEP] for window in windows)
    explained = sum(window["steps"] for window in windows) * BATCH * SLEEP_PER_SAMPLE - overlapped
    assert verdict["steps"] == sum(window["steps"] for window in windows)
    assert top["lost_s"] == pytest.approx(explained, rel=0.2), (top, explained)
    # Against the healthy job's pace (another run, so another load on this machine): the
    # same order, not 20 %.
    assert 0.5 < top["lost_s"] / (verdict["steps"] * (BATCH * SLEEP_PER_SAMPLE - healthy_ms / 1000)) < 2
    # The job's useful time is what the slow rank's steps took, not rank 0's waiting.
    assert verdict["job_goodput"] < 0.5
    # The job across restarts moves at rank 1's pace too: its ledger gives the job's totals,
    # with its wait for data as badput (rank 0's waiting for it was step time).
    job_totals = report["job"]["totals"]
    assert job_totals["rank"] == 1 and job_totals["seconds"]["data_wait"] > 0.5 * top["lost_s"]
    assert job_totals["goodput"] < verdict["job_goodput"]
    assert "no stragglers" not in text and "bottleneck: rank 1, data_wait" in text, text


def _lines(workdir: Path, rank: int) -> list[dict]:
    path = workdir / "output" / f"train_metric_rank_{rank}.json"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _all_or_none(ranks: set[int], what: str) -> None:
    """A healthy job's step-time rise, if the host's load makes one, is on every rank."""
    assert ranks in (set(), {0, 1}), f"{what} named {sorted(ranks)} alone in a healthy job"


_HEALTHY: dict[str, float] = {}


def _healthy_step_ms(workdir: Path) -> float:
    """The same job with no slow rank: nothing fires, nothing is named; its median step time."""
    if "ms" in _HEALTHY:
        return _HEALTHY["ms"]
    with run_job(workdir) as job:
        # 20 evaluations of both ranks' data-wait share in Prometheus, and 10 windows each.
        query = 'count_over_time(job_training_rank_training_section:mindformers_rank_section_time:share5m{training_section="data_wait"}[1m])'
        job.wait(
            lambda: len([r for r in job.prometheus.query(query) if float(r["value"][1]) >= 20]) == 2, "evaluations"
        )
        firing = job.firing()
        job.stop()
        signals = job.signals()  # once both ranks ended and flushed: a streak a window behind lands
        report = job.report()
    assert not [a for a in firing if a["labels"]["alertname"] == "MindformersRankHoldsJobBack"], firing
    assert {rank for rank, section, _ in signals if section == names.SECTION_DATA_WAIT} == set()
    _all_or_none({int(a["labels"]["training_rank"]) for a in firing}, "live individual score")
    _all_or_none({rank for rank, _, _ in signals}, "in-process individual signal")
    verdict = report["bottleneck"]
    # No rank waits for its data; a loaded host may make one lose time in another section.
    bottleneck = verdict["bottleneck"]
    assert bottleneck is None or bottleneck["section"] != names.SECTION_DATA_WAIT, verdict
    _all_or_none({rise["rank"] for rise in verdict["rises"]}, "report's rises")
    assert report["step_time_view"]["stragglers"] == []
    assert report["holds_back"] == (bottleneck["label"] if bottleneck else None), report["holds_back"]
    _HEALTHY["ms"] = report["median_step_time_ms"]
    return _HEALTHY["ms"]


def test_a_rank_whose_step_time_rises_is_caught_by_the_individual_score(tmp_path):
    prom.require_binary(prom.PROMETHEUS)
    with run_job(tmp_path, "--slow-step-rank", "1", "--slow-step-after", str(SLOW_STEP_AFTER)) as job:
        job.wait(lambda: (1, names.SECTION_IN_STEP, names.SCORE_INDIVIDUAL) in job.signals(), "individual signal")
        job.stop()
        report = job.report()
        text = job.report_text()
    assert not any(section == names.SECTION_DATA_WAIT for _, section, _ in job.signals())
    verdict = report["bottleneck"]
    assert verdict["bottleneck"] is None
    assert 1 in {rise["rank"] for rise in verdict["rises"]}
    assert "look alike from host clocks" in text and "npu-smi" in text, text
    assert "see below for the ranks whose step time rose" in text, text
