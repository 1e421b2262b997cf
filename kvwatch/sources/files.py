"""Saved logs in: plain files, ``.gz``, UTF-16 (a Windows PowerShell redirect), ``-`` (stdin); fast
candidate-line scanning; parallel fan-out.

Reading every line of a multi-GB log in Python is far too slow, and most lines (access lines,
"Received request ...") say nothing about the KV cache. So logs are read as large binary chunks of
whole lines, and only *candidate* physical lines are decoded and parsed:

* small inputs, and the first and last EDGE_BYTES of a large one (startup at the top, a crash at
  the end), are searched for every literal of ``logpatterns.PREFILTER_ANCHORS`` (``bytes.find``,
  one C-speed pass per literal, each about as costly as a grep of those bytes);
* the big middle of a large log gets one pass for ``PRIMARY_ANCHORS`` ("cache": every stats
  record, preemption and capacity error), and the other literals are looked for only in a window
  of WINDOW_BYTES around startup lines (with the neighbouring chunk's bytes as context);
* a line whose KV usage has no record start before it brings the lines before (the first part of a
  hard-wrapped record), and a record that does not end in its last percentage brings the next
  few lines (an 80-column terminal cuts one into up to five).

Candidates go through the one ``LogParser`` in order, with their true line numbers. A large plain
file is cut into chunk-sized byte ranges scanned (and parsed) by worker processes; results come
back in file order, so the outcome is the same as a serial read (tests compare them). Memory is
bounded by the chunk size times the ranges in flight, never by the input size.
"""

from __future__ import annotations

import codecs
import gc
import gzip
import os
import stat
import sys
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass
from itertools import islice, pairwise
from multiprocessing.reduction import ForkingPickler
from operator import attrgetter
from typing import Any, BinaryIO, get_args

from kvwatch.errors import UsageError
from kvwatch.parse.log import MAX_WRAP_LINES, LineScan, LogParser, StatsRow, scan_line_compact
from kvwatch.parse.logpatterns import PREFILTER_ANCHORS, PRIMARY_ANCHORS, REQUEST_MARKERS, STATS_START
from kvwatch.records import LogRecord, LogTime

CHUNK_BYTES = 16 << 20  # one read; bytes.find passes are memory-bound, larger chunks gain nothing
MAX_LINE_BYTES = 1 << 20  # a candidate line is cut here (a 10 MB tqdm line is not a vLLM record)
PARALLEL_MIN_BYTES = 64 << 20  # below this, starting worker processes costs more than it saves

_STATS = STATS_START.encode()
_KV_USAGE = b"KV cache usage"
_REQUEST = tuple(m.encode() for m in REQUEST_MARKERS)
_NOT_STARTUP = (b"throughput", b"hit rate", b"preempted", b"EngineDead", *_REQUEST)
WINDOW_BYTES = 512 << 10  # startup lines sit this close to a startup line that says "cache"
FULL_SCAN_BYTES = 64 << 20  # inputs up to this size are scanned for every anchor everywhere
# The first and the last EDGE_BYTES of a larger input are scanned for every anchor: the startup
# block at the top and a crash at the end (about 10,000 lines each; a startup block or a crash's
# tracebacks, even from 8 workers, are a few hundred KB). Each anchor pass costs about a grep over
# the bytes: every anchor over two whole 16 MiB chunks cost more than the rest of a 400 MB log, and
# 2 MiB edges cost 0.07 s of CPU on it. Startup blocks elsewhere are found by their windows.
EDGE_BYTES = 2 << 20


@dataclass(frozen=True, slots=True)
class ChunkScan:
    """One chunk's candidate lines, already parsed: ``(line index in the chunk, text, scan)``.

    ``text`` is kept only for a line that follows a stats record left open (LogParser joins the
    two); elsewhere it is "" so that less crosses the process boundary. ``scan`` is a plain
    ``StatsRow`` for a line that is one stats record and nothing else (nearly all of a big log's
    candidates), a ``LineScan`` for anything else.
    """

    lines: int
    nbytes: int
    candidates: list[tuple[int, str, LineScan | StatsRow]]


def _positional_reducer(cls: type) -> Callable[[Any], tuple[type, tuple[Any, ...]]]:
    values = attrgetter(*(f.name for f in fields(cls)))  # one C call for all fields

    def reduce(obj: Any) -> tuple[type, tuple[Any, ...]]:
        return cls, values(obj)

    return reduce


# Worker results cross a process boundary once per chunk. The default pickling of slotted
# dataclasses sets every field by name on load; rebuilding them from positional arguments halves
# the cost of moving them (multiprocessing's own registration API). NamedTuple records (LogTime,
# StatsRecord) need no reducer, and plain stats lines travel as plain tuples anyway (StatsRow).
_cls: type
for _cls in (*get_args(LogRecord), LogTime, LineScan, ChunkScan):
    if is_dataclass(_cls):
        ForkingPickler.register(_cls, _positional_reducer(_cls))


def _find_lines(data: bytes, anchors: tuple[bytes, ...], spans: dict[int, int], lo: int, hi: int) -> None:
    """Add the span of every line in ``data[lo:hi]`` holding one of ``anchors``."""
    find, rfind = data.find, data.rfind
    for anchor in anchors:
        pos = find(anchor, lo, hi)
        while pos != -1:
            start = max(lo, rfind(b"\n", lo, pos) + 1)
            end = find(b"\n", pos, hi)
            if end == -1:
                end = hi
            spans[start] = end
            pos = find(anchor, end, hi)


def _is_seed(data: bytes, start: int, end: int) -> bool:
    """Whether the line ``data[start:end]`` may be a startup line (none of _NOT_STARTUP in it)."""
    if data.find(_NOT_STARTUP[0], start, end) != -1:
        return False  # a stats record, nearly every PRIMARY_ANCHORS line of a big log: no slice
    line = data[start:end]
    return not any(m in line for m in _NOT_STARTUP[1:])


def _seeds(data: bytes, lo: int, hi: int) -> list[tuple[int, int]]:
    """Startup lines among the PRIMARY_ANCHORS lines of ``data[lo:hi]``: where windows centre."""
    hits: dict[int, int] = {}
    _find_lines(data, PRIMARY_ANCHORS, hits, lo, hi)
    return [(s, e) for s, e in sorted(hits.items()) if _is_seed(data, s, e)]


def candidate_spans(
    data: bytes,
    full: bool,
    lo: int = 0,
    hi: int | None = None,
    ctx_lo: int | None = None,
    ctx_hi: int | None = None,
    head: int = 0,
    tail: int = 0,
) -> dict[int, int]:
    """Start -> end of every candidate line in ``data[lo:hi]`` (complete lines).

    ``data[ctx_lo:ctx_hi]`` (complete lines around ``[lo, hi)``) is context: a startup line there
    opens a window that reaches into ``[lo, hi)``, so a startup block cut by a chunk boundary is
    read on both sides. When not ``full``, the first ``head`` and the last ``tail`` bytes of
    ``[lo, hi)`` are searched for every anchor too, as windows (the edges of the input).
    """
    hi = len(data) if hi is None else hi
    ctx_lo = lo if ctx_lo is None else ctx_lo
    ctx_hi = hi if ctx_hi is None else ctx_hi
    spans: dict[int, int] = {}
    if full:
        _find_lines(data, PREFILTER_ANCHORS, spans, lo, hi)
    else:
        _find_lines(data, PRIMARY_ANCHORS, spans, lo, hi)
        seeds = _seeds(data, ctx_lo, lo) + [(s, e) for s, e in sorted(spans.items()) if _is_seed(data, s, e)]
        if ctx_hi > hi:
            seeds += _seeds(data, hi, ctx_hi)
        wanted = [(max(lo, start - WINDOW_BYTES), min(hi, end + WINDOW_BYTES)) for start, end in seeds]
        if head > 0:
            wanted.append((lo, min(hi, lo + head)))
        if tail > 0:
            wanted.append((max(lo, hi - tail), hi))
        windows: list[tuple[int, int]] = []
        for w_lo, w_hi in sorted(wanted):
            if w_lo >= w_hi:
                continue
            if windows and w_lo <= windows[-1][1]:
                windows[-1] = (windows[-1][0], max(windows[-1][1], w_hi))
            else:
                windows.append((w_lo, w_hi))
        for w_lo, w_hi in windows:
            # Widen to whole lines so a line cut by the window edge is still found.
            w_start = max(lo, data.rfind(b"\n", lo, w_lo) + 1)
            w_end = data.find(b"\n", w_hi, hi)
            _find_lines(data, PREFILTER_ANCHORS, spans, w_start, hi if w_end == -1 else w_end)
    find, rfind, endswith = data.find, data.rfind, data.endswith
    for start, end in list(spans.items()):
        kv = find(_KV_USAGE, start, end)
        stats = rfind(_STATS, start, end)
        if kv != -1 and (stats == -1 or stats > kv) and start > lo:
            # KV usage with no record start before it: the first part of a hard-wrapped record
            # is on the lines before.
            cur = start
            for _ in range(MAX_WRAP_LINES - 1):
                if cur <= lo:
                    break
                prev = max(lo, rfind(b"\n", lo, cur - 1) + 1)
                spans.setdefault(prev, cur - 1)
                cur = prev
        part = stats if stats != -1 else kv  # a record, or the rest of one cut before its KV usage
        if (
            part != -1
            and end < hi
            and (
                (kv if kv >= part else find(_KV_USAGE, part, end)) == -1
                # endswith first: the common whole record ends in "%" and needs no slice
                or not (endswith(b"%", part, end) or data[part:end].rstrip().rstrip(b".").endswith(b"%"))
            )
        ):
            # A record cut short (no KV usage yet, or not ending in its last percentage) may
            # continue on the next lines (LogParser decides how many belong to it).
            nxt = end + 1
            for _ in range(MAX_WRAP_LINES - 1):
                if nxt >= hi:
                    break
                nend = data.find(b"\n", nxt, hi)
                nend = hi if nend == -1 else nend
                spans.setdefault(nxt, nend)
                nxt = nend + 1
    return spans


def candidate_lines(
    data: bytes,
    full: bool = True,
    lo: int = 0,
    hi: int | None = None,
    ctx_lo: int | None = None,
    ctx_hi: int | None = None,
    head: int = 0,
    tail: int = 0,
) -> ChunkScan:
    """Candidate lines of ``data[lo:hi]`` (complete lines; the last may lack its newline), parsed.

    ``full``, ``ctx_lo``, ``ctx_hi``, ``head`` and ``tail`` as for ``candidate_spans``.
    """
    hi = len(data) if hi is None else hi
    spans = candidate_spans(data, full, lo, hi, ctx_lo, ctx_hi, head, tail)
    candidates: list[tuple[int, str, LineScan | StatsRow]] = []
    line = 0
    prev = lo
    count = data.count
    open_until = -1  # the last line that may continue a stats record left open (hard wrap)
    for start in sorted(spans):
        line += count(b"\n", prev, start)
        prev = start
        end = min(spans[start], start + MAX_LINE_BYTES)
        text = data[start:end].decode("utf-8", "replace")
        scan = scan_line_compact(text, line + 1)
        # The text travels on only where LogParser may need it: the lines after an open record
        # (and a chunk's first line, whose predecessor is in the chunk before).
        candidates.append((line, text if line == 0 or line <= open_until else "", scan))
        if isinstance(scan, LineScan) and scan.open_stats is not None:
            open_until = line + MAX_WRAP_LINES - 1
    lines = line + count(b"\n", prev, hi)
    if hi > lo and data[hi - 1 : hi] != b"\n":
        lines += 1
    return ChunkScan(lines, hi - lo, candidates)


def _merge(scans: list[ChunkScan]) -> ChunkScan:
    """Consecutive pieces as one chunk (line indices shifted by the lines before)."""
    if len(scans) == 1:
        return scans[0]
    candidates: list[tuple[int, str, LineScan | StatsRow]] = []
    lines = nbytes = 0
    for sc in scans:
        candidates.extend((rel + lines, text, scan) for rel, text, scan in sc.candidates)
        lines += sc.lines
        nbytes += sc.nbytes
    return ChunkScan(lines, nbytes, candidates)


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused for a bounded-memory read of a log.

    Reading a big log allocates hundreds of thousands of short-lived tuples and lists that
    reference counting frees at once; the reader and the analysis create no reference cycles, so
    the collector's passes (one per 700 allocations) only re-walk live objects: about 4 % of the
    time of ``kvwatch analyze`` on a 2 M-line log (0.93 s instead of 0.97 s in-process).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


Range = tuple[str, int, int, bool, int, int]  # path, start, end, full, head and tail edge bytes


def _scan_range(args: Range) -> ChunkScan:
    """Worker: scan the lines that start in ``[start, end)`` of a plain file.

    It reads WINDOW_BYTES more on each side as context (see candidate_spans), so a startup block
    cut by the range boundary is found from both ranges; each line is reported by one range only.
    Its first ``head`` and last ``tail`` bytes (the input's edges) are searched for every anchor.
    """
    path, start, end, full, head, tail = args
    with paused_gc():
        return _scan_range_lines(path, start, end, full, head, tail)


def _scan_range_lines(path: str, start: int, end: int, full: bool, head: int, tail: int) -> ChunkScan:
    with open(path, "rb") as fh:
        c0 = max(0, start - WINDOW_BYTES)
        fh.seek(c0)
        buf = fh.read(end - c0 + WINDOW_BYTES)
        at_eof = len(buf) < end - c0 + WINDOW_BYTES
        rel_start, rel_end = start - c0, min(end - c0, len(buf))
        # The lines that start in [start, end): one that starts before belongs to the range before.
        if start == 0 or buf[rel_start - 1 : rel_start] == b"\n":
            lo = rel_start  # the range starts with a line (it used to be dropped whole)
        else:
            lo = buf.find(b"\n", rel_start) + 1
            if lo == 0:  # no newline after start: the line began in the range before
                return ChunkScan(0, 0, [])
        if lo >= rel_end:
            return ChunkScan(0, 0, [])
        if rel_end == len(buf) or buf[rel_end - 1 : rel_end] == b"\n":
            hi = rel_end
        else:
            nl = buf.find(b"\n", rel_end)
            if nl == -1 and not at_eof:
                buf += fh.readline()  # a line longer than the context crosses ``end`` (rare)
                nl = buf.find(b"\n", rel_end)
            hi = len(buf) if nl == -1 else nl + 1
        ctx_lo = 0 if c0 == 0 else min(lo, buf.find(b"\n") + 1)
        ctx_hi = max(hi, buf.rfind(b"\n") + 1) if not at_eof else len(buf)
    return candidate_lines(buf, full, lo, hi, ctx_lo, ctx_hi, head, tail)


Piece = tuple[bytes, int, int]  # data, lo, hi: the complete lines data[lo:hi]


def _pieces(fh: BinaryIO) -> Iterator[Piece]:
    """A stream as pieces of complete lines, without copying the big blocks it reads.

    A line that crosses a block boundary becomes a small piece of its own; a line longer than
    four blocks is cut there, so memory stays bounded whatever the input.
    """
    carry = b""
    while True:
        block = fh.read(CHUNK_BYTES)
        if not block:
            break
        lo = 0
        if carry:
            nl = block.find(b"\n")
            if nl == -1:
                carry += block
                if len(carry) >= 4 * CHUNK_BYTES:
                    yield carry, 0, len(carry)
                    carry = b""
                continue
            joined = carry + block[: nl + 1]
            yield joined, 0, len(joined)
            carry = b""
            lo = nl + 1
        last = block.rfind(b"\n", lo) + 1
        if last > lo:
            yield block, lo, last
        carry = block[max(lo, last) :]
    if carry:
        yield carry, 0, len(carry)


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    """The pieces of a stream as bytes (for tests and simple callers)."""
    for data, lo, hi in _pieces(fh):
        yield data[lo:hi]


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


# How a saved file is stored, from its first bytes: gzip, or UTF-16 with its byte-order mark (what
# Windows PowerShell 5's `docker logs vllm > vllm.log` writes); anything else is read as it is.
_GZIP = b"\x1f\x8b"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _storage(path: str) -> str:
    """``gzip``, ``utf-16`` or ``plain`` for the file at ``path``."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == _GZIP:
        return "gzip"
    return "utf-16" if magic in _UTF16_BOMS else "plain"


def _open(path: str) -> BinaryIO:
    if path == "-":
        return sys.stdin.buffer
    try:
        storage = _storage(path)
        if storage == "gzip":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        if storage == "utf-16":  # re-encoded as UTF-8 on the way in: the reader sees what vLLM wrote
            return codecs.EncodedFile(open(path, "rb"), "utf-8", "utf-16", errors="replace")
        return open(path, "rb")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror}); check the path and its permissions") from None


def _ranges(path: str, size: int, full: bool) -> list[Range]:
    # Chunk-sized ranges: memory is bounded by the ranges in flight, not by the file. The first
    # and the last EDGE_BYTES are ranges of their own when the input is large: they are scanned
    # for every anchor (startup at the top, a crash at the end), which costs as much as a whole
    # chunk's scan, and small edge ranges keep the two workers evenly busy at the start and end.
    edge = EDGE_BYTES if not full and size > 4 * EDGE_BYTES else 0
    n = max(1, -(-(size - 2 * edge) // CHUNK_BYTES))
    step = -(-(size - 2 * edge) // n)
    bounds = ([0] if edge else []) + list(range(edge, size - edge, step)) + [size - edge] * bool(edge) + [size]
    out: list[Range] = []
    for s, e in pairwise(bounds):
        out.append((path, s, e, full, max(0, EDGE_BYTES - s), max(0, EDGE_BYTES - (size - e))))
    return out


def _scans(path: str, jobs: int) -> Iterator[ChunkScan]:
    is_plain = path != "-" and os.path.isfile(path)
    size = os.path.getsize(path) if is_plain else 0
    # Byte ranges and the size-based choices below need the bytes on disk to be the log's bytes.
    as_on_disk = is_plain and _storage(path) == "plain"
    if as_on_disk and jobs > 1 and size >= PARALLEL_MIN_BYTES:
        yield from _parallel_scans(path, size, jobs)
        return
    fh = _open(path)
    try:
        # A piece is scanned once the next is read (the neighbours' facing WINDOW_BYTES are its
        # context, see candidate_spans) and once EDGE_BYTES follow it or the input has ended:
        # then it is known how much of it lies in the last EDGE_BYTES (usually one piece of delay).
        held: deque[Piece] = deque()
        held_bytes = 0  # bytes of the held pieces
        offset = 0  # input offset of the oldest held piece
        before = b""
        small = as_on_disk and size <= FULL_SCAN_BYTES
        for piece in _pieces(fh):
            held.append(piece)
            held_bytes += piece[2] - piece[1]
            while len(held) > 1 and held_bytes - (held[0][2] - held[0][1]) >= EDGE_BYTES:
                oldest = held.popleft()
                held_bytes -= oldest[2] - oldest[1]
                yield _scan_piece(oldest, small, before, _head(held[0]), max(0, EDGE_BYTES - offset), 0)
                before = _tail(oldest)
                offset += oldest[2] - oldest[1]
        while held:  # the input has ended
            oldest = held.popleft()
            held_bytes -= oldest[2] - oldest[1]
            after = _head(held[0]) if held else b""
            yield _scan_piece(
                oldest, small, before, after, max(0, EDGE_BYTES - offset), max(0, EDGE_BYTES - held_bytes)
            )
            before = _tail(oldest)
            offset += oldest[2] - oldest[1]
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise UsageError(
            f"{path}: damaged or truncated gzip ({exc}); re-copy the file or gunzip what is readable"
        ) from None
    except OSError as exc:
        raise UsageError(f"{path}: read failed ({exc}); check the file") from None
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


def _head(piece: Piece) -> bytes:
    """The first WINDOW_BYTES of a piece, in whole lines."""
    data, lo, hi = piece
    cut = data.find(b"\n", min(hi, lo + WINDOW_BYTES) - 1, hi)
    return data[lo : hi if cut == -1 else cut + 1]


def _tail(piece: Piece) -> bytes:
    """The last WINDOW_BYTES of a piece, in whole lines."""
    data, lo, hi = piece
    cut = data.rfind(b"\n", lo, max(lo, hi - WINDOW_BYTES))
    return data[lo if cut == -1 else cut + 1 : hi]


def _scan_piece(piece: Piece, full: bool, before: bytes, after: bytes, head: int = 0, tail: int = 0) -> ChunkScan:
    data, lo, hi = piece
    # Every anchor everywhere for small inputs and small pieces, and in the piece's first ``head``
    # and last ``tail`` bytes (the input's edges); the rest of a large log is scanned for
    # PRIMARY_ANCHORS and windows (see candidate_spans).
    if full or hi - lo < CHUNK_BYTES // 4:
        return candidate_lines(data, True, lo, hi)
    if not (before and _seeds(before, 0, len(before))) and not (after and _seeds(after, 0, len(after))):
        return candidate_lines(data, False, lo, hi, head=head, tail=tail)
    # A neighbour holds a startup line whose window reaches here: scan with it as context.
    buf = before + data[lo:hi] + after
    return candidate_lines(buf, False, len(before), len(before) + hi - lo, 0, len(buf), head, tail)


def _parallel_scans(path: str, size: int, jobs: int) -> Iterator[ChunkScan]:
    """Byte ranges scanned by ``jobs`` worker processes, yielded in file order.

    At most two ranges per worker are in flight, so a slow consumer never lets results pile up.
    The last range goes second (its result waits): the end then has no slow range left for one
    worker while the other idles.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    all_ranges = _ranges(path, size, size <= FULL_SCAN_BYTES)
    ranges = iter(all_ranges[:-1] if len(all_ranges) > 2 else all_ranges)
    with ctx.Pool(jobs) as pool:
        in_flight = deque(pool.apply_async(_scan_range, (r,)) for r in islice(ranges, 1))
        last = pool.apply_async(_scan_range, (all_ranges[-1],)) if len(all_ranges) > 2 else None
        in_flight.extend(pool.apply_async(_scan_range, (r,)) for r in islice(ranges, 2 * jobs - 2))
        while in_flight:
            result = in_flight.popleft().get()
            nxt = next(ranges, None)
            if nxt is not None:
                in_flight.append(pool.apply_async(_scan_range, (nxt,)))
            yield result
        if last is not None:
            yield last.get()


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
        self._read: tuple[int, int, list[LogRecord]] | None = None  # read ahead by a worker

    def is_small_file(self) -> bool:
        """A plain file small enough to read whole in one worker (many pods' logs in parallel)."""
        return self.path != "-" and os.path.isfile(self.path) and os.path.getsize(self.path) < PARALLEL_MIN_BYTES

    def batches(self) -> Iterator[list[LogRecord]]:
        """Records chunk by chunk (the memory held is one chunk's, whatever the input size)."""
        if self._read is not None:
            self.lines, self.bytes, records = self._read
            self._read = None
            if self.progress is not None:
                self.progress(self.bytes)
            if records:
                yield records
            return
        parser = LogParser()
        for scan in _scans(self.path, self.jobs):
            batch = parser.feed_chunk(scan.candidates, self.lines)
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


def _read_whole(path: str) -> tuple[int, int, list[LogRecord]]:
    """Worker: one small input read whole."""
    log = LogInput(path)
    records = [r for batch in log.batches() for r in batch]
    return log.lines, log.bytes, records


def iter_logs(
    paths: list[str], *, jobs: int | None = None, progress: Callable[[int], None] | None = None
) -> Iterator[LogInput]:
    """``open_logs``, in input order, with small files read ahead in parallel by worker processes.

    One log per pod is the common postmortem: each small file goes whole to a worker (at most
    two per worker in flight); a large file is split into byte ranges by ``LogInput`` itself.
    """
    logs = open_logs(paths, jobs=jobs, progress=progress)
    n = logs[0].jobs if logs else 1
    small = [log for log in logs if log.is_small_file()]
    if n < 2 or len(small) < 2:
        yield from logs
        return
    import multiprocessing

    ctx = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    with ctx.Pool(n) as pool:
        todo = iter(small)
        in_flight = deque((log, pool.apply_async(_read_whole, (log.path,))) for log in islice(todo, 2 * n))
        for log in logs:
            if in_flight and in_flight[0][0] is log:
                _, result = in_flight.popleft()
                log._read = result.get()
                nxt = next(todo, None)
                if nxt is not None:
                    in_flight.append((nxt, pool.apply_async(_read_whole, (nxt.path,))))
            yield log
