"""Optional extras: `validate` names the one to install, and a run without it trains on
with that output off and one warning. Absence is simulated by a sitecustomize on PYTHONPATH
that makes the module unimportable (`sys.modules[name] = None`) in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from otel_mindformers.config.extras import EXTRA_OF_MODULE
from tests.support import instrumented
from tests.support.cli import cli
from tests.support.hidden import hiding
from tests.support.paths import REPO
from tests.support.reliability_worker import run


def _hide(tmp_path: Path, *modules: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([hiding(tmp_path / "shim", modules), str(REPO)])}


def test_the_table_names_extras_of_pyproject():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, (distribution, extra) in EXTRA_OF_MODULE.items():
        assert any(req.split(">")[0].split("=")[0].strip() == distribution for req in extras[extra]), (module, extra)


CASES = [
    (
        "output_type: [tensorboard]",
        "tensorboardX",
        "monitor_config.output_type: tensorboard needs tensorboardX, which is not installed: "
        "pip install 'otel-mindformers[tensorboard]'",
    ),
    (
        "output_type: [prometheus]",
        "prometheus_client",
        "monitor_config.output_type: prometheus needs prometheus_client, which is not installed: "
        "pip install 'otel-mindformers[prometheus]'",
    ),
    (
        "device_monitor: true",
        "psutil",
        "monitor_config.device_monitor needs psutil, which is not installed: pip install 'otel-mindformers[devices]'",
    ),
    (
        "{device_monitor: true, device_config: {sources: [nvidia]}}",
        "pynvml",
        "monitor_config.device_config.sources: nvidia needs pynvml, which is not installed: "
        "pip install 'otel-mindformers[devices]'",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("section, module, message", CASES, ids=[c[1] for c in CASES])
def test_validate_names_the_extra_to_install(tmp_path, section, module, message):
    config = tmp_path / "monitor.yaml"
    config.write_text(f"monitor_config: {section if section.startswith('{') else '{' + section + '}'}\n")
    present = cli("validate", str(config), cwd=tmp_path, timeout=120)
    assert present.returncode == 0, present.stderr
    absent = cli("validate", str(config), cwd=tmp_path, timeout=120, env=_hide(tmp_path, module))
    assert absent.returncode == 1
    assert absent.stderr.splitlines() == [f"invalid: {message}"]


RUN_CASES = [
    ("tensorboard", {}, "tensorboardX"),
    ("prometheus", {"prometheus": {"port": 0}}, "opentelemetry.exporter.prometheus"),
    ("prometheus", {"prometheus": {"port": 0}}, "prometheus_client"),
]


@pytest.mark.slow
@pytest.mark.parametrize("output, settings, module", RUN_CASES, ids=[c[2] for c in RUN_CASES])
def test_training_without_an_outputs_extra_runs_with_one_warning(tmp_path, output, settings, module):
    spec = {
        "config": {"interval": 1, "output_type": [output, "json_file"], **settings},
        "steps": 6,
        "report": str(tmp_path / "report.json"),
        "log_level": "WARNING",
    }
    process, _ = run(spec, tmp_path, env=_hide(tmp_path, module))
    assert process.returncode == 0, process.stderr[-3000:]
    warnings = [line for line in process.stderr.splitlines() if output in line.lower()]
    assert len(warnings) == 1 and f"pip install 'otel-mindformers[{output}]'" in warnings[0], process.stderr
    lines = (tmp_path / "output" / "train_metric.json").read_text().splitlines()
    assert len(lines) == 6
    # An output that is off leaves no trace on disk: an empty TensorBoard folder would say it ran.
    assert sorted(p.name for p in (tmp_path / "output").iterdir() if p.is_dir()) == []


@pytest.mark.slow
def test_no_optional_module_is_needed_to_import_the_package_or_its_cli(tmp_path):
    """The class of problem behind a crash without an extra: a module imported at the top of
    a file that every run or CLI command imports. With every optional module hidden, the
    package, the callback and the CLI still import, and `--help` runs."""
    env = {**os.environ, **_hide(tmp_path, *EXTRA_OF_MODULE)}
    instrumented.run([sys.executable, "-c", "import otel_mindformers, otel_mindformers.cli"], env, tmp_path, 120)
    # The callback imports MindSpore, which needs psutil itself: psutil is optional only
    # where MindSpore is not imported.
    without_psutil = [module for module in EXTRA_OF_MODULE if module != "psutil"]
    (tmp_path / "run").mkdir()
    run_env = {**os.environ, **_hide(tmp_path / "run", *without_psutil)}
    callback = "import otel_mindformers.runtime.callback, otel_mindformers.runtime.run"
    instrumented.run([sys.executable, "-c", callback], run_env, tmp_path, 120)
    helped = cli("--help", cwd=tmp_path, timeout=120, env=env)
    assert helped.returncode == 0, helped.stderr[-2000:]


# An installed package that fails on import, as users meet it: its own ImportError, the
# protobuf mismatch's TypeError (raised from a generated _pb2 module, several lines long),
# or a package that calls sys.exit() when it finds its own dependency wrong.
BROKEN = {
    "import-error": ("ImportError", "raise ImportError('cannot import name _C from partially initialised module')"),
    "protobuf-mismatch": (
        "TypeError",
        "raise TypeError('Descriptors cannot be created directly.\\n"
        "If this call came from a _pb2.py file, your generated code is out of date')",
    ),
    "sys-exit": ("SystemExit", "import sys\nsys.exit('this build needs protobuf<4, found 5.29: reinstall it')"),
}


def _validate(tmp_path: Path, section: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`otel-mindformers validate` of a file holding `monitor_config: {section}`."""
    config = tmp_path / "monitor.yaml"
    config.write_text(f"monitor_config: {{{section}}}\n")
    command = [sys.executable, "-m", "otel_mindformers.cli", "validate", str(config)]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def _broken(tmp_path: Path, package: str, body: str) -> dict[str, str]:
    """A real package on PYTHONPATH, ahead of the installed one, whose import raises."""
    site = tmp_path / "broken"
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(body + "\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


@pytest.mark.slow
@pytest.mark.parametrize("kind", BROKEN)
def test_a_tensorboardx_that_fails_on_import_turns_the_output_off_and_training_runs_on(tmp_path, kind):
    error, body = BROKEN[kind]
    env = _broken(tmp_path, "tensorboardX", body)
    warning = _the_tensorboard_warning_of_a_run(tmp_path, env)
    assert f"tensorboardX fails on import ({error}: " in warning
    assert "pip install 'otel-mindformers[tensorboard]'" in warning
    assert not (tmp_path / "output" / "tensorboard_log").exists()

    validated = _validate(tmp_path, "output_type: [tensorboard]", {**os.environ, **env})
    assert validated.returncode == 1
    (line,) = validated.stderr.splitlines()
    assert line.startswith(
        f"invalid: monitor_config.output_type: tensorboard needs tensorboardX, which fails on import ({error}: "
    )
    assert line.endswith("): pip install 'otel-mindformers[tensorboard]'")


@pytest.mark.slow
def test_a_tensorboard_writer_that_fails_after_a_clean_import_turns_the_output_off(tmp_path):
    # crc32c imports, and fails in the checksum of the event file's first record.
    env = _broken(
        tmp_path, "crc32c", "def crc32c(data, value=0):\n    raise RuntimeError('illegal instruction in crc32c')"
    )
    warning = _the_tensorboard_warning_of_a_run(tmp_path, env)
    assert "the tensorboard output (monitor_config.output_type) is off: its event writer failed " in warning
    assert "(RuntimeError: illegal instruction in crc32c)" in warning


def _the_tensorboard_warning_of_a_run(tmp_path: Path, env: dict[str, str]) -> str:
    """A 4-step training with TensorBoard and JSON lines under `env`: it runs to the end, every
    JSON line is written, and it says one thing about TensorBoard: that line."""
    spec = {
        "config": {"interval": 1, "output_type": ["tensorboard", "json_file"]},
        "steps": 4,
        "report": str(tmp_path / "report.json"),
        "log_level": "WARNING",
    }
    process, _ = run(spec, tmp_path, env=env)
    assert process.returncode == 0, process.stderr[-3000:]
    warnings = [line for line in process.stderr.splitlines() if "tensorboard" in line.lower()]
    assert len(warnings) == 1, process.stderr[-3000:]
    assert len((tmp_path / "output" / "train_metric.json").read_text().splitlines()) == 4
    return warnings[0]


# Every other optional package, broken, in the code path that imports it. psutil breaks
# with an ImportError only: the OpenTelemetry SDK (and MindSpore) import it too, and
# survive nothing else.
BROKEN_ELSEWHERE = [
    (
        "prometheus_client",
        "protobuf-mismatch",
        "output_type: [prometheus], prometheus: {port: 0}",
        "the prometheus output",
    ),
    (
        "psutil",
        "import-error",
        "device_monitor: true, device_config: {sources: [host]}",
        "readings from psutil are off",
    ),
    ("pynvml", "protobuf-mismatch", "device_monitor: true, device_config: {sources: [nvidia]}", "from pynvml are off"),
]


@pytest.mark.slow
@pytest.mark.parametrize("package, kind, section, warned", BROKEN_ELSEWHERE, ids=[c[0] for c in BROKEN_ELSEWHERE])
def test_any_broken_optional_package_is_one_warning_and_one_validate_line(tmp_path, package, kind, section, warned):
    error, body = BROKEN[kind]
    env = {**os.environ, **_broken(tmp_path, package, body)}
    validated = _validate(tmp_path, section, env)
    config = tmp_path / "monitor.yaml"
    assert validated.returncode == 1, validated.stdout
    (line,) = validated.stderr.splitlines()
    assert f"needs {package}, which fails on import ({error}: " in line
    # The run side: the component that imports the package, built as a run builds it.
    script = (
        "import logging; logging.basicConfig(level=logging.WARNING)\n"
        "from otel_mindformers.config import load_monitor_config\n"
        f"config = load_monitor_config({str(config)!r})\n"
        "from otel_mindformers.devices.selection import build_sources\n"
        "from otel_mindformers.telemetry.providers import _prometheus_reader\n"
        "from otel_mindformers.job.identity import Identity\n"
        "identity = Identity(rank=0, world_size=1, host_name='n')\n"
        "if config.device_monitor:\n"
        "    print([type(s).__name__ for s in build_sources(config.device_config, None)])\n"
        "else:\n"
        "    print(_prometheus_reader(config, identity))\n"
    )
    built = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (warning,) = [line for line in built.stderr.splitlines() if warned in line]
    assert f"{package} fails on import ({error}: " in warning
    assert "pip install 'otel-mindformers[" in warning
