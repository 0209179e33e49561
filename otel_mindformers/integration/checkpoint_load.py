"""`checkpoint.load` phases: MindSpore's `load_checkpoint` and MindFormers' resume path.

The instrumentor's `register()` wraps them and `unregister()` puts the originals back:

- MindSpore's `load_checkpoint`, where the `mindspore`, `mindspore.train` and
  `mindspore.train.serialization` modules hold it, as soon as `mindspore` is imported. Code
  that bound the name before that (`from mindspore import load_checkpoint` before
  `import otel_mindformers`) keeps calling the original: import otel_mindformers first.
- MindFormers' `BaseTrainer` loads through two names of `mindformers.trainer.base_trainer`,
  looked up at call time: `transform_and_load_checkpoint` (the `.ckpt`/safetensors path,
  `load_checkpoint` / `resume_training` in the YAML) and `load_checkpoint` (the new format's
  `checkpoint.load_path`). Both are wrapped there, whatever was imported first.

A load is a `phase("checkpoint.load")` carrying the path (`training.checkpoint.path`), the
size for a file (`training.checkpoint.size`) and, for MindFormers, whether the optimizer
state is resumed too (`training.checkpoint.resume`). A load made by another load (MindFormers'
loader calling MindSpore's) is timed once, by the outer one. A resume loads before training
begins, outside any run: phases.py remembers the phase and the next run counts it in its
start-up breakdown, histogram and trace.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from otel_mindformers.compat import mindformers_api
from otel_mindformers.compat.lookup import ApiNotFound, feature_off
from otel_mindformers.integration.patches import Patches
from otel_mindformers.names.phase_names import ATTR_CHECKPOINT_RESUME, PHASE_CHECKPOINT_LOAD
from otel_mindformers.timing.callback_phases import checkpoint_attributes
from otel_mindformers.timing.phases import open_phase_name, phase

# The modules that hold MindSpore's `load_checkpoint` once `import mindspore` has finished.
MINDSPORE_MODULES = ("mindspore.train.serialization", "mindspore.train", "mindspore")

Describe = Callable[[tuple, dict], dict[str, Any]]


def _timed_load(describe: Describe, active: Callable[[], bool]) -> Callable:
    """A wrapt wrapper timing each call as a `checkpoint.load` phase described by `describe`."""

    def load(wrapped: Callable, _instance: Any, args: tuple, kwargs: dict) -> Any:
        # `active`: a reference bound while patched outlives unregister(); it then times nothing.
        if not active() or open_phase_name() == PHASE_CHECKPOINT_LOAD:
            return wrapped(*args, **kwargs)
        with phase(PHASE_CHECKPOINT_LOAD, **describe(args, kwargs)):
            return wrapped(*args, **kwargs)

    return load


def _argument(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    return args[position] if len(args) > position else kwargs.get(name)


def _path_attributes(path: Any) -> dict[str, Any]:
    return checkpoint_attributes(str(os.fspath(path))) if isinstance(path, (str, os.PathLike)) else {}


def _mindspore_load(args: tuple, kwargs: dict) -> dict[str, Any]:
    """`load_checkpoint(ckpt_file_name, net=None, ...)`."""
    return _path_attributes(_argument(args, kwargs, 0, "ckpt_file_name"))


def _mindformers_transform_load(args: tuple, kwargs: dict) -> dict[str, Any]:
    """`transform_and_load_checkpoint(config, model, network, dataset, optimizer=None, ...)`:
    the path is the config's `checkpoint.load_path` (MindFormers fills it from the YAML's
    `load_checkpoint`); an optimizer is passed when training resumes."""
    config = _argument(args, kwargs, 0, "config")
    section = config.get("checkpoint") if isinstance(config, dict) else None
    path = section.get("load_path") if isinstance(section, dict) else None
    if path is None and isinstance(config, dict):
        path = config.get("load_checkpoint")
    resume = _argument(args, kwargs, 4, "optimizer") is not None
    return {**_path_attributes(path), ATTR_CHECKPOINT_RESUME: resume}


def _mindformers_load(args: tuple, kwargs: dict) -> dict[str, Any]:
    """`load_checkpoint(checkpoint, network, optimizer=None, ...)` (mindformers.checkpoint)."""
    resume = _argument(args, kwargs, 2, "optimizer") is not None
    return {**_path_attributes(_argument(args, kwargs, 0, "checkpoint")), ATTR_CHECKPOINT_RESUME: resume}


# What each of MindFormers' resume loads (compat/mindformers_api.RESUME_LOADS) is called with.
_MINDFORMERS_LOADS = {
    "transform_and_load_checkpoint": _mindformers_transform_load,
    "load_checkpoint": _mindformers_load,
}


def patch_mindspore(active: Callable[[], bool]) -> Patches:
    """Wrap MindSpore's `load_checkpoint` in every module of MINDSPORE_MODULES holding it."""
    from mindspore.train import serialization

    original = vars(serialization)["load_checkpoint"]
    patches = Patches()
    for name in MINDSPORE_MODULES:
        module = sys.modules.get(name)
        if module is not None and vars(module).get("load_checkpoint") is original:
            patches.wrap(module, "load_checkpoint", _timed_load(_mindspore_load, active))
    return patches


def wrap_mindformers(wrap: Callable[[Any, str, Callable], None]) -> None:
    """Wrap MindFormers' resume loads in `base_trainer` with `wrap(owner, name, wrapper)`
    (mindformers_glue.Patches.wrap: undone with the rest of the MindFormers patches)."""
    try:
        base_trainer, loads = mindformers_api.resume_loads()
    except ApiNotFound as exc:
        feature_off("checkpoint.load phases of a MindFormers resume", exc)
        return
    for name in loads:
        wrap(base_trainer, name, _timed_load(_MINDFORMERS_LOADS[name], lambda: True))
