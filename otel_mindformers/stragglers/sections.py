"""A sampled window's wall time on one rank, split into sections (names/straggler_names.py).

The window runs from the previous sample's end to this one's, `steps` steps long. Its data
wait is the gaps between steps less the phases inside them (timeline.py); the phases that
ended in the window (checkpoint saves, evaluations, user phases) reach the accounting
through the same queue before the window's record. What is left is the time inside the
steps: compute and communication as one figure, since host clocks cannot split them
(in synchronous data parallelism it includes the wait for the slowest rank inside the
gradient all-reduce; docs/stragglers.md says what can split it).
"""

from __future__ import annotations

from otel_mindformers.names import phase_names
from otel_mindformers.names import straggler_names as names

_PHASE_SECTIONS = {
    phase_names.PHASE_CHECKPOINT_SAVE: names.SECTION_CHECKPOINT,
    phase_names.PHASE_CHECKPOINT_LOAD: names.SECTION_CHECKPOINT,
    phase_names.PHASE_EVALUATION: names.SECTION_EVALUATION,
}
# The JSON line's `sections` object: seconds by section, with the window's length and steps.
WINDOW_KEY = "window"
STEPS_KEY = "steps"


def section_of_phase(phase: str) -> str:
    return _PHASE_SECTIONS.get(phase, names.SECTION_OTHER)


class WindowSections:
    """Phase seconds of the window being filled (pipeline worker), and the split at its end."""

    def __init__(self) -> None:
        self._phases: dict[str, float] = {}

    def phase(self, phase: str, seconds: float) -> None:
        section = section_of_phase(phase)
        self._phases[section] = self._phases.get(section, 0.0) + max(0.0, seconds)

    def close(self, steps: int, elapsed: float, data_wait: float) -> dict[str, float]:
        """The window's sections (seconds), with `window` (its wall seconds) and `steps`."""
        phases, self._phases = self._phases, {}
        data_wait = min(max(0.0, data_wait), elapsed)
        in_step = max(0.0, elapsed - data_wait - sum(phases.values()))
        sections = {names.SECTION_DATA_WAIT: data_wait, names.SECTION_IN_STEP: in_step}
        sections.update(phases)
        sections[WINDOW_KEY] = elapsed
        sections[STEPS_KEY] = float(steps)
        return sections


__all__ = ["STEPS_KEY", "WINDOW_KEY", "WindowSections", "section_of_phase"]
