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


def secret_parts(url: str, secret: str | None) -> list[str]:
    """The substrings of `url` (and the signing `secret`) that must never be printed."""
    parts: set[str] = {url.strip()}
    if secret:
        parts.add(secret.strip())
    split = urllib.parse.urlsplit(url.strip())
    if split.password:
        parts.add(split.password)
    if split.username:
        parts.add(split.username)
    for _name, value in urllib.parse.parse_qsl(split.query, keep_blank_values=True):
        if len(value) >= _MIN_TOKEN_VALUE:
            parts.add(value)
    parts.update(segment for segment in split.path.split("/") if _token_like(segment))
    printed = {form for part in parts for form in (part, urllib.parse.quote(part, safe=""), repr(part)[1:-1])}
    return sorted((p for p in printed if p), key=len, reverse=True)


class Redactor:
    def __init__(self, parts: Iterable[str]) -> None:
        self._parts = sorted(set(parts), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for part in self._parts:
            text = text.replace(part, MASK)
        return text
