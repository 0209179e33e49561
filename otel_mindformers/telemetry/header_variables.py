"""OTEL_EXPORTER_OTLP_HEADERS and its per-signal variables, checked before an exporter reads
them. The SDK's parser logs a malformed entry whole (`Header format invalid! ...:
authorization: Bearer <token>`, the usual mistake), once per exporter and rank, and drops it:
the token went to stderr (and a log exporter) while every export was refused. A malformed
entry is one ConfigError naming the variable and the entry's place, never its text."""

from __future__ import annotations

import os
import re

from otel_mindformers.config import ConfigError

HEADER_VARIABLES = (
    "OTEL_EXPORTER_OTLP_HEADERS",
    *(f"OTEL_EXPORTER_OTLP_{signal}_HEADERS" for signal in ("TRACES", "METRICS", "LOGS")),
)
# What the SDK's exporters accept (opentelemetry.util.re, liberal): `name=value`, the name a
# token, the value printable ASCII but `"` `,` `;` `\`, spaces allowed.
_ENTRY = re.compile(
    r"[ \t]*[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+[ \t]*="
    r"[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*"
)
_DELIMITER = re.compile(r"[ \t]*,[ \t]*")


def check_header_variables() -> None:
    """Raise a ConfigError for the first header variable with an entry that is not `name=value`."""
    for variable in HEADER_VARIABLES:
        entries = _DELIMITER.split(os.environ.get(variable, ""))
        for place, entry in enumerate(entries, start=1):
            if entry and not _ENTRY.fullmatch(entry.strip()):
                raise ConfigError(
                    f"{variable}: entry {place} of {len(entries)} is not name=value (comma-separated "
                    "name=value pairs, values URL-encoded; e.g. authorization=Bearer%20<token>); "
                    "the value is not shown"
                )


__all__ = ["HEADER_VARIABLES", "check_header_variables"]
