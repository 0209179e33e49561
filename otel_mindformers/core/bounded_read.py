"""A network peer's reply read within a bound of bytes and of time.

An endpoint that streams a reply without end (a broken proxy, a misconfigured URL that
answers with a stream) grows the reader's memory with `read()`, and one that drips it holds
the reading thread for as long as it likes: a socket timeout bounds each wait, not the
whole reply. We read replies only for a status or an error code, so at most
`MAX_REPLY_BYTES` are read, and only until a deadline.
"""

from __future__ import annotations

import http.client
import os
import socket
import stat
import time
from collections.abc import Callable
from typing import Any

# Platforms and collectors answer `{"errcode": 0}` or a small protobuf: the rest is unread.
MAX_REPLY_BYTES = 64 * 1024


def reply_socket(response: Any) -> socket.socket | None:
    """The socket an `http.client.HTTPResponse` reads from (kept only inside its file object)."""
    return getattr(getattr(response.fp, "raw", None), "_sock", None)


def read_reply(
    read1: Callable[[int], bytes],
    deadline: float,
    *,
    sock: socket.socket | None = None,
    max_bytes: int = MAX_REPLY_BYTES,
) -> tuple[bytes, bool]:
    """(At most `max_bytes` of a body read with `read1`, until `deadline` (monotonic); True
    when the body ended within both). With `sock`, each read waits only for what is left
    before the deadline, not a whole socket timeout. A timeout, a reset or a broken chunk ends
    the reading: the caller checks what arrived."""
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if sock is not None:
            sock.settimeout(left)
        try:
            chunk = read1(max_bytes + 1 - size)  # one byte past the bound: is there more?
        except (OSError, http.client.HTTPException):
            break
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:max_bytes], False


def read_small_file(path: str | os.PathLike[str], max_bytes: int) -> bytes | None:
    """The bytes of a regular file of at most `max_bytes`; None for a larger file, or one that
    is no regular file (a FIFO would block the reader until someone writes to it). OSError
    as `open` raises it (FileNotFoundError: no file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, no writer needed
    with os.fdopen(fd, "rb") as stream:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size > max_bytes:
            return None
        # What fstat saw, and one byte more (a read of `max_bytes` would allocate them all).
        data = stream.read(status.st_size + 1)
        if len(data) > status.st_size:  # it grew since: the rest, within the bound
            data += stream.read(max_bytes + 1 - len(data))
    return data if len(data) <= max_bytes else None
