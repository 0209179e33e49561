"""A dataset whose source blocks at one step until the test releases it: a data-loader
deadlock that can be ended on cue. The blocking function has a distinctive name, so a test
can look for it in a stack dump."""

from __future__ import annotations

from collections.abc import Callable

import mindspore as ms
import numpy as np
from mindspore.dataset import GeneratorDataset

from tests.support.training import BATCH, FEATURES, build_model


def wait_for_the_test_to_release_batch(release: Callable[[], None]) -> None:
    release()


class _BlockingSource:
    def __init__(self, steps: int, block_at_step: int | None, release: Callable[[], None]) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((steps * BATCH, FEATURES)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.block_at = None if block_at_step is None else (block_at_step - 1) * BATCH
        self.release = release

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if index == self.block_at:
            wait_for_the_test_to_release_batch(self.release)
        return self.x[index], self.y[index]


def use_cpu() -> None:
    """PyNative mode on CPU; under msrun, call it before `init()` (MindSpore refuses after)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")


def train_blocking(callbacks: list, *, steps: int, block_at_step: int | None, release: Callable[[], None]) -> None:
    """A real training of `steps` steps whose data for step `block_at_step` waits for
    `release()` to return (the data pipeline's thread blocks; the training thread waits on it).
    The context must be set (`use_cpu`)."""
    source = _BlockingSource(steps, block_at_step, release)
    dataset = GeneratorDataset(source, column_names=["x", "y"], shuffle=False).batch(BATCH)
    build_model().train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
