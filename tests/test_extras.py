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
from tests.support.cli import cli
from tests.support.paths import REPO
from tests.support.reliability_worker import run


def _hide(tmp_path: Path, *modules: str) -> dict[str, str]:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text("import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules))
    return {"PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])}


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


@pytest.mark.slow
def test_no_optional_module_is_needed_to_import_the_package_or_its_cli(tmp_path):
    """The class of problem behind a crash without an extra: a module imported at the top of
    a file that every run or CLI command imports. With every optional module hidden, the
    package, the callback and the CLI still import, and `--help` runs."""
    env = {**os.environ, **_hide(tmp_path, *EXTRA_OF_MODULE)}
    imported = subprocess.run(
        [sys.executable, "-c", "import otel_mindformers, otel_mindformers.cli"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
    # The callback imports MindSpore, which needs psutil itself: psutil is optional only
    # where MindSpore is not imported.
    without_psutil = [module for module in EXTRA_OF_MODULE if module != "psutil"]
    (tmp_path / "run").mkdir()
    run_env = {**os.environ, **_hide(tmp_path / "run", *without_psutil)}
    imported = subprocess.run(
        [sys.executable, "-c", "import otel_mindformers.runtime.callback, otel_mindformers.runtime.run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=run_env,
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
    helped = cli("--help", cwd=tmp_path, timeout=120, env=env)
    assert helped.returncode == 0, helped.stderr[-2000:]
