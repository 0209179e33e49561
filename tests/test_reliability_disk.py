"""Disk trouble under `json_file` and `tensorboard`: training continues, one warning names
the path, and every line already written stays a whole JSON object.

Three ways the disk fails mid-run, each in a real training subprocess:
- the file-size limit (RLIMIT_FSIZE, EFBIG) is hit: works anywhere, no privileges;
- a tiny tmpfs fills up (ENOSPC): needs permission to mount; skipped without it, a
  failure under CI=true;
- the log folder becomes unwritable while the JSON log rolls over (EACCES): root ignores
  file permissions, so a root test process runs the worker without that privilege.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.support.backends import unavailable
from tests.support.permissions import obey_file_permissions
from tests.support.reliability_worker import run, spawn
from tests.support.tensorboard_events import loss_steps
from tests.support.waiting import wait_until

STEPS = 60


def _spec(directory: Path, **extra) -> dict:
    return {
        "config": {
            "interval": 1,
            "output_type": ["json_file", "tensorboard"],
            "json_log_path": str(directory / "logs" / "train_metric.json"),
            "tensorboard_path": str(directory / "logs" / "tensorboard"),
        },
        "steps": STEPS,
        "graph": True,
        "report": str(directory / "report.json"),
        **extra,
    }


def _whole_lines(path: Path) -> list[dict]:
    """Every line of the file, parsed: a partial line fails the test."""
    text = path.read_text()
    assert text == "" or text.endswith("\n"), "the file ends in a partial line"
    return [json.loads(line) for line in text.splitlines()]


def _step_of(line: str) -> int | None:
    """The step of a whole JSON line; None for a line still being written."""
    try:
        return json.loads(line)["step"]
    except ValueError:
        return None


def _assert_survived(process, report, json_path: Path, at_least: int) -> list[str]:
    assert process.returncode == 0, process.stderr[-3000:]
    assert report["error"] is None
    assert len(report["hook_seconds"]["on_train_step_end"]) == STEPS, "training ran every step"
    lines = _whole_lines(json_path)
    steps = [line["step"] for line in lines]
    assert steps == list(range(1, len(steps) + 1)), "lines already written stay in order"
    # The writer thread runs behind the training thread, so the trouble that starts at step k
    # finds k lines or fewer on disk: the bound below is what was surely written before it.
    assert at_least <= len(steps) < STEPS, "the disk trouble stopped the log mid-run"
    return [line for line in process.stderr.splitlines() if line.startswith("otel_mindformers:")]


@pytest.mark.slow
def test_file_size_limit_mid_run(tmp_path):
    json_path = tmp_path / "logs" / "train_metric.json"
    spec = _spec(tmp_path, at={"20": [["fsize", 500]]})
    process, report = run(spec, tmp_path)
    warnings = _assert_survived(process, report, json_path, at_least=1)
    json_warnings = [w for w in warnings if "'json_file'" in w]
    assert len(json_warnings) == 1, warnings
    assert str(json_path) in json_warnings[0]
    logdir = tmp_path / "logs" / "tensorboard" / "rank_0"
    tensorboard_warnings = [w for w in warnings if "'tensorboard'" in w]
    assert len(tensorboard_warnings) == 1, warnings
    assert str(logdir) in tensorboard_warnings[0]
    steps = loss_steps(logdir)
    assert steps == list(range(1, len(steps) + 1)) and 0 < len(steps) < STEPS


def _tmpfs(tmp_path: Path, size: str):
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        # The file-size limit test above covers the same short writes without privileges.
        unavailable(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    yield from _tmpfs(tmp_path, "64k")


@pytest.fixture
def small_tmpfs(tmp_path):
    yield from _tmpfs(tmp_path, "4m")


@pytest.mark.slow
def test_disk_full_mid_run(tmp_path, tiny_tmpfs):
    json_path = tiny_tmpfs / "logs" / "train_metric.json"
    spec = _spec(tiny_tmpfs, report=str(tmp_path / "report.json"))
    json_path.parent.mkdir()
    # Leave room for about 25 lines and the TensorBoard file header, then the disk is full.
    filler = tiny_tmpfs / "filler"
    filler.write_bytes(b"\0" * (64 * 1024 - 12 * 1024))
    process, report = run(spec, tmp_path)
    warnings = _assert_survived(process, report, json_path, at_least=5)
    assert any(str(json_path) in w for w in warnings), warnings
    assert any("tensorboard" in w for w in warnings), warnings


@pytest.mark.slow
def test_disk_filling_up_under_the_flight_ring_mid_run(tmp_path, small_tmpfs):
    """The ring is written in place (flight_recorder/): a write into a block the file system
    does not have yet fails on a full disk. Its blocks are all there from the start, so the
    ring keeps every step and the training goes on to its end when the disk fills up under it."""
    json_path = small_tmpfs / "logs" / "train_metric.json"
    spec = _spec(small_tmpfs, report=str(tmp_path / "report.json"), at={"5": [["fill", str(small_tmpfs / "filler")]]})
    process, report = run(spec, tmp_path)
    assert list((small_tmpfs / "logs").glob("*.flight")), "the test needs a ring made before the disk filled"
    # The writer thread may not have written its first batch by step 5 (a loaded machine):
    # the log may hold no line at all; the ring holds every step either way.
    warnings = _assert_survived(process, report, json_path, at_least=0)
    assert any(str(json_path) in w for w in warnings), warnings


@pytest.mark.slow
def test_log_folder_unwritable_mid_run(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    marker, made_unwritable = tmp_path / "step-20", tmp_path / "unwritable"
    # The training waits at step 20 until the folder is unwritable: the steps after it meet it.
    spec = _spec(tmp_path, at={"20": [["touch", str(marker)], ["await", str(made_unwritable)]]})
    # A small rollover size makes the JSON log rename and open files as it goes.
    spec["config"] = {
        **spec["config"],
        "output_type": ["json_file"],
        "log_rotation": {"max_bytes": 2000, "backup_count": 50},
    }
    process = spawn(spec, tmp_path, preexec_fn=obey_file_permissions)

    def step_20_written() -> bool:  # the worker writes lines in batches, after the step
        try:
            lines = [line for path in logs.glob("train_metric.json*") for line in path.read_text().splitlines()]
        except FileNotFoundError:  # rotated between the listing and the read: look again
            return False
        return marker.exists() and any(_step_of(line) == 20 for line in lines)

    try:
        deadline = time.monotonic() + 120
        while not step_20_written() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        logs.chmod(0o555)
        made_unwritable.touch()
        _, stderr = process.communicate(timeout=240)
    finally:
        logs.chmod(0o755)
        if process.poll() is None:
            process.kill()
            process.communicate()
    report = json.loads(Path(spec["report"]).read_text())
    assert process.returncode == 0, stderr[-3000:]
    assert report["error"] is None
    assert len(report["hook_seconds"]["on_train_step_end"]) == STEPS, "training ran every step"
    lines = [line for path in logs.glob("train_metric.json*") for line in _whole_lines(path)]
    steps = sorted(line["step"] for line in lines)
    assert steps == list(range(1, len(steps) + 1)), "lines already written stay"
    assert 20 <= len(steps) < STEPS
    warnings = [line for line in stderr.splitlines() if line.startswith("otel_mindformers:")]
    json_warnings = [w for w in warnings if "'json_file'" in w]
    assert len(json_warnings) == 1, warnings
    assert str(logs / "train_metric.json") in json_warnings[0]


def _outputs_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("otel_mindformers: output ")]


def _in_order_to_the_last_step(steps: list[int]) -> None:
    assert steps == sorted(set(steps)) and steps[-1] == STEPS, steps


@pytest.mark.slow
def test_disk_space_coming_back_is_written_to_again(tmp_path, small_tmpfs):
    """A full disk, then space again (a checkpoint removed): each output says once that it
    failed and once that it writes again, and writes on to the last step."""
    logs, filler, freed = small_tmpfs / "logs", small_tmpfs / "filler", tmp_path / "freed"
    # Twenty steps on a full disk are more lines than the JSON log's last page has room for.
    spec = _spec(small_tmpfs, report=str(tmp_path / "report.json"), at={"20": [["fill", str(filler)]]})
    spec["at"]["40"] = [["await", str(freed)]]
    process = spawn(spec, tmp_path)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(process.stderr), daemon=True)
    reader.start()
    try:
        both_failed = ("output 'json_file' failed", "output 'tensorboard' failed")
        wait_until(
            lambda: all(w in "".join(stderr) for w in both_failed), "both outputs' failure", process, timeout=120
        )
        filler.unlink()
        freed.touch()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        reader.join()
    assert process.returncode == 0, "".join(stderr)[-3000:]
    _in_order_to_the_last_step([line["step"] for line in _whole_lines(logs / "train_metric.json")])
    _in_order_to_the_last_step(loss_steps(logs / "tensorboard" / "rank_0"))
    warnings = _outputs_warnings("".join(stderr))
    for output in ("json_file", "tensorboard"):
        said = [w for w in warnings if f"'{output}'" in w]
        assert len(said) == 2 and "failed" in said[0] and "writes again from step" in said[1], warnings


@pytest.mark.slow
def test_output_folder_removed_mid_run_is_written_to_again(tmp_path):
    """`rm -rf` of the output folder while the run writes: the JSON log starts again at its
    path, TensorBoard in a new event file, said once; neither goes on into a removed file."""
    logs = tmp_path / "logs"
    process, report = run(_spec(tmp_path, at={"20": [["remove", str(logs)]]}), tmp_path)
    assert process.returncode == 0, process.stderr[-3000:]
    for steps in (
        [line["step"] for line in _whole_lines(logs / "train_metric.json")],
        loss_steps(logs / "tensorboard" / "rank_0"),
    ):
        assert steps[-1] == STEPS and steps == sorted(set(steps)) and steps[0] <= 21, steps
    removed = [line for line in process.stderr.splitlines() if "was removed while the run wrote it" in line]
    assert len(removed) == 1, process.stderr[-3000:]
