"""The run's side of the model state: on sampled steps only, the 7-tuple's local norms
(one readback) and what MindFormers' monitors put in the inbox since the last sample."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_mindformers.config import GradNorm
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.model_state.inbox import INBOX
from otel_mindformers.model_state.parameters import ParameterFilter
from otel_mindformers.model_state.state import FamilyReadings, ModelState
from otel_mindformers.names.model_state import GRAD_NORM, PARAMETER_SERIES_CAP
from otel_mindformers.runtime.extract import local_norm_squares

_logger = get_logger(__name__)

_NOTHING: dict[str, float] = {}  # read only (the caller merges it when not empty)


def parameter_filter(native: Mapping[str, Any]) -> ParameterFilter:
    """MindFormers' `monitor_config.target` / `invert` (a list of regexes, or one)."""
    target = native.get("target")
    if isinstance(target, str):
        target = [target]
    return ParameterFilter(target, bool(native.get("invert")), PARAMETER_SERIES_CAP)


def weight_names(train_network: Any) -> tuple[str, ...]:
    """Names of the gradients a train cell computes, in its order (`TrainOneStepCell.weights`)."""
    weights = getattr(train_network, "weights", None)
    if weights is None and hasattr(train_network, "trainable_params"):
        weights = train_network.trainable_params()
    return tuple(str(getattr(w, "name", w)) for w in weights or ())


class StateReader:
    """Opened at run start (the inbox keeps readings only while a run is open), closed at its end.
    `reads_outputs`: a sampled step's outputs may hold local norms (MindFormers' 7-tuple);
    without them and with nothing in the inbox (`INBOX.written`), `read` has nothing to read and
    the run does not call it (runtime/run.py: a frame less on every sampled step)."""

    def __init__(self, selection: ParameterFilter, read_local_norms: bool) -> None:
        self._selection = selection
        self.reads_outputs = read_local_norms
        self._names: tuple[str, ...] | None = None
        self._warned = False
        INBOX.open_run()

    @classmethod
    def start(cls, native: Mapping[str, Any], grad_norm: GradNorm, train_cell: bool) -> StateReader:
        """`train_cell`: the loop runs a train cell (`Model.train`), whose outputs may hold
        local norms; a custom loop's `run.log` values never do."""
        return cls(parameter_filter(native), read_local_norms=train_cell and grad_norm is not GradNorm.OFF)

    def read(self, cb_params: Any, after_step: int) -> tuple[dict[str, float], ModelState | None]:
        """The routed scalar metrics and the model state of the steps after `after_step`
        (None when nothing was read: the common case costs two checks)."""
        squares = None
        if self.reads_outputs:
            outputs = cb_params.get("net_outputs")
            # Only the 7-tuple carries local norms (checked here: every call is cold inside
            # Model.train, and most runs have neither local norms nor inbox readings).
            if isinstance(outputs, (tuple, list)) and len(outputs) == 7:
                squares = local_norm_squares(outputs)
        if squares is None and not INBOX.written:  # most runs, most steps
            return _NOTHING, None
        scalars, state = INBOX.take(after_step)
        state.selection = self._selection
        if squares is not None:
            if self._names is None:
                self._names = weight_names(cb_params.get("train_network"))
            if len(self._names) == squares.size:
                state.families[GRAD_NORM] = FamilyReadings(self._names, squares)
            elif not self._warned:
                self._warned = True
                _logger.warning(
                    "otel_mindformers: the step outputs hold %d local norms but the train "
                    "network has %d weights; per-parameter gradient norms are not reported",
                    squares.size,
                    len(self._names),
                )
        return scalars, state

    def close(self) -> None:
        INBOX.close_run()
