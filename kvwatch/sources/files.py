"""Saved logs in: plain files, ``.gz``, UTF-16 (a Windows PowerShell redirect), ``-`` (stdin); fast
candidate-line scanning; parallel fan-out.

Reading every line of a multi-GB log in Python is far too slow, and most lines (access lines,
"Received request ...") say nothing about the KV cache. So logs are read as large binary chunks of
whole lines, and only *candidate* physical lines are decoded and parsed:

* every byte of every input, whatever its size (a file, a .gz, stdin), is searched for every
  literal of ``logpatterns.PREFILTER_ANCHORS`` by ``kvwatch.sources.scanner`` (one compiled
  multi-pattern pass where hyperscan imports, one ``bytes.find`` pass per literal elsewhere). A
  postmortem does not depend on the file's size: a crash or a restart far from any "cache" line
  is read in a 10 GB log as in a 10 KB one;
* a line whose KV usage has no record start before it brings the lines before (the first part of a
  hard-wrapped record), and a record that does not end in its last percentage brings the next
  few lines (an 80-column terminal cuts one into up to five).

Candidates go through the one ``LogParser`` in order, with their true line numbers. A large plain
file, or many files, are cut into chunk-sized byte ranges scanned (and parsed) by one pool of
worker processes; a .gz is inflated by a reader thread (kvwatch.sources.inflate: ISA-L where it
is installed, else zlib; both release the GIL) while the pieces before are scanned, by the workers
when it is large (the pieces reach them as short-lived files, kvwatch.sources.spool). Results come
back in input order, so the outcome is the same as a serial read (tests compare them). Memory is
bounded by the chunk size times the ranges in flight, never by the input size.
"""

from __future__ import annotations

import codecs
import gc
import os
import stat
import sys
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass
from itertools import chain, islice
from multiprocessing.reduction import ForkingPickler
from operator import attrgetter
from typing import Any, BinaryIO, get_args

from kvwatch.errors import UsageError
from kvwatch.parse.log import (
    ASGI_ERROR,
    ECHOED,
    HEADER_BYTES,
    MAX_WRAP_LINES,
    Head,
    LineScan,
    LogParser,
    RunState,
    RunTail,
    StatsRow,
    StreamRuns,
    after_runs,
    lead_level,
    runtime_streams,
    says_something,
    scan_line_compact,
    stream_tag,
)
from kvwatch.parse.logpatterns import STATS_START
from kvwatch.parse.statsbytes import plain_stats_row
from kvwatch.records import LogRecord, LogTime
from kvwatch.sources import inflate, spool
from kvwatch.sources.pieces import CLOSED, LOOKBACK, Open, continuations, entry, line_start_after, python_partials
from kvwatch.sources.readahead import read_ahead
from kvwatch.sources.scanner import find_lines, line_spans

CHUNK_BYTES = 16 << 20  # one read; bytes.find passes are memory-bound, larger chunks gain nothing
MAX_LINE_BYTES = 1 << 20  # a candidate line is cut here (a 10 MB tqdm line is not a vLLM record)
PARALLEL_MIN_BYTES = 64 << 20  # below this, starting worker processes costs more than it saves

_STATS = STATS_START.encode()
_KV_USAGE = b"KV cache usage"


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
    open_streams: Open = CLOSED  # the runtime streams whose last entry here was a partial one
    # Candidates (index, prefix) whose run of one vLLM prefix began before the chunk, and what its
    # lines tell of the run they end in (log.EchoRuns; None: no line): the reader, who reads the
    # chunks in order, decides them (LogInput.batches).
    echo_pending: tuple[tuple[int, str, str, int], ...] = ()  # (index, stream, run key, leading events before it)
    echo_tails: tuple[tuple[str, RunTail], ...] = ()  # (stream, its tail): log.StreamRuns.tails


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


# The pure-Python line finder, under its old name for callers of this module.
_find_lines = find_lines


def candidate_spans(
    data: bytes, full: bool = True, lo: int = 0, hi: int | None = None, pending: Open = CLOSED
) -> dict[int, int]:
    """Start -> end of every candidate line in ``data[lo:hi]`` (complete lines).

    Every line kind of the pattern table is searched in every byte. ``full`` is kept for callers
    of the time when a large input's middle was searched for "cache" only; it changes nothing.
    ``pending``: the container-runtime streams open at ``lo`` (kvwatch.sources.pieces).
    """
    return _candidate_spans(data, lo, len(data) if hi is None else hi, pending)[0]


def _candidate_spans(data: bytes, lo: int, hi: int, pending: Open) -> tuple[dict[int, int], Open, Sequence[int]]:
    """``candidate_spans``, the runtime streams still open at ``hi`` and the starts of the
    runtime's continuation pieces.

    A piece that continues an entry the container runtime cut (a long line stored as several
    entries) is no candidate, whatever it holds: it is the rest of the line its first piece
    started, and a client may have put a forged header at its start (kvwatch.sources.pieces).
    """
    partials: list[int] = []
    spans = line_spans(data, lo, hi, partials)
    cont, still_open = continuations(data, lo, hi, partials, pending) if partials or pending else ((), CLOSED)
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
    for start in cont:  # after the hard-wrap lines: a continuation piece is no record's rest either
        spans.pop(start, None)
    return spans, still_open, cont


def candidate_lines(
    data: bytes,
    full: bool = True,
    lo: int = 0,
    hi: int | None = None,
    pending: Open = CLOSED,
    streams: Sequence[str] = (),
) -> ChunkScan:
    """Candidate lines of ``data[lo:hi]`` (complete lines; the last may lack its newline), parsed.

    ``full`` and ``pending`` as for ``candidate_spans``; the scan's ``open_streams`` is the
    ``pending`` of the bytes that follow. ``streams``: the input's runtime streams, whose runs are
    kept apart (``input_streams``).
    """
    hi = len(data) if hi is None else hi
    spans, still_open, cont = _candidate_spans(data, lo, hi, pending)
    skip = frozenset(cont)
    runs = StreamRuns(lambda: _ChunkLines(data, lo, hi, skip), streams)
    echo_pending: list[tuple[int, str, str, int]] = []
    candidates: list[tuple[int, str, LineScan | StatsRow]] = []
    line = 0
    prev = lo
    count = data.count
    open_until = -1  # the last line that may continue a stats record left open (hard wrap)
    for start in sorted(spans):
        line += count(b"\n", prev, start)
        prev = start
        end = min(spans[start], start + MAX_LINE_BYTES)
        # The common V1 stats layout straight from the bytes; any other line decoded and parsed.
        row = plain_stats_row(data, start, end)
        if row is not None:
            candidates.append((line, data[start:end].decode() if line == 0 or line <= open_until else "", row))
            continue
        text = data[start:end].decode("utf-8", "replace")
        scan = scan_line_compact(text, line + 1)
        if isinstance(scan, LineScan) and says_something(scan):
            stream = runs.stream(start)
            echo = runs.of(stream)
            key = echo.head(start, text).key
            level, n = echo.before(start, key)
            if level == ECHOED:
                continue  # the rest of a message a client's text holds (log.record_head)
            if level is None:  # its run began before this chunk: the reader decides
                echo_pending.append((len(candidates), stream, key, n))
        # The text travels on only where LogParser may need it: the lines after an open record
        # (and a chunk's first line, whose predecessor is in the chunk before).
        candidates.append((line, text if line == 0 or line <= open_until else "", scan))
        if isinstance(scan, LineScan) and scan.open_stats is not None:
            open_until = line + MAX_WRAP_LINES - 1
    lines = line + count(b"\n", prev, hi)
    if hi > lo and data[hi - 1 : hi] != b"\n":
        lines += 1
    return ChunkScan(lines, hi - lo, candidates, still_open, tuple(echo_pending), runs.tails())


def input_streams(first_line: bytes) -> tuple[str, ...]:
    """The runtime streams of an input that begins with ``first_line`` (log.runtime_streams): the
    whole input is read by them, whatever a line further on may spell."""
    end = first_line.find(b"\n")
    e = entry(first_line, 0, len(first_line) if end == -1 else end)
    return runtime_streams(e[0].decode("ascii") if e is not None else "")


_ASGI_WORDS = ASGI_ERROR.encode()
_FIRST_LINE_BYTES = 64 << 10  # enough of an input's first line for its runtime's tag (input_streams)


class _ChunkLines:
    """``log.Lines`` of ``data[lo:hi]``, by line start. The lines that hold ASGI_ERROR's words and
    the headed lines are found in the bytes (an access-log flood between vLLM's lines is never
    read line by line); each header the byte search finds is confirmed by the caller's reading
    (``head``), as log.HEADER_BYTES says."""

    __slots__ = ("_asgi", "_data", "_headed", "_hi", "_lo", "_skip")

    def __init__(self, data: bytes, lo: int, hi: int, skip: frozenset[int]) -> None:
        self._data, self._lo, self._hi, self._skip = data, lo, hi, skip
        self._asgi: list[int] | None = None
        self._headed: dict[int, int | None] = {}

    def text(self, pos: int) -> str:
        if pos in self._skip:
            return ""
        end = self._data.find(b"\n", pos, self._hi)
        end = self._hi if end == -1 else end
        return self._data[pos : min(end, pos + MAX_LINE_BYTES)].decode("utf-8", "replace")

    def prev(self, pos: int) -> int | None:
        data, lo = self._data, self._lo
        while pos > lo:
            pos = max(lo, data.rfind(b"\n", lo, pos - 1) + 1)
            if pos not in self._skip:
                return pos
        return None

    def next(self, pos: int) -> int | None:
        data, hi = self._data, self._hi
        while True:
            end = data.find(b"\n", pos, hi)
            if end == -1 or end + 1 >= hi:
                return None
            pos = end + 1
            if pos not in self._skip:
                return pos

    def first(self) -> int | None:
        return self._lo if self._lo not in self._skip else self.next(self._lo)

    def last(self) -> int | None:
        data, lo, hi = self._data, self._lo, self._hi
        if hi <= lo:
            return None
        start = max(lo, data.rfind(b"\n", lo, hi - 1 if data[hi - 1 : hi] == b"\n" else hi) + 1)
        return start if start not in self._skip else self.prev(start)

    def asgi_lines(self) -> list[int]:
        if self._asgi is None:
            data, lo, hi = self._data, self._lo, self._hi
            found: list[int] = []
            at = data.find(_ASGI_WORDS, lo, hi)
            while at != -1:
                line = max(lo, data.rfind(b"\n", lo, at) + 1)
                if not found or found[-1] != line:
                    found.append(line)
                at = data.find(_ASGI_WORDS, at + len(_ASGI_WORDS), hi)
            self._asgi = found
        return self._asgi

    def stream(self, pos: int) -> str:
        end = self._data.find(b"\n", pos, self._hi)
        e = entry(self._data, pos, self._hi if end == -1 else end)
        return e[0].decode("ascii") if e is not None else ""

    def seek(self, pos: int | None, stream: str, forward: bool) -> int | None:
        # A runtime tags every line of its log, so the next line of ``stream`` is found by its tag
        # in the bytes, not line by line (one stream's lines may stand far apart).
        data, lo, hi = self._data, self._lo, self._hi
        marker = stream_tag(stream).encode("ascii") if stream else b"\n"
        while pos is not None:
            s = self.stream(pos)
            if (not s or s == stream) and pos not in self._skip:
                return pos
            if forward:
                end = data.find(b"\n", pos, hi)
                at = -1 if end == -1 else data.find(marker, end + 1, hi)
            else:
                at = data.rfind(marker, lo, pos - 1) if pos > lo else -1
            pos = None if at == -1 else max(lo, data.rfind(b"\n", lo, at) + 1)
        return None

    def headed_from(self, pos: int, head: Callable[[int], Head], stream: str | None = None) -> int | None:
        # The memo holds one ``stream``'s answers: each StreamLines view has a _ChunkLines of its own.
        memo = self._headed
        if pos in memo:
            return memo[pos]
        data, lo, hi = self._data, self._lo, self._hi
        frm, found = pos, None
        passed = [pos]  # each line passed on the way has the same answer: every walk is walked once
        while frm < hi:
            m = HEADER_BYTES.search(data, frm, hi)
            if m is None:
                break
            line = max(lo, data.rfind(b"\n", lo, m.start()) + 1)
            if line in memo:
                found = memo[line]
                break
            if (stream is None or self.stream(line) in ("", stream)) and head(line).bounds:
                found = line
                break
            passed.append(line)
            end = data.find(b"\n", m.end(), hi)
            if end == -1:
                break
            frm = end + 1
        for line in passed:
            memo[line] = found
        return found


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


# path, start, end, the file's runtime streams: the lines that start in [start, end) of a plain file
Range = tuple[str, int, int, tuple[str, ...]]
RANGE_SLACK = 64 << 10  # read this far past a range's end for the line that crosses it


def _scan_range(args: Range) -> ChunkScan:
    """Worker: scan the lines that start in ``[start, end)`` of a plain file.

    Each line is reported by exactly one range: the one it starts in. The line that crosses
    ``end`` is read whole from beyond it.
    """
    path, start, end, streams = args
    with paused_gc():
        return _scan_range_lines(path, start, end, streams)


def _scan_range_lines(path: str, start: int, end: int, streams: tuple[str, ...] = ()) -> ChunkScan:
    with open(path, "rb") as fh:
        # LOOKBACK bytes before: the runtime streams open where the range's lines begin (and one
        # byte before at least: whether ``start`` begins a line).
        c0 = max(0, start - max(1, LOOKBACK))
        fh.seek(c0)
        want = end - c0 + RANGE_SLACK
        buf = fh.read(want)
        at_eof = len(buf) < want
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
                buf += fh.readline()  # a line longer than the slack crosses ``end`` (rare)
                nl = buf.find(b"\n", rel_end)
            hi = len(buf) if nl == -1 else nl + 1
    return candidate_lines(buf, True, lo, hi, open_before(buf, 0 if c0 == 0 else 1, lo), streams)


def open_before(data: bytes, lo: int, at: int, pending: Open = CLOSED) -> Open:
    """The runtime streams open at the line start ``at``, read from ``data[lo:at]`` from its first
    line start on, with ``pending`` open there (by default every stream is taken as closed there:
    see kvwatch.sources.pieces)."""
    lo = line_start_after(data, lo, 0)
    if lo >= at:
        return pending
    # A few finds over the look-back (the same partial entries the compiled scanner finds, which
    # would also build the spans of every anchor there for nothing).
    partials = python_partials(data, lo, at)
    return continuations(data, lo, at, partials, pending)[1] if partials or pending else CLOSED


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
            return inflate.open_gzip(path)
        if storage == "utf-16":  # re-encoded as UTF-8 on the way in: the reader sees what vLLM wrote
            return codecs.EncodedFile(open(path, "rb"), "utf-8", "utf-16", errors="replace")
        return open(path, "rb")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror}); check the path and its permissions") from None


def _ranges(path: str, size: int) -> list[Range]:
    """Chunk-sized byte ranges of a plain file: memory is bounded by the ranges in flight."""
    if size <= 0:
        return []
    n = -(-size // CHUNK_BYTES)
    step = -(-size // n)
    with open(path, "rb") as fh:
        streams = input_streams(fh.read(_FIRST_LINE_BYTES))
    return [(path, s, min(size, s + step), streams) for s in range(0, size, step)]


class _SharedRanges:
    """The byte ranges of several plain files, scanned by one pool of workers in input order.

    Work is balanced by bytes, not by files: every file is cut into chunk-sized ranges and the
    workers take the next range of the next file as they free up (eight pod logs of 50 MB keep two
    workers as busy as one 400 MB log). At most two ranges per worker are in flight.
    """

    def __init__(self, pool: Any, work: list[tuple[int, Range]], jobs: int) -> None:
        self._pool = pool
        self._work = iter(work)
        self._limit = 2 * jobs
        self._in_flight: deque[tuple[int, Any]] = deque()
        self._fill()

    def _fill(self) -> None:
        while len(self._in_flight) < self._limit:
            nxt = next(self._work, None)
            if nxt is None:
                return
            idx, rng = nxt
            self._in_flight.append((idx, self._pool.apply_async(_scan_range, (rng,))))

    def scans(self, idx: int) -> Iterator[ChunkScan]:
        """The scans of input ``idx``, in order (those of inputs before it are dropped unread)."""
        while self._in_flight and self._in_flight[0][0] < idx:
            self._in_flight.popleft()
            self._fill()
        while self._in_flight and self._in_flight[0][0] == idx:
            _, result = self._in_flight.popleft()
            self._fill()
            yield result.get()


def _scans(path: str, jobs: int, pool: Any = None) -> Iterator[ChunkScan]:
    """The chunk scans of one input, in order. A large .gz is under way when this returns (its
    reader thread inflates, spools and submits, see _SpooledScans); anything else starts when it
    is first iterated."""
    is_plain = path != "-" and os.path.isfile(path)
    size = os.path.getsize(path) if is_plain else 0
    # Byte ranges need the bytes on disk to be the log's bytes.
    storage = _storage(path) if is_plain else "stream"
    if storage == "plain" and jobs > 1 and size >= PARALLEL_MIN_BYTES:
        return _parallel_scans(path, size, jobs)
    fh = _open(path)
    if storage == "gzip" and (pool is not None or (jobs > 1 and size >= PARALLEL_MIN_BYTES // 8)):  # ~64 MiB of text
        try:
            spooled = _SpooledScans(fh, jobs, pool)
        except BaseException:
            fh.close()
            raise
        return _Scans(path, fh, spooled, spooled.close)
    return _Scans(path, fh, _serial_scans(fh, storage))


def _serial_scans(fh: BinaryIO, storage: str) -> Iterator[ChunkScan]:
    """A stream scanned in this process; a .gz inflated by a reader thread (the inflater releases
    the GIL) while this one scans the piece before."""
    pieces = read_ahead(_pieces(fh)) if storage == "gzip" else _pieces(fh)
    pending = CLOSED  # read in order here: each piece starts with what the one before left open
    streams: tuple[str, ...] | None = None
    for data, lo, hi in pieces:
        if streams is None:
            streams = input_streams(data[lo : lo + _FIRST_LINE_BYTES])
        scan = candidate_lines(data, True, lo, hi, pending, streams)
        pending = scan.open_streams
        yield scan


class _Scans(Iterator[ChunkScan]):
    """An input's chunk scans with a read failure (a damaged .gz, an I/O error) raised as a
    one-line UsageError. ``close()`` releases the file and what reads it, iterated or not."""

    def __init__(
        self, path: str, fh: BinaryIO, scans: Iterable[ChunkScan], close: Callable[[], None] | None = None
    ) -> None:
        self._path = path
        self._fh: BinaryIO | None = fh
        self._scans = iter(scans)
        self._close = close

    def __next__(self) -> ChunkScan:
        try:
            return next(self._scans)
        except StopIteration:
            self.close()
            raise
        except inflate.errors() as exc:
            self.close()
            raise UsageError(
                f"{self._path}: damaged or truncated gzip ({exc}); re-copy the file or gunzip what is readable"
            ) from None
        except OSError as exc:
            self.close()
            raise UsageError(f"{self._path}: read failed ({exc}); check the file") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop what reads the input (a reader thread, the workers it started) and close the file."""
        fh, self._fh = self._fh, None
        if fh is None:
            return
        close_scans = getattr(self._scans, "close", None)
        if close_scans is not None:
            close_scans()
        if self._close is not None:
            self._close()
        if fh is not sys.stdin.buffer:
            fh.close()


def _scan_piece(piece: Piece, pending: Open = CLOSED, streams: tuple[str, ...] = ()) -> ChunkScan:
    """Worker: the candidate lines of one piece of a stream (``pending``: the runtime streams
    open where it starts; ``streams``: the input's, ``input_streams``)."""
    data, lo, hi = piece
    with paused_gc():
        return candidate_lines(data, True, lo, hi, pending, streams)


def _scan_spooled(item: spool.Spooled, pending: Open = CLOSED, streams: tuple[str, ...] = ()) -> ChunkScan:
    """Worker: the candidate lines of one spooled piece (its file is deleted once read)."""
    return _scan_piece(spool.take(item), pending, streams)


def _open_at_ends(pieces: Iterator[Piece], opened: deque[tuple[Open, tuple[str, ...]]]) -> Iterator[Piece]:
    """``pieces`` unchanged, with the runtime streams open where each starts appended to
    ``opened`` as it passes (read from the LOOKBACK bytes before its end: the workers that scan
    the pieces run apart, so this thread tells each where the one before left off), beside the
    input's streams (``input_streams``, read off the first piece)."""
    pending = CLOSED
    streams: tuple[str, ...] | None = None
    for data, lo, hi in pieces:
        if streams is None:
            streams = input_streams(data[lo : lo + _FIRST_LINE_BYTES])
        opened.append((pending, streams))
        yield data, lo, hi
        back = line_start_after(data, hi - LOOKBACK, lo)
        pending = open_before(data, back, hi, pending if back == lo else CLOSED)


class _SpooledScans:
    """A stream's pieces inflated, spooled and sent to the workers by a reader thread from the
    moment this is made; iterating takes their scans in order (``pool``, or a pool of ``jobs``
    started here).

    The reader thread submits each piece as soon as it is written: the workers never wait for the
    consumer, which folds the records of the pieces before (a submission per result taken left
    them idle while it folded). At most ``2 * jobs`` pieces are in flight.
    """

    def __init__(self, fh: BinaryIO, jobs: int, pool: Any) -> None:
        self._directory = spool.spool_directory()
        self._own = _pool(jobs) if pool is None else None  # forked before the reader thread starts
        workers = pool if self._own is None else self._own
        directory = self._directory.name

        def submitted() -> Iterator[Any]:  # runs in the reader thread
            opened: deque[tuple[Open, tuple[str, ...]]] = deque()
            for item in spool.spooled(_open_at_ends(_pieces(fh), opened), directory):
                yield workers.apply_async(_scan_spooled, (item, *opened.popleft()))

        self._results = read_ahead(submitted(), depth=2 * jobs)

    def __iter__(self) -> Iterator[ChunkScan]:
        for result in self._results:
            yield result.get()

    def close(self) -> None:
        """Stop the reader thread, then the workers this started, then remove the directory."""
        self._results.close()
        if self._own is not None:
            self._own.terminate()
        self._directory.cleanup()


def _pool(jobs: int) -> Any:
    import multiprocessing

    ctx = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    return ctx.Pool(jobs)


def _in_order(pool: Any, func: Callable[[Any], ChunkScan], work: Iterator[Any], jobs: int) -> Iterator[ChunkScan]:
    """``func`` over ``work`` in ``pool``, results in order, at most two items per worker in flight
    (a slow consumer never lets results pile up)."""
    in_flight = deque(pool.apply_async(func, (w,)) for w in islice(work, 2 * jobs))
    while in_flight:
        result = in_flight.popleft().get()
        nxt = next(work, None)
        if nxt is not None:
            in_flight.append(pool.apply_async(func, (nxt,)))
        yield result


def _parallel_scans(path: str, size: int, jobs: int) -> Iterator[ChunkScan]:
    """Byte ranges scanned by ``jobs`` worker processes, yielded in file order."""
    with _pool(jobs) as pool:
        yield from _in_order(pool, _scan_range, iter(_ranges(path, size)), jobs)


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
        # Set by iter_logs: the workers shared by all inputs, and this input's place among them.
        self._shared: tuple[_SharedRanges | None, Any, int] | None = None
        self._started: Iterator[ChunkScan] | None = None

    def start(self) -> None:
        """Begin reading now, before ``batches()`` is asked for: a large .gz's reader thread inflates
        and its workers scan while the caller does other work (iter_logs starts the first input)."""
        if self._started is None:
            self._started = self._chunk_scans()

    def close(self) -> None:
        """Stop what reads this input, started or not (a reader thread, the workers it started)."""
        started, self._started = self._started, None
        close = getattr(started, "close", None)
        if close is not None:
            close()

    def is_small_file(self) -> bool:
        """A plain file below the size where one input alone is worth worker processes."""
        return self.path != "-" and os.path.isfile(self.path) and os.path.getsize(self.path) < PARALLEL_MIN_BYTES

    def _chunk_scans(self) -> Iterator[ChunkScan]:
        if self._shared is None:
            return _scans(self.path, self.jobs)
        ranges, pool, idx = self._shared
        if ranges is not None and _is_plain_file(self.path):
            return ranges.scans(idx)
        return _scans(self.path, self.jobs, pool)  # a .gz or stdin: pieces for the same workers

    def batches(self) -> Iterator[list[LogRecord]]:
        """Records chunk by chunk (the memory held is one chunk's, whatever the input size)."""
        parser = LogParser()
        self.start()
        scans, self._started = self._started, None
        runs: dict[str, RunState] = {}  # the run of one prefix each stream's chunks before ended in
        for scan in scans or ():
            candidates = scan.candidates
            if scan.echo_pending:
                # Candidates whose run began in an earlier chunk: what it holds before each of them.
                tails = dict(scan.echo_tails)
                drop = {
                    i
                    for i, stream, key, n in scan.echo_pending
                    if lead_level(runs.get(stream) or RunState(), key, tails[stream].lead[:n]) == ECHOED
                }
                if drop:
                    candidates = [c for i, c in enumerate(candidates) if i not in drop]
            runs = after_runs(runs, scan.echo_tails)
            batch = parser.feed_chunk(candidates, self.lines)
            self.lines += scan.lines
            self.bytes += scan.nbytes
            if self.progress is not None:
                self.progress(scan.nbytes)
            if batch:
                yield batch
        rest = parser.finish()
        if rest:
            yield rest


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


def _is_plain_file(path: str) -> bool:
    """A regular file whose bytes on disk are the log's (byte ranges can be cut in it)."""
    return path != "-" and os.path.isfile(path) and _storage(path) == "plain"


@contextmanager
def started_logs(
    paths: list[str], *, jobs: int | None = None, progress: Callable[[int], None] | None = None
) -> Iterator[Iterator[LogInput]]:
    """``iter_logs(paths)`` already under way: where it uses workers, they are forked and their
    first ranges sent before this returns, so they scan while the caller does other work (``kvwatch
    analyze`` imports the reconcile stack, ~0.1 s, meanwhile). The workers stop when the block ends.
    """
    logs = iter_logs(paths, jobs=jobs, progress=progress)
    try:
        first = next(logs, None)  # runs iter_logs to its first input: the pool and its first ranges
        yield chain(() if first is None else (first,), logs)
    finally:
        logs.close()


def iter_logs(
    paths: list[str], *, jobs: int | None = None, progress: Callable[[int], None] | None = None
) -> Generator[LogInput, None, None]:
    """``open_logs``, in input order, with every input's bytes scanned by one pool of workers.

    One log per pod is the common postmortem: all plain files are cut into byte ranges that the
    workers take in input order (balanced by size, see _SharedRanges) while the caller folds the
    records of the input before; a .gz sends its inflated pieces to the same workers (stdin is
    read in this process). Workers start only where there is enough to share: two inputs, or one
    large one (a .gz counts as 8 times its compressed size, about its text). When the first input
    is a .gz, its reading starts before it is yielded, as the plain files' ranges do.
    """
    logs = open_logs(paths, jobs=jobs, progress=progress)
    n = logs[0].jobs if logs else 1
    storage = [_storage(log.path) if log.path != "-" and os.path.isfile(log.path) else "stream" for log in logs]
    plain = [kind == "plain" for kind in storage]
    sizes = [os.path.getsize(log.path) if kind == "plain" else 0 for log, kind in zip(logs, storage, strict=True)]
    gz = [8 * os.path.getsize(log.path) if kind == "gzip" else 0 for log, kind in zip(logs, storage, strict=True)]
    if n < 2 or (len(logs) < 2 and sum(sizes) + sum(gz) < PARALLEL_MIN_BYTES):
        yield from logs
        return
    with _pool(n) as pool:
        work = [(i, r) for i, log in enumerate(logs) if plain[i] for r in _ranges(log.path, sizes[i])]
        ranges = _SharedRanges(pool, work, n) if work else None
        try:
            for i, log in enumerate(logs):
                log._shared = (ranges, pool, i)
                if i == 0 and gz[0]:
                    log.start()  # its reader thread inflates and the workers scan from now on
                yield log
        finally:
            for log in logs:
                log.close()
