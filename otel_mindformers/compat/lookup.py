"""A MindSpore / MindFormers name resolved where an adapter expects it, or one loud error.

`find("mindformers.trainer.base_trainer:BaseTrainer.training_process", ...)` imports the
module, then walks the attributes. What is not there raises `ApiNotFound`, whose message
names the installed release, the full name and what needs it, so a release that moved an
API fails in one place with one line rather than somewhere later with an AttributeError.
A feature that cannot run without the name is turned off with `feature_off`: one warning.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from otel_mindformers.compat import releases
from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)
_said: set[str] = set()
_said_lock = threading.Lock()


class ApiNotFound(ImportError):
    """A MindSpore / MindFormers name is not where the adapter expects it on this release."""


def find(path: str, *, package: str, needed_for: str) -> Any:
    """`module.path:Qualified.name` → the object; ApiNotFound naming the release if absent."""
    module_name, _, qualname = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for attribute in filter(None, qualname.split(".")):
            target = getattr(target, attribute)
    except Exception as exc:  # ImportError, AttributeError, or the library failing to import
        raise ApiNotFound(
            f"{releases.release(package)}: {path} is not there ({type(exc).__name__}: {exc}); "
            f"{needed_for} needs it (tested: {releases.LABELS[package]} {releases.tested_range(package)})"
        ) from exc
    return target


def feature_off(feature: str, error: ApiNotFound) -> None:
    """Say once per process that `feature` is off, and why (the error names the release)."""
    with _said_lock:
        if feature in _said:
            return
        _said.add(feature)
    _logger.warning("otel_mindformers: %s is off: %s", feature, error)
