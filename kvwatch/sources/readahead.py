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


def read_ahead(source: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``source``'s items in order, produced by a thread at most ``depth`` items ahead.

    An exception the source raises is raised here, in the consumer, at the point the failed item
    would have been; closing this iterator early stops the reader at its next item.
    """
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
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

    reader = threading.Thread(target=run, name="kvwatch-read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            item = items.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while reader.is_alive():  # unblock a reader waiting to put, then let it finish
            with contextlib.suppress(queue.Empty):
                items.get(timeout=0.1)
            reader.join(timeout=0.1)
