"""A requests session for the OTLP/HTTP exporters that keeps the configured CA file.

requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace `Session.verify` on every request
(psf/requests#3829). Where those are set (many base images and conda environments set
them), the exporters' OTEL_EXPORTER_OTLP_CERTIFICATE would be silently ignored and a
collector with a private CA refused. A CA file set on the session wins here.
"""

from __future__ import annotations

from typing import Any

import requests


class CertificateSession(requests.Session):
    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and isinstance(self.verify, str):
            settings["verify"] = self.verify
        return settings
