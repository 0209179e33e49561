"""`Patches`: what one patching changed (wrapped attributes, registered callbacks), so that
`undo()` restores exactly that."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import wrapt


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
        from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

        from otel_mindformers.runtime.callback import MonitorCallback, OtelCallback

        for cls in (MonitorCallback, OtelCallback):
            if not MindFormerRegister.is_exist(MindFormerModuleType.CALLBACK, cls.__name__):
                MindFormerRegister.register_cls(cls, module_type=MindFormerModuleType.CALLBACK)
                self._registered.append(cls.__name__)

    def undo(self) -> None:
        for owner, name, original in reversed(self._attributes):
            setattr(owner, name, original)
        self._attributes.clear()
        if self._registered:
            from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

            for name in self._registered:
                MindFormerRegister.registry[MindFormerModuleType.CALLBACK].pop(name, None)
                MindFormerRegister.search_names_map.pop((MindFormerModuleType.CALLBACK, name), None)
            self._registered.clear()
