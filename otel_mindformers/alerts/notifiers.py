"""Notification payloads, one class per platform, each in its documented message format.

A notifier only builds the request (URL + JSON body) and judges the platform's reply; the
delivery thread does the HTTP. URLs and secrets carry tokens, so no notifier exposes them
in its repr, and `label` (type and position in the config) is what messages name.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.parse
from typing import Any, Protocol

from otel_mindformers.alerts.alert import Alert
from otel_mindformers.config import NotifierConfig
from otel_mindformers.config.redaction import Redactor, secret_parts
from otel_mindformers.core import safe_json


class PlatformError(Exception):
    """The platform answered 2xx but refused the message (its own error code)."""


class Notifier(Protocol):
    label: str
    kind: str
    redact: Redactor  # masks this notifier's URL tokens and secret in a message

    def request(self, alert: Alert) -> tuple[str, dict[str, Any]]:
        """The URL to POST to and the JSON body."""
        ...

    def check_reply(self, body: bytes) -> None:
        """Raise PlatformError when a 2xx reply still reports a failure."""
        ...


def _json_reply(body: bytes) -> dict[str, Any]:
    try:
        reply = safe_json.loads(body or b"{}")
    except ValueError:
        return {}
    return reply if isinstance(reply, dict) else {}


class _Base:
    kind = ""

    def __init__(self, label: str, url: str, secret: str | None = None) -> None:
        self.label = label
        # `$(cat file)` leaves a trailing newline: a URL or secret never means its whitespace.
        self._url = url.strip()
        self._secret = secret.strip() if secret else secret
        self.redact = Redactor(secret_parts(url, secret))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label!r})"

    def check_reply(self, body: bytes) -> None:
        return None

    def request(self, alert: Alert) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError  # each platform builds its own


class WebhookNotifier(_Base):
    """A generic JSON webhook: the alert's fields as one JSON object."""

    kind = "webhook"

    def request(self, alert: Alert) -> tuple[str, dict[str, Any]]:
        return self._url, alert.to_json_dict()


class WeComNotifier(_Base):
    """WeCom (企业微信) group robot: `{"msgtype": "text", "text": {"content": ...}}`;
    a 200 reply carries `errcode` (0 = accepted)."""

    kind = "wecom"

    def request(self, alert: Alert) -> tuple[str, dict[str, Any]]:
        return self._url, {"msgtype": "text", "text": {"content": alert.text()}}

    def check_reply(self, body: bytes) -> None:
        reply = _json_reply(body)
        if reply.get("errcode", 0) != 0:
            raise PlatformError(f"errcode {reply.get('errcode')}: {reply.get('errmsg', '')}")


def dingtalk_signature(secret: str, timestamp_ms: int) -> str:
    """DingTalk's signed-robot check: base64(HMAC-SHA256(key=secret, "<ms timestamp>\\n<secret>"))."""
    string_to_sign = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), string_to_sign, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


class DingTalkNotifier(WeComNotifier):
    """DingTalk robot: the same text message and `errcode` reply as WeCom. With a secret,
    `timestamp` (ms) and `sign` are added to the URL's query, as DingTalk's signing requires."""

    kind = "dingtalk"

    def request(self, alert: Alert) -> tuple[str, dict[str, Any]]:
        url, body = super().request(alert)
        if self._secret:
            timestamp = int(time.time() * 1000)
            query = urllib.parse.urlencode(
                {"timestamp": timestamp, "sign": dingtalk_signature(self._secret, timestamp)}
            )
            url = f"{url}{'&' if urllib.parse.urlsplit(url).query else '?'}{query}"
        return url, body


def feishu_signature(secret: str, timestamp_s: int) -> str:
    """Feishu/Lark's signed-bot check: base64(HMAC-SHA256(key="<s timestamp>\\n<secret>", b""))."""
    key = f"{timestamp_s}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


class FeishuNotifier(_Base):
    """Feishu / Lark custom bot: `{"msg_type": "text", "content": {"text": ...}}`, with
    `timestamp` (s) and `sign` in the body when a secret is set. Replies carry `code`
    (older deployments `StatusCode`), 0 = accepted."""

    kind = "feishu"

    def request(self, alert: Alert) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"msg_type": "text", "content": {"text": alert.text()}}
        if self._secret:
            timestamp = int(time.time())
            body["timestamp"] = str(timestamp)
            body["sign"] = feishu_signature(self._secret, timestamp)
        return self._url, body

    def check_reply(self, body: bytes) -> None:
        reply = _json_reply(body)
        code = reply.get("code", reply.get("StatusCode", 0))
        if code != 0:
            raise PlatformError(f"code {code}: {reply.get('msg', reply.get('StatusMessage', ''))}")


def slack_escape(text: str) -> str:
    """Slack reads `&`, `<` and `>` as control characters in message text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackNotifier(_Base):
    """Slack incoming webhook: `{"text": ...}` (mrkdwn, title in bold); failures come back
    as HTTP 4xx."""

    kind = "slack"

    def request(self, alert: Alert) -> tuple[str, dict[str, Any]]:
        title, *rest = slack_escape(alert.text()).split("\n")
        return self._url, {"text": "\n".join([f"*{title}*", *rest])}


NOTIFIER_CLASSES: dict[str, type[_Base]] = {
    cls.kind: cls for cls in (WebhookNotifier, WeComNotifier, DingTalkNotifier, FeishuNotifier, SlackNotifier)
}


def build_notifiers(configs: list[NotifierConfig]) -> list[Notifier]:
    """Notifiers for validated configs (config.py checked type, URL and secret)."""
    notifiers: list[Notifier] = []
    for index, c in enumerate(configs):
        assert c.type is not None and c.url is not None  # checks.py requires both
        notifiers.append(NOTIFIER_CLASSES[c.type](f"#{index} ({c.type})", c.url, c.secret))
    return notifiers
