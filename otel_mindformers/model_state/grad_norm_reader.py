"""Reading the gradient-norm probes (model_state/grad_norm_probe.py) on sampled steps.

A probe writes its optimizer's norm and counts the call each time the train cell calls the
optimizer, which need not be every step: a cell that accumulates gradients calls it every
k-th step, a loss-scale cell skips it on an overflow. A sampled step's `grad_norm` is the norm
of the gradients applied at that step, or none; never a norm of an earlier step:
- the counts since the previous sampled step equal the steps since: the optimizer ran on each
  of them, this one included (every step of a plain train cell, without a host write);
- no count since: this step applied nothing, and has no norm;
- anything else (some steps updated, some not): this step cannot be told from its
  neighbours, and has no norm; from then on the counts are also read at the begin of each
  sampled step (`arm`, from the step-begin hook through the StepClock), so each later sampled
  step is told exactly (the run's last step, sampled at train end, by the counts alone).
Several optimizers (`optimizer` and `head_optimizer`): the norm over all the gradients applied
at the step, sqrt(sum of each probe's norm squared).

Warned once: a probe never called in the run (the cell updates its weights some other way),
updates only on steps no sample fell on, and a norm that stays at one value step after step
(a cell that clips its gradients before its optimizer: the probe measures what the
optimizer receives, docs/model_state.md).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from otel_mindformers.compat import mindspore_tensor
from otel_mindformers.core.clock import StepClock
from otel_mindformers.core.guarded_log import get_logger

_logger = get_logger(__name__)

NEVER = sys.maxsize  # `StepClock.arm_after` while no count is read at a step's begin
# A clipped norm: this many reported values in a row equal to within CLIP_TOLERANCE.
CLIP_REPEATS = 3
CLIP_TOLERANCE = 1e-5


class GradNormReader:
    """The probes' norms for sampled steps (training thread). `read` at a sampled step's
    end, `arm` at its begin when the counts are needed there, `close` at the run's end."""

    def __init__(self, probes: Sequence[Any], names: Sequence[str], clock: StepClock, first_step: int) -> None:
        """`probes`: GradNormProbes (their `norm` and `calls` Parameters); `names`: where the
        train network holds each one's optimizer (`optimizer`), for the warnings."""
        self._norms = tuple(probe.norm for probe in probes)
        self._calls = tuple(probe.calls for probe in probes)
        self._names = tuple(names)
        self._clock = clock
        self._step = first_step
        self._counts = [mindspore_tensor.read_scalar(calls) for calls in self._calls]  # at the previous sample
        self._installed = list(self._counts)
        self._begin: list[int] | None = None  # the counts at this step's begin, when armed
        self._armed_mode = False
        self._reported = 0  # sampled steps given a norm
        self._set_aside = False  # the train cell returns its own norm: that one is reported
        self._last = -1.0  # the previous reported norm, and how many in a row equal it
        self._repeats = 0
        self._clip_said = False
        clock.arm_after, clock.arm = NEVER, self.arm

    def arm(self) -> None:
        """At the begin of a sampled step: the counts before it runs."""
        self._clock.arm_after = NEVER
        try:
            self._begin = [mindspore_tensor.read_scalar(calls) for calls in self._calls]
        except Exception as exc:  # the step's end finds out again and says so
            _logger.debug("otel_mindformers: the gradient-norm probes' counts: %s", exc)

    def read(self, step: int, overflow: bool) -> float | None:
        """This step's norm; inf on an overflow step (loss scaling skipped its update); None
        where this step applied no gradients or cannot be told from its neighbours. One frame
        (inside Model.train each call is cold, docs/performance.md)."""
        steps, self._step = step - self._step, step
        begin, self._begin = self._begin, None
        counts = self._counts
        total, applied, unknown = 0.0, False, False
        try:
            for index, calls in enumerate(self._calls):
                count = mindspore_tensor.read_scalar(calls)
                since, counts[index] = count - counts[index], count
                if begin is not None:  # armed: the counts at this step's begin are known
                    if count == begin[index]:
                        continue
                elif since == 0:
                    continue
                elif since != steps:
                    unknown = True
                    continue
                norm = mindspore_tensor.read_scalar(self._norms[index])
                total += norm * norm
                applied = True
        except Exception as exc:  # a probe that cannot be read: no norm from now on, training goes on
            self._calls = self._norms = ()
            _logger.warning(
                "otel_mindformers: grad_monitor cannot read the gradient-norm probe (%s): grad_norm "
                "is not reported from here on.",
                exc,
            )
            return None
        if unknown:
            self._armed_mode = True
        if self._armed_mode:
            self._clock.arm_after = self._clock.next_sample - 1
        if overflow:
            return math.inf
        if unknown or not applied:
            return None
        value = math.sqrt(total)
        self._reported += 1
        # The same value again (not an old one: see above): a clip holds it there.
        if value > 0.0 and abs(value - self._last) <= CLIP_TOLERANCE * value:
            self._repeats += 1
            if self._repeats == CLIP_REPEATS - 1:
                self._warn_clipped(value)
        else:
            self._repeats = 0
        self._last = value
        return value

    def _warn_clipped(self, value: float) -> None:
        if self._clip_said:
            return
        self._clip_said = True
        _logger.warning(
            "otel_mindformers: grad_norm has been %.6g on %d sampled steps in a row: the train cell seems to "
            "clip its gradients before its optimizer (ops.clip_by_global_norm(grads, %.6g)). grad_monitor "
            "measures the gradients the optimizer receives, so grad_norm stays at the clip value and norm "
            "alerts cannot fire; return the norm before clipping as the 5th output to report it instead "
            "(docs/model_state.md).",
            value,
            CLIP_REPEATS,
            value,
        )

    def set_aside(self) -> None:
        """The train cell returns its own global norm, the one reported: nothing to say of the
        probes' (runtime/extract.py stops reading them)."""
        self._set_aside = True

    def close(self) -> None:
        """At the run's end: say once what kept the norm from being reported."""
        self._clock.arm_after = NEVER
        if not self._calls or self._set_aside:  # unreadable (said when found), or not the norm reported
            return
        try:
            calls = [
                mindspore_tensor.read_scalar(calls) - installed
                for calls, installed in zip(self._calls, self._installed)
            ]
        except Exception:  # the run is ending on an error: nothing to add to it
            return
        never = [name for name, count in zip(self._names, calls) if count == 0]
        if never:
            _logger.warning(
                "otel_mindformers: grad_monitor: the train step never called its optimizer %s, where the "
                "gradient-norm probe is (a cell that updates its weights some other way), so %s",
                ", ".join(f"`{name}`" for name in never),
                "grad_norm is not reported." if len(never) == len(calls) else "grad_norm leaves its gradients out.",
            )
        elif self._reported == 0:
            _logger.warning(
                "otel_mindformers: grad_monitor: the optimizer updated the weights on %d step(s), none of them "
                "a sampled step that could be told from its neighbours, so grad_norm is not reported "
                "(a cell that accumulates gradients: an interval that is a multiple of its accumulation "
                "steps samples the steps that update).",
                max(calls),
            )


__all__ = ["CLIP_REPEATS", "GradNormReader"]
