"""The run API under msrun: a real 2-rank data-parallel PyNative custom loop on CPU
(`init()`, MindSpore's data-parallel context, `nn.DistributedGradReducer`;
tests/support/custom_loop_msrun_worker.py), one job read back by `report` and `hang-report`
as a user would:

- rank 0's data source sleeps: `report` names rank 0 and data wait (the other rank waits for
  it inside its step, in the all-reduce);
- rank 1 is a silent rank (`report_ranks: [0]`) whose batch of step 25 has a NaN label: with
  `nonfinite_check: all_ranks` rank 1 is the first bad rank at step 25, though rank 0 goes
  NaN too one step later (the averaged gradients carry it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from otel_mindformers.names import straggler_names as names
from tests.support.cli import cli_output
from tests.support.instrumented import BIN, REPO, child_env, free_port

# msrun_api: MindSpore's data-parallel context and DistributedGradReducer in a custom loop
pytestmark = [
    pytest.mark.slow, pytest.mark.integration, pytest.mark.mindspore_api, pytest.mark.msrun_job, pytest.mark.msrun_api,
]  # fmt: skip

STEPS, INTERVAL = 40, 5
SLOW_RANK, SLEEP_PER_SAMPLE = 0, 0.03  # 0.12 s a batch of 4: well over a step's compute here
NAN_RANK, NAN_AT = 1, 25  # a sampled step


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """The job's output folder, once both ranks finished."""
    workdir = tmp_path_factory.mktemp("custom_loop_msrun")
    output = workdir / "output"
    config = workdir / "monitor.yaml"
    monitor = {
        "interval": INTERVAL,
        "output_type": ["json_file"],
        "json_log_path": str(output / "train_metric.json"),
        "report_ranks": [0],
        "nonfinite_check": "all_ranks",
    }
    config.write_text(yaml.safe_dump({"monitor_config": monitor}))
    command = [
        str(BIN / "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}", "--join=True",
        f"--log_dir={workdir / 'msrun_log'}", str(REPO / "tests" / "support" / "custom_loop_msrun_worker.py"),
        str(config), str(STEPS), "--slow-rank", str(SLOW_RANK), "--sleep", str(SLEEP_PER_SAMPLE),
        "--nan-rank", str(NAN_RANK), "--nan-at", str(NAN_AT),
    ]  # fmt: skip
    done = subprocess.run(command, env=child_env(), cwd=workdir, capture_output=True, text=True, timeout=600)
    logs = "\n".join(path.read_text()[-3000:] for path in sorted((workdir / "msrun_log").glob("worker_*.log")))
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{logs}"
    return output


def _lines(output: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (output / f"train_metric_rank_{rank}.json").read_text().splitlines()]


def test_both_ranks_log_their_sampled_steps_with_sections(job):
    sampled = [1, *range(INTERVAL, STEPS + 1, INTERVAL)]
    for rank in (0, 1):
        lines = _lines(job, rank)
        assert [line["step"] for line in lines] == sampled
        assert all("sections" in line for line in lines[1:])  # a window ends at every sample after the first
    assert all("loss" not in line for line in _lines(job, NAN_RANK))  # the silent rank reports no values


def test_report_names_the_rank_whose_data_is_slow_and_data_wait(job):
    report = json.loads(cli_output("report", str(job), "--json"))
    verdict = report["bottleneck"]
    top = verdict["bottleneck"]
    assert (top["rank"], top["section"]) == (SLOW_RANK, names.SECTION_DATA_WAIT), verdict
    # The other rank's wait for the slow one is in its step, not a data wait of its own (on a
    # loaded CI host it may lose time in another section: its largest loss is listed too).
    over = [
        (loss["rank"], loss["section"]) for loss in verdict["losses"] if loss["share_of_job"] > verdict["threshold"]
    ]
    assert [rank for rank, section in over if section == names.SECTION_DATA_WAIT] == [SLOW_RANK], verdict
    text = cli_output("report", str(job))
    assert f"bottleneck: rank {SLOW_RANK}, data_wait" in text, text


def test_the_rank_with_the_nan_is_the_first_bad_rank_at_its_step(job):
    text = cli_output("report", str(job))
    (finding,) = [line.strip() for line in text.splitlines() if "first non-finite" in line]
    assert finding.startswith(f"first non-finite value at step {NAN_AT}: rank {NAN_RANK} (loss, grad_norm)"), finding
    hang = json.loads(cli_output("hang-report", str(job), "--format", "json"))
    assert hang["first_nonfinite"]["step"] == NAN_AT
    assert [r["rank"] for r in hang["first_nonfinite"]["ranks"]] == [NAN_RANK]
    # Rank 0 went non-finite after rank 1, from the averaged gradients: named, but not first.
    assert f"rank 0: non-finite values at steps {NAN_AT + INTERVAL}," in text, text
