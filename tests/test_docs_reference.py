"""docs/configuration.md is the reference the README calls complete: every `monitor_config`
key the schema accepts has its row in the Keys table (each subsection's keys named in it or in
the page it links), and every extra of pyproject.toml a user installs is in the extras table."""

from __future__ import annotations

import dataclasses
import re

import tomllib

from otel_mindformers.config.schema import MonitorConfig
from tests.support.paths import REPO

REFERENCE = (REPO / "docs" / "configuration.md").read_text()
NOT_FOR_USERS = {"test", "test-tools"}  # the test command's and the version matrix's own


def _table(heading: str) -> str:
    section = REFERENCE.split(f"## {heading}\n", 1)[1]
    return section.split("\n## ", 1)[0]


def _first_cells(table: str) -> set[str]:
    """The backticked names of each row's first cell (`a`, `b` for a row of two keys)."""
    return {
        name
        for row in table.splitlines()
        if row.startswith("| ")
        for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])
    }


def test_every_top_level_key_has_its_row():
    keys = {field.name for field in dataclasses.fields(MonitorConfig)} - MonitorConfig.INTERNAL_FIELDS
    assert keys - _first_cells(_table("Keys")) == set()


def test_every_key_of_device_config_is_named_in_its_row():
    from otel_mindformers.config.schema import DeviceConfig

    (row,) = [row for row in _table("Keys").splitlines() if row.startswith("| `device_config`")]
    assert {field.name for field in dataclasses.fields(DeviceConfig)} - set(re.findall(r"`(\w+)[:`]", row)) == set()


def test_every_extra_is_in_the_extras_table():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) - NOT_FOR_USERS - _first_cells(_table("Optional outputs and their extras")) == set()
