"""Capture every Python thread's stack from the interpreter's own frame table.

`sys._current_frames()` is read from whichever thread asks (the stall watchdog, the signal
thread, a caller): no debugger, and no signal is sent to the process, so MindSpore's own
threads are never interrupted. A snapshot is bounded (threads, frames per thread, frames in
all, characters per source line), keeping the innermost frames, which say where a thread is.

Not `faulthandler.dump_traceback(all_threads=True)`: on CPython 3.11 that C walk reads the
thread list without its lock, and crashes the process when a native MindSpore data thread
creates its thread state meanwhile (docs/hangs.md).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import traceback
from dataclasses import dataclass
from typing import Any

from otel_mindformers.compat import mindspore_model
from otel_mindformers.names import phase_names

MAX_THREADS = 32
MAX_FRAMES_PER_THREAD = 40
MAX_FRAMES_TOTAL = 400
MAX_SOURCE_CHARS = 160
# Threads of this package and of the OTel SDK: recorded, but not what a user debugs.
TELEMETRY_THREAD_PREFIXES = ("otel-mindformers", "Otel")

_LIBRARY_DIRS = tuple(
    os.path.normcase(os.path.realpath(p))
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
# This package's own frames (a zero-code wrapper around the user's training call) are not the
# user's code, wherever it is installed: a checkout or an editable install lies outside the
# dirs above, and a dump read elsewhere carries the paths of the machine that wrote it.
_OWN_PACKAGE = f"{os.sep}otel_mindformers{os.sep}"


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    source: str

    def location(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"

    def is_library(self) -> bool:
        """In the standard library (frozen modules too), an installed package, or this one."""
        if self.file.startswith("<") or _OWN_PACKAGE in self.file:
            return True
        return os.path.normcase(os.path.realpath(self.file)).startswith(_LIBRARY_DIRS)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "source": self.source}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Frame:
        return cls(str(data["file"]), int(data["line"]), str(data["function"]), str(data.get("source", "")))


@dataclass(frozen=True)
class ThreadStack:
    """One thread's frames, outermost first (as tracebacks print them)."""

    name: str
    ident: int
    training: bool
    frames: tuple[Frame, ...]
    omitted_frames: int = 0  # outer frames left out by the bounds

    @property
    def telemetry(self) -> bool:
        return self.name.startswith(TELEMETRY_THREAD_PREFIXES)

    def signature(self) -> tuple[tuple[str, int, str], ...]:
        """What "the same stack" means: the code positions, not the thread's name or id."""
        return tuple((f.file, f.line, f.function) for f in self.frames)

    def innermost(self) -> Frame | None:
        return self.frames[-1] if self.frames else None

    def innermost_own_code(self) -> Frame | None:
        """The innermost frame outside the standard library and installed packages."""
        return next((f for f in reversed(self.frames) if not f.is_library()), None)

    def own_code_tail(self, count: int = 2) -> tuple[tuple[Frame, ...], int]:
        """The innermost `count` frames of the user's own code (outer first), and how many
        library frames lie below them: the fewer, the closer that code is to the wait."""
        own = [i for i, f in enumerate(self.frames) if not f.is_library()]
        if not own:
            return (), len(self.frames)
        return tuple(self.frames[i] for i in own[-count:]), len(self.frames) - 1 - own[-1]

    def text(self) -> str:
        role = " (training thread)" if self.training else ""
        lines = [f'Thread "{self.name}"{role}, most recent call last:']
        if self.omitted_frames:
            lines.append(f"  ... {self.omitted_frames} outer frames omitted")
        for frame in self.frames:
            lines.append(f'  File "{frame.file}", line {frame.line}, in {frame.function}')
            if frame.source:
                lines.append(f"    {frame.source}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ident": self.ident,
            "training": self.training,
            "omitted_frames": self.omitted_frames,
            "frames": [f.to_json() for f in self.frames],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ThreadStack:
        return cls(
            name=str(data["name"]),
            ident=int(data["ident"]),
            training=bool(data.get("training")),
            frames=tuple(Frame.from_json(f) for f in data.get("frames", [])),
            omitted_frames=int(data.get("omitted_frames", 0)),
        )


@dataclass(frozen=True)
class Snapshot:
    """Every thread's stack at one moment; the training thread first."""

    threads: tuple[ThreadStack, ...]
    omitted_threads: int = 0

    def training_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.training), None)

    def blocking_own_code(self) -> tuple[ThreadStack, tuple[Frame, ...]] | None:
        """The user's code nearest to where a thread waits: of every thread that is not
        telemetry, the one with the fewest library frames below its own innermost code
        (a data source blocking in a pipeline thread beats the training loop calling
        `model.train`)."""
        best = None
        for thread in self.threads:
            if thread.telemetry:
                continue
            frames, below = thread.own_code_tail()
            if frames and (best is None or below < best[0]):
                best = (below, thread, frames)
        return None if best is None else (best[1], best[2])

    def moved_threads(self, earlier: Snapshot) -> dict[int, bool]:
        """Per thread id present in both snapshots: did its stack change?"""
        before = {t.ident: t.signature() for t in earlier.threads}
        return {t.ident: t.signature() != before[t.ident] for t in self.threads if t.ident in before}

    def text(self, max_chars: int) -> str:
        parts = [t.text() for t in self.threads]
        if self.omitted_threads:
            parts.append(f"... {self.omitted_threads} more threads omitted")
        text = "\n\n".join(parts)
        if len(text) > max_chars:
            text = text[:max_chars] + f"\n... cut at {max_chars} characters"
        return text


def capture(training_ident: int | None, *, skip_current: bool = True) -> Snapshot:
    """Every Python thread's stack now (the asking thread left out when `skip_current`)."""
    current = threading.get_ident()
    known = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    idents = [i for i in frames if not (skip_current and i == current)]
    # The training thread first, then the user's threads, then telemetry threads.
    idents.sort(key=lambda i: (i != training_ident, known.get(i, "").startswith(TELEMETRY_THREAD_PREFIXES), i))
    threads: list[ThreadStack] = []
    budget = MAX_FRAMES_TOTAL
    for ident in idents[:MAX_THREADS]:
        if budget <= 0:
            break
        stack = _thread_stack(
            frames[ident],
            name=known.get(ident, f"native thread {ident}"),
            ident=ident,
            training=ident == training_ident,
            limit=min(MAX_FRAMES_PER_THREAD, budget),
        )
        budget -= len(stack.frames)
        threads.append(stack)
    return Snapshot(tuple(threads), omitted_threads=len(idents) - len(threads))


def _thread_stack(frame: Any, *, name: str, ident: int, training: bool, limit: int) -> ThreadStack:
    walked = list(traceback.walk_stack(frame))  # innermost first
    summary = traceback.StackSummary.extract(walked[:limit], lookup_lines=True)
    kept = [Frame(f.filename, f.lineno or 0, f.name, (f.line or "")[:MAX_SOURCE_CHARS]) for f in reversed(summary)]
    return ThreadStack(name, ident, training, tuple(kept), omitted_frames=max(0, len(walked) - limit))


# --- phase inference, for progress objects that do not say ---------------------------------
def phase_of(marked: str | None, training: ThreadStack | None) -> str:
    """The phase the progress object marks; where it marks none, or only "step", what the
    training thread's stack shows (a step-end-to-step-begin gap is data loading)."""
    if marked and marked != phase_names.PHASE_STEP:
        return marked
    inferred = infer_phase(training)
    if marked == phase_names.PHASE_STEP and inferred == phase_names.PHASE_OUTSIDE_TRAINING:
        return marked
    return inferred


def infer_phase(training: ThreadStack | None) -> str:
    """Where the training thread is, from its innermost recognisable frame (MindSpore's own
    functions and files: compat/mindspore_model.py)."""
    if training is None:
        return phase_names.PHASE_OUTSIDE_TRAINING
    for frame in reversed(training.frames):
        if frame.function in mindspore_model.CHECKPOINT_FUNCTIONS:
            return phase_names.PHASE_CHECKPOINT_SAVE
        if any(marker in frame.file for marker in mindspore_model.DATA_FILES):
            return phase_names.PHASE_DATA_WAIT
        if frame.function in mindspore_model.EVAL_FUNCTIONS:
            return phase_names.PHASE_EVALUATION
        if frame.function in mindspore_model.LOOP_FUNCTIONS:
            return phase_names.PHASE_STEP
    return phase_names.PHASE_OUTSIDE_TRAINING
