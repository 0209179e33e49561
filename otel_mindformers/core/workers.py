"""`BoundedWorker`: one daemon thread behind a bounded queue, for work the training thread
must never wait on (local output writes, alert notifications).

`submit` never blocks: a full queue hands the item to `on_drop` instead. `close` stops the
thread within a deadline and returns what it could not get to; a worker stuck inside a
slow call is left to finish on its own (it is a daemon) rather than hold up exit.

The worker takes up to `max_batch` items queued when it wakes as one batch: it handles them
in order, then calls `end_batch`. With a `batch_interval` it rests that long before the next batch: a
steady stream of items (a sampled step every few milliseconds) wakes it a few times a
second instead of once per item, and a batch can share work (one gauge set for many
records, in `end_batch`). With a `min_batch`, an item that arrives alone, less than
`max_delay` seconds after the previous one woke the worker, waits (checking every
`batch_interval`) until `min_batch` items are queued, `max_delay` has passed or nothing came
for `max_quiet` seconds: a lone item runs every line of the worker's code cold (about three
times the cost of an item in a batch, docs/performance.md), and a sampled step every 50 ms
would otherwise always arrive alone. Items further apart than that would wait for nothing:
they are handled at once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Generic, TypeVar

from otel_mindformers.core.deadline import Deadline

T = TypeVar("T")

_STOP = object()


class BoundedWorker(Generic[T]):
    def __init__(
        self,
        name: str,
        max_queue: int,
        batch_interval: float = 0.0,
        max_batch: int = 1,
        *,
        min_batch: int = 1,
        max_delay: float = 0.0,
        max_quiet: float = float("inf"),
    ) -> None:
        # SimpleQueue: a put is one C call (queue.Queue takes a lock and notifies a
        # condition on the training thread); the bound is checked before the put.
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._max_queue = max_queue
        self._batch_interval = batch_interval
        self._max_batch = max_batch  # taken off the queue at once: the bound is max_queue + max_batch
        self._min_batch, self._max_delay, self._max_quiet = min_batch, max_delay, max_quiet
        self._closing = threading.Event()  # ends the rest between batches
        self._batch: deque[object] = deque()  # taken off the queue, not handled yet
        self._deadline: Deadline | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- hooks ----------------------------------------------------------------------------
    def handle(self, item: T) -> None:
        """Process one item (worker thread)."""
        raise NotImplementedError

    def end_batch(self) -> None:
        """The items queued when the worker woke have been handled (worker thread)."""

    def on_drop(self, item: T) -> None:
        """`item` did not fit in the queue (caller's thread)."""

    def on_stop(self) -> None:
        """The queue is drained and the worker is about to exit (worker thread)."""

    # --- caller side ----------------------------------------------------------------------
    @property
    def max_queue(self) -> int:
        return self._max_queue

    def submit(self, item: T) -> None:
        if self._queue.qsize() >= self._max_queue:
            self.on_drop(item)
        else:
            self._queue.put(item)

    def put(self, item: T) -> None:
        """Queue `item` past the bound (one-off control items the worker must see)."""
        self._queue.put(item)

    def remaining(self) -> float:
        """Seconds left before the `close` deadline (infinite while not closing)."""
        return float("inf") if self._deadline is None else self._deadline.remaining()

    def close(self, timeout: float) -> list[T]:
        """Let the worker finish what is queued within `timeout` seconds; return the items
        it did not reach (empty when it finished in time)."""
        self._deadline = Deadline(timeout)
        self._closing.set()
        self._queue.put(_STOP)
        self._thread.join(self.remaining())
        if not self._thread.is_alive():
            return []
        left: list[T] = []
        while True:  # each item goes to the worker or to the caller, never to both
            try:
                left.append(self._batch.popleft())  # type: ignore[arg-type]
            except IndexError:
                break
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                left.append(item)  # type: ignore[arg-type]
        self._queue.put(_STOP)  # the worker exits once its current call returns
        return left

    def _run(self) -> None:
        get, get_nowait, batch = self._queue.get, self._queue.get_nowait, self._batch
        stopping = False
        woke = -float("inf")
        while not stopping:
            item = get()
            if self._min_batch > 1:
                woke, previous = time.monotonic(), woke
                if item is not _STOP and woke - previous < self._max_delay:  # items come often
                    self._wait_for_company(woke)
            while item is not _STOP:
                batch.append(item)
                if len(batch) == self._max_batch:
                    break
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            stopping = item is _STOP
            while batch:
                self.handle(batch.popleft())  # type: ignore[arg-type]
            self.end_batch()
            if self._batch_interval and not stopping:
                self._closing.wait(self._batch_interval)
        self.on_stop()

    def _wait_for_company(self, woke: float) -> None:
        """Hold the item just taken until `min_batch` items are queued, `max_delay` has
        passed, nothing came for `max_quiet` seconds (the caller paused: a hang, a
        checkpoint, a kill on its way), or `close` began."""
        until = woke + self._max_delay
        queued, grew = self._queue.qsize(), woke
        while queued + 1 < self._min_batch:
            if self._closing.wait(self._batch_interval):
                return
            now = time.monotonic()
            queued, before = self._queue.qsize(), queued
            if queued != before:
                grew = now
            if now >= until or now - grew >= self._max_quiet:
                return
