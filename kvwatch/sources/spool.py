"""Decompressed pieces of a stream handed to worker processes through short-lived files.

A ``.gz`` is inflated in the parent (a gzip stream has one reading order), and its pieces were
pickled to the workers through multiprocessing's pipes: four copies of every byte (pickle, pipe
write, pipe read, unpickle) and a third of the parent's CPU on a 400 MB log. Written to a file in
the temporary directory, a piece costs one copy in and one out, the write runs in the read-ahead
thread (``os.write`` releases the GIL), and the worker that reads a piece deletes it, so at most
the pieces in flight (a few chunks) exist at once, whatever the input's size. Where the
directory cannot be written (full, read-only), pieces travel through the pipe as before.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

Piece = tuple[bytes, int, int]  # data, lo, hi: the complete lines data[lo:hi]
Spooled = str | Piece  # a spooled piece's file, or the piece itself where spooling failed


def spooled(pieces: Iterator[Piece], directory: str) -> Iterator[Spooled]:
    """Each piece written to its own file in ``directory`` (the file's path), in order; after a
    failed write, the pieces themselves."""
    spooling = True
    for n, piece in enumerate(pieces):
        if spooling:
            data, lo, hi = piece
            path = os.path.join(directory, f"{n:08d}.piece")
            try:
                with open(path, "wb") as out:
                    out.write(memoryview(data)[lo:hi])
            except OSError:
                spooling = False  # e.g. ENOSPC: the rest by pipe; this piece too
                _remove(path)
            else:
                yield path
                continue
        yield piece


def take(item: Spooled) -> Piece:
    """Worker: the piece behind ``item``, its file deleted once read."""
    if isinstance(item, tuple):
        return item
    with open(item, "rb") as fh:
        data = fh.read()
    _remove(item)
    return data, 0, len(data)


def spool_directory() -> tempfile.TemporaryDirectory[str]:
    """A fresh directory for one stream's pieces (removed with whatever is left in it)."""
    return tempfile.TemporaryDirectory(prefix="kvwatch-spool-", ignore_cleanup_errors=True)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
