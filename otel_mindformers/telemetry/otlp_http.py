"""A requests session for the OTLP/HTTP exporters: it keeps the configured CA file, and
reads a collector's reply within a bound.

requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace `Session.verify` on every request
(psf/requests#3829). Where those are set (many base images and conda environments set
them), the exporters' OTEL_EXPORTER_OTLP_CERTIFICATE would be silently ignored and a
collector with a private CA refused. A CA file set on the session wins here.

requests reads a whole reply into memory before it returns, and the exporters look only at
its status and headers: an endpoint that streams a reply without end (a proxy, a URL that is
no collector) grew the export thread's memory for as long as it streamed. Here at most 64
KiB of it are read, until the request's timeout (core/bounded_read.py); a reply cut short
closes its connection.
"""

from __future__ import annotations

import time
from typing import Any

import requests

from otel_mindformers.core.bounded_read import read_reply, reply_socket


class CertificateSession(requests.Session):
    def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and isinstance(self.verify, str):
            settings["verify"] = self.verify
        return settings

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        timeout = kwargs.get("timeout")
        kwargs["stream"] = True  # the body is ours to read
        response = super().request(method, url, *args, **kwargs)
        seconds = timeout if isinstance(timeout, (int, float)) and timeout > 0 else 10.0
        raw = response.raw
        body, ended = read_reply(
            lambda size: raw.read1(size, decode_content=True),
            time.monotonic() + seconds,
            sock=reply_socket(raw._fp) if getattr(raw, "_fp", None) is not None else None,
        )
        response._content = body
        if ended:  # read to its end: the connection goes back to the pool
            response._content_consumed = True  # type: ignore[attr-defined]  # requests' own flag
        response.close()  # a reply cut short: its connection is closed, not reused
        return response
