"""The commands the docs show are the commands that work.

Every `otel-mindformers` and `promtool` line of a bash/sh block in README.md, docs/*.md and
collector-config/README.md runs here as written, against the logs of a real training in
`output/`. Lines that need a collector (`replay --endpoint`) or a secret are left out, and so
is any block preceded by `<!-- illustrative -->`.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from otel_mindformers import MonitorCallback
from otel_mindformers.version import __version__
from tests.support import training
from tests.support.instrumented import BIN, child_env
from tests.support.paths import REPO

pytestmark = [pytest.mark.slow, pytest.mark.analysis]  # a real training, then the CLI as documented

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "collector-config" / "README.md"]
_BLOCK = re.compile(r"(<!-- illustrative -->\s*)?```(?:bash|sh|shell)\n(.*?)```", re.S)
_TOOLS = ("otel-mindformers", "promtool")
_NEEDS_A_COLLECTOR = ("--endpoint", "--header", "$")


def documented_commands() -> list[tuple[Path, str]]:
    found = []
    for doc in DOCS:
        for illustrative, body in _BLOCK.findall(doc.read_text()):
            if illustrative:
                continue
            for line in body.replace("\\\n", " ").splitlines():
                command = line.split(" #", 1)[0].strip()  # a trailing comment is not part of it
                if command.startswith(_TOOLS) and not any(marker in command for marker in _NEEDS_A_COLLECTOR):
                    found.append((doc, command))
    return found


COMMANDS = documented_commands()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A working directory whose `output/` holds what a real run leaves there."""
    workdir = tmp_path_factory.mktemp("docs")
    output = workdir / "output"
    config = {
        "interval": 1,
        "output_type": ["json_file", "tensorboard"],
        "json_log_path": str(output / "train_metric.json"),
        "tensorboard_path": str(output / "tensorboard_log"),
    }
    training.train([MonitorCallback(config)], steps=6, shape="tuple5")
    return workdir


def test_the_docs_show_commands_to_run():
    tools = {command.split()[0] for _, command in COMMANDS}
    subcommands = {command.split()[1] for _, command in COMMANDS if command.startswith("otel-mindformers")}
    assert tools == set(_TOOLS) and {"plot", "report", "replay"} <= subcommands, COMMANDS


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d.name}: {c}" for d, c in COMMANDS])
def test_a_documented_command_runs(trained, doc, command):
    if command.startswith("promtool"):
        from tests.support.prometheus import require_binary

        promtool = require_binary("promtool")
        command, cwd = command.replace("promtool", shlex.quote(promtool), 1), doc.parent
    else:
        command, cwd = command.replace("otel-mindformers", shlex.quote(str(BIN / "otel-mindformers")), 1), trained
    # bash: the docs rely on its globbing (`rules/*.yaml`).
    result = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{doc.name}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"


def test_version():
    result = subprocess.run([str(BIN / "otel-mindformers"), "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"otel-mindformers {__version__}"


def test_replay_to_a_dead_endpoint_says_so_in_one_line(trained):
    from tests.support.instrumented import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    for protocol in ("grpc", "http/protobuf"):
        result = subprocess.run(
            [
                str(BIN / "otel-mindformers"),
                "replay",
                "output/",
                "--endpoint",
                endpoint,
                "--protocol",
                protocol,
                "--timeout",
                "2",
            ],
            cwd=trained,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 1
        (line,) = [line for line in result.stderr.splitlines() if line.strip()]
        assert endpoint in line and "refused" in line.lower(), line
