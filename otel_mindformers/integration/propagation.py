"""Outgoing trace context: child processes continue the trace of the span that started them.

The OpenTelemetry environment-carrier convention: the W3C `traceparent` / `tracestate` (and
`baggage`) headers travel as the environment variables TRACEPARENT / TRACESTATE / BAGGAGE,
which the child reads as our ranks read the launcher's (runtime/parts.py launcher_context).

- `trace_environment()` gives those variables for the current span, for code that starts
  processes itself: `subprocess.run(cmd, env={**os.environ, **trace_environment()})`.
- With OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT=true, the `mindformers` instrumentor's
  `register()` (run by `import otel_mindformers`) wraps `subprocess.Popen` so that every
  child started while a span is current (a phase, a checkpoint save) gets them too, and
  `unregister()` removes the wrapper. Off by default: it changes every child's environment.
  Variables the caller's own `env` sets win.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate

from otel_mindformers.integration.environment_variables import OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT
from otel_mindformers.integration.patches import Patches


def trace_environment(context: otel_context.Context | None = None) -> dict[str, str]:
    """The environment variables that carry `context` (default: the current one) to a child
    process: TRACEPARENT, TRACESTATE, BAGGAGE, or whatever the configured propagators
    (OTEL_PROPAGATORS) write, upper-cased. Empty when no span is current."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return {re.sub(r"[^A-Z0-9_]", "_", key.upper()): value for key, value in carrier.items()}


def subprocess_context_requested() -> bool:
    return os.environ.get(OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT, "").strip().lower() == "true"


def _with_trace_environment(wrapped: Callable, _instance: Any, args: tuple, kwargs: dict) -> Any:
    extra = trace_environment()
    if extra:
        # Popen(args, bufsize, executable, stdin, stdout, stderr, preexec_fn, close_fds,
        # shell, cwd, env, ...): `env` is the eleventh positional parameter.
        if len(args) > 10:
            args = (*args[:10], _merged(args[10], extra), *args[11:])
        else:
            kwargs = {**kwargs, "env": _merged(kwargs.get("env"), extra)}
    return wrapped(*args, **kwargs)


def _merged(env: Any, extra: dict[str, str]) -> Any:
    if env is None:
        return {**os.environ, **extra}
    if any(isinstance(key, bytes) for key in env):
        return env  # a bytes environment is left as the caller built it
    merged = dict(env)
    for key, value in extra.items():
        # A value the caller set on purpose wins; one copied from our own environment (the
        # launcher's TRACEPARENT, say) gives way to the current span.
        if merged.get(key) in (None, os.environ.get(key)):
            merged[key] = value
    return merged


def patch_subprocess() -> Patches:
    """Wrap `subprocess.Popen` (and so `run`, `call`, `check_output`); `undo()` restores it."""
    patches = Patches()
    patches.wrap(subprocess.Popen, "__init__", _with_trace_environment)
    return patches


__all__ = ["patch_subprocess", "subprocess_context_requested", "trace_environment"]
