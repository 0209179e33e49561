"""The `mindformers` resource detector: who this process is in the training job.

Registered under `opentelemetry_resource_detector`, so an SDK configured from the
environment (`opentelemetry-instrument`; the `mindformers` distro enables it, other setups
list it in OTEL_EXPERIMENTAL_RESOURCE_DETECTORS) carries the same rank, world, device,
node, job and Kubernetes attributes as the providers MonitorCallback builds itself.

A file of OTel's declarative configuration runs it too (telemetry/config_file.py puts it
first among the file's detectors), with `attributes` when a run already knows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource, ResourceDetector

from otel_mindformers.job.identity import detect_identity, rank_in_environment
from otel_mindformers.names import semconv
from otel_mindformers.names.semconv import DEFAULT_SERVICE_NAME


class MindFormersResourceDetector(ResourceDetector):
    def __init__(
        self, attributes: Mapping[str, Any] | None = None, service_name: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._attributes = dict(attributes) if attributes is not None else None
        self._service_name = service_name or DEFAULT_SERVICE_NAME

    def detect(self) -> Resource:
        if self._attributes is not None:  # a run's own (config_file.py)
            return Resource(self._attributes)
        identity = detect_identity()
        attributes = identity.attributes()
        if identity.distributed and not rank_in_environment():
            # msrun assigns this rank only at init(), after the SDK is set up: rank 0 here
            # would merge every rank into one series. Points and spans still carry the rank.
            del attributes[semconv.ATTR_RANK], attributes["service.instance.id"]
        # Detectors merge before OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, which still win.
        return Resource({"service.name": self._service_name, **attributes})
