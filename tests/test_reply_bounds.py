"""Replies of network peers are read within a bound (issue 24 item 3, other instances): a
webhook endpoint that streams a reply without end, drips it, or stalls in the middle of it
neither grows the alert thread's memory nor holds it past the attempt's timeout; an OTLP/HTTP
endpoint that streams its reply no longer grows the export thread's memory. Real HTTP
servers on 127.0.0.1 (tests/support/webhook_receiver.py)."""

from __future__ import annotations

import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_mindformers.alerts.alert import Alert
from otel_mindformers.alerts.delivery import NotificationDelivery
from otel_mindformers.alerts.notifiers import build_notifiers
from otel_mindformers.config import NotifierConfig, OtlpConfig
from otel_mindformers.telemetry.providers import otlp_exporters
from tests.support.webhook_receiver import StreamingReply


def _deliver(url: str, timeout: float, kind: str = "webhook") -> NotificationDelivery:
    counter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t").create_counter("n")
    delivery = NotificationDelivery(
        build_notifiers([NotifierConfig(type=kind, url=url)]),
        timeout=timeout,
        retries=0,
        counter=counter,
        attributes={},
    )
    delivery.submit(
        Alert(
            rule="loss_threshold",
            severity="warning",
            status="firing",
            step=1,
            detail="loss 9 > threshold 8",
            job="j",
            rank=0,
            world_size=1,
            host="h",
            time_stamp=time.time(),
            value=9.0,
            threshold=8.0,
        )  # fmt: skip
    )
    return delivery


def test_a_reply_without_end_is_read_up_to_the_cap_and_the_connection_closed():
    with StreamingReply() as endpoint:  # 64 KiB chunks as fast as they are read, forever
        delivery = _deliver(endpoint.url(), timeout=30.0, kind="wecom")
        assert endpoint.closed.wait(20), f"the alert thread did not hang up ({endpoint.sent} bytes sent)"
        delivery.close(10.0)
    assert delivery.outcomes == {"delivered": 1}  # a 200; no error code in what was read
    # Hung up after the cap, long before the attempt's 30 s: not a timeout that ended it.
    assert endpoint.closed_at - endpoint.arrived < 10.0


def test_a_dripping_reply_is_read_only_until_the_attempts_timeout():
    with StreamingReply(chunk=b"x", interval=0.01) as endpoint:  # 100 bytes/s: the cap is 11 min away
        delivery = _deliver(endpoint.url(), timeout=1.0)
        assert endpoint.closed.wait(20), f"the alert thread did not hang up ({endpoint.sent} bytes sent)"
        delivery.close(10.0)
    assert delivery.outcomes == {"delivered": 1}
    # Ended by the attempt's 1 s, not by the cap 11 min away (slack for a loaded host).
    assert endpoint.closed_at - endpoint.arrived < 1.0 + 4.0


def test_a_reply_that_stalls_late_in_the_attempt_waits_only_for_what_is_left_of_it():
    """A byte at 70 % of the timeout, then nothing: a read that waited a whole socket timeout
    from there would end at 170 % (6.8 s), the attempt's own end is at 4 s: 2 s of slack for a
    loaded host still tells them apart."""
    with StreamingReply(chunk=b"{", interval=2.8, stall_after=2) as endpoint:  # at 0 s, 2.8 s, then stalls
        delivery = _deliver(endpoint.url(), timeout=4.0)
        assert endpoint.closed.wait(20)
        delivery.close(10.0)
    assert delivery.outcomes == {"delivered": 1}
    assert endpoint.closed_at - endpoint.arrived < 4.0 + 2.0


def test_an_otlp_http_reply_without_end_is_read_up_to_the_cap():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with StreamingReply() as endpoint:
        base = endpoint.url("")
        span_exporter, _metrics, _logs = otlp_exporters(OtlpConfig(endpoint=base, protocol="http/protobuf", timeout=30))
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        started = time.monotonic()
        provider.get_tracer("t").start_span("step").end()  # exported now, on this thread
        took = time.monotonic() - started
        assert endpoint.closed.wait(20), f"the exporter did not hang up ({endpoint.sent} bytes sent)"
        provider.shutdown()
    assert took < 10.0  # the cap ended it, long before the request's 30 s


def test_a_capture_request_that_is_a_fifo_or_huge_is_not_read(tmp_path):
    """Anyone who can write the capture folder can put a FIFO (reading it blocks until a
    writer comes) or a huge file where `otel-mindformers capture` writes its request: the
    watching training process reads neither, and still takes a real request after them."""
    import os
    import threading

    from otel_mindformers.captures import store as capture_store
    from otel_mindformers.names import capture_names as names

    request = tmp_path / names.CONTROL_FILE
    watcher = capture_store.RequestWatcher(tmp_path)
    os.mkfifo(request)
    seen: list = []
    poller = threading.Thread(target=lambda: seen.append(watcher.poll()), daemon=True)
    poller.start()
    poller.join(10)
    if poller.is_alive():  # unblock the reader before failing: open the FIFO for writing
        os.close(os.open(request, os.O_WRONLY | os.O_NONBLOCK))
        poller.join(5)
        raise AssertionError("the watcher blocked on a FIFO")
    assert seen == [[]]
    request.unlink()
    with open(request, "wb") as stream:  # valid JSON, 16 MiB of it
        stream.write(b'{"id": "big", "kinds": ["stacks"], "pad": "' + b"x" * (16 << 20) + b'"}')
    assert watcher.poll() == []
    request.unlink()
    fresh = capture_store.write_request(tmp_path, steps=1, ranks=None, kinds=["stacks"])
    assert watcher.poll() == [fresh]


def test_a_ledger_that_is_a_fifo_or_huge_is_kept_aside_not_read(tmp_path):
    import os
    import threading

    from otel_mindformers.restarts.ledger_file import MAX_LEDGER_BYTES, new_ledger, read_ledger, write_ledger

    path = tmp_path / "m.job.rank_0.ledger"
    os.mkfifo(path)
    read: list = []
    reader = threading.Thread(target=lambda: read.append(read_ledger(path)), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the reader before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
        raise AssertionError("reading the ledger blocked on a FIFO")
    assert read == [None] and not path.exists() and (tmp_path / f"{path.name}.corrupt").exists()
    huge = new_ledger("job")
    huge["attempts"] = [{"attempt": i, "pad": "x" * 1000} for i in range(MAX_LEDGER_BYTES // 1000 + 1)]
    write_ledger(path, huge)  # valid, and past the bound
    assert read_ledger(path) is None and not path.exists()
