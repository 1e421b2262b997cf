"""An iterator advanced by a reader thread, a bounded number of items ahead of its consumer.

For ``.gz`` input: inflating is as costly as scanning, and zlib releases the GIL while it inflates
(CPython's zlibmodule.c wraps each ``inflate()`` call in ``Py_BEGIN_ALLOW_THREADS``), so a reader
thread decompresses the next piece while the caller scans this one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()  # the reader is done (the source is exhausted)


class ReadAhead(Iterator[T]):
    """``source``'s items in order, produced by a thread at most ``depth`` items ahead.

    The thread starts when this is made, so the source is under way before the first item is
    asked for. An exception the source raises is raised here, in the consumer, at the point the
    failed item would have been; ``close()`` (or the end of the items) stops the reader.
    """

    def __init__(self, source: Iterator[T], depth: int = 2) -> None:
        self._items: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._reader = threading.Thread(target=self._run, args=(source,), name="kvwatch-read-ahead", daemon=True)
        self._reader.start()

    def _run(self, source: Iterator[T]) -> None:
        items, stop = self._items, self._stop
        try:
            for item in source:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.5)  # wakes to notice a consumer that left
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            items.put(exc)

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._items.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item  # type: ignore[return-value]

    def __del__(self) -> None:  # a consumer that left without close(): the reader ends at its next item
        self._stop.set()

    def close(self) -> None:
        """Stop the reader (it ends at its next item) and wait for it."""
        self._done = True
        self._stop.set()
        while self._reader.is_alive():  # unblock a reader waiting to put, then let it finish
            with contextlib.suppress(queue.Empty):
                self._items.get(timeout=0.1)
            self._reader.join(timeout=0.1)


def read_ahead(source: Iterator[T], depth: int = 2) -> ReadAhead[T]:
    """``ReadAhead(source, depth)``: its reader thread starts now."""
    return ReadAhead(source, depth)
