"""`Patches`: what one patching changed (wrapped attributes, registered callbacks), so that
`undo()` restores exactly that."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import wrapt

from otel_mindformers.compat import mindformers_api


class Patches:
    """What one patching changed, so that `undo()` restores exactly that."""

    def __init__(self) -> None:
        self._attributes: list[tuple[Any, str, Any]] = []
        self._registered: list[str] = []

    def wrap(self, owner: Any, name: str, wrapper: Callable) -> None:
        # The class attribute itself is kept: `apply` is a classmethod, and restoring what the
        # class returns on lookup (a method bound to the base class) would break subclasses.
        self._attributes.append((owner, name, owner.__dict__[name]))
        wrapt.wrap_function_wrapper(owner, name, wrapper)

    def register_callbacks(self) -> None:
        """`callbacks: - type: MonitorCallback` / `OtelCallback` in MindFormers' registry."""
        from otel_mindformers.runtime.callback import MonitorCallback, OtelCallback

        register, callback = mindformers_api.callback_registry()
        for cls in (MonitorCallback, OtelCallback):
            if not register.is_exist(callback, cls.__name__):
                register.register_cls(cls, module_type=callback)
                self._registered.append(cls.__name__)

    def undo(self) -> None:
        for owner, name, original in reversed(self._attributes):
            setattr(owner, name, original)
        self._attributes.clear()
        for name in self._registered:
            mindformers_api.forget_callback(name)
        self._registered.clear()
