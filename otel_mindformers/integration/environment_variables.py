"""Environment variables read by the zero-code instrumentation.

Registered under the `opentelemetry_environment_variables` entry point, so
`opentelemetry-instrument --mindformers_config monitor.yaml` sets the first one.

That command loads this module before it parses its flags and then replaces itself with the
user's command, so the flag is gone by the time the instrumentor could name it in an error.
Loaded there, this module records the variable's value of that moment in
`CONFIG_BEFORE_FLAGS`: a process that sees another value got it from the flag.
"""

import os
import sys

OTEL_PYTHON_MINDFORMERS_CONFIG = "OTEL_PYTHON_MINDFORMERS_CONFIG"
"""
.. envvar:: OTEL_PYTHON_MINDFORMERS_CONFIG

A YAML file with a `monitor_config` section (or the section itself) for the callback the
instrumentor injects. Unset: a MindFormers YAML's own `monitor_config`, else the defaults.
"""

OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT = "OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT"
"""
.. envvar:: OTEL_PYTHON_MINDFORMERS_SUBPROCESS_CONTEXT

`true`: every child process started while a span is current (a phase, a checkpoint save)
inherits it as TRACEPARENT / TRACESTATE (integration/propagation.py). Off by default.
"""

# Not OTEL_-prefixed module attributes: opentelemetry-instrument makes a flag of each of those.
CONFIG_FLAG = "mindformers_config"
CONFIG_BEFORE_FLAGS = "_OTEL_MINDFORMERS_CONFIG_BEFORE_FLAGS"

if sys.argv and os.path.basename(sys.argv[0]) == "opentelemetry-instrument":
    os.environ[CONFIG_BEFORE_FLAGS] = os.environ.get(OTEL_PYTHON_MINDFORMERS_CONFIG, "")
