"""Keeping secrets out of messages: URLs shown without credentials (`redact_url`), and notifier
tokens masked in every string a delivery logs (`Redactor`).

A webhook URL is a credential (DingTalk `access_token`, WeCom `key`, Slack and Feishu put
theirs in the path). Errors raised by the HTTP library quote the URL, sometimes as `repr`
(`http.client.InvalidURL: URL can't contain control characters. '/robot/send?access_token=…'`),
so the redaction replaces the parts that carry secrets, in every form they are printed in,
rather than the URL as a whole.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable


def redact_url(url: str) -> str:
    """`url` without what carries a credential: user info, query and fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    userinfo = "***@" if "@" in parts.netloc else ""
    query = "?***" if parts.query else ""
    fragment = "#***" if parts.fragment else ""
    return urllib.parse.urlunsplit((parts.scheme, f"{userinfo}{host}{port}", parts.path, "", "")) + query + fragment


MASK = "***"
_MIN_TOKEN_VALUE = 4


def _token_like(segment: str) -> bool:
    """A path segment that carries a token (Slack's `T0123ABCD`, Feishu's hook UUID), not a
    route name (`services`, `open-apis`, `robot`, `v2`)."""
    return len(segment) >= 16 or (len(segment) >= 6 and any(c.isdigit() for c in segment))


def _split(url: str) -> urllib.parse.SplitResult:
    """`url` parsed, also in the gRPC form without a scheme (`user:token@host:4317`)."""
    text = url.strip()
    return urllib.parse.urlsplit(text if "://" in text else f"//{text}")


def host_port(url: str) -> str | None:
    """`host:port` of an endpoint as the gRPC exporter writes it (IPv6 in brackets, the
    scheme's default port when none is given), also in the form without a scheme; None when
    it names no host or port."""
    try:
        split = _split(url)
        port = split.port or {"http": 80, "https": 443}.get(split.scheme)
    except ValueError:
        return None
    if not split.hostname or not port:
        return None
    host = f"[{split.hostname}]" if ":" in split.hostname else split.hostname
    return f"{host}:{port}"


def _query_values(split: urllib.parse.SplitResult) -> set[str]:
    return {
        value
        for _name, value in urllib.parse.parse_qsl(split.query, keep_blank_values=True)
        if len(value) >= _MIN_TOKEN_VALUE
    }


def secret_parts(url: str, secret: str | None) -> list[str]:
    """The substrings of a notifier's `url` (and its signing `secret`) that must never be
    printed: the URL is a credential as a whole, and so is each token in it."""
    parts: set[str] = {url.strip()}
    if secret:
        parts.add(secret.strip())
    split = _split(url)
    if split.password:
        parts.add(split.password)
    if split.username:
        parts.add(split.username)
    parts |= _query_values(split)
    parts.update(segment for segment in split.path.split("/") if _token_like(segment))
    return sorted((p for p in parts if p), key=len, reverse=True)


def endpoint_secrets(endpoint: str) -> set[str]:
    """The parts of an OTLP `endpoint` that are credentials: its user info and query, and on
    their own the password and the query values (shorter ones are masked only as part of the
    whole: masking every "ab" in a message would garble it)."""
    try:
        split = _split(endpoint)
        password = split.password
    except ValueError:
        return {endpoint}
    found = {split.netloc.rpartition("@")[0], split.query} | _query_values(split)
    if password and len(password) >= _MIN_TOKEN_VALUE:
        found.add(password)
    return {part for part in found if part}


def printable_endpoint(endpoint: str) -> str:
    """`endpoint` without credentials, also in the gRPC form without a scheme (`user:token@host:4317`)."""
    if "://" in endpoint:
        return redact_url(endpoint)
    return redact_url(f"//{endpoint}")[2:] if "@" in endpoint or "?" in endpoint else endpoint


class Redactor:
    """Masks each secret part in every form a message may quote it in (as is, URL-quoted,
    repr-escaped), longest first."""

    def __init__(self, parts: Iterable[str]) -> None:
        forms = {form for part in parts for form in (part, urllib.parse.quote(part, safe=""), repr(part)[1:-1])}
        self._parts = sorted((form for form in forms if form), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for part in self._parts:
            text = text.replace(part, MASK)
        return text
