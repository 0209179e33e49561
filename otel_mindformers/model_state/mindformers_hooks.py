"""The MindFormers methods whose outputs become OTel readings, wrapped by the instrumentor
(mindformers_glue.patch_mindformers) and restored by its `Patches.undo()`:

- `TrainingStateMonitor._output(tag, data, step, formats)`: every reading of MindFormers'
  state monitor passes through it on its way to the log or TensorBoard;
- `TopkBiasBalanceCallback._update_topk_bias`: its expert loads, taken from the
  `add_scalars("expert_load/<layer>", ...)` it writes (only when it writes them);
- `MoEDropRateCallback._callback_droprate`: its drop rates, from the log lines it writes.

Each wrapper hands MindFormers' values to the inbox and then does exactly what MindFormers
did; a failure to hand them over is never MindFormers' failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from otel_mindformers.compat import mindformers_api
from otel_mindformers.compat.lookup import ApiNotFound, feature_off
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.model_state.inbox import INBOX

_logger = get_logger(__name__)


def _step_of(args: tuple, kwargs: dict) -> int:
    return int(kwargs.get("global_step", args[2] if len(args) > 2 else 0) or 0)


def state_output(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    if INBOX.open:
        try:
            tag = kwargs.get("tag", args[0] if args else None)
            data = kwargs.get("data", args[1] if len(args) > 1 else None)
            INBOX.put(str(tag), data, _step_of(args, kwargs))
        except Exception as exc:  # telemetry never fails MindFormers' monitor
            _logger.debug("otel_mindformers: state reading not routed: %s", exc)
    return wrapped(*args, **kwargs)


class _ExpertLoadTee:
    """Stands in for the callback's TensorBoard writer during one update: expert loads go to
    the inbox and on to the real writer."""

    def __init__(self, writer: Any, step: int) -> None:
        self._writer = writer
        self._step = step

    def add_scalars(self, tag: str, values: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tag, str) and tag.startswith("expert_load/"):
            try:
                INBOX.put_expert_load(tag, values, self._step)
            except Exception as exc:
                _logger.debug("otel_mindformers: expert load not routed: %s", exc)
        return self._writer.add_scalars(tag, values, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


def expert_load(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    writer = getattr(instance, "tensor_writer", None)
    if not INBOX.open or writer is None:
        return wrapped(*args, **kwargs)
    instance.tensor_writer = _ExpertLoadTee(writer, int(getattr(instance, "cur_step", 0) or 0))
    try:
        return wrapped(*args, **kwargs)
    finally:
        instance.tensor_writer = writer


class _DropRateLines(logging.Filter):
    def __init__(self, step: int) -> None:
        super().__init__()
        self._step = step

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            INBOX.put_log_line(record.getMessage(), self._step)
        except Exception as exc:
            _logger.debug("otel_mindformers: drop rate not routed: %s", exc)
        return True  # the line is MindFormers': it is logged as before


def drop_rate(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    if not INBOX.open:
        return wrapped(*args, **kwargs)
    target = logging.getLogger("mindformers")  # where mindformers.tools.logger writes
    line_filter = _DropRateLines(getattr(instance, "_otel_step", 0))
    target.addFilter(line_filter)
    try:
        return wrapped(*args, **kwargs)
    finally:
        target.removeFilter(line_filter)


def drop_rate_step(wrapped: Callable, instance: Any, args: tuple, kwargs: dict) -> Any:
    """`on_train_step_end`: remember the step for the drop-rate lines it logs."""
    run_context = args[0] if args else kwargs.get("run_context")
    try:
        instance._otel_step = int(run_context.original_args().cur_step_num) + INBOX.step_offset  # type: ignore[union-attr]
    except Exception:  # no run context (a direct call): the step is unknown
        instance._otel_step = 0
    return wrapped(*args, **kwargs)


# The wrapper of each (class, method) of compat/mindformers_api.STATE_HOOKS.
WRAPPERS = {
    ("TrainingStateMonitor", "_output"): state_output,
    ("TopkBiasBalanceCallback", "_update_topk_bias"): expert_load,
    ("MoEDropRateCallback", "_callback_droprate"): drop_rate,
    ("MoEDropRateCallback", "on_train_step_end"): drop_rate_step,
}


def install(wrap: Callable[[type, str, Callable], None]) -> None:
    """Wrap MindFormers' monitors through `wrap(owner, name, wrapper)` (Patches.wrap); one
    this release lacks turns its series off, said once (compat/mindformers_api.py)."""
    for class_name, method, feature in mindformers_api.STATE_HOOKS:
        try:
            owner = mindformers_api.state_hook(class_name, method, feature)
        except ApiNotFound as exc:
            feature_off(feature, exc)
            continue
        wrap(owner, method, WRAPPERS[class_name, method])
