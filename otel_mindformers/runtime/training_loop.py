"""`TrainingLoop`: what a run reads of the training it watches, as one typed value.

Two doors build it and the same run is started from it (runtime/assembly.py): the callback
from `Model.train`'s `cb_params` at train begin (`of_model_train`), the run API
(`otel_mindformers.start`) from its arguments in a custom loop. No part reads MindSpore's
`cb_params` for itself: what it needs is a field here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from otel_mindformers.compat import mindspore_model
from otel_mindformers.job.resume import step_offset
from otel_mindformers.runtime.extract import optimizer_of


@dataclasses.dataclass(frozen=True)
class TrainingLoop:
    """The training loop as the run's parts see it. MindSpore objects are untyped (`Any`):
    MindSpore ships no type information."""

    network: Any  # the model's network (MFU's model config; None where the loop names none)
    train_network: Any  # the cell one step runs (Model.train's train cell; None in a custom loop)
    optimizer: Any  # the mindspore.nn.Optimizer: the learning rate, model state; or None
    dataset: Any  # the training dataset (its batch metadata, captures' notes), or None
    batch_size: int | None  # samples per step, None when unknown (no throughput)
    epochs: int  # 0 when unknown
    steps_per_epoch: int  # 0 when unknown (no ETA, epochs derived from the step only when known)
    steps_done: int  # the loop's own count of steps before this run's first (MindSpore's cur_step_num)
    step_offset: int  # the job's step less the loop's (job/resume.py)
    callbacks: Sequence[Any]  # the callbacks the loop runs beside ours (LearningRateScheduler, savers)
    # Where a sampled step reads the step's outputs, in `cb_params`' keys: `net_outputs`,
    # `cur_step_num`, `cur_epoch_num`, ... The callback's is `cb_params` itself; the run API
    # keeps its own mapping, filled by `run.step` / `run.log`.
    step_view: MutableMapping[str, Any]
    # The job's step a checkpoint saved now holds (a save phase ending on the training thread).
    checkpoint_step: Callable[[], int]
    # The job's last step where the loop names it (the run API's epochs × steps_per_epoch), else
    # 0: `Model.train`'s last step is sampled at its train end (runtime/cadence.py).
    last_step: int = 0

    @property
    def first_step(self) -> int:
        """The job's step before this run's first step."""
        return self.steps_done + self.step_offset

    @property
    def known_last_step(self) -> int:
        """The job's last step where the loop's length is known, else 0 (the ETA's end). A
        `Model.train` call's epochs are the ones it runs, after its `initial_epoch`: they go on
        from the epoch of the job's step it starts at (a resume inside an epoch, MindSpore's
        own or MindFormers', finishes that epoch first)."""
        if self.last_step:
            return self.last_step
        if self.epochs and self.steps_per_epoch:
            return (self.first_step // self.steps_per_epoch + self.epochs) * self.steps_per_epoch
        return 0

    @classmethod
    def of_model_train(cls, cb_params: Any) -> TrainingLoop:
        """The loop `Model.train` runs, from its `cb_params` at train begin."""
        dataset = cb_params.get("train_dataset")
        offset = step_offset(cb_params)
        return cls(
            network=cb_params.get("network"),
            train_network=cb_params.get("train_network"),
            optimizer=optimizer_of(cb_params),
            dataset=dataset,
            batch_size=batch_size_of(dataset),
            epochs=int(cb_params.get("epoch_num") or 0),
            steps_per_epoch=mindspore_model.steps_per_epoch(cb_params),
            steps_done=int(cb_params.get("cur_step_num") or 0),
            step_offset=offset,
            callbacks=tuple(mindspore_model.callbacks(cb_params) or ()),
            step_view=cb_params,
            # MindSpore's count: the callback saving a checkpoint may run before ours at a step's end.
            checkpoint_step=lambda: int(cb_params.get("cur_step_num") or 0) + offset,
        )


def batch_size_of(dataset: Any) -> int | None:
    """Samples per step from the dataset's metadata (no readback); None when it has none."""
    try:
        return int(dataset.get_batch_size()) if dataset is not None else None
    except Exception:  # a dataset without batch metadata: no throughput, not a failure
        return None


__all__ = ["TrainingLoop", "batch_size_of"]
