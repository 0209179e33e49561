"""OpenTelemetry instrumentation for MindSpore / MindFormers training, driven by `monitor_config`.

The `monitor_config` article, cited in this package as "the monitor_config article", is
MindSpore Transformers' (MindFormers') tutorial on its built-in monitoring configuration: a
YAML section that declares what to monitor (loss, learning rate, grad norm, step time,
overflow, NPU readings), where it goes (stdout, TensorBoard, JSON lines), alerts with early
stop, and a custom monitor class, with no change to the training network. This package keeps
its keys and makes them OpenTelemetry: spans and metrics with rank and device attributes,
shipped over OTLP to any collector.

Usage
-----
In code::

    from otel_mindformers import MonitorCallback, load_monitor_config

    cfg = load_monitor_config("train_config.yaml")   # the YAML's monitor_config, validated
    model.train(epochs, dataset, callbacks=[MonitorCallback(cfg)])

Without touching the training code::

    OTEL_PYTHON_MINDFORMERS_CONFIG=train_config.yaml opentelemetry-instrument python train.py

or `otel_mindformers.instrument()` once, at the top of the script. A MindFormers `Trainer`
whose YAML says `monitor_config: {enable: True}` is monitored after a plain
`import otel_mindformers` (docs/zero_code.md). Under `msrun`, every rank identifies itself; rank 0 reports training metrics and
every rank its hardware, each to files of its own.

Offline: `otel-mindformers validate CONFIG`, `report`, `plot`, `replay`, `hang-report`,
`capture`, `devices` (`otel-mindformers --help`).

Read on: `MonitorCallback` (what is recorded), docs/configuration.md (every key),
docs/telemetry.md (every name), docs/architecture.md (the package's shape).
"""

import os
from typing import Any

# MindSpore's generated *_pb2 modules load only under protobuf's pure-Python implementation,
# which `import mindspore` selects itself; if the OTLP exporters import protobuf first, the
# C implementation is locked in and `import mindspore` fails. Choose first, as MindSpore would.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

from otel_mindformers.config import ConfigError, MonitorConfig, load_monitor_config
from otel_mindformers.integration.environment_variables import OTEL_PYTHON_MINDFORMERS_CONFIG
from otel_mindformers.integration.instrumentor import MindFormersInstrumentor, instrumentation_disabled
from otel_mindformers.integration.propagation import trace_environment
from otel_mindformers.runtime.custom_monitors import BaseMonitor
from otel_mindformers.timing.phases import phase
from otel_mindformers.version import __version__

# The monitor_config article's `monitor_config` keys in MindFormers YAMLs, `callbacks: - type: MonitorCallback`,
# and the Trainer building its monitoring from `monitor_config`: patched in when (and only
# if) MindFormers is imported, unless OTEL_PYTHON_DISABLED_INSTRUMENTATIONS names `mindformers`.
if not instrumentation_disabled():
    MindFormersInstrumentor().register()


def instrument(
    config: Any = None, *, tracer_provider: Any = None, meter_provider: Any = None, logger_provider: Any = None
) -> None:
    """Monitor every training run of this process without touching the training code.

    What `opentelemetry-instrument` does, from one line of code: each `Model.train` /
    MindFormers `Trainer` run gets exactly one MonitorCallback. `config`: a YAML path, a
    mapping or a MonitorConfig (default: OTEL_PYTHON_MINDFORMERS_CONFIG, else a MindFormers
    YAML's `monitor_config`, else the defaults); kwargs: `tracer_provider`,
    `meter_provider`, `logger_provider` (`monitor_config` keys go in `config`: a keyword of
    its own is a TypeError, not a setting silently dropped).
    """
    providers = {
        "tracer_provider": tracer_provider,
        "meter_provider": meter_provider,
        "logger_provider": logger_provider,
    }
    MindFormersInstrumentor().instrument(
        config=config, **{name: provider for name, provider in providers.items() if provider is not None}
    )


def start(config: Any = None, **kwargs: Any) -> Any:
    """Monitor a custom training loop (the run API, runtime/run_api.py; docs/custom_loops.md)::

        run = otel_mindformers.start("train_config.yaml", optimizer=optimizer)
        for step, (x, y) in enumerate(dataset.create_tuple_iterator(), start=1):
            with run.step(step):
                loss, grads = train_step(x, y)
                run.log(loss=loss, grads=grads)
            if run.should_stop:
                break
        run.end()

    `config`: a YAML path, a mapping or a MonitorConfig; None: `OTEL_PYTHON_MINDFORMERS_CONFIG`'s
    file when set (zero-code), else the defaults. The keyword arguments: `run_api.start`'s.
    """
    from otel_mindformers.runtime.run_api import start as start_run

    named = os.environ.get(OTEL_PYTHON_MINDFORMERS_CONFIG) if config is None else None
    if not named:
        return start_run(config, **kwargs)
    try:
        return start_run(named, **kwargs)
    except ConfigError as exc:  # the launcher's environment chose the file: say which
        raise ConfigError(
            *(f"{OTEL_PYTHON_MINDFORMERS_CONFIG}={named}: {problem}" for problem in exc.problems)
        ) from None


def uninstrument() -> None:
    """Undo `instrument()`: MindSpore's Model gets its own methods back, and MindFormers'
    Trainer again adds a callback only when `monitor_config` says `enable: true`."""
    MindFormersInstrumentor().uninstrument()


def __getattr__(name: str):
    # MonitorCallback imports mindspore (~2 s): load it only when asked for, so the CLI's
    # `validate` and config loading stay fast.
    if name == "MonitorCallback":
        from otel_mindformers.runtime.callback import MonitorCallback

        return MonitorCallback
    if name == "dump_stacks":  # hangs/dumps.py: every thread's stack, on demand (docs/hangs.md)
        from otel_mindformers.hangs.dumps import dump_stacks

        return dump_stacks
    raise AttributeError(f"module 'otel_mindformers' has no attribute {name!r}")


__all__ = [
    "BaseMonitor",
    "ConfigError",
    "MonitorCallback",
    "MonitorConfig",
    "__version__",
    "dump_stacks",
    "instrument",
    "load_monitor_config",
    "phase",
    "start",
    "trace_environment",
    "uninstrument",
]
