"""Replay a saved vLLM log at X times its recorded pace (``kvwatch watch --replay FILE --speed X``).

The pace comes from the lines' own timestamps (vLLM's ``MM-DD HH:MM:SS`` or an outer RFC3339
stamp): a line is released when ``(its time - the first line's time) / speed`` seconds have passed
since the replay started. Lines without a timestamp go with the line before them. Clock and
sleep are injected, so tests replay a whole log without waiting.
"""

from __future__ import annotations

import gzip
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from kvwatch.sources.lines import Line, SourceStatus

# vLLM's _DATE_FORMAT "%m-%d %H:%M:%S" (every version); an outer docker/kubectl RFC3339 stamp.
_VLLM_TS = re.compile(r"(?<!\d)(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?!\d)")
_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))\s")


def line_seconds(line: str) -> float | None:
    """Seconds on a nominal timeline for the line's timestamp, None when it has none."""
    outer = _RFC3339.match(line)
    if outer:
        text = outer.group(1).replace("Z", "+00:00")
        if "." in text:  # fromisoformat in 3.11 takes at most 6 fractional digits
            head, _, rest = text.partition(".")
            digits = re.match(r"\d+", rest)
            frac = digits.group(0) if digits else ""
            text = f"{head}.{frac[:6]}{rest[len(frac) :]}"
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            return None
    m = _VLLM_TS.search(line, 0, 200)
    if not m:
        return None
    month, day, hour, minute, second = (int(g) for g in m.groups())
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 62):
        return None
    days_before = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)
    return float((((days_before[month - 1] + day - 1) * 24 + hour) * 60 + minute) * 60 + second)


def open_text(path: Path) -> Iterator[str]:
    """Lines of a plain or gzip file, decoded leniently, without their line ends."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for raw in handle:
            yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


class ReplaySource:
    """A LineSource (kvwatch.sources.lines) releasing a saved log's lines at the recorded pace."""

    def __init__(
        self,
        path: Path,
        speed: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        max_wait: float = 1.0,
    ) -> None:
        self._lines = open_text(path)
        self._speed = speed
        self._clock = clock
        self._sleep = sleep
        self._max_wait = max_wait
        self._start_wall: float | None = None
        self._start_log: float | None = None
        self._held: str | None = None
        self.done = False
        self._delivered = 0
        self._wall = time.time

    def _due(self, line: str) -> float:
        """Seconds until ``line`` is due (<= 0: now)."""
        ts = line_seconds(line)
        if ts is None or self._start_log is None or self._start_wall is None:
            if ts is not None:
                self._start_log, self._start_wall = ts, self._clock()
            return 0.0
        return (self._start_wall + max(0.0, ts - self._start_log) / self._speed) - self._clock()

    def poll(self) -> list[Line]:
        """The lines due now (waits at most ``max_wait`` for the next one)."""
        lines = self.poll_text()
        self._delivered += len(lines)
        return [Line(text) for text in lines]

    def wait(self, timeout: float) -> bool:
        """poll() itself waits for the next due line; nothing to wait for here."""
        return not self.done

    def commit(self) -> None:
        """A replay keeps no position."""

    def close(self) -> None:
        """Close the file."""
        close = getattr(self._lines, "close", None)
        if close is not None:
            close()

    @property
    def up(self) -> bool:
        """A saved file is always readable once opened."""
        return True

    @property
    def last_error(self) -> str | None:
        """Replay reports no read errors (decoding is lenient)."""
        return None

    def status(self) -> SourceStatus:
        """Up while reading; eof once every line was delivered."""
        return SourceStatus(True, None, self._wall(), lines_total=self._delivered, mode="replay", eof=self.done)

    def poll_text(self) -> list[str]:
        """The lines due now as text (waits at most ``max_wait`` for the next one)."""
        out: list[str] = []
        while True:
            line = self._held
            self._held = None
            if line is None:
                line = next(self._lines, None)
                if line is None:
                    self.done = True
                    return out
            wait = self._due(line)
            if wait > 0:
                if out:
                    self._held = line
                    return out
                self._sleep(min(wait, self._max_wait))
                if wait > self._max_wait:
                    self._held = line
                    return out
            out.append(line)
            if len(out) >= 10_000:
                return out
