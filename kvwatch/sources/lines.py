"""Bytes to text lines, shared by every log source (file follower, stdin, wrapped child).

A source hands the parser complete lines only: a partial last line waits for its newline, CRLF
loses its CR, invalid UTF-8 becomes U+FFFD, and a line longer than the bound keeps its first
``max_line_bytes`` bytes and is flagged ``truncated`` (the rest is counted and dropped, so memory
stays bounded however long a line grows; a tqdm bar or a base64 blob can be megabytes with no
newline). Nothing here parses vLLM text.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import NamedTuple, Protocol

#: Default bound on one line. vLLM's longest legitimate lines (the "Initializing a V1 LLM engine
#: with config: ..." dump, engine args) are a few KiB; 1 MiB leaves room for anything real.
DEFAULT_MAX_LINE_BYTES = 1 << 20


class Line(NamedTuple):
    """One complete log line, decoded, without its line terminator.

    ``truncated`` is True when the physical line was longer than the source's bound and ``text``
    holds only its first ``max_line_bytes`` bytes (decoded). ``stream``: the pipe it came from where
    the source reads a process's stdout and stderr apart ("stdout", "stderr"; "" elsewhere).

    A tuple, not a frozen dataclass: a followed log makes one per line, and a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``, a cost paid per followed line
    (benchmarks/followed_path_cost.py measures the sidecar's log step per line).
    """

    text: str
    truncated: bool = False
    stream: str = ""


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What a source says about itself (exported as ``kvwatch_source_up{source="log"}`` etc.).

    ``up`` is True while the source is readable now; a log file that does not exist yet is
    ``up=False`` with ``last_error=None`` ("no data yet" is not an error). ``last_success_at`` is
    the wall-clock time (seconds since the epoch) of the last successful read, data or not.
    """

    up: bool
    last_error: str | None
    last_success_at: float | None
    lines_total: int = 0
    truncated_lines_total: int = 0
    mode: str = ""  # how the source learns of new data: "inotify", "poll", "pipe"
    eof: bool = False  # stdin / child: the stream has ended and every line has been delivered
    dropped_lines_total: int = 0  # child: lines dropped because the consumer fell far behind


class LineSource(Protocol):
    """The interface the sidecar's main loop drives: poll, wait, commit, close, status."""

    def poll(self) -> list[Line]:
        """Lines that are complete now; never blocks."""
        ...

    def wait(self, timeout: float) -> bool:
        """Block until new data may be there (True) or ``timeout`` passes (False)."""
        ...

    def commit(self) -> None:
        """Every line returned by poll() so far has been processed (persist where supported)."""
        ...

    def close(self) -> None:
        """Release threads and file descriptors. Does not commit."""
        ...

    def status(self) -> SourceStatus:
        """Self-report for ``kvwatch_source_up`` and friends."""
        ...

    @property
    def up(self) -> bool:
        """``status().up``: readable now."""
        ...

    @property
    def last_error(self) -> str | None:
        """``status().last_error``: one line naming the problem, None when fine or not there yet."""
        ...


class LineSplitter:
    """Incremental bytes -> Line splitter with a bounded buffer.

    ``held`` is the number of bytes consumed since the last newline (including bytes dropped
    from an over-long line): a file follower's position of the last complete line is its read
    offset minus ``held``.
    """

    __slots__ = ("_buf", "_max", "_over", "_stream", "held")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, stream: str = "") -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self._max = max_line_bytes
        self._stream = stream  # every Line's ``stream``
        self._buf = bytearray()
        self._over = False
        self.held = 0

    def feed(self, data: bytes) -> list[Line]:
        """Consume ``data``; return the lines it completes (in order)."""
        lines: list[Line] = []
        start = 0
        if self.held:
            # A follower's read mostly ends inside a line: finish that one first.
            nl = data.find(b"\n")
            if nl < 0:
                self._append(data)
                return lines
            lines.append(self._complete(data[:nl]))
            start = nl + 1
        # The lines after it, whole in ``data``: decoded a piece of up to _PIECE_BYTES at a time and
        # split at their newlines, which gives the lines decoding each alone gives (a newline byte
        # is never part of a UTF-8 sequence, so an invalid one before it becomes the same U+FFFD
        # either way). Pieces, straight from a memoryview, keep what a catch-up read of 8 MiB
        # holds at once to a few hundred KiB. A CR or NUL in a piece, or a line over the bound,
        # sends the rest the line-by-line way below, which treats those.
        view, stream = memoryview(data), self._stream
        while True:
            last = data.rfind(b"\n", start, start + _PIECE_BYTES)
            if last <= start or data.find(b"\r", start, last) >= 0 or data.find(b"\0", start, last) >= 0:
                break
            if last - start > self._max and max(map(len, data[start:last].split(b"\n"))) > self._max:
                break
            texts = str(view[start:last], "utf-8", "replace").split("\n")
            lines += [_new_line(Line, (text, False, stream)) for text in texts]
            start = last + 1
        find = data.find
        while True:
            nl = find(b"\n", start)
            if nl < 0:
                break
            if not self.held and nl - start <= self._max:
                # Fast path: the whole line is inside this chunk and nothing is buffered.
                lines.append(_decode(data[start:nl], False, self._stream))
            else:
                lines.append(self._complete(data[start:nl]))
            start = nl + 1
        if start < len(data):
            self._append(data[start:])
        return lines

    def flush(self) -> Line | None:
        """The partial line still held, as a Line (at end of stream), or None if there is none."""
        if not self.held:
            return None
        return self._take()

    def state(self) -> tuple[bytes, bool, int]:
        """The held partial line, to ``restore`` if what was fed since must be taken back."""
        return bytes(self._buf), self._over, self.held

    def restore(self, state: tuple[bytes, bool, int]) -> None:
        """Go back to a ``state()``."""
        buf, self._over, self.held = state
        self._buf = bytearray(buf)

    def _append(self, chunk: bytes) -> None:
        self.held += len(chunk)
        room = self._max - len(self._buf)
        if len(chunk) > room:
            self._buf += chunk[: max(room, 0)]
            self._over = True
        else:
            self._buf += chunk

    def _complete(self, rest: bytes) -> Line:
        """The line held so far, ended by ``rest`` (the bytes before its newline)."""
        self._append(rest)
        return self._take()

    def _take(self) -> Line:
        line = _decode(bytes(self._buf), self._over, self._stream)
        self._buf.clear()
        self._over = False
        self.held = 0
        return line


_new_line = tuple.__new__  # a Line from its three fields, without NamedTuple's keyword handling
# The most of a batch decoded in one call (LineSplitter.feed): a follower's poll at 5,000 lines/s
# finds ~100 KiB; a catch-up read up to 8 MiB is taken in pieces, not held twice over at once.
_PIECE_BYTES = 256 << 10


def _decode(raw: bytes, truncated: bool, stream: str = "") -> Line:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if raw[:1] == b"\0":
        # A writer without O_APPEND keeps its old offset after a copytruncate, so the file
        # restarts with a hole of NULs before the next line: they are not text.
        raw = raw.lstrip(b"\0")
    return Line(raw.decode("utf-8", errors="replace"), truncated, stream)


class QueuedLines:
    """A thread-safe hand-over of lines from a reader thread to the main loop.

    Bounded: when the main loop falls behind by ``max_lines`` the reader blocks, which pushes
    back on the pipe (the writer waits) instead of growing memory.
    """

    def __init__(self, max_lines: int = 10_000) -> None:
        self._queue: queue.Queue[Line | None] = queue.Queue(maxsize=max_lines)
        self._ready = threading.Event()
        self._ended = False  # the reader has put its end marker
        self._eof = False  # the main loop has taken the end marker

    def put(self, line: Line) -> None:
        """Reader side: hand over one line (blocks while the queue is full)."""
        self._queue.put(line)
        self._ready.set()

    def offer(self, line: Line) -> bool:
        """Reader side: hand over one line unless the queue is full (then False: dropped)."""
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            return False
        self._ready.set()
        return True

    def end(self) -> None:
        """Reader side: the stream has ended."""
        self._ended = True
        self._queue.put(None)
        self._ready.set()

    def take(self) -> list[Line]:
        """Main-loop side: every line queued now; never blocks."""
        self._ready.clear()
        out: list[Line] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return out
            if item is None:
                self._eof = True
            else:
                out.append(item)

    def wait(self, timeout: float) -> bool:
        """Main-loop side: block until something is queued or ``timeout`` passes."""
        if self._eof:
            # Nothing will ever come: block for the timeout so a loop that polls on does not spin.
            threading.Event().wait(timeout)
            return False
        return self._ready.wait(timeout)

    @property
    def eof(self) -> bool:
        """True once the end marker has been taken: every line has been delivered."""
        return self._eof


class PipeLines:
    """The LineSource half shared by stdin and a wrapped child: lines a reader thread queued.

    A pipe has no position, so ``commit`` is a no-op; subclasses add ``close`` and ``status``.
    """

    def __init__(self, queue: QueuedLines) -> None:
        self._queue = queue
        self._lines_total = 0
        self._truncated_total = 0

    def poll(self) -> list[Line]:
        """Lines queued since the last poll; never blocks."""
        lines = self._queue.take()
        self._lines_total += len(lines)
        self._truncated_total += sum(1 for line in lines if line.truncated)
        return lines

    def wait(self, timeout: float) -> bool:
        """Block until a line (or the end of the stream) is there, or ``timeout`` passes."""
        return self._queue.wait(timeout)

    def commit(self) -> None:
        """Nothing to persist: a pipe has no position."""
