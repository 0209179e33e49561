"""The contract every device source fulfils, and what a poll produces."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, Union

AttributeValue = Union[str, int, float, bool]

MIB = 1024 * 1024


@dataclass(frozen=True)
class Point:
    """One observation for the instrument named `metric` (a semconv name).

    `tool` names the command or library call the value came from (`npu-smi info -t ecc`);
    the `devices` command shows it, the exporters do not.
    """

    metric: str
    value: float
    attributes: Mapping[str, AttributeValue]
    tool: str = ""


@dataclass(frozen=True)
class Readings:
    """What one successful poll of a source saw.

    `points` feed the observable instruments; `snapshot` holds this rank's own readings
    under flat JSON keys (units in the key, e.g. `npu_hbm_used_mb`) for the local outputs.
    `problems` are the queries of an otherwise successful poll that failed (a driver
    without `npu-smi info -t ecc`): counted and warned about like a failed poll.
    """

    points: tuple[Point, ...] = ()
    snapshot: Mapping[str, float] = field(default_factory=dict)
    problems: tuple[SourceError, ...] = ()


class SourceError(Exception):
    """A poll (or one query of it) that produced nothing; `error_type` becomes the failure
    counter's error.type, `query` names the query for the one-time warning."""

    def __init__(self, error_type: str, message: str, query: str = "") -> None:
        super().__init__(message)
        self.error_type = error_type
        self.query = query


class Source(Protocol):
    """A reader of one kind of device. Both methods run on the poll thread.

    `read` raises SourceError (or anything else, which is counted the same way) when it
    can see nothing; a partial reading is a success with fewer points.
    """

    name: str

    def read(self) -> Readings: ...

    def close(self) -> None: ...


def physical_device(logical: int, visible_env: str) -> str:
    """The driver's id of the device a framework calls `logical`.

    With `ASCEND_RT_VISIBLE_DEVICES=4,5` (or `CUDA_VISIBLE_DEVICES`), the process's device 1
    is the driver's device 5; the driver tools and NVML speak the driver's ids. GPU entries
    may be UUIDs, so the result is a string.
    """
    visible = [item.strip() for item in os.environ.get(visible_env, "").split(",") if item.strip()]
    if 0 <= logical < len(visible):
        return visible[logical]
    return str(logical)
