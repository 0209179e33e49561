"""OpenTelemetry instrumentation for MindSpore / MindFormers training, driven by `monitor_config`."""

import os

# MindSpore's generated *_pb2 modules load only under protobuf's pure-Python implementation,
# which `import mindspore` selects itself; if the OTLP exporters import protobuf first, the
# C implementation is locked in and `import mindspore` fails. Choose first, as MindSpore would.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.monitor import BaseMonitor
from otel_mindformers.version import __version__


def __getattr__(name: str):
    # MonitorCallback imports mindspore (~2 s): load it only when asked for, so the CLI's
    # `validate` and config loading stay fast.
    if name == "MonitorCallback":
        from otel_mindformers.callback import MonitorCallback

        return MonitorCallback
    raise AttributeError(f"module 'otel_mindformers' has no attribute {name!r}")


__all__ = [
    "BaseMonitor",
    "ConfigError",
    "MonitorCallback",
    "MonitorConfig",
    "__version__",
    "load_monitor_config",
]
