"""Readings from inside the model: MindFormers' training-state monitor (local norms,
optimizer and weight state, local loss, max attention logit), the 7-tuple's local norms,
and the MoE callbacks' expert load and drop rate, routed into OTel with bounded cardinality.

- `parameters.py`: layer / kind of a parameter name and the `target` / `invert` filter;
  `state.py`: one step's readings and their summary; `inbox.py` + `mindformers_hooks.py`:
  MindFormers' monitors hand us their readings; `movement.py`: which layer moved most;
  `cell.py`: per-parameter gradient norms for a plain MindSpore `TrainOneStepCell`
  (`LocalNormTrainOneStepCell`); `grad_norm_probe.py`: the global gradient norm of any train
  cell. The series and their attributes are named in `names/model_state.py`; the run's
  sampled-step reading is `runtime/state_reader.py`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LocalNormTrainOneStepCell", "local_norms"]


def __getattr__(name: str) -> Any:
    # The cell needs MindSpore: imported when asked for, not with the package.
    if name in __all__:
        from otel_mindformers.model_state import cell

        return getattr(cell, name)
    raise AttributeError(name)
