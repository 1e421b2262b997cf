"""``--log -``: log lines from standard input (e.g. ``vllm serve ... 2>&1 | kvwatch watch --log -``).

A reader thread turns the byte stream into lines (``kvwatch.sources.lines``) and hands them to
the main loop through a bounded queue, so a slow consumer pushes back on the pipe instead of
growing memory. There is no position to persist: a pipe cannot be re-read after a restart.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from kvwatch.sources.lines import DEFAULT_MAX_LINE_BYTES, LineSplitter, PipeLines, QueuedLines, SourceStatus

_CHUNK = 64 * 1024


class StdinSource(PipeLines):
    """Lines from a binary stream (standard input by default), read in a daemon thread.

    ``poll()`` returns what has been read so far and never blocks; ``wait(timeout)`` blocks until
    a line is there; ``status().eof`` turns True once the stream has ended and every line has been
    delivered (a final line without a newline is delivered at end of stream).
    """

    def __init__(
        self,
        stream: BinaryIO | None = None,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_queued_lines: int = 10_000,
        coalesce: float = 0.02,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._stream = stream if stream is not None else sys.stdin.buffer
        super().__init__(QueuedLines(max_queued_lines))
        self._splitter = LineSplitter(max_line_bytes)
        self._wall_clock = wall_clock
        self._coalesce = coalesce  # after draining the pipe, let lines gather (a wake-up per line is costly)
        self._error: str | None = None
        self._last_success_at: float | None = None
        self._thread = threading.Thread(target=self._read, name="kvwatch-stdin", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        read: Callable[[int], bytes] = getattr(self._stream, "read1", self._stream.read)
        try:
            while True:
                data = read(_CHUNK)
                if not data:
                    break
                self._last_success_at = self._wall_clock()
                for line in self._splitter.feed(data):
                    self._queue.put(line)
                if len(data) < _CHUNK and self._coalesce > 0:
                    time.sleep(self._coalesce)
            tail = self._splitter.flush()
            if tail is not None:
                self._queue.put(tail)
        except (OSError, ValueError) as exc:  # closed or unreadable stream: report, do not crash
            self._error = f"cannot read standard input: {exc}"
        finally:
            self._queue.end()

    def close(self) -> None:
        """Stop using the stream. The daemon reader thread ends with the process or at EOF."""

    @property
    def up(self) -> bool:
        """Shorthand for ``status().up``."""
        return self.status().up

    @property
    def last_error(self) -> str | None:
        """Shorthand for ``status().last_error``."""
        return self._error

    def status(self) -> SourceStatus:
        """Up while the stream is open and readable; ``eof`` once it has ended and been drained."""
        eof = self._queue.eof
        return SourceStatus(
            up=not eof and self._error is None,
            last_error=self._error,
            last_success_at=self._last_success_at,
            lines_total=self._lines_total,
            truncated_lines_total=self._truncated_total,
            mode="pipe",
            eof=eof,
        )
