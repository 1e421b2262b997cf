"""Saved ``/metrics`` scrapes among ``analyze``'s inputs: recognised by content, read whole.

A scrape is small (tens of KB), so it is read at once; only its head is handed out to tell it from
a log, so a multi-GB log costs one 256 KiB read here. gzip is recognised by its magic bytes, like
logs (kvwatch.sources.files).
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass

from kvwatch.errors import UsageError

SNIFF_BYTES = 256 << 10
MAX_SCRAPE_BYTES = 64 << 20  # a scrape larger than this is not a /metrics page of one server


@dataclass(frozen=True, slots=True)
class SavedScrape:
    """One saved exposition: its path, text, size on disk and modification time."""

    path: str
    text: str
    nbytes: int
    mtime: float


def _head(path: str) -> bytes:
    with open(path, "rb") as fh:
        magic = fh.read(2)
        fh.seek(0)
        if magic == b"\x1f\x8b":
            try:
                with gzip.open(fh) as gz:
                    return gz.read(SNIFF_BYTES)
            except (OSError, EOFError, zlib.error):
                return b""  # a damaged .gz: the log reader reports it
        return fh.read(SNIFF_BYTES)


def read_head(path: str) -> str | None:
    """The first SNIFF_BYTES of a file as text (gzip undone), for telling a scrape from a log
    (kvwatch.parse.scrapes.looks_like_exposition); None for ``-``, binary or unreadable files."""
    if path == "-" or not os.path.isfile(path):
        return None
    try:
        head = _head(path)
    except OSError:
        return None  # unreadable: the log reader gives the one-line error
    if not head.strip() or b"\x00" in head[:4096]:
        return None
    return head.decode("utf-8", errors="replace")


def read_scrape(path: str) -> SavedScrape:
    """The whole scrape at ``path`` (gzip undone). Raises UsageError when it cannot be read."""
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            data = fh.read(MAX_SCRAPE_BYTES + 1)
    except OSError as exc:
        raise UsageError(
            f"{path}: cannot read ({exc.strerror or type(exc).__name__}); give a saved /metrics file"
        ) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            raise UsageError(f"{path}: damaged gzip data; save the scrape again") from None
    if len(data) > MAX_SCRAPE_BYTES:
        raise UsageError(
            f"{path}: over {MAX_SCRAPE_BYTES >> 20} MiB, not one server's /metrics; give one scrape per file"
        )
    return SavedScrape(path, data.decode("utf-8", errors="replace"), st.st_size, st.st_mtime)
