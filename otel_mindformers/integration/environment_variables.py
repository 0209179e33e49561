"""Environment variables read by the zero-code instrumentation.

Registered under the `opentelemetry_environment_variables` entry point, so
`opentelemetry-instrument --mindformers_config monitor.yaml` sets the first one.
"""

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
inherits it as TRACEPARENT / TRACESTATE (otel_mindformers/propagation.py). Off by default.
"""
