"""Where MindFormers' own monitors (and the run API's gradients) hand us their readings.

MindFormers' `TrainingStateMonitor` writes every reading through one method,
`_output(tag, data, step, formats)`, which dispatches to its per-format writers (log,
TensorBoard). The instrumentor wraps that method (model_state/mindformers_hooks.py) so each
reading is also put here, with its tag and step: MindFormers' numbers, not recomputed. The
MoE callbacks' expert loads and drop rates arrive the same way; so do the per-parameter
gradient norms of a custom loop's `run.log(grads=...)` (runtime/logged_values.py), as one
family of readings.

`put` runs on the training thread inside MindFormers' callback and only stores a reference
(latest per tag); the active run `take`s them on its sampled steps. With no run open,
nothing is kept.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from otel_mindformers.model_state.state import FamilyReadings, ModelState
from otel_mindformers.names import training as tm
from otel_mindformers.names.model_state import ADAM_M_NORM, ADAM_V_NORM, GRAD_NORM

# MindFormers' tag → the family of per-parameter norms it belongs to.
_FAMILY_TAGS = {"local_norm/": GRAD_NORM, "adam_m_norm/": ADAM_M_NORM, "adam_v_norm/": ADAM_V_NORM}
# MindFormers' scalar tags → our training-metric keys.
SCALAR_TAGS = {
    "weight_norm": tm.WEIGHT_NORM,
    "device_local_norm": tm.DEVICE_LOCAL_NORM,
    "throughput_linearity": tm.THROUGHPUT_LINEARITY,
    "max_attention_logit/max": tm.MAX_ATTENTION_LOGIT,
}
_MICRO_LOSS = re.compile(r"micro_local_(\w+)_loss$")
_MEAN_LOCAL_LOSS = re.compile(r"local_(\w+)_loss$")
_DEVICE_LOSS = re.compile(r"device_accum_local_(\w+)_loss$")
_DROP_RATE = re.compile(r"layer: (\d+), drop_rate: ([-+0-9.eE]+|nan|inf)")


def _float(data: Any) -> float:
    return float(np.asarray(data, dtype=np.float64).mean())


class StateInbox:
    def __init__(self) -> None:
        self._runs = 0
        # What the open run adds to MindSpore's `cur_step_num` for the job's step (job/resume.py).
        self.step_offset = 0
        self._latest: dict[str, tuple[int, Any]] = {}
        self._micro: dict[str, tuple[int, list[Any]]] = {}
        self._expert_loads: dict[str, tuple[int, list[float]]] = {}
        self._drop_rates: dict[str, tuple[int, float]] = {}
        self._families: dict[str, tuple[int, FamilyReadings]] = {}
        # True once MindFormers wrote since the last take: an attribute, not a method, because
        # the run reads it on every sampled step, where each call is a cold frame.
        self.written = False

    @property
    def open(self) -> bool:
        return self._runs > 0

    def open_run(self) -> None:
        self._runs += 1

    def close_run(self) -> None:
        self._runs = max(0, self._runs - 1)
        if not self._runs:
            self._clear()

    def _clear(self) -> None:
        self._latest.clear()
        self._micro.clear()
        self._expert_loads.clear()
        self._drop_rates.clear()
        self._families.clear()
        self.written = False

    # --- MindFormers' side (training thread) ---------------------------------------------
    def put(self, tag: str, data: Any, step: int) -> None:
        if not self._runs or not isinstance(tag, str):
            return
        if tag.startswith("micro_local_"):
            seen = self._micro.get(tag)
            if seen is None or seen[0] != step:
                self._micro[tag] = seen = (step, [])
            seen[1].append(data)
        else:
            self._latest[tag] = (step, data)
        self.written = True

    def put_expert_load(self, tag: str, loads: Any, step: int) -> None:
        """`expert_load/<layer>` with `{ep_i: load}` as TopkBiasBalanceCallback writes it."""
        if self._runs and isinstance(loads, dict):
            layer = tag.rsplit("/", 1)[-1]
            values = [loads[k] for k in sorted(loads, key=lambda k: int(re.sub(r"\D", "", k) or 0))]
            self._expert_loads[layer] = (step, values)
            self.written = True

    def put_log_line(self, message: str, step: int) -> None:
        """MoEDropRateCallback logs `layer: i, drop_rate: x`: the log line is its only output."""
        match = _DROP_RATE.search(message) if self._runs else None
        if match:
            self._drop_rates[match.group(1)] = (step, float(match.group(2)))
            self.written = True

    def put_family(self, family: str, readings: FamilyReadings, step: int) -> None:
        """A whole family of per-parameter squared norms at once (the run API's gradients)."""
        if self._runs:
            self._families[family] = (step, readings)
            self.written = True

    # --- the run's side (training thread, sampled steps) ------------------------------------
    def take(self, after_step: int) -> tuple[dict[str, float], ModelState]:
        """Readings written for steps after `after_step`: the scalar training metrics, and the
        model state (parsed later, on the worker thread, by `ModelState.summary`)."""
        latest = {tag: data for tag, (step, data) in self._latest.items() if step > after_step}
        micro = {tag: data for tag, (step, data) in self._micro.items() if step > after_step}
        loads = {k: v for k, (step, v) in self._expert_loads.items() if step > after_step}
        drops = {k: v for k, (step, v) in self._drop_rates.items() if step > after_step}
        families = {k: v for k, (step, v) in self._families.items() if step > after_step}
        self._clear()
        scalars = {}
        for tag, key in SCALAR_TAGS.items():
            if tag in latest:
                try:
                    scalars[key] = _float(latest.pop(tag))
                except (TypeError, ValueError):
                    latest.pop(tag, None)
        state = ModelState(expert_loads={k: [_float(x) for x in v] for k, v in loads.items()}, drop_rates=drops)
        state.families.update(_families(latest))
        state.families.update(families)
        for values in micro.values():
            state.local_losses += [_float(v) for v in values]
        for tag, data in latest.items():
            device = _DEVICE_LOSS.match(tag)
            if device:
                state.device_local_losses[device.group(1)] = _float(data)
            elif not micro and _MEAN_LOCAL_LOSS.match(tag):
                state.local_losses.append(_float(data))  # only the per-step mean was written
        return scalars, state


def _families(latest: dict[str, Any]) -> dict[str, FamilyReadings]:
    names: dict[str, list[str]] = {}
    squares: dict[str, list[float]] = {}
    for tag, data in latest.items():
        for prefix, family in _FAMILY_TAGS.items():
            if tag.startswith(prefix):
                try:
                    value = _float(data)
                except (TypeError, ValueError):
                    break
                names.setdefault(family, []).append(tag[len(prefix) :])
                squares.setdefault(family, []).append(value * value if math.isfinite(value) else value)
                break
    return {family: FamilyReadings(names[family], squares[family]) for family in names}


# The one inbox of the process: MindFormers' monitors are patched at class level.
INBOX = StateInbox()
