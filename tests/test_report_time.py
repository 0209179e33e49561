"""`otel-mindformers report`'s goodput by phase per rank, on what a real two-rank training
wrote: each rank loads a checkpoint, waits for a sleeping dataset, evaluates and saves
checkpoints (tests/support/timed_fit.py); the report is read back through the CLI and its
seconds compared with the ranks' own clocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_mindformers.names import training as tm
from tests.support.cli import cli_output
from tests.support.paths import pythonpath_with_repo

pytestmark = pytest.mark.slow  # two real trainings in child processes

# Seconds each rank's dataset sleeps before a batch: longer than a step here, so the steps wait.
SLEEPS = {0: 0.15, 1: 0.5}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """Both ranks trained at once: (folder of the JSON logs, each rank's own measurements)."""
    import mindspore as ms

    from tests.support.timed_fit import build_net

    root = tmp_path_factory.mktemp("job")
    checkpoint = root / "init.ckpt"
    ms.save_checkpoint(build_net(), str(checkpoint))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = pythonpath_with_repo(env.get("PYTHONPATH"))
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    children = {}
    for rank, sleep in SLEEPS.items():
        folder = root / f"rank{rank}"
        folder.mkdir()
        argv = [
            sys.executable,
            "-m",
            "tests.support.timed_fit",
            "--checkpoint",
            str(checkpoint),
            "--json-log",
            str(root / "logs" / "m.json"),
            "--measured",
            str(folder / "measured.json"),
            "--sleep",
            str(sleep),
            "--save-dir",
            str(folder / "ckpt"),
        ]
        children[rank] = subprocess.Popen(
            argv,
            cwd=folder,
            env={**env, "RANK_ID": str(rank), "RANK_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for child in children.values():
        output, _ = child.communicate(timeout=600)
        assert child.returncode == 0, output[-3000:]
    measured = {rank: json.loads((root / f"rank{rank}" / "measured.json").read_text()) for rank in SLEEPS}
    return root / "logs", measured


def _last_line(logs: Path, rank: int) -> dict:
    return json.loads((logs / f"m_rank_{rank}.json").read_text().splitlines()[-1])


def test_report_json_gives_each_rank_its_seconds_by_phase_as_its_own_clocks_measured(job):
    logs, measured = job
    report = json.loads(cli_output("report", str(logs), "--format", "json"))
    by_label = {series["label"]: series["time"] for series in report["series"]}
    assert set(by_label) == {"rank 0", "rank 1"}
    for rank, own in measured.items():
        time, last = by_label[f"rank {rank}"], _last_line(logs, rank)
        lost = time["lost_s"]
        assert time["wall_s"] == pytest.approx(last["time"]["wall"])
        assert time["goodput"] == pytest.approx(last["time"]["productive"] / last["time"]["wall"])
        if tm.GOODPUT in last:  # the gauge's value where the rank reports it (report_ranks)
            assert time["goodput"] == pytest.approx(last[tm.GOODPUT], abs=1e-3)
        # The last line is written at the last step: before the last evaluation and the save
        # at train end, so those are not in it.
        load_begin, load_end = own["load"]
        assert lost["checkpoint.load"] == pytest.approx(load_end - load_begin, abs=0.02)
        (first_evaluation, _second) = own["evaluations"]
        assert lost["evaluation"] == pytest.approx(first_evaluation[1] - first_evaluation[0], abs=0.02)
        saved = [end - begin for begin, end, _path in own["saves"] if end <= own["last_end_wall"]]
        assert len(saved) >= 4 and lost["checkpoint.save"] == pytest.approx(sum(saved), abs=0.01 * len(saved))
        # Data wait: the gaps between steps (the first step's wait is start-up), less the
        # evaluation that ran in the gap between the epochs.
        gaps = sum(begin - end for begin, end in zip(own["begins"][1:], own["ends"]))
        evaluation = first_evaluation[1] - first_evaluation[0]
        assert lost.get("data_wait", 0.0) == pytest.approx(gaps - evaluation, abs=0.01 * len(own["begins"]))
        assert lost["startup"] > 0 and "other" not in lost
        assert time["productive_s"] == pytest.approx(time["wall_s"] - sum(lost.values()), abs=1e-6)
    # The rank whose data pipeline is slower lost more to it.
    assert by_label["rank 1"]["lost_s"]["data_wait"] > by_label["rank 0"]["lost_s"].get("data_wait", 0.0)


def _seconds(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


def _cell(seconds: float, wall: float) -> str:
    return f"{_seconds(seconds)} ({seconds / wall:.1%})"


def test_report_text_and_markdown_tables_say_which_rank_lost_how_much_to_what(job):
    logs, _ = job
    report = json.loads(cli_output("report", str(logs), "--format", "json"))
    text, markdown = cli_output("report", str(logs)), cli_output("report", str(logs), "--format", "markdown")
    title = "Where the time went per series (seconds lost by phase, share of wall time)"
    text_rows = text.split(title)[1].splitlines()
    header = text_rows[1].split()
    assert header[:5] == ["series", "wall", "s", "own", "goodput"]
    assert {"startup", "checkpoint.load", "data_wait", "evaluation", "checkpoint.save"} <= set(header[5:])
    assert "own goodput: each series' time in its steps over its own wall time" in text
    worst = max(
        (seconds, series["label"], phase)
        for series in report["series"]
        for phase, seconds in series["time"]["lost_s"].items()
    )
    for series in report["series"]:
        time = series["time"]
        (text_row,) = [row for row in text_rows if row.strip().startswith(series["label"] + " ")]
        (md_row,) = [
            row for row in markdown.splitlines() if row.startswith(f"| {series['label']} | {time['wall_s']:.1f} |")
        ]
        for phase, seconds in time["lost_s"].items():
            assert _cell(seconds, time["wall_s"]) in text_row and _cell(seconds, time["wall_s"]) in md_row, phase
        assert f"{time['goodput']:.3f}" in text_row
    seconds, label, phase = worst
    assert f"largest loss: {label}, {_seconds(seconds)} to {phase}" in text
    assert f"## {title}" in markdown and f"largest loss: {label}" in markdown


def test_a_log_two_runs_wrote_adds_up_both_runs(job, tmp_path):
    """A restarted run appending to the same log starts a new ledger: both runs count."""
    logs, _ = job
    lines = (logs / "m_rank_1.json").read_text()
    twice = tmp_path / "m_rank_1.json"
    twice.write_text(lines + lines)
    (once,) = json.loads(cli_output("report", str(logs / "m_rank_1.json"), "--format", "json"))["series"]
    (both,) = json.loads(cli_output("report", str(twice), "--format", "json"))["series"]
    assert both["time"]["wall_s"] == pytest.approx(2 * once["time"]["wall_s"])
    for phase, seconds in once["time"]["lost_s"].items():
        assert both["time"]["lost_s"][phase] == pytest.approx(2 * seconds)
    assert both["time"]["goodput"] == pytest.approx(once["time"]["goodput"])
