"""Checkpoint and evaluation phases from the run's own callbacks, without global patches.

At train begin the run wraps methods of the callback *instances* in `cb_params.list_callback`
and puts the originals back at train end, so nothing outlives the run and nothing outside it
changes:

- MindSpore's `ModelCheckpoint` (and MindFormers' `CheckpointMonitor`, its subclass):
  `_save_ckpt` runs on every step and decides inside whether to save, so the wrapper times it
  with two clock reads and records a `checkpoint.save` phase only when the latest checkpoint
  file changed; MindFormers' new-format save (`_save_megatron_ckpt_file_format`) always saves.
  The span carries the file's path and size (`training.checkpoint.path`, `.size`).
- MindFormers' `EvalCallBack`: `_execute_eval` is an `evaluation` phase.
"""

from __future__ import annotations

import functools
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from otel_mindformers.core.step_record import PhaseInterval
from otel_mindformers.names import phase_names
from otel_mindformers.timing.phases import PhaseRecorder, phase


def checkpoint_attributes(path: str) -> dict[str, Any]:
    """The path, and the size in bytes when the path is a file (not for a folder-format
    checkpoint, nor an async save still being written)."""
    attributes: dict[str, Any] = {phase_names.ATTR_CHECKPOINT_PATH: path}
    try:
        info = os.stat(path)
    except OSError:
        return attributes
    if stat.S_ISREG(info.st_mode):
        attributes[phase_names.ATTR_CHECKPOINT_SIZE] = info.st_size
    return attributes


def _timed_save(callback: Any, original: Callable, recorder: PhaseRecorder) -> Callable:
    def save(*args: Any, **kwargs: Any) -> Any:
        before = getattr(callback, "_latest_ckpt_file_name", "")
        start_perf, start_wall = time.perf_counter(), time.time()
        result = original(*args, **kwargs)
        latest = getattr(callback, "_latest_ckpt_file_name", "")
        if latest and latest != before:
            seconds = time.perf_counter() - start_perf
            interval = PhaseInterval(
                phase_names.PHASE_CHECKPOINT_SAVE,
                start_wall,
                start_wall + seconds,
                seconds,
                checkpoint_attributes(latest),
            )
            recorder.finished_interval(interval)
        return result

    return save


def _as_phase(name: str, original: Callable) -> Callable:
    def marked(*args: Any, **kwargs: Any) -> Any:
        with phase(name):
            return original(*args, **kwargs)

    return marked


def instrument_callbacks(callbacks: Any, recorder: PhaseRecorder) -> Callable[[], None]:
    """Wrap the phase methods of `callbacks` (instances); returns the undo."""
    from mindspore.train.callback import ModelCheckpoint

    wrapped: list[tuple[Any, str]] = []

    def wrap(instance: Any, method: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(instance, method, None)
        if original is None or method in vars(instance):  # absent, or already wrapped by someone
            return
        setattr(instance, method, make(original))
        wrapped.append((instance, method))

    for callback in callbacks or ():
        if isinstance(callback, ModelCheckpoint):
            wrap(callback, "_save_ckpt", functools.partial(_timed_save, callback, recorder=recorder))
            wrap(
                callback,
                "_save_megatron_ckpt_file_format",
                lambda original: _as_phase(phase_names.PHASE_CHECKPOINT_SAVE, original),
            )
        elif type(callback).__name__ == "EvalCallBack":
            wrap(callback, "_execute_eval", lambda original: _as_phase(phase_names.PHASE_EVALUATION, original))

    def undo() -> None:
        for instance, method in wrapped:
            vars(instance).pop(method, None)

    return undo
