"""`SampledStep`: what the training thread hands the pipeline worker on a sampled step.

Only what the training thread alone can know: the step's read-back values and the window's
clock readings (`time.perf_counter()` seconds). The worker builds the StepRecord and does
the rest (runtime/pipeline.py, timing/accounting.py). A NamedTuple, built on the sampled
step with `tuple.__new__(SampledStep, (...))`: one C call and no Python frame
(tests/test_hot_path_counts.py), read by name everywhere after.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class SampledStep(NamedTuple):
    step: int  # the job's step (job/resume.py)
    epoch: Any  # cb_params' cur_epoch_num (None or 0: derived from the step on the worker)
    values: dict[str, float]  # the read-back training values, by names/training.py key
    model_state: Any  # model_state/state.ModelState, or None
    is_last: bool  # sampled at train end
    steps: int  # steps since the previous sample
    elapsed: float  # seconds since the previous sample
    previous_end: float  # the end of the sampled step's predecessor
    step_begin: float  # the sampled step's begin
    end: float  # its end
    data_wait: float  # seconds between the window's steps, less the phases in them
    phases: float  # seconds of the phases inside the window (evaluation, saves, user phases): not step time
    breakdown_at: float  # train end for a last step sampled there (its breakdown's time), else 0: the step's end


__all__ = ["SampledStep"]
