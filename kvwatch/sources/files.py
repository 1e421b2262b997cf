"""Saved logs in: plain files, ``.gz``, ``-`` (stdin); fast candidate-line scanning; parallel fan-out.

Reading every line of a multi-GB log in Python is far too slow, and most lines (access lines,
"Received request ...") say nothing about the KV cache. So logs are read as large binary chunks
cut at a newline, and only *candidate* physical lines are decoded: lines holding one of
``logpatterns.PREFILTER_ANCHORS`` (found with ``bytes.find``, one C-speed pass per literal), plus
the line after a stats record that stops short of its KV usage (a hard-wrapped record continues
there). Candidates go through the one ``LogParser`` in order, with their true line numbers.

A large plain file is cut into byte ranges scanned by worker processes (``jobs``); the ranges come
back in order, so the result is the same as a serial read. Memory is bounded by the chunk size
times the ranges in flight, never by the input size.
"""

from __future__ import annotations

import gzip
import os
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from multiprocessing.reduction import ForkingPickler
from typing import Any, BinaryIO, get_args

from kvwatch.errors import UsageError
from kvwatch.parse.log import LineScan, LogParser, scan_line
from kvwatch.parse.logpatterns import PREFILTER_ANCHORS, PRIMARY_ANCHORS, REQUEST_MARKERS, STATS_START
from kvwatch.records import LogRecord, LogTime

CHUNK_BYTES = 16 << 20  # one read; bytes.find passes are memory-bound, larger chunks gain nothing
MAX_LINE_BYTES = 1 << 20  # a candidate line is cut here (a 10 MB tqdm line is not a vLLM record)
PARALLEL_MIN_BYTES = 64 << 20  # below this, starting worker processes costs more than it saves

_STATS = STATS_START.encode()
_KV_USAGE = b"KV cache usage"
_REQUEST = tuple(m.encode() for m in REQUEST_MARKERS)
_NOT_STARTUP = (b"throughput", b"hit rate", b"preempted", b"EngineDead", *_REQUEST)
WINDOW_BYTES = 512 << 10  # startup lines sit this close to a "cache"/"memory" startup line
FULL_SCAN_BYTES = 64 << 20  # inputs up to this size are scanned for every anchor everywhere


@dataclass(frozen=True, slots=True)
class ChunkScan:
    """One chunk's candidate lines, already parsed: ``(line index in the chunk, text, scan)``."""

    lines: int
    nbytes: int
    candidates: list[tuple[int, str, LineScan]]


def _positional_reducer(cls: type) -> Callable[[Any], tuple[type, tuple[Any, ...]]]:
    names = tuple(f.name for f in fields(cls))

    def reduce(obj: Any) -> tuple[type, tuple[Any, ...]]:
        return type(obj), tuple([getattr(obj, n) for n in names])

    return reduce


# Worker results cross a process boundary once per chunk. The default pickling of slotted
# dataclasses sets every field by name on load; rebuilding them from positional arguments halves
# the cost of moving tens of thousands of records (multiprocessing's own registration API).
for _cls in (*get_args(LogRecord), LogTime, LineScan, ChunkScan):
    ForkingPickler.register(_cls, _positional_reducer(_cls))


def _line_span(data: bytes, pos: int, size: int) -> tuple[int, int]:
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    return start, size if end == -1 else end


def _find_lines(data: bytes, anchors: tuple[bytes, ...], spans: dict[int, int], lo: int, hi: int) -> None:
    size = len(data)
    find = data.find
    for anchor in anchors:
        pos = find(anchor, lo, hi)
        while pos != -1:
            start, end = _line_span(data, pos, size)
            spans[start] = end
            pos = find(anchor, end, hi)


def candidate_spans(data: bytes, full: bool) -> dict[int, int]:
    """Start -> end of every candidate line in ``data`` (complete lines)."""
    spans: dict[int, int] = {}
    size = len(data)
    if full:
        _find_lines(data, PREFILTER_ANCHORS, spans, 0, size)
    else:
        _find_lines(data, PRIMARY_ANCHORS, spans, 0, size)
        windows: list[tuple[int, int]] = []
        for start, end in sorted(spans.items()):
            line = data[start:end]
            if any(marker in line for marker in _NOT_STARTUP):
                continue
            lo, hi = max(0, start - WINDOW_BYTES), min(size, end + WINDOW_BYTES)
            if windows and lo <= windows[-1][1]:
                windows[-1] = (windows[-1][0], max(windows[-1][1], hi))
            else:
                windows.append((lo, hi))
        for lo, hi in windows:
            _find_lines(data, PREFILTER_ANCHORS, spans, lo, hi)
    for start, end in list(spans.items()):
        kv = data.find(_KV_USAGE, start, end)
        stats = data.rfind(_STATS, start, end)
        if kv != -1 and (stats == -1 or stats > kv) and start > 0:
            # KV usage with no record start before it: the first half of a hard-wrapped record
            # is on the line before.
            prev = data.rfind(b"\n", 0, start - 1) + 1
            spans.setdefault(prev, start - 1)
        if (
            stats != -1
            and end < size
            and (data.find(_KV_USAGE, stats, end) == -1 or not data[stats:end].rstrip().rstrip(b".").endswith(b"%"))
        ):
            # A record cut short (no KV usage yet, or not ending in its last percentage) may
            # continue on the next line.
            nxt = end + 1
            nend = data.find(b"\n", nxt)
            spans.setdefault(nxt, size if nend == -1 else nend)
    return spans


def candidate_lines(data: bytes, full: bool = True) -> ChunkScan:
    """Candidate lines of ``data`` (complete lines; the last may lack its newline), parsed."""
    spans = candidate_spans(data, full)
    candidates: list[tuple[int, str, LineScan]] = []
    line = 0
    prev = 0
    count = data.count
    for start in sorted(spans):
        line += count(b"\n", prev, start)
        prev = start
        end = min(spans[start], start + MAX_LINE_BYTES)
        text = data[start:end].decode("utf-8", "replace")
        candidates.append((line, text, scan_line(text, line + 1)))
    size = len(data)
    lines = line + count(b"\n", prev)
    if size and data[-1:] != b"\n":
        lines += 1
    return ChunkScan(lines, size, candidates)


def _scan_range(args: tuple[str, int, int, bool]) -> ChunkScan:
    """Worker: scan the lines that start in ``[start, end)`` of a plain file."""
    path, start, end, full = args
    with open(path, "rb") as fh:
        if start > 0:
            fh.seek(start - 1)
            # A line that starts before ``start`` belongs to the previous range.
            if fh.read(1) != b"\n":
                start += len(fh.readline())
        if start >= end:
            return ChunkScan(0, 0, [])
        fh.seek(start)
        data = fh.read(end - start)
        if data and data[-1:] != b"\n":
            data += fh.readline()  # finish the line that crosses ``end``
    return candidate_lines(data, full)


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    """Chunks of a stream, each ending at a newline (except the very last)."""
    carry = b""
    while True:
        block = fh.read(CHUNK_BYTES)
        if not block:
            break
        data = carry + block if carry else block
        cut = data.rfind(b"\n")
        if cut == -1 and len(data) < 4 * CHUNK_BYTES:
            carry = data  # one very long line: wait for its end (bounded, see below)
            continue
        if cut == -1:
            cut = len(data) - 1  # a line longer than 64 MiB: cut it, memory stays bounded
        yield data[: cut + 1]
        carry = data[cut + 1 :]
    if carry:
        yield carry


def check_path(path: str) -> None:
    """Raise UsageError (exit 2) for a missing path, a directory or an unreadable file."""
    if path == "-":
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; pass a saved vLLM log (plain, .gz) or - for stdin") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror}); check the path and its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{path}: is a directory; pass the log files inside it (e.g. {path}/*.log)")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{path}: permission denied; check the file's permissions")


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    try:
        with open(path, "rb") as probe:
            magic = probe.read(2)
        if magic == b"\x1f\x8b":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return open(path, "rb")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror}); check the path and its permissions") from None


def _ranges(path: str, size: int, jobs: int, full: bool) -> list[tuple[str, int, int, bool]]:
    # More ranges than workers keeps memory bounded (one chunk per range in flight).
    n = max(jobs, -(-size // CHUNK_BYTES))
    step = -(-size // n)
    return [(path, i, min(size, i + step), full) for i in range(0, size, step)]


def _scans(path: str, jobs: int) -> Iterator[ChunkScan]:
    is_plain = path != "-" and os.path.isfile(path)
    size = os.path.getsize(path) if is_plain else 0
    gz = False
    if is_plain:
        with open(path, "rb") as probe:
            gz = probe.read(2) == b"\x1f\x8b"
    if is_plain and not gz and jobs > 1 and size >= PARALLEL_MIN_BYTES:
        import multiprocessing

        ctx = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
        with ctx.Pool(jobs) as pool:
            yield from pool.imap(_scan_range, _ranges(path, size, jobs, size <= FULL_SCAN_BYTES))
        return
    fh = _open(path)
    try:
        seen = 0
        for data in _chunks(fh):
            # A small input is scanned for every anchor; a large one in windows (see above).
            seen += len(data)
            yield candidate_lines(data, full=seen <= FULL_SCAN_BYTES and len(data) < CHUNK_BYTES)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise UsageError(
            f"{path}: damaged or truncated gzip ({exc}); re-copy the file or gunzip what is readable"
        ) from None
    except OSError as exc:
        raise UsageError(f"{path}: read failed ({exc}); check the file") from None
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


class LogInput:
    """One input (plain, gzip by its magic bytes, or ``-``) read as batches of records, in order.

    ``lines`` and ``bytes`` are complete once ``batches()`` is exhausted.
    """

    def __init__(self, path: str, *, jobs: int = 1, progress: Callable[[int], None] | None = None) -> None:
        check_path(path)
        self.path = path
        self.jobs = jobs
        self.progress = progress
        self.lines = 0
        self.bytes = 0

    def batches(self) -> Iterator[list[LogRecord]]:
        """Records chunk by chunk (the memory held is one chunk's, whatever the input size)."""
        parser = LogParser()
        for scan in _scans(self.path, self.jobs):
            batch: list[LogRecord] = []
            for rel, text, line_scan in scan.candidates:
                batch.extend(parser.feed_scan(line_scan, self.lines + rel + 1, text))
            self.lines += scan.lines
            self.bytes += scan.nbytes
            if self.progress is not None:
                self.progress(scan.nbytes)
            if batch:
                yield batch
        tail = parser.finish()
        if tail:
            yield tail


def default_jobs() -> int:
    """Worker processes for a big file: the CPUs this process may use, at most 4."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


def open_logs(
    paths: list[str], *, jobs: int | None = None, progress: Callable[[int], None] | None = None
) -> list[LogInput]:
    """Every input, checked before any is read, so a typo in the last path fails at once."""
    for path in paths:
        check_path(path)
    if paths.count("-") > 1:
        raise UsageError("- (stdin) given more than once; pass it once")
    n = default_jobs() if jobs is None else jobs
    return [LogInput(path, jobs=n, progress=progress) for path in paths]
