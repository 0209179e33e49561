"""The job's step after a resume: what to add to MindSpore's `cur_step_num`.

MindSpore restarts `cur_step_num` at 0 for every `Model.train` call, `initial_epoch` or
not (`cur_epoch_num` goes on: 3, 4, ...), so a resumed run's steps would read 1, 2, ...
again. The job's step is `cur_step_num` plus the offset found here once, at train begin:

- MindSpore's own resume (TFT/UCE fills `cb_params.initial_step` and starts `cur_step_num`
  there): `cur_step_num` already counts the job's steps, offset 0;
- MindFormers (`Trainer(resume_training=True)`): its callbacks carry the resumed step,
  `runner_config.initial_step` (`CheckpointMonitor._append_step_num`, `MFLossMonitor` and
  `TrainingStateMonitor.initial_step`);
- plain MindSpore `Model.train(..., initial_epoch=E)`: `E` × steps per epoch (the sink
  size in sink mode on a device; the dataset's size where MindSpore feeds step by step, the
  CPU's fallback from sink mode included: compat/mindspore_model.py). `initial_epoch` is
  not in `cb_params` at train begin, so it is read from the `Model.train` call on the
  stack.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from otel_mindformers.compat import mindformers_api, mindspore_model


def _nonnegative_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def mindformers_initial_step(callbacks: Any) -> int | None:
    """The step MindFormers resumed from, as its own callbacks hold it (None: none says)."""
    for callback in callbacks or ():
        for class_name, attribute in mindformers_api.INITIAL_STEP_ATTRIBUTES:
            if any(klass.__name__ == class_name for klass in type(callback).__mro__):
                value = _nonnegative_int(getattr(callback, attribute, None))
                if value is not None:
                    return value
    return None


def initial_epoch_on_stack() -> int | None:
    """`initial_epoch` of the `Model.train` / `Model.fit` call that is starting the run."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in mindspore_model.TRAIN_FRAMES and mindspore_model.INITIAL_EPOCH in frame.f_locals:
            owner = frame.f_locals.get("self")
            if owner is not None and type(owner).__name__ == "Model":
                return _nonnegative_int(frame.f_locals[mindspore_model.INITIAL_EPOCH])
        frame = frame.f_back
    return None


def step_offset(cb_params: Any) -> int:
    """What to add to `cur_step_num` for the job's step (once per run, at train begin)."""
    if int(cb_params.get("cur_step_num") or 0) > 0:
        return 0  # MindSpore's own resume: the count already starts at the resumed step
    from_mindformers = mindformers_initial_step(mindspore_model.callbacks(cb_params))
    if from_mindformers is not None:
        return from_mindformers
    initial_epoch = initial_epoch_on_stack()
    return initial_epoch * mindspore_model.steps_per_epoch(cb_params) if initial_epoch else 0


__all__ = ["initial_epoch_on_stack", "mindformers_initial_step", "step_offset"]
