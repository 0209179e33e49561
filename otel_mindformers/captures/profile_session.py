"""MindSpore's profiler for N steps, started and stepped at step boundaries.

`mindspore.profiler.profile` with a one-shot schedule (active = N) and
`tensorboard_trace_handler`: the N `step()` calls after `start()` are captured, and the
last one hands the analysis to a process of its own (`async_mode`), or leaves the raw data
(`analyse_flag=False`, `analysis: deferred`). What start and the last step() cost, with
async analysis and without: docs/captures.md.

The profiler is process-wide state: the caller runs one session at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otel_mindformers.compat import profiler as profiler_api
from otel_mindformers.compat.lookup import ApiNotFound


class ProfilerUnavailable(Exception):
    """The profiler cannot be imported, or it started without writing anything."""


def load_profiler() -> Any:
    """The `mindspore.profiler` module, or ProfilerUnavailable saying why not (the release
    and the missing name: compat/profiler.py)."""
    try:
        return profiler_api.load_profiler()
    except ApiNotFound as exc:  # an older or newer MindSpore, a broken install
        raise ProfilerUnavailable(f"mindspore.profiler is unavailable ({exc})") from exc


class ProfileSession:
    """One capture: `start(...)` at a step's end, then `step()` at each following step's
    end; the N-th returns True (the capture is complete)."""

    def __init__(self, prof: Any, steps: int) -> None:
        self._prof = prof
        self.left = steps

    @classmethod
    def start(
        cls, profiler: Any, out_dir: Path, steps: int, *, analyse: bool, device_target: str | None, metadata: str
    ) -> ProfileSession:
        activities = [profiler.ProfilerActivity.CPU]
        if device_target == "Ascend":
            activities.append(profiler.ProfilerActivity.NPU)
        elif device_target == "GPU":
            activities.append(profiler.ProfilerActivity.GPU)
        try:
            prof = profiler.profile(
                activities=activities,
                start_profile=False,
                schedule=profiler.schedule(wait=0, warmup=0, active=steps, repeat=1, skip_first=0),
                on_trace_ready=profiler.tensorboard_trace_handler(
                    dir_name=str(out_dir), analyse_flag=analyse, async_mode=True
                ),
            )
            prof.add_metadata_json("otel_capture", metadata)
            prof.start()
        except Exception as exc:
            raise ProfilerUnavailable(f"the profiler failed to start ({type(exc).__name__}: {exc})") from exc
        # A folder it cannot create is logged by MindSpore, not raised: look for its output.
        if not any(out_dir.glob("*_ascend_ms")):
            _stop_quietly(prof)
            raise ProfilerUnavailable(f"the profiler wrote nothing under {out_dir} (see MindSpore's log)")
        return cls(prof, steps)

    def step(self) -> bool:
        self._prof.step()
        self.left -= 1
        if self.left > 0:
            return False
        # The schedule has saved its N steps; stopping now only marks the profile stopped.
        # Left started, MindSpore stops it whenever the object is collected, on any thread,
        # and warns "profile is stopped at the end of the program" (or, at exit, "not
        # stopped ... may be incomplete") about a capture that is complete.
        _stop_quietly(self._prof)
        return True

    def abandon(self) -> None:
        _stop_quietly(self._prof)


def _stop_quietly(prof: Any) -> None:
    try:
        prof.stop()
    except Exception:  # already stopped, or never started: nothing to undo
        pass
