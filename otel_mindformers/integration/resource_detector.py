"""The `mindformers` resource detector: who this process is in the training job.

Registered under `opentelemetry_resource_detector`, so an SDK configured from the
environment (`opentelemetry-instrument`; the `mindformers` distro enables it, other setups
list it in OTEL_EXPERIMENTAL_RESOURCE_DETECTORS) carries the same rank, world, device,
node, job and Kubernetes attributes as the providers MonitorCallback builds itself.
"""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource, ResourceDetector

from otel_mindformers.job.identity import detect_identity, rank_in_environment
from otel_mindformers.names import semconv
from otel_mindformers.names.semconv import DEFAULT_SERVICE_NAME


class MindFormersResourceDetector(ResourceDetector):
    def detect(self) -> Resource:
        identity = detect_identity()
        attributes = identity.attributes()
        if identity.distributed and not rank_in_environment():
            # msrun assigns this rank only at init(), after the SDK is set up: rank 0 here
            # would merge every rank into one series. Points and spans still carry the rank.
            del attributes[semconv.ATTR_RANK], attributes["service.instance.id"]
        # Detectors merge before OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, which still win.
        return Resource({"service.name": DEFAULT_SERVICE_NAME, **attributes})
