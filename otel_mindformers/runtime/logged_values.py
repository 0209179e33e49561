"""What `run.log` was given (the run API, runtime/run_api.py) → a sampled step's host values.

Runs on sampled steps only, on the training thread, where OutputReader (extract.py) runs for
the callback: the only device readback of the run API's values. The gradients' global norm is
computed on the device here, and only here: one compiled graph, one launch, whatever the
number of gradients (one operation each in PyNative would be one launch each), run from its
compiled phase without `jit`'s per-call wrapper (compat/mindspore_graph.py).
Then every value is read back one after the other: the first readback waits for the device,
the others copy what is ready, so a sampled step synchronises once. The same graph gives each
gradient's squared norm; where they are asked for (`local_norm_format`, MindFormers' key for
its per-parameter norms), the run reads model state and the optimizer names the gradients,
they go to the model-state inbox as per-parameter gradient norms.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mindspore import Tensor

from otel_mindformers.compat import mindspore_graph, mindspore_tensor
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.step_record import LINE_FIELDS
from otel_mindformers.model_state.inbox import INBOX
from otel_mindformers.model_state.state import FamilyReadings
from otel_mindformers.names import training as tm
from otel_mindformers.names.model_state import GRAD_NORM
from otel_mindformers.runtime.extract import LearningRateSource, to_host

_logger = get_logger(__name__)
_NATIVE_TENSOR = mindspore_tensor.NATIVE_TENSOR


class Logged(Protocol):
    """What one step logged (the run API's step scope holds it: no object per step)."""

    loss: Any
    grads: Any
    grad_norm: Any
    lr: Any
    overflow: Any
    loss_scale: Any
    scalars: dict[str, Any] | None
    logged_at: int  # the step whose `log` set them


# The process's compiled graphs (another would compile again): the global norm, and the
# global norm with each gradient's squared norm (per-parameter norms asked for).
_NORM_GRAPHS: dict[bool, Any] = {}


def _global_norm_graph(with_squares: bool) -> Any:
    graph = _NORM_GRAPHS.get(with_squares)
    if graph is not None:
        return graph
    import mindspore
    from mindspore import ops

    if with_squares:

        def norms(grads: Any) -> Any:  # compiled: no import inside
            squares = ops.stack([ops.square(grad.astype(mindspore.float32)).sum() for grad in grads])
            return ops.sqrt(squares.sum()), squares

    else:

        def norms(grads: Any) -> Any:
            return ops.sqrt(ops.addn([ops.square(grad.astype(mindspore.float32)).sum() for grad in grads]))

    compiled = _NORM_GRAPHS[with_squares] = mindspore_graph.compiled(norms)
    return compiled


# Names a custom scalar cannot have: the record's own keys and the monitor's metrics.
_RESERVED = LINE_FIELDS | frozenset(tm.BY_KEY)
_RESERVED_HINTS = {tm.LEARNING_RATE: "the learning rate is run.log(lr=...)"}
_ARGUMENTS = {tm.LEARNING_RATE: "lr"}  # a record key that `run.log` takes under another name


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "asnumpy")


def _gradients(grads: Any) -> bool:
    """A non-empty sequence of tensors: what `run.log(grads=...)` takes."""
    return isinstance(grads, Sequence) and bool(grads) and all(_is_tensor(grad) for grad in grads)


class LoggedReader:
    """A sampled step's values from what `run.log` was given: the keys `wanted` names (the
    monitored metrics of a reporting rank, or the first bad rank's loss, norm and overflow),
    and every custom scalar. A value that cannot be read is left out with one warning naming
    it; training goes on."""

    def __init__(
        self,
        wanted: frozenset[str],
        optimizer: Any,
        *,
        step_now: Callable[[], int],
        custom_scalars: bool = True,
        per_parameter: bool = False,
        grad_norm_asked: bool = False,
    ) -> None:
        """`step_now`: the step being read (a learning-rate schedule given as `lr` is evaluated
        at it; asked only then, so a sampled step's common path pays nothing for it).
        `grad_norm_asked`: `grad_monitor: True` on a rank that reports it; a loop that logs no
        gradients is told once."""
        self._wanted = wanted
        self._per_parameter_norms = per_parameter
        self._optimizer = optimizer
        self._custom = custom_scalars
        self.reads_anything = bool(wanted) or custom_scalars
        self._learning_rate: LearningRateSource | None = None
        self._names: tuple[str, ...] | None = None  # the optimizer's parameters: the gradients' names
        self._step_now = step_now
        self._warned: set[str] = set()
        # Checked at the first logged step read: the last step `end()` samples has no gradients.
        self._check_norm_given = grad_norm_asked

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _logger.warning("otel_mindformers: " + message, *args)

    def read(self, view: Any, step: int) -> dict[str, float | bool]:
        """The host values of step `step` (the view's `net_outputs` is what was logged)."""
        logged: Logged | None = view.get("net_outputs")
        if logged is None or logged.logged_at != step:
            if logged is not None and logged.logged_at > 0 and self._custom:
                self._warn_once(
                    "unlogged", "step %d was sampled but run.log(...) was not called in it (last in step %d): "
                    "it is recorded without its values. A run.log inside a mindspore.jit function runs only "
                    "while the function compiles: call it after the compiled step, with what the step returns",
                    step, logged.logged_at,
                )  # fmt: skip
            return {}
        wanted = self._wanted
        handles: list[tuple[str, Any]] = []
        for key, value in (
            (tm.LOSS, logged.loss), (tm.GRAD_NORM, logged.grad_norm), (tm.LEARNING_RATE, logged.lr),
            (tm.OVERFLOW, logged.overflow), (tm.LOSS_SCALE, logged.loss_scale),
        ):  # fmt: skip
            if value is not None and key in wanted:
                handles.append((key, value))
        if self._check_norm_given:
            self._check_norm_given = False
            if tm.GRAD_NORM in wanted and logged.grad_norm is None and logged.grads is None:
                self._warn_once(
                    "no_grads", "grad_monitor is on but run.log(...) got neither grads= nor grad_norm= (step %d): "
                    "grad_norm is not reported. Return the gradients from the train step and log them "
                    "(run.log(loss=loss, grads=grads)), or log grad_norm=...; or set grad_monitor: false", step,
                )  # fmt: skip
        squares = None
        if tm.GRAD_NORM in wanted and logged.grad_norm is None and logged.grads is not None:
            if self._per_parameter_norms and INBOX.open:  # open: this rank reads model state
                norms = self._grads_norm(logged.grads, with_squares=True)
                if norms is not None:
                    handles.append((tm.GRAD_NORM, norms[0]))
                    squares = norms[1]
            else:
                norm = self._grads_norm(logged.grads)
                if norm is not None:
                    handles.append((tm.GRAD_NORM, norm))
        if tm.LEARNING_RATE in wanted and logged.lr is None and self._optimizer is not None:
            rate = self._optimizer_rate(step)
            if rate is not None:
                handles.append((tm.LEARNING_RATE, rate))
        if self._custom and logged.scalars:
            handles.extend(self._custom_scalars(logged.scalars))
        values: dict[str, float | bool] = {}
        for key, handle in handles:
            # The common value inline (a MindSpore tensor whose data is made): a frame less
            # each, after a PyNative step every one cold. Any other, or a failed read: `_host`.
            if isinstance(handle, _NATIVE_TENSOR) and handle.init is None:
                try:
                    value = float(mindspore_tensor.read_scalar(handle))
                except Exception:
                    value = self._host(key, handle)
            else:
                value = self._host(key, handle)
            if value is not None:
                values[key] = bool(value) if key == tm.OVERFLOW and math.isfinite(value) else value
        if squares is not None:
            self._per_parameter(squares, step)
        return values

    def _custom_scalars(self, scalars: dict[str, Any]) -> list[tuple[str, Any]]:
        """The custom scalars whose names the record does not use itself (one warning each
        other name: written, it would overwrite the record's step, time or a metric)."""
        kept = []
        for key, value in scalars.items():
            if key in _RESERVED:
                hint = _RESERVED_HINTS.get(key, "give the custom scalar another name")
                self._warn_once(
                    f"reserved:{key}", "run.log(%s=...): %r is a name the monitor records itself: the custom scalar "
                    "is left out (%s)", key, key, hint,
                )  # fmt: skip
                continue
            kept.append((key, value))
        return kept

    def _per_parameter(self, squares: Any, step: int) -> None:
        """The gradients' squared norms, named by the optimizer's parameters, into the inbox."""
        if self._names is None:
            parameters = getattr(self._optimizer, "parameters", None) or ()
            self._names = tuple(str(getattr(p, "name", p)) for p in parameters)
        if len(self._names) != squares.size:
            self._warn_once(
                "names", "run.log(grads=...) has %d gradients but the optimizer %d parameters: per-parameter "
                "gradient norms are not reported", squares.size, len(self._names),
            )  # fmt: skip
            return
        try:
            INBOX.put_family(GRAD_NORM, FamilyReadings(self._names, squares.asnumpy()), step)
        except Exception as exc:  # a readback that fails: no per-parameter norms, the run goes on
            self._warn_once("squares", "cannot read the gradients' per-parameter norms: %s", exc)

    def _host(self, key: str, handle: Any) -> float | None:
        """One value read back: a number (Python's, numpy's) or a one-element tensor or array.
        Anything else (a bigger tensor, a string, a list) is left out, with one warning. A
        MindSpore tensor, the common case, is read first and its size asked only when the read
        fails: after a PyNative step every call here runs cold (docs/performance.md)."""
        try:
            # A MindSpore tensor or a Parameter (a learning rate), told by a C check (against
            # `Tensor`, a Parameter costs an ABC's Python call); `init` set: data not made yet.
            if isinstance(handle, _NATIVE_TENSOR):
                if handle.init is None:
                    try:
                        return float(mindspore_tensor.read_scalar(handle))
                    except ValueError:  # more than one element: said below
                        if handle.size == 1:
                            raise
                elif handle.size == 1:
                    return to_host(handle)
            elif isinstance(handle, (bool, int, float)):
                return float(handle)
            elif _is_tensor(handle):  # a tensor of another kind
                if handle.size == 1:
                    return to_host(handle)
            elif isinstance(handle, numbers.Real):  # numpy's numbers
                return float(handle)
            elif getattr(handle, "size", None) == 1 and hasattr(handle, "dtype"):  # numpy's one-element arrays
                return to_host(handle)
            elif key == tm.LEARNING_RATE and callable(handle):  # `lr=optimizer.learning_rate`, a schedule
                rate = self._schedule_rate(handle)
                return None if rate is None else self._host(key, rate)
        except Exception as exc:  # any value of any kind: left out, never raised
            self._warn_once(
                f"read:{key}", "run.log(%s=...): cannot read %r: %s", _ARGUMENTS.get(key, key), type(handle).__name__,
                exc,
            )  # fmt: skip
            return None
        self._warn_once(
            f"shape:{key}", "run.log(%s=...) takes a scalar (a one-element tensor or a number); got %s: %s is left "
            "out of the records%s", _ARGUMENTS.get(key, key), _describe_value(handle), key, _aux_hint(key, handle),
        )  # fmt: skip
        return None

    def _grads_norm(self, grads: Any, with_squares: bool = False) -> Any:
        """The global L2 norm of `grads` on the device (a tensor; with `with_squares`, and
        each one's squared norm: two tensors), or None with one warning when `grads` is not a
        sequence of tensors. `value_and_grad`'s tuple goes straight to the graph; what is not
        gradients is told apart only when the graph cannot take it."""
        kind = grads.__class__
        if (kind is not tuple and kind is not list or not grads) and not _gradients(grads):
            self._not_gradients(grads)
            return None
        try:
            # The compiled graph without a call where it is made already.
            return (_NORM_GRAPHS.get(with_squares) or _global_norm_graph(with_squares))(grads)
        except Exception as exc:  # not gradients, or a graph MindSpore cannot compile here: no norm
            if not _gradients(grads):
                self._not_gradients(grads)
                return None
            self._warn_once("norm", "cannot compute the gradients' global norm: %s", exc)
            return None

    def _not_gradients(self, grads: Any) -> None:
        self._warn_once(
            "grads", "run.log(grads=...) takes the sequence of gradient tensors value_and_grad returns; got %s: "
            "grad_norm is not reported from it", _describe(grads),
        )  # fmt: skip

    def _schedule_rate(self, schedule: Any) -> Any:
        """A learning-rate schedule's rate at this step: the optimizer's own schedule as the
        optimizer used it (its update count), another at the job's step."""
        step = self._step_now()
        if schedule is getattr(self._optimizer, "learning_rate", None):
            return self._optimizer_rate(step)
        from mindspore import int32

        return schedule(Tensor(step - 1, int32))

    def _optimizer_rate(self, step: int) -> Any:
        """The rate the optimizer used at this step (extract.py's LearningRateSource)."""
        try:
            if self._learning_rate is None:
                self._learning_rate = LearningRateSource(self._optimizer)
            source = self._learning_rate
            return source.constant if source.constant is not None else source.tensor(step - 1)
        except Exception as exc:  # an exotic schedule: no lr, not a failed run
            self._warn_once(tm.LEARNING_RATE, "cannot evaluate the optimizer's learning rate: %s", exc)
            return None


def _aux_hint(key: str, value: Any) -> str:
    """Where a loss is the `(loss, aux)` pair of `value_and_grad(..., has_aux=True)`: how to
    take the loss out of it (MindSpore's quick start returns `(loss, logits)`)."""
    if key != tm.LOSS or not isinstance(value, (tuple, list)) or len(value) < 2:
        return ""
    if getattr(value[0], "size", None) != 1:
        return ""
    return (
        ". value_and_grad(..., has_aux=True) returns ((loss, aux), grads): log the loss alone "
        "((loss, _), grads = grad_fn(...))"
    )


def _describe_value(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple):
        return f"a {'tensor' if _is_tensor(value) else type(value).__name__} of shape {shape}"
    return f"a {type(value).__name__} ({reprlib.repr(value)})"


def _describe(value: Any) -> str:
    if isinstance(value, Sequence) and not isinstance(value, str):
        kinds = sorted({type(item).__name__ for item in value})
        return f"a {type(value).__name__} of {len(value)} ({', '.join(kinds) or 'nothing'})"
    return f"a {type(value).__name__}"


__all__ = ["Logged", "LoggedReader"]
