"""MindSpore's `Model.train` from the inside: the `cb_params` keys this package reads, the
frames of its training loop, and the argument that says where a resume starts.

`cb_params` (`run_context.original_args()`) is a dict MindSpore's `Model._train` fills; its
keys are not a versioned API. `CB_PARAMS` lists every key the package reads, the first hook
of `Model.train` that carries it, and what needs it; tests/test_compat.py trains a real
`Model.train` on the installed release and fails naming the release and the key when one is
missing, and a static check keeps the package from reading a key not listed here.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from otel_mindformers.compat import releases
from otel_mindformers.compat.lookup import ApiNotFound, find

# key -> (the first hook that carries it, what reads it)
CB_PARAMS: dict[str, tuple[str, str]] = {
    "cur_step_num": ("on_train_begin", "the step number"),
    "batch_num": ("on_train_begin", "steps per epoch (ETA, resume offset, capture's place in the epoch)"),
    "dataset_sink_mode": ("on_train_begin", "whether an epoch is `batch_num` steps (sink) or the dataset's"),
    "epoch_num": ("on_train_begin", "the run's epochs (ETA, the run span)"),
    "list_callback": ("on_train_begin", "the run's other callbacks (checkpoint and LR-scheduler phases, resume)"),
    "train_network": ("on_train_begin", "the network (model state, FLOPs, the optimizer under MindFormers)"),
    "network": ("on_train_begin", "the network (FLOPs)"),
    "optimizer": ("on_train_begin", "the learning rate"),
    "train_dataset": ("on_train_begin", "the dataset's size, batch size and columns (captures, data wait)"),
    "cur_epoch_num": ("on_train_epoch_begin", "the epoch"),
    "train_dataset_element": ("on_train_step_begin", "the batch capture's input shapes and CRC"),
    "net_outputs": ("on_train_step_end", "loss, overflow, loss scale, grad norm"),
}
# The hooks in the order Model.train calls them.
HOOKS = ("on_train_begin", "on_train_epoch_begin", "on_train_step_begin", "on_train_step_end")

# `Model` methods whose frames hold `initial_epoch` while the train-begin callbacks run
# (job/resume.py reads it there: it is not in cb_params).
TRAIN_FRAMES = frozenset({"_train", "train", "fit"})
INITIAL_EPOCH = "initial_epoch"
# Where a stack dump finds the training thread (hangs/stacks.py): MindSpore's training loop,
# its evaluation loop, its checkpoint saves (names of several releases), its data pipeline.
LOOP_FUNCTIONS = frozenset({"_train_process", "_train_dataset_sink_process", "train", "_train"})
EVAL_FUNCTIONS = frozenset({"eval", "_eval_process", "_eval_dataset_sink_process", "evaluate"})
CHECKPOINT_FUNCTIONS = frozenset({"save_checkpoint", "_save_ckpt", "_exec_save_checkpoint", "async_ckpt_thread_status"})
DATA_FILES = (f"{os.sep}mindspore{os.sep}dataset{os.sep}", "dataset_helper.py")


def batch_inputs(cb_params: Any) -> Any:
    """This step's batch, as the network receives it (a tuple of tensors; None before the
    first step), or ApiNotFound if this release's cb_params does not carry it."""
    if "train_dataset_element" not in cb_params:
        check_cb_params(cb_params, "on_train_step_begin")
    return cb_params["train_dataset_element"]


def steps_per_epoch(cb_params: Any) -> int:
    """The steps one epoch of `Model.train` runs (0: unknown). `batch_num` is the sink size
    whenever `sink_size` is given, but only a sinking loop runs that many per epoch: where
    MindSpore feeds step by step (the CPU falls back so from sink mode, and says
    `dataset_sink_mode` False) an epoch is the whole dataset."""
    batch_num = int(cb_params.get("batch_num") or 0)
    if cb_params.get("dataset_sink_mode", True):
        return batch_num
    try:  # Model.train asked the dataset its size before train begin: the dataset kept it
        return int(cb_params.get("train_dataset").get_dataset_size()) or batch_num
    except Exception:  # no dataset, or one that cannot tell: MindSpore's count
        return batch_num


def callbacks(cb_params: Any) -> Any:
    """The run's callbacks as MindSpore holds them (a list), or None."""
    return cb_params.get("list_callback")


def missing_keys(cb_params: Any, hook: str) -> list[str]:
    """The keys `hook` should carry that this release's cb_params lacks, each with what needs it."""
    carried = HOOKS[: HOOKS.index(hook) + 1]
    return [
        f"{key} (first at {first}; {needed_for})"
        for key, (first, needed_for) in CB_PARAMS.items()
        if first in carried and key not in cb_params
    ]


def check_cb_params(cb_params: Any, hook: str) -> None:
    """ApiNotFound naming the release and each key `hook` should carry and does not."""
    missing = missing_keys(cb_params, hook)
    if missing:
        raise ApiNotFound(f"{releases.release(releases.MINDSPORE)}: cb_params at {hook} has no {', '.join(missing)}")


def check_train_loop() -> None:
    """ApiNotFound unless `Model._train` takes `initial_epoch` and its loop functions exist."""
    train = find("mindspore.train.model:Model._train", package=releases.MINDSPORE, needed_for="a resume's step")
    if INITIAL_EPOCH not in inspect.signature(train).parameters:
        raise ApiNotFound(
            f"{releases.release(releases.MINDSPORE)}: mindspore.train.model:Model._train takes no "
            f"{INITIAL_EPOCH!r} argument; a resume's step (job/resume.py) reads it there"
        )
    for name in sorted((LOOP_FUNCTIONS | EVAL_FUNCTIONS) - {"evaluate"}):  # `evaluate`: MindFormers'
        find(f"mindspore.train.model:Model.{name}", package=releases.MINDSPORE, needed_for="a stack dump's phase")
    for path in (
        "mindspore.train.callback:ModelCheckpoint._save_ckpt",
        "mindspore.train.serialization:save_checkpoint",
    ):
        find(path, package=releases.MINDSPORE, needed_for="a stack dump's checkpoint phase")
