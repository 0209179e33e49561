"""The one lifecycle of a run's parts (telemetry, devices, alerts, stacks, captures, restarts,
logs, the model-state reader, the pipeline...).

MonitorRun starts its parts in their order (runtime/assembly.py) and keeps the ones that
started. At the run's end it calls every part's `end`, last started first, while everything
is still up (the run's outcome written down: the pipeline drained, the attempt closed, the run
span ended, the notice sent); then every part's `close`, in the same order, which releases
what the part holds (threads, handlers, files, providers). A start that fails ends and closes
what started before it the same way.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable

from otel_mindformers.core.one_line import one_line
from otel_mindformers.core.step_record import StepRecord

Remaining = Callable[[], float]  # seconds left of the run's shutdown deadline


@dataclasses.dataclass
class RunEnding:
    """How the run ended, handed to every part's `end` (training thread, at train end).
    The outcome is read when asked: a rule may still ask to stop while the pipeline drains."""

    error: BaseException | None
    last_step: int
    ended_at: float | None  # perf seconds at train end; None when the start failed
    remaining: Remaining  # seconds left of the shutdown deadline
    stop_reason: Callable[[], str | None]  # the stop the run was asked for, if any
    job_line: str | None = None  # the end-of-run notice's line about the job (the attempt's part sets it)

    @property
    def outcome(self) -> str:
        return self._outcome()[0]

    @property
    def reason(self) -> str | None:
        return self._outcome()[1]

    def _outcome(self) -> tuple[str, str | None]:
        if self.error is not None:
            return outcome_of_error(self.error)
        reason = self.stop_reason()
        return ("stopped", reason) if reason is not None else ("completed", None)


def outcome_of_error(error: BaseException) -> tuple[str, str]:
    """How a run that an exception ended is written down: Ctrl-C, and an exit on purpose (a
    scheduler's SIGTERM whose handler saves a checkpoint and calls `sys.exit(143)`, or
    `sys.exit(0)`), stopped the run; anything else crashed it."""
    if isinstance(error, KeyboardInterrupt):
        return "stopped", "interrupted (KeyboardInterrupt: Ctrl-C or SIGINT)"
    if isinstance(error, SystemExit):
        code = error.code
        if code is None or code == 0:
            return "stopped", f"the process exited (sys.exit({code!r}))"
        # A shell's convention: 128 + N is "ended by signal N".
        if isinstance(code, int) and 128 < code < 128 + signal.NSIG:
            try:
                name = signal.Signals(code - 128).name
            except ValueError:  # a number no signal has
                pass
            else:
                return "stopped", f"the process exited on {name} (sys.exit({code}))"
    return "crashed", one_line(f"{type(error).__name__}: {error}")


class RunPart:
    """One part of a run. Every hook is optional; the run calls only those a part defines.

    - `on_first_step(begin, end)`: the run's first step ended (training thread, once);
    - `on_record(record)`: a sampled step's record, its time accounted (pipeline worker);
    - `on_checkpoint(step, seconds)`: a checkpoint of `step` was saved (training thread);
    - `end(ending)`: the run ended (training thread; before any part closes);
    - `close(remaining)`: release what the part holds within `remaining()` seconds.
    """

    def on_first_step(self, begin: float, end: float) -> None:
        pass

    def on_record(self, record: StepRecord) -> None:
        pass

    def on_checkpoint(self, step: int, seconds: float) -> None:
        pass

    def end(self, ending: RunEnding) -> None:
        pass

    def close(self, remaining: Remaining) -> None:
        pass


def defines(part: RunPart, hook: str) -> bool:
    """Whether `part` overrides `hook`: the run calls only those, so a hook costs nothing
    to the parts that do not need it."""
    return getattr(type(part), hook) is not getattr(RunPart, hook)


__all__ = ["Remaining", "RunEnding", "RunPart", "defines", "outcome_of_error"]
