"""The README's first command, run as written: the article's example trains with monitoring on;
and docs/telemetry.md holds the name tables generated from the code."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.hidden import hiding
from tests.support.instrumented import run
from tests.support.paths import REPO

pytestmark = pytest.mark.mindspore_api


def readme_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_opens_with_the_demo_and_the_test_command():
    assert readme_commands() == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert (REPO / ".ci" / "run").read_text().strip().endswith("bash scripts/test.sh")


@pytest.mark.slow
def test_demo_command_trains_and_writes_every_local_output():
    output = REPO / "output"
    metric_file = output / "train_metric.json"
    if metric_file.exists():
        metric_file.unlink()  # the article's custom monitor appends: start from a clean file
    demo = subprocess.Popen(
        readme_commands()[0].split(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    stdout, stderr = demo.communicate(timeout=900)
    result = subprocess.CompletedProcess(demo.args, demo.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    # The training is the script's child, not the script exec'd into Python: an exec'd
    # process keeps the shell's start, and the installation would count as its start-up.
    attempt = json.loads((output / "train_metric.job.rank_0.ledger").read_text())["attempts"][-1]
    assert attempt["pid"] != demo.pid
    # The report's time table (each line's `time`) and the job's totals (the ledger) count
    # from one reading of the process's start, to the clock tick.
    last = [json.loads(line) for line in metric_file.read_text().splitlines() if "rank" in line][-1]
    assert last["time_stamp"] - last["time"]["wall"] == pytest.approx(attempt["process_start"], abs=0.02)
    ours = [line for line in result.stdout.splitlines() if line.startswith("[otel_mindformers]")]
    assert [int(re.search(r"step (\d+)", line).group(1)) for line in ours] == [1, 10, 20, 30, 40, 50, 60]
    assert f"JSON lines : {metric_file}" in result.stdout
    # The tiny LM's train cell returns its own grad norm, the one on every line: the optimizer's
    # probe, set aside, says nothing at the end about a norm it did not report.
    assert "grad_monitor" not in result.stderr, result.stderr[-3000:]

    records = [json.loads(line) for line in metric_file.read_text().splitlines()]
    builtin = [record for record in records if "rank" in record]
    custom = [record for record in records if "lr" in record]  # the article's custom monitor, every step
    assert [record["step"] for record in builtin] == [1, 10, 20, 30, 40, 50, 60]
    assert len(custom) == 60
    assert builtin[-1]["loss"] < builtin[0]["loss"] / 10, "the tiny LM learns its sequences"
    assert set(builtin[0]) >= {"loss", "learning_rate", "grad_norm", "train_per_step_time", "overflow"}
    assert any((output / "tensorboard_log" / "rank_0").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_demo_without_tensorboardx_warns_once_and_says_the_output_was_off(tmp_path):
    """A user who installed the package without its `tensorboard` extra runs the example as
    written: one warning names the extra, training completes, and the closing summary does not
    point at a TensorBoard folder that was never written."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([hiding(tmp_path / "shim", ["tensorboardX"]), str(REPO)]),
    }
    result = run([sys.executable, str(REPO / "examples" / "train_main.py")], env, tmp_path)
    warnings = [line for line in result.stderr.splitlines() if "tensorboard" in line.lower()]
    assert len(warnings) == 1 and "pip install 'otel-mindformers[tensorboard]'" in warnings[0], result.stderr
    assert "  TensorBoard: off, see the warning above" in result.stdout.splitlines(), result.stdout
    assert not (tmp_path / "output" / "tensorboard_log").exists()
    assert len([line for line in result.stdout.splitlines() if line.startswith("[otel_mindformers]")]) == 7


TELEMETRY_PAGE = REPO / "docs" / "telemetry.md"


def test_telemetry_page_names_every_metric_and_span_the_package_emits():
    from otel_mindformers.names import semconv

    text = TELEMETRY_PAGE.read_text(encoding="utf-8")
    names = [m.name for m in semconv.all_metrics()] + [
        semconv.SPAN_RUN,
        semconv.SPAN_EPOCH,
        semconv.SPAN_STEP,
        semconv.SPAN_JOB_STEP,
    ]
    missing = [name for name in names if f"`{name}`" not in text]
    assert not missing, f"docs/telemetry.md's name tables lack {missing}"


def test_telemetry_page_metric_tables_are_the_generated_ones():
    """docs/telemetry.md's two metric tables are `training_metrics.markdown_table()` and
    `semconv.markdown_table()`: a metric added without regenerating the page fails here."""
    from otel_mindformers.names import semconv
    from otel_mindformers.names import training as training_metrics

    text = TELEMETRY_PAGE.read_text(encoding="utf-8")
    assert training_metrics.markdown_table() in text
    assert semconv.markdown_table() in text
