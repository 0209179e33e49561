"""Installing it as a user does, far from the cluster: the README's install commands, run
here, and the CLI of a base install (no extras, no MindSpore, no numpy).

The fast-enough check hides MindSpore, MindFormers, numpy and every extra from a fresh
interpreter and runs each command that needs none of them; the slow one builds the wheel
from a clean copy of the repository, installs it into a new virtual environment and runs
the same commands there, then adds the extras with the README's line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from otel_mindformers.config.extras import EXTRA_OF_MODULE
from otel_mindformers.hangs.dumps import StackDumper
from otel_mindformers.job.identity import Identity
from otel_mindformers.outputs.diagnosis_file import diagnosis_path
from tests.support.backends import unavailable
from tests.support.hidden import hiding
from tests.support.otlp_receiver import OtlpReceiver

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "tests" / "fixtures" / "logs"
# What a laptop without the training stack lacks; the CLI's commands must not need any.
TRAINING_STACK = ("numpy", "mindspore", "mindformers")

# The README's install section, word for word (tests/test_install.py runs each line).
INSTALL_FROM_CHECKOUT = 'pip install ".[tensorboard,prometheus,devices,analysis]"'
BUILD_WHEEL = "pip wheel --no-deps -w dist ."


def _hide(tmp_path: Path, modules) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([hiding(tmp_path / "shim", modules), str(REPO)])}


def _stack_dumps(folder: Path) -> Path:
    """Two ranks' real stack dumps (rank 1 two steps behind), as StackDumper writes them."""
    folder.mkdir()

    class Progress:
        def __init__(self, step: int) -> None:
            self.step, self.last_step_end, self.phase = step, time.perf_counter(), None

    class NoLogs:
        def emit(self, **_record) -> None:
            pass

    for rank, step in ((0, 7), (1, 5)):
        identity = Identity(rank=rank, world_size=2, host_name="laptop")
        path = Path(diagnosis_path(str(folder / "train_metric.json"), rank))
        StackDumper(identity, NoLogs(), Progress(step), path).dump("test")
    return folder


def _analysed_capture(root: Path) -> Path:
    """A capture folder as `capture --analyse` leaves it: its manifest and a (here empty)
    profiler trace, so `capture --plot` gets as far as drawing."""
    folder = root / "rank_0" / "20261201T000000-step5-manual"
    trace = folder / "profile" / "r0_ascend_ms" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    trace.parent.mkdir(parents=True)
    trace.write_text("[]")
    manifest = {"rank": 0, "step": 5, "trigger": "manual", "status": "analysed", "time_stamp": time.time()}
    (folder / "capture.json").write_text(json.dumps(manifest))
    return root


def _raw_capture(root: Path) -> Path:
    """A capture taken with `analysis: deferred`: its manifest and a raw profile folder that
    `capture --analyse` has not analysed yet."""
    folder = root / "rank_0" / "20261201T000000-step5-manual"
    (folder / "profile" / "r0_ascend_ms").mkdir(parents=True)
    manifest = {"rank": 0, "step": 5, "trigger": "manual", "status": "raw", "time_stamp": time.time()}
    (folder / "capture.json").write_text(json.dumps(manifest))
    return root


def _commands(tmp_path: Path, dumps: Path, endpoint: str) -> list[tuple[list[str], int, str]]:
    """(arguments, exit status, a line the output holds) of each command a base install runs."""
    no_matplotlib = "needs matplotlib, which is not installed: pip install 'otel-mindformers[analysis]'"
    captures = _analysed_capture(tmp_path / "captures")
    return [
        (["--version"], 0, "otel-mindformers "),
        (
            ["validate", str(REPO / "examples" / "train_config.yaml")],
            1,  # the example writes TensorBoard: validate names the extra, and nothing breaks
            "invalid: monitor_config.output_type: tensorboard needs tensorboardX, which is not installed: "
            "pip install 'otel-mindformers[tensorboard]'",
        ),
        (["report", str(LOGS / "multirank")], 0, "Findings"),
        (["report", "--format", "json", str(LOGS / "gap_and_restart.json")], 0, '"series"'),
        (  # its styles and scripts ship with the package; an analysed capture's trace is drawn
            ["report", str(LOGS / "multirank"), "--html", str(tmp_path / "run.html"), "--captures", str(captures)],
            0,
            "wrote ",
        ),
        (
            ["replay", "--endpoint", endpoint, "--protocol", "http/json", str(LOGS / "gap_and_restart.json")],
            0,
            "sent ",
        ),
        (["hang-report", str(dumps)], 0, "rank 1"),
        (
            ["plot", str(LOGS / "gap_and_restart.json"), "-o", str(tmp_path / "loss.png")],
            1,
            f"error: plot {no_matplotlib}",
        ),
        (
            ["plot", "--attempts", str(LOGS / "gap_and_restart.json"), "-o", str(tmp_path / "attempts.png")],
            1,
            f"error: plot {no_matplotlib}",
        ),
        (
            ["capture", "--plot", str(tmp_path / "trace.png"), str(captures)],
            1,
            f"error: capture --plot {no_matplotlib}",
        ),
        (
            ["capture", "--analyse", str(_raw_capture(tmp_path / "raw_captures"))],
            1,
            "error: capture --analyse needs mindspore, which is not installed: pip install mindspore",
        ),
    ]


def _check(run, commands) -> None:
    for arguments, status, expected in commands:
        done = run(arguments)
        output = done.stdout + done.stderr
        assert "Traceback" not in output, (arguments, output[-3000:])
        assert done.returncode == status, (arguments, output[-3000:])
        assert expected in output, (arguments, output[-3000:])


@pytest.mark.slow
def test_the_cli_runs_without_the_training_stack_or_any_extra(tmp_path):
    """The class behind `No module named 'numpy'`: a module the CLI imports at the top of a
    file needs a package that is not a dependency. Here every such package is hidden."""
    env = _hide(tmp_path, TRAINING_STACK + tuple(EXTRA_OF_MODULE))
    dumps = _stack_dumps(tmp_path / "dumps")
    with OtlpReceiver() as receiver:

        def run(arguments):
            command = [sys.executable, "-m", "otel_mindformers.cli", *arguments]
            return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)

        _check(run, _commands(tmp_path, dumps, receiver.http_endpoint))
        assert receiver.wait_for(lambda r: r.spans()), "the replay sent nothing"


def _clean_copy(destination: Path) -> Path:
    """The repository's tracked files, as a fresh clone holds them (no build, no venv)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60)
    if listed.returncode != 0:  # not a git checkout (an unpacked archive): all but the build state
        shutil.copytree(
            REPO, destination, ignore=shutil.ignore_patterns(".venv", ".matrix", "build", "dist", "*.egg-info")
        )
        return destination
    for name in listed.stdout.decode().split("\0"):
        if name and (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)
    return destination


def _pip(python: Path, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_the_wheel_holds_the_package_and_its_type_marker_and_nothing_else(tmp_path):
    """What a user installs from the README's wheel line: every module of the package and
    the files it reads (the HTML page's styles and scripts), the PEP 561 marker (without it
    mypy rejects `from otel_mindformers import MonitorCallback` in the user's training code
    as untyped), and no tests, examples or backend configs."""
    source = _clean_copy(tmp_path / "checkout")
    built = _pip(Path(sys.executable), *BUILD_WHEEL.split()[1:], cwd=source)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (source / "dist").glob("otel_mindformers-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {path.relative_to(source).as_posix() for path in (source / "otel_mindformers").rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    assert "otel_mindformers/py.typed" in names
    assets = {
        path.relative_to(source).as_posix()
        for pattern in ("*.css", "*.js", "*.json", "*.proto", "*.pyi")
        for path in (source / "otel_mindformers").rglob(pattern)
    }
    # The HTML page's styles and scripts; MindCluster's fault-code table, ClusterD's .proto files.
    assert assets and assets <= names, sorted(assets - names)
    assert "otel_mindformers/cluster/fault_codes.json" in assets
    tops = {name.split("/")[0] for name in names}
    assert tops == {"otel_mindformers", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops


@pytest.mark.slow
@pytest.mark.integration
def test_the_wheel_installs_into_a_clean_venv_and_its_cli_runs_there(tmp_path):
    source = _clean_copy(tmp_path / "checkout")
    # The README's wheel line, run as shown (pip of the interpreter running the tests).
    built = _pip(Path(sys.executable), *BUILD_WHEEL.split()[1:], cwd=source)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (source / "dist").glob("otel_mindformers-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # pip 23.2 (Python 3.11's bundled pip) cannot resolve the OTLP JSON exporter's pins
    # (docs/install.md): the README says to upgrade pip first, as here.
    upgraded = _pip(python, "install", "--upgrade", "pip", cwd=tmp_path)
    if upgraded.returncode != 0:
        unavailable(f"the package registry is not reachable from here: {upgraded.stderr.strip()[-500:]}")
    installed = _pip(python, "install", str(wheel), cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    absent = subprocess.run(
        [str(python), "-c", f"import importlib.util as u; print([m for m in {TRAINING_STACK!r} if u.find_spec(m)])"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert absent.stdout.strip() == "[]", "the base install pulled in part of the training stack"

    otel_mindformers = venv / "bin" / "otel-mindformers"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    dumps = _stack_dumps(tmp_path / "dumps")

    def run(arguments):
        command = [str(otel_mindformers), *arguments]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)

    where = subprocess.run(
        [str(python), "-c", "import otel_mindformers; print(otel_mindformers.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert str(venv) in where.stdout, where.stdout + where.stderr  # the wheel's copy, not the checkout
    with OtlpReceiver() as receiver:
        _check(run, _commands(tmp_path, dumps, receiver.http_endpoint))
        assert receiver.wait_for(lambda r: r.spans()), "the replay sent nothing"

    # The README's line for the optional outputs, from the checkout: validate passes and plot draws.
    extras = _pip(python, *INSTALL_FROM_CHECKOUT.replace('"', "").split()[1:], cwd=source)
    assert extras.returncode == 0, extras.stderr[-3000:]
    validated = run(["validate", str(REPO / "examples" / "train_config.yaml")])
    assert validated.returncode == 0 and ": valid; monitoring enabled" in validated.stdout, validated.stderr
    plotted = run(["plot", str(LOGS / "gap_and_restart.json"), "-o", str(tmp_path / "loss.png")])
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    assert (tmp_path / "loss.png").stat().st_size > 0
    report = json.loads(run(["report", "--format", "json", str(LOGS / "multirank")]).stdout)
    assert report["series"]
