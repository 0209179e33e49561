"""Posting alerts without the training thread ever waiting on the network.

The training thread only puts an Alert on a bounded queue (a full queue drops it, counted).
One daemon thread posts each alert to every notifier with a per-request timeout, retrying
with jittered exponential backoff on 5xx, 429, timeouts and connection errors. Redirects
are never followed (a POST turned into a GET to another host is not a delivery): a 3xx is
a failure. At shutdown, what is queued gets until a deadline; whatever is left is counted
as dropped. Every message about a notifier goes through its redactor.

A reply is read for the platform's error code only: at most 64 KiB, and only until the
attempt's timeout (core/bounded_read.py), so an endpoint that streams without end neither
grows memory nor holds the alert thread.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

from otel_mindformers.alerts.alert import Alert
from otel_mindformers.alerts.notifiers import Notifier
from otel_mindformers.core.bounded_read import read_reply, reply_socket
from otel_mindformers.core.guarded_log import get_logger
from otel_mindformers.core.workers import BoundedWorker
from otel_mindformers.names import semconv

_logger = get_logger(__name__)

DELIVERED = "delivered"
FAILED = "failed"
DROPPED = "dropped"


class _Retryable(Exception):
    """A failure worth another attempt (server error, throttling, network, timeout)."""


class RedirectRefused(Exception):
    """The endpoint answered with a redirect; notifications do not follow them."""

    def __init__(self, code: int) -> None:
        super().__init__(f"redirect refused (HTTP {code}): notifications never follow redirects")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 (urllib's signature)
        fp.close()
        raise RedirectRefused(code)


# urllib's usual handlers (proxies from the environment, HTTPS), with redirects refused.
_OPENER = urllib.request.build_opener(_NoRedirects)


class NotificationDelivery(BoundedWorker[Alert]):
    """Posts alerts to every notifier on one daemon thread behind a bounded queue."""

    def __init__(
        self,
        notifiers: list[Notifier],
        *,
        timeout: float,
        retries: int,
        counter: Any,
        attributes: dict[str, Any],
        max_queue: int = 256,
        backoff: float = 0.5,
    ) -> None:
        self._notifiers = list(notifiers)
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._counter = counter
        self._attributes = attributes
        self._lock = threading.Lock()
        self._outcomes: Counter[str] = Counter()
        self._warned: set[str] = set()
        super().__init__("otel-mindformers-alerts", max_queue)

    @property
    def outcomes(self) -> dict[str, int]:
        """Notifications by outcome (delivered / failed / dropped), over all notifiers."""
        with self._lock:
            return dict(self._outcomes)

    def on_drop(self, alert: Alert) -> None:
        """A full queue drops the alert for every notifier."""
        for notifier in self._notifiers:
            self._record(notifier, DROPPED)
        self._warn_once(
            "queue",
            "otel_mindformers: alert queue full (%d alerts); dropping alerts rather than slowing training",
            self.max_queue,
        )

    def close(self, timeout: float) -> None:  # type: ignore[override]  # counts what is left instead
        """Deliver what is queued within `timeout` seconds; count the rest as dropped."""
        left = super().close(timeout)
        for _alert in left:
            for notifier in self._notifiers:
                self._record(notifier, DROPPED)
        if left:
            _logger.warning(
                "otel_mindformers: %d alert(s) not sent before the %.1f s shutdown deadline",
                len(left),
                timeout,
            )

    # --- worker thread ---------------------------------------------------------------
    def handle(self, alert: Alert) -> None:
        for notifier in self._notifiers:
            self._deliver(notifier, alert)

    def _deliver(self, notifier: Notifier, alert: Alert) -> None:
        error: BaseException | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                delay = self._backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
                time.sleep(min(delay, max(0.0, self.remaining())))
            budget = min(self._timeout, self.remaining())
            if budget <= 0:
                self._record(notifier, DROPPED)
                return
            try:
                self._post(notifier, alert, budget)
            except _Retryable as exc:
                error = exc.__cause__ or exc
                continue
            except Exception as exc:  # refused by the platform, 4xx, a redirect, a bad URL: final
                error = exc
                break
            self._record(notifier, DELIVERED)
            return
        self._record(notifier, FAILED)
        self._warn_once(
            notifier.label,
            "otel_mindformers: alert notifier %s failed: %s; later failures are only counted (%s)",
            notifier.label,
            notifier.redact(f"{type(error).__name__}: {error}"),
            semconv.ALERT_NOTIFICATIONS.name,
        )

    def _post(self, notifier: Notifier, alert: Alert, timeout: float) -> None:
        url, body = notifier.request(alert)
        request = urllib.request.Request(
            url,
            data=json.dumps(body, ensure_ascii=False, allow_nan=False).encode(),
            headers={"Content-Type": "application/json; charset=utf-8"},
            method="POST",
        )
        deadline = time.monotonic() + timeout
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                reply, _ended = read_reply(response.read1, deadline, sock=reply_socket(response))
        except urllib.error.HTTPError as exc:
            exc.close()
            if 300 <= exc.code < 400:  # a redirect without a Location urllib could follow
                raise RedirectRefused(exc.code) from None
            if exc.code >= 500 or exc.code == 429:
                raise _Retryable() from exc
            raise
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            raise _Retryable() from exc
        notifier.check_reply(reply)

    # --- bookkeeping (both threads) ----------------------------------------------------
    def _record(self, notifier: Notifier, outcome: str) -> None:
        with self._lock:
            self._outcomes[outcome] += 1
        self._counter.add(
            1,
            {
                **self._attributes,
                semconv.ATTR_NOTIFIER: notifier.kind,
                semconv.ATTR_NOTIFICATION_OUTCOME: outcome,
            },
        )

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        _logger.warning(message, *args)
