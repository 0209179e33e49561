"""The `mindformers` distro and configurator for `opentelemetry-instrument`.

`opentelemetry-instrument` runs, in order: the distro, the configurator (which builds the
SDK from the OTEL_* variables and so imports the OTLP exporters, and protobuf with them),
then the instrumentors. MindSpore's generated *_pb2 modules load only under protobuf's
pure-Python implementation, which is fixed when protobuf is first imported; loading this
module imports `otel_mindformers`, which chooses it (unless the environment already did),
before the configurator runs. `import mindspore` would be too late.

Like opentelemetry-distro, it also defaults the exporters to OTLP, and it adds the
`mindformers` resource detector, so every rank's resource says who it is in the job.
Spans and logs over OTLP/gRPC default to `otlp_in_place` (telemetry/otlp_wire_encoder.py): the
SDK's exporters and bytes, at a thirtieth of their encoding CPU; over `http/json`, the JSON
exporters (`otlp_json_http`). Where several distros are installed,
`OTEL_PYTHON_DISTRO=mindformers` picks this one.

With `OTEL_CONFIG_FILE` set, the configurator configures the SDK from that file
(telemetry/config_file.py: our resource attributes added, our instrumentor's options taken
out for it). A file that cannot be used (opentelemetry-configuration missing, a file that
does not load) is one error, said here, and the instrumentors still load, ours refusing to
train: the SDK's own configurator would raise, and `opentelemetry-instrument` would then
skip every instrumentor and let the script train with nothing exported.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from opentelemetry.environment_variables import (
    OTEL_LOGS_EXPORTER,
    OTEL_METRICS_EXPORTER,
    OTEL_TRACES_EXPORTER,
)
from opentelemetry.instrumentation.distro import BaseDistro
from opentelemetry.sdk._configuration import _OTelSDKConfigurator
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPERIMENTAL_RESOURCE_DETECTORS,
    OTEL_EXPORTER_OTLP_LOGS_PROTOCOL,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    OTEL_EXPORTER_PROMETHEUS_PORT,
)

from otel_mindformers.config import ConfigError
from otel_mindformers.config.limits import PROMETHEUS_PORT
from otel_mindformers.integration.instrumentor import file_problem_said
from otel_mindformers.job.identity import detect_identity, runs_no_training
from otel_mindformers.telemetry import config_file

RESOURCE_DETECTOR = "mindformers"
# Our `opentelemetry_traces_exporter` and `opentelemetry_logs_exporter` entry points: the
# SDK's OTLP/gRPC exporters, sending the requests telemetry/otlp_wire_encoder.py writes.
IN_PLACE_EXPORTER = "otlp_in_place"

# opentelemetry-exporter-otlp-json-http's entry points: the SDK's `otlp` exporter name knows
# only grpc and http/protobuf, and raises on `http/json` (every instrumentor is then skipped).
JSON_EXPORTER = "otlp_json_http"

_DEFAULTS = (
    (OTEL_EXPORTER_OTLP_PROTOCOL, "grpc"),
    (OTEL_EXPERIMENTAL_RESOURCE_DETECTORS, RESOURCE_DETECTOR),
)

# (exporter variable, its signal's protocol variable, the signal's exporter over gRPC)
_SIGNALS = (
    (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, IN_PLACE_EXPORTER),
    (OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, "otlp"),
    (OTEL_LOGS_EXPORTER, OTEL_EXPORTER_OTLP_LOGS_PROTOCOL, IN_PLACE_EXPORTER),
)


class MindFormersDistro(BaseDistro):
    """Defaults for the OTEL_* variables the user did not set."""

    def _configure(self, **kwargs: Any) -> None:
        for variable, default in _DEFAULTS:
            os.environ.setdefault(variable, default)
        for exporter, protocol_variable, over_grpc in _SIGNALS:
            protocol = (os.environ.get(protocol_variable) or os.environ[OTEL_EXPORTER_OTLP_PROTOCOL]).strip()
            default = {"grpc": over_grpc, "http/json": JSON_EXPORTER}.get(protocol, "otlp")
            os.environ.setdefault(exporter, default)


class MindFormersConfigurator(_OTelSDKConfigurator):
    """The SDK's own configurator (every distro brings one; the SDK registers none), except
    for `OTEL_CONFIG_FILE`: read by telemetry/config_file.py."""

    def _configure(self, **kwargs: Any) -> None:
        if runs_no_training():  # msrun's launcher and scheduler: a scrape endpoint there takes rank 0's port
            return
        if config_file.path() is None:
            with _prometheus_port_per_rank():
                super()._configure(**kwargs)
            return
        try:
            config_file.configure()
        except ConfigError as exc:
            file_problem_said(exc)


@contextlib.contextmanager
def _prometheus_port_per_rank() -> Iterator[None]:
    """`OTEL_METRICS_EXPORTER=prometheus` starts a scrape endpoint on
    `OTEL_EXPORTER_PROMETHEUS_PORT` (9464) in every process: the ranks of a node would all
    ask for one port, and each that lost would skip every instrumentor (the SDK's "Failed to
    auto initialize"). As the `prometheus` output does, local rank r listens on port + r, for
    the configuration only: the process's children see the variable as it was."""
    exporters = {name.strip() for name in os.environ.get(OTEL_METRICS_EXPORTER, "").split(",")}
    before = os.environ.get(OTEL_EXPORTER_PROMETHEUS_PORT)
    try:
        port = int(before or PROMETHEUS_PORT)
    except ValueError:  # the exporter says what is wrong with it
        port = 0
    listens = detect_identity().node_port(port)
    if "prometheus" not in exporters or listens == port:
        yield
        return
    os.environ[OTEL_EXPORTER_PROMETHEUS_PORT] = str(listens)
    try:
        yield
    finally:
        if before is None:
            del os.environ[OTEL_EXPORTER_PROMETHEUS_PORT]
        else:
            os.environ[OTEL_EXPORTER_PROMETHEUS_PORT] = before
