"""Our own log messages, which must never stop training.

`logger.warning(...)` runs every handler and filter of the logger and its ancestors on the
calling thread, and an exception raised by one of them (a user's handler that raises, a
filter with a bug) propagates into the caller: into `model.train` when the call is made
from a training-thread hook, or out of a worker thread's loop. Handlers derived from
`logging.Handler` that catch their own errors are fine; nothing forces a user's to.

Every module of the package logs through `get_logger(__name__)`: the same stdlib logger
(same name, level, handlers and records), behind methods that swallow what a handler
raises. The first such exception in a process is reported once on stderr.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

_reported = False
# Keys of the process's warnings said once (a file's problem, warned about by whichever
# thread or run meets it first).
_said: set[str] = set()
_said_lock = threading.Lock()


def _report_once(exc: BaseException) -> None:
    global _reported
    if _reported:
        return
    _reported = True
    try:
        sys.stderr.write(
            f"otel_mindformers: a logging handler raised {type(exc).__name__}: {exc}; "
            "otel_mindformers' own messages skip it from now on rather than stop training\n"
        )
    except Exception:  # no usable stderr either: nothing more to do
        pass


class GuardedLogger:
    """The stdlib logger's logging methods, each unable to raise (other attributes are the
    logger's own)."""

    __slots__ = ("logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        self._log(level, msg, args, kwargs)

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._log(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._log(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._log(logging.WARNING, msg, args, kwargs)

    def warning_once(self, key: str, msg: object, *args: Any) -> None:
        """`warning`, the first time this process meets `key` (a file's path, say)."""
        with _said_lock:
            if key in _said:
                return
            _said.add(key)
        self._log(logging.WARNING, msg, args, {})

    def error(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._log(logging.ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exc_info", True)
        self._log(logging.ERROR, msg, args, kwargs)

    def _log(self, level: int, msg: object, args: tuple, kwargs: dict[str, Any]) -> None:
        logger = self.logger
        if not logger.isEnabledFor(level):
            return
        # The record names the caller of warning() & co., not this module.
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2
        try:
            logger.log(level, msg, *args, **kwargs)
        except Exception as exc:  # a handler or filter that raises: never into our caller
            _report_once(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


def get_logger(name: str) -> GuardedLogger:
    return GuardedLogger(logging.getLogger(name))


__all__ = ["GuardedLogger", "get_logger"]
