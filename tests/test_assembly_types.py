"""The composition root's order is a type error to break (runtime/assembly.py).

Each starter of runtime/parts.py takes the parts it needs as typed parameters. A run put
together in the wrong order, or with a part it does not have, fails mypy, as the package's
own check runs it (pyproject's `[tool.mypy]`), before anything runs.
"""

from __future__ import annotations

import textwrap

import pytest

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


_SNIPPETS = {"right": _RIGHT, "stacks_after_alerts": _STACKS_AFTER_ALERTS, "none_for_a_part": _NONE_FOR_A_PART}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, str]:
    """One mypy run over the three wirings (one module each): each module's own lines."""
    from mypy import api as mypy_api  # the test command's venv has it; the matrix rows' do not

    folder = tmp_path_factory.mktemp("wirings")
    for name, body in _SNIPPETS.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(_PROLOGUE) + textwrap.indent(textwrap.dedent(body), "    "))
    stdout, stderr, _ = mypy_api.run(
        [
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--no-incremental",
            *(str(folder / f"{n}.py") for n in _SNIPPETS),
        ]
    )
    lines = (stdout + stderr).splitlines()
    # Nothing but the two wrong wirings' errors (a broken config or import would add more).
    assert lines[-1] == "Found 3 errors in 2 files (checked 3 source files)", stdout + stderr
    return {
        name: "\n".join(line for line in lines if line.startswith(str(folder / f"{name}.py"))) for name in _SNIPPETS
    }


def test_the_parts_in_their_order_type_check(reports) -> None:
    assert reports["right"] == ""


def test_a_part_used_before_it_started_fails_type_checking(reports) -> None:
    report = reports["stacks_after_alerts"]
    assert 'Name "stacks" is used before definition' in report, report


def test_a_missing_part_fails_type_checking(reports) -> None:
    report = reports["none_for_a_part"]
    assert 'Argument 6 to "start_run_span" has incompatible type "None"; expected "StackDumper"' in report, report
