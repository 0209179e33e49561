"""`SIGUSR1` → a stack dump, served by a background thread.

Installed from the main thread whenever a run is monitored (the `MindformersRankStoppedFirst`
runbook tells operators to send `SIGUSR1`, and without a handler the signal ends the process).
A handler the user had is kept: ours calls it after asking for the dump. `stop()` puts back
what was there. A Python signal handler runs only when the main thread next
executes Python code, which a rank stuck inside a C call (a collective, a data queue) never
does. So the signal is also routed through `signal.set_wakeup_fd` (when no one else uses
it): the interpreter's C-level handler writes the signal number to our pipe at once, and
our thread dumps while the main thread is still blocked.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

_STOP_BYTE = 0


class SignalTrigger:
    """Calls `action()` on its own thread each time the process receives `SIGUSR1`."""

    def __init__(self, action: Callable[[], object]) -> None:
        self._action = action
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._previous_handler = signal.getsignal(signal.SIGUSR1)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._owns_wakeup_fd = self._previous_wakeup_fd == -1
        if not self._owns_wakeup_fd:  # someone else's (asyncio): give it back, use our handler
            signal.set_wakeup_fd(self._previous_wakeup_fd)
        signal.signal(signal.SIGUSR1, self._on_signal)
        self._thread = threading.Thread(target=self._run, name="otel-mindformers-signals", daemon=True)
        self._thread.start()

    @classmethod
    def install(cls, action: Callable[[], object]) -> SignalTrigger | None:
        """The trigger, or None where it cannot be installed (not the main thread, or no
        SIGUSR1 on this platform)."""
        if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
            return None
        return cls(action)

    def _on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        # With the wakeup fd, the interpreter has already written the signal number to our
        # pipe; this handler replaces the default action (which ends the process) and then
        # runs the handler the user had, if any.
        if not self._owns_wakeup_fd:
            try:
                os.write(self._write_fd, bytes([signal.SIGUSR1]))
            except OSError:  # pipe full: a dump is already pending
                pass
        previous = self._previous_handler
        if callable(previous):
            previous(_signum, _frame)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data or _STOP_BYTE in data:
                return
            if signal.SIGUSR1 in data:
                self._action()

    def stop(self) -> None:
        """Restore the previous handler and wakeup fd. Off the main thread Python forbids
        that: the trigger then stays installed (harmless) and its thread keeps running."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGUSR1) == self._on_signal:
            signal.signal(signal.SIGUSR1, self._previous_handler)
        if self._owns_wakeup_fd:
            current = signal.set_wakeup_fd(-1)
            if current != self._write_fd:  # someone replaced ours meanwhile: keep theirs
                signal.set_wakeup_fd(current)
        try:
            os.write(self._write_fd, bytes([_STOP_BYTE]))
        except OSError:
            pass
        self._thread.join(1.0)
        if not self._thread.is_alive():  # never close an fd a running thread may still read
            os.close(self._read_fd)
            os.close(self._write_fd)
