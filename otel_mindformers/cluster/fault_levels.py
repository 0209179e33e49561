"""MindCluster's fault levels: the level the Ascend device plugin gives each NPU fault code.

The table is data (`fault_codes.json` beside this module): the device plugin's published
`faultCode.json`, one level per code, with the repository, path and release it was taken
from (docs/mindcluster.md). A code listed under several levels takes the most severe, as
the device plugin's `GetFaultTypeByCode` does. tests/test_cluster_units.py checks the table
against a copy of the published file.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

# ClusterD's levels beyond the device plugin's table: a manual isolation ranks above all.
MANUALLY_SEPARATE = "ManuallySeparateNPU"
UNLISTED = "unlisted"  # a code the table does not hold (the device plugin then goes by the event's severity)


@functools.cache
def table() -> dict[str, Any]:
    """The table file as read: `source`, `severity` (most severe first) and `levels`."""
    text = resources.files(__package__).joinpath("fault_codes.json").read_text(encoding="utf-8")
    return dict(json.loads(text))


def normalized(code: str) -> str:
    """`0x80e21007`, `80E21007 ` -> `80E21007`: npu-smi prints codes with 0x, ClusterD without."""
    code = code.strip().upper()
    return code[2:] if code.startswith("0X") else code


def level_of(code: str) -> str:
    """The level MindCluster gives `code`, or UNLISTED."""
    return str(table()["levels"].get(normalized(code), UNLISTED))


@functools.cache
def _rank() -> dict[str, int]:
    order = [MANUALLY_SEPARATE, *table()["severity"]]
    return {level: len(order) - index for index, level in enumerate(order)}


def severity(level: str) -> int:
    """Higher is more severe; a level neither the table nor ClusterD names ranks lowest (0)."""
    return _rank().get(level, 0)


def most_severe(levels: list[str]) -> str | None:
    """The most severe of `levels` (ties: the first); None when there are none."""
    return max(levels, key=severity) if levels else None


__all__ = ["MANUALLY_SEPARATE", "UNLISTED", "level_of", "most_severe", "normalized", "severity", "table"]
