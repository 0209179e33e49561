"""Notifications to real HTTP endpoints on 127.0.0.1, one per platform.

Each payload is checked against the platform's documented message format, signatures are
recomputed from the documented algorithm, and delivery failures (500, slow, down, refused
by the platform, full queue, shutdown deadline) are exercised for real.
"""

import base64
import hashlib
import hmac
import http.server
import logging
import threading
import time
import types
import urllib.parse

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_mindformers.alerts import Alert
from otel_mindformers.alerts.delivery import NotificationDelivery
from otel_mindformers.alerts.notifiers import build_notifiers
from otel_mindformers.config import NotifierConfig, load_monitor_config
from otel_mindformers.core.step_record import StepRecord
from otel_mindformers.job.identity import Identity
from otel_mindformers.telemetry.providers import build_telemetry
from tests.support.alert_engine import engine_for
from tests.support.metrics import counter_values
from tests.support.webhook_receiver import WebhookReceiver, closed_port_url

IDENTITY = Identity(rank=3, world_size=8, job_id="llama-pretrain-42", host_name="node-7")
DINGTALK_SECRET = "SECd1ngta1k"
FEISHU_SECRET = "fe1shu-s3cret"


def start_engine(alert_section, reader=None):
    config = load_monitor_config(
        {"output_type": [], "alert_config": {"enable_alert": True, "stall_timeout": None, **alert_section}}
    )
    telemetry = build_telemetry(
        config.telemetry,
        IDENTITY,
        meter_provider=MeterProvider(metric_readers=[reader or InMemoryMetricReader()]),
        logger_provider=LoggerProvider(),
    )
    progress = types.SimpleNamespace(step=0, last_step_end=time.perf_counter())
    return engine_for(config, IDENTITY, telemetry, progress)


def record(step, loss):
    return StepRecord(step=step, epoch=1, rank=IDENTITY.rank, time_stamp=time.time(), values={"loss": loss})


def assert_names_everything(text):
    for part in ("llama-pretrain-42", "rank 3", "step 7", "loss_threshold", "9.5", "threshold: 8"):
        assert part in text, part


@pytest.fixture
def receivers():
    with (
        WebhookReceiver(reply={"status": "ok"}) as webhook,
        WebhookReceiver(reply={"errcode": 0, "errmsg": "ok"}) as wecom,
        WebhookReceiver(reply={"errcode": 0, "errmsg": "ok"}) as dingtalk,
        WebhookReceiver(reply={"code": 0, "msg": "success", "data": {}}) as feishu,
        WebhookReceiver(reply=b"ok") as slack,
    ):
        yield types.SimpleNamespace(webhook=webhook, wecom=wecom, dingtalk=dingtalk, feishu=feishu, slack=slack)


def test_every_platform_gets_its_documented_payload(receivers):
    engine = start_engine(
        {
            "loss_threshold": 8.0,
            "notifiers": [
                {"type": "webhook", "url": receivers.webhook.url("/alerts")},
                {"type": "wecom", "url": receivers.wecom.url("/cgi-bin/webhook/send?key=wc-key")},
                {
                    "type": "dingtalk",
                    "url": receivers.dingtalk.url("/robot/send?access_token=dt-token"),
                    "secret": DINGTALK_SECRET,
                },
                {
                    "type": "feishu",
                    "url": receivers.feishu.url("/open-apis/bot/v2/hook/fs-hook"),
                    "secret": FEISHU_SECRET,
                },
                {"type": "slack", "url": receivers.slack.url("/services/T0/B0/XYZ")},
            ],
        }
    )
    before = int(time.time())
    engine.evaluate(record(7, 9.5), None)
    engine.shutdown(10.0)
    after = int(time.time()) + 1

    (webhook,) = receivers.webhook.requests
    assert webhook.path == "/alerts"
    assert webhook.headers["content-type"].startswith("application/json")
    assert webhook.body == {
        "source": "otel_mindformers",
        "status": "firing",
        "rule": "loss_threshold",
        "severity": "warning",
        "job": "llama-pretrain-42",
        "rank": 3,
        "world_size": 8,
        "host": "node-7",
        "step": 7,
        "value": 9.5,
        "threshold": 8.0,
        "message": "loss 9.5 > threshold 8",
        "time_stamp": webhook.body["time_stamp"],
    }
    assert before <= webhook.body["time_stamp"] <= after

    (wecom,) = receivers.wecom.requests
    assert wecom.query == {"key": "wc-key"}
    assert set(wecom.body) == {"msgtype", "text"} and wecom.body["msgtype"] == "text"
    assert set(wecom.body["text"]) == {"content"}
    assert_names_everything(wecom.body["text"]["content"])

    (dingtalk,) = receivers.dingtalk.requests
    assert dingtalk.path == "/robot/send"
    assert set(dingtalk.query) == {"access_token", "timestamp", "sign"}
    assert dingtalk.query["access_token"] == "dt-token"
    timestamp = dingtalk.query["timestamp"]
    assert before * 1000 <= int(timestamp) <= after * 1000  # milliseconds
    expected = base64.b64encode(
        hmac.new(DINGTALK_SECRET.encode(), f"{timestamp}\n{DINGTALK_SECRET}".encode(), hashlib.sha256).digest()
    ).decode()
    assert dingtalk.query["sign"] == expected
    assert dingtalk.body["msgtype"] == "text" and set(dingtalk.body) == {"msgtype", "text"}
    assert_names_everything(dingtalk.body["text"]["content"])

    (feishu,) = receivers.feishu.requests
    assert set(feishu.body) == {"msg_type", "content", "timestamp", "sign"}
    assert feishu.body["msg_type"] == "text" and set(feishu.body["content"]) == {"text"}
    timestamp = feishu.body["timestamp"]
    assert isinstance(timestamp, str) and before <= int(timestamp) <= after  # seconds
    expected = base64.b64encode(
        hmac.new(f"{timestamp}\n{FEISHU_SECRET}".encode(), b"", hashlib.sha256).digest()
    ).decode()
    assert feishu.body["sign"] == expected
    assert_names_everything(feishu.body["content"]["text"])

    (slack,) = receivers.slack.requests
    assert set(slack.body) == {"text"}
    text = slack.body["text"]
    assert text.startswith("*[FIRING] loss_threshold")
    assert "loss 9.5 &gt; threshold 8" in text and ">" not in text
    assert_names_everything(text.replace("&gt;", ">"))


def test_unsigned_dingtalk_and_feishu_add_no_signature(receivers):
    engine = start_engine(
        {
            "loss_threshold": 8.0,
            "notifiers": [
                {"type": "dingtalk", "url": receivers.dingtalk.url("/robot/send?access_token=t")},
                {"type": "feishu", "url": receivers.feishu.url("/hook")},
            ],
        }
    )
    engine.evaluate(record(7, 9.5), None)
    engine.shutdown(10.0)
    assert receivers.dingtalk.requests[0].query == {"access_token": "t"}
    assert set(receivers.feishu.requests[0].body) == {"msg_type", "content"}


def test_rate_limit_200_anomalous_steps_interval_50_gives_exactly_4(receivers):
    reader = InMemoryMetricReader()
    engine = start_engine(
        {
            "loss_threshold": 1.0,
            "alert_interval": 50,
            "notifiers": [{"type": "webhook", "url": receivers.webhook.url()}],
        },
        reader,
    )
    for step in range(1, 201):
        engine.evaluate(record(step, 5.0), None)
    engine.shutdown(10.0)
    bodies = [r.body for r in receivers.webhook.requests]
    assert [(b["status"], b["step"]) for b in bodies] == [
        ("firing", 1),
        ("firing", 51),
        ("firing", 101),
        ("firing", 151),
    ]
    # Every anomalous step is still counted; only notifications are limited.
    counts = counter_values(reader, "mindformers.alerts")
    assert counts == {
        (("training.alert.rule", "loss_threshold"), ("training.alert.severity", "warning"), ("training.rank", 3)): 200
    }
    delivered = counter_values(reader, "mindformers.alert.notifications")
    assert delivered == {
        (("training.alert.notifier", "webhook"), ("training.alert.outcome", "delivered"), ("training.rank", 3)): 4
    }


def test_resolved_notice_when_the_rule_stops_firing(receivers):
    engine = start_engine(
        {"loss_threshold": 8.0, "alert_interval": 1, "notifiers": [{"type": "webhook", "url": receivers.webhook.url()}]}
    )
    for step, loss in enumerate([1.0, 9.0, 9.0, 2.0, 2.0], start=1):
        engine.evaluate(record(step, loss), None)
    engine.shutdown(10.0)
    assert [(r.body["status"], r.body["step"]) for r in receivers.webhook.requests] == [
        ("firing", 2),
        ("firing", 3),
        ("resolved", 4),
    ]


def _delivery(url, *, timeout=10.0, retries=2, reply_check=None, max_queue=256, reader=None, kind="webhook"):
    reader = reader or InMemoryMetricReader()
    counter = MeterProvider(metric_readers=[reader]).get_meter("t").create_counter("n")
    notifiers = build_notifiers([NotifierConfig(type=kind, url=url)])
    delivery = NotificationDelivery(
        notifiers, timeout=timeout, retries=retries, counter=counter, attributes={}, max_queue=max_queue, backoff=0.05
    )
    return delivery


def alert(step=1):
    return Alert(
        rule="loss_threshold", severity="warning", status="firing", step=step, detail="loss 9 > threshold 8",
        job="j", rank=0, world_size=1, host="h", time_stamp=time.time(), value=9.0, threshold=8.0,
    )  # fmt: skip


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_are_retried_then_counted_failed(status, caplog):
    with WebhookReceiver(status=status) as receiver:
        delivery = _delivery(receiver.url("/hook?token=tok-9f2"), retries=2)
        delivery.submit(alert(1))
        delivery.submit(alert(2))
        delivery.close(30.0)
        assert len(receiver.requests) == 6  # 1 + 2 retries, for each alert
    assert delivery.outcomes == {"failed": 2}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "#0 (webhook)" in warnings[0].getMessage()
    assert "tok-9f2" not in caplog.text


def test_client_errors_and_platform_refusals_are_not_retried():
    with (
        WebhookReceiver(status=404) as missing,
        WebhookReceiver(reply={"errcode": 310000, "errmsg": "sign not match"}) as refusing,
    ):
        not_found = _delivery(missing.url())
        refused = _delivery(refusing.url("/robot/send?access_token=t"), kind="dingtalk")
        not_found.submit(alert())
        refused.submit(alert())
        not_found.close(30.0)
        refused.close(30.0)
        assert (len(missing.requests), len(refusing.requests)) == (1, 1)
    assert not_found.outcomes == refused.outcomes == {"failed": 1}


def test_receiver_down_counts_failed_after_retries():
    delivery = _delivery(closed_port_url(), retries=1)
    delivery.submit(alert())
    delivery.close(30.0)
    assert delivery.outcomes == {"failed": 1}


def test_slow_receiver_times_out_and_is_retried():
    with WebhookReceiver(delay=2.0) as receiver:
        delivery = _delivery(receiver.url(), timeout=0.2, retries=1)
        delivery.submit(alert())
        delivery.close(30.0)
        # Both sent before close returned; the server's threads take them in their own time.
        assert len(receiver.wait_for(2)) == 2
    assert delivery.outcomes == {"failed": 1}


def test_full_queue_drops_and_counts(caplog):
    reader = InMemoryMetricReader()
    with WebhookReceiver(delay=0.3) as receiver:
        delivery = _delivery(receiver.url(), timeout=5.0, retries=0, max_queue=2, reader=reader)
        for step in range(10):
            delivery.submit(alert(step))
        dropped_at_submit = delivery.outcomes.get("dropped", 0)
        delivery.close(30.0)
    # The worker holds at most one alert and the queue two: at least seven were dropped.
    assert dropped_at_submit >= 7
    assert delivery.outcomes["delivered"] + delivery.outcomes["dropped"] == 10
    assert sum(1 for r in caplog.records if "queue full" in r.getMessage()) == 1
    points = counter_values(reader, "n")
    dropped = points[(("training.alert.notifier", "webhook"), ("training.alert.outcome", "dropped"))]
    assert dropped == delivery.outcomes["dropped"]


def test_pending_alerts_are_flushed_at_shutdown():
    with WebhookReceiver(delay=0.1) as receiver:
        delivery = _delivery(receiver.url(), timeout=5.0)
        for step in range(5):
            delivery.submit(alert(step))
        delivery.close(30.0)
        assert [r.body["step"] for r in receiver.requests] == [0, 1, 2, 3, 4]
    assert delivery.outcomes == {"delivered": 5}


def test_shutdown_deadline_drops_what_is_left(caplog):
    with WebhookReceiver(delay=3.0) as receiver:
        delivery = _delivery(receiver.url(), timeout=10.0, retries=0)
        for step in range(4):
            delivery.submit(alert(step))
        receiver.wait_for(1)  # the first is in flight (a loaded machine may start it late)
        delivery.close(0.5)
        outcomes = delivery.outcomes
        assert len(receiver.requests) == 1  # the one in flight when the deadline passed
    assert outcomes.get("dropped", 0) >= 3
    assert "not sent before the 0.5 s shutdown deadline" in caplog.text


class _Redirecting:
    """An endpoint that answers every POST with a redirect to `location`."""

    def __init__(self, status, location):
        outer = self
        self.posts = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                outer.posts += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(status)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def url(self, path="/hook?token=tok-redirect"):
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_redirects_are_not_followed_and_count_as_failures_named(status, caplog):
    with WebhookReceiver() as elsewhere, _Redirecting(status, elsewhere.url("/stolen")) as redirecting:
        delivery = _delivery(redirecting.url(), retries=2)
        delivery.submit(alert())
        delivery.close(30.0)
        assert redirecting.posts == 1 and elsewhere.requests == []  # not retried, not followed
    assert delivery.outcomes == {"failed": 1}
    assert f"redirect refused (HTTP {status})" in caplog.text and "tok-redirect" not in caplog.text


def test_a_url_with_a_trailing_newline_is_delivered():
    """`url: $(cat robot_url.txt)` leaves a newline at the end of the token."""
    with WebhookReceiver(reply={"errcode": 0}) as receiver:
        delivery = _delivery(receiver.url("/robot/send?access_token=dt-token\n"), kind="dingtalk")
        delivery.submit(alert())
        delivery.close(30.0)
        assert [r.query["access_token"] for r in receiver.requests] == ["dt-token"]
    assert delivery.outcomes == {"delivered": 1}


def test_tokens_are_redacted_from_the_http_librarys_own_errors(caplog):
    # http.client refuses the space and quotes the whole request target, token included.
    delivery = _delivery(closed_port_url("/robot/send?access_token=tok-leak-42 x"), kind="dingtalk", retries=0)
    delivery.submit(alert())
    delivery.close(30.0)
    assert delivery.outcomes == {"failed": 1}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "InvalidURL" in warning and "***" in warning and "tok-leak-42" not in warning


def test_redaction_covers_every_printed_form_of_a_token():
    from otel_mindformers.config.redaction import Redactor, secret_parts

    url = "https://user:pa55word@hooks.example/services/T0001ABCD/B0002EFGH/XyZsecretPathXYZ?key=k3y/value&x=1"
    redact = Redactor(secret_parts(url, "SECsigning"))
    for leaked in (
        "pa55word",
        "T0001ABCD",
        "B0002EFGH",
        "XyZsecretPathXYZ",
        "k3y/value",
        "SECsigning",
        urllib.parse.quote("k3y/value", safe=""),
    ):
        assert redact(f"error near {leaked}!") == "error near ***!", leaked
    assert redact("/services/open-apis/v2/x") == "/services/open-apis/v2/x"  # route names stay readable
