"""MindFormers 1.9 on a CPU: the patches its tiny-LLaMA training needs, and a runner.

The YAML side (`fused_rms_norm: False`, `use_rope_slice: True`) lives in the config; the one
code patch lives here, never in the package: MFTrainOneStepCell's loss-scale overflow check
calls NPUGetFloatStatusV2, which the CPU backend lacks, so it is replaced by an isfinite
reduction over the gradients (the same answer).

    python -m tests.support.mindformers_cpu script.py [args...]   # patch, then run the script
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import mindspore as ms
from mindspore import ops
from mindspore.nn.wrap.loss_scale import TrainOneStepWithLossScaleCell


def _cpu_overflow(self, status, grads):
    flag = ops.zeros((), ms.bool_)
    for grad in grads:
        flag = ops.logical_or(flag, ops.logical_not(ops.isfinite(grad)).any())
    return flag


def apply() -> None:
    TrainOneStepWithLossScaleCell.get_overflow_status = _cpu_overflow


if __name__ == "__main__":
    apply()
    script, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script.py` would
    runpy.run_path(script, run_name="__main__")
