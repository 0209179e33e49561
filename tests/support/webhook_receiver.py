"""A real HTTP endpoint on 127.0.0.1 standing in for a chat robot or webhook.

It records every POST (path, decoded query, headers, JSON body) and answers with a
configurable status, reply body and delay, so tests can play a healthy platform, a slow
one, or one that fails.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar


@dataclass
class Received:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    arrived: float  # time.monotonic()


_Server = TypeVar("_Server", bound="_LocalServer")


class _LocalServer:
    """A threading HTTP server on 127.0.0.1 for `handler`, served while in a `with` block."""

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self: _Server) -> _Server:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def url(self, path: str = "/hook") -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{path}"


class WebhookReceiver(_LocalServer):
    """`with WebhookReceiver(reply={"errcode": 0}) as rx:` → POST to `rx.url("/robot/send")`."""

    def __init__(self, *, status: int = 200, reply: Any = None, delay: float = 0.0) -> None:
        self.status = status
        self.reply = {"ok": True} if reply is None else reply
        self.delay = delay
        self.requests: list[Received] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                split = urllib.parse.urlsplit(self.path)
                entry = Received(
                    path=split.path,
                    query=dict(urllib.parse.parse_qsl(split.query)),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=json.loads(raw),
                    arrived=time.monotonic(),
                )
                with receiver._changed:
                    receiver.requests.append(entry)
                    receiver._changed.notify_all()
                if receiver.delay:
                    time.sleep(receiver.delay)
                payload = receiver.reply if isinstance(receiver.reply, bytes) else json.dumps(receiver.reply).encode()
                try:
                    self.send_response(receiver.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (timeout): nothing to answer

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(Handler)

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        """Block until `count` requests arrived (or the generous timeout passed); return all."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return list(self.requests)


def closed_port_url(path: str = "/hook") -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


class StreamingReply(_LocalServer):
    """An endpoint on 127.0.0.1 that answers a POST with 200 and a body without end: `chunk`
    every `interval` seconds (0: as fast as the client reads), or, with `stall_after`, that
    many chunks and then nothing, holding the connection open. It records when the request
    arrived, the bytes it sent, and sets `closed` once the client closed the connection.
    Past `limit` bytes it ends the reply itself (`closed` stays unset): a client that reads
    without a bound fails its test without taking the machine's memory."""

    def __init__(
        self,
        *,
        chunk: bytes = b"x" * 65536,
        interval: float = 0.0,
        stall_after: int | None = None,
        limit: int = 64 << 20,
    ) -> None:
        self.sent = 0
        self.arrived: float | None = None
        self.closed_at: float | None = None
        self.closed = threading.Event()
        self._stop = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):  # HTTP/1.0: the body ends where the connection does
            def do_POST(self) -> None:
                receiver.arrived = time.monotonic()
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    count = 0
                    while not receiver._stop.is_set() and (stall_after is None or count < stall_after):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        receiver.sent += len(chunk)
                        if receiver.sent >= limit:
                            return
                        count += 1
                        if interval and count != stall_after:
                            receiver._stop.wait(interval)
                    self.connection.settimeout(0.05)
                    while not receiver._stop.is_set():  # stalled: wait for the client to hang up
                        try:
                            if not self.connection.recv(1):
                                break
                        except TimeoutError:
                            continue
                except OSError:  # a reset or a broken pipe: the client hung up
                    pass
                if not receiver._stop.is_set():
                    receiver.closed_at = time.monotonic()
                    receiver.closed.set()

            def log_message(self, *args: Any) -> None:
                pass

        self._serve(Handler)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()  # the handlers' loops end, then the server
        super().__exit__(*exc)
