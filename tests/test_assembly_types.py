"""The composition root's order is a type error to break (runtime/assembly.py).

Each starter of runtime/parts.py takes the parts it needs as typed parameters. A run put
together in the wrong order, or with a part it does not have, fails mypy, as the package's
own check runs it (pyproject's `[tool.mypy]`), before anything runs.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # mypy reads the package: seconds (it starts no process)

_PROLOGUE = """
from otel_mindformers.runtime import parts
from otel_mindformers.runtime.assembly import RunInputs


def wired(inputs: RunInputs) -> None:
    config, identity, loop, clock = inputs.config, inputs.identity, inputs.loop, inputs.clock
    telemetry, exports, step_ids, _ = parts.start_telemetry(config, identity, inputs.providers, clock)
"""

_RIGHT = """
    stacks, _ = parts.start_stacks(config, identity, loop.first_step, telemetry, clock)
    captures, _ = parts.start_captures(config, identity, telemetry, loop, clock)
    parts.start_alerts(config, identity, telemetry, clock, True, captures, stacks)
"""

# The alerts before the stack dumper they dump through: the old bag's None at run time.
_STACKS_AFTER_ALERTS = """
    captures, _ = parts.start_captures(config, identity, telemetry, loop, clock)
    parts.start_alerts(config, identity, telemetry, clock, True, captures, stacks)
    stacks, _ = parts.start_stacks(config, identity, loop.first_step, telemetry, clock)
"""

# The run span started with no stack dumper at all (a part left out).
_NONE_FOR_A_PART = """
    parts.start_run_span(identity, loop, telemetry, inputs.launcher, None, None)
"""


def _mypy(tmp_path: Path, body: str) -> tuple[str, int]:
    snippet = tmp_path / "wiring.py"
    snippet.write_text(textwrap.dedent(_PROLOGUE) + textwrap.indent(textwrap.dedent(body), "    "))
    stdout, stderr, status = mypy_api.run(
        ["--config-file", str(REPO / "pyproject.toml"), "--no-incremental", str(snippet)]
    )
    return stdout + stderr, status


def test_the_parts_in_their_order_type_check(tmp_path: Path) -> None:
    report, status = _mypy(tmp_path, _RIGHT)
    assert status == 0, report


def test_a_part_used_before_it_started_fails_type_checking(tmp_path: Path) -> None:
    report, status = _mypy(tmp_path, _STACKS_AFTER_ALERTS)
    assert status == 1, report
    assert 'Name "stacks" is used before definition' in report, report


def test_a_missing_part_fails_type_checking(tmp_path: Path) -> None:
    report, status = _mypy(tmp_path, _NONE_FOR_A_PART)
    assert status == 1, report
    assert 'Argument 6 to "start_run_span" has incompatible type "None"; expected "StackDumper"' in report, report
