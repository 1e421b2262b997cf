"""The sidecar: the one place where sources, parser, reconciler and exporter are wired together.

Threads: one reads the log source (follow, stdin, child output or replay) and feeds each line
through the log parser into the live state; one scrapes /metrics every interval; the HTTP server
renders the state at Prometheus' scrape time. One lock serialises access to the state. A failing
source is reported (``kvwatch_source_up``, one line in kvwatch's log on failure and on recovery)
and never stops the others.

kvwatch's own log: one line per state change, source failure/recovery and capacity mismatch;
never one per record, and never request content.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from kvwatch.export.collector import StateCollector
from kvwatch.export.server import MetricsServer
from kvwatch.reconcile.live import Event, LiveState
from kvwatch.records import LogRecord, MetricsSnapshot

log = logging.getLogger("kvwatch")


class LineSource(Protocol):
    """What the log thread reads: any of follower, stdin, child output, replay."""

    def poll(self) -> list[str]:
        """Complete lines available now (never blocks for long)."""

    def wait(self, timeout: float) -> None:
        """Block until more may be available, at most ``timeout`` seconds."""

    def commit(self) -> None:
        """The lines returned so far are processed: persist the position."""

    def close(self) -> None:
        """Release files, threads and watches."""

    @property
    def up(self) -> bool:
        """Whether the last read succeeded."""

    @property
    def done(self) -> bool:
        """True when no more lines will come (stdin EOF, replay end, child exit)."""

    @property
    def last_error(self) -> str | None:
        """One line about the last failure."""


class LineParser(Protocol):
    """The log parser's incremental face (kvwatch.parse.log)."""

    def feed_line(self, line: str) -> list[LogRecord]:
        """Records completed by this line."""

    def flush(self) -> list[LogRecord]:
        """Records still held (e.g. a stats record awaiting a possible continuation line)."""


@dataclass(frozen=True, slots=True)
class ScrapeOutcome:
    """What the sidecar needs from one scrape."""

    ok: bool
    snapshot: MetricsSnapshot | None
    error: str | None
    duration_seconds: float


class Scraper(Protocol):
    """The /metrics source (kvwatch.sources.scrape)."""

    def scrape(self) -> ScrapeOutcome:
        """One scrape; never raises for network or content trouble."""


class Sidecar:
    """Runs the threads and serves /metrics until ``stop()``."""

    def __init__(
        self,
        state: LiveState,
        *,
        parser: LineParser,
        lines: LineSource | None,
        scraper: Scraper | None,
        listen: str,
        scrape_interval: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.parser = parser
        self.lines = lines
        self.scraper = scraper
        self.scrape_interval = scrape_interval
        self.clock = clock
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StateCollector(self.state.samples, self.lock, clock))
        self.server = MetricsServer(self.registry, listen, healthy=lambda: not self.stopping.is_set())
        self._threads: list[threading.Thread] = []
        self.log_finished = threading.Event()

    # ------------------------------------------------------------------ steps (also driven by tests)

    def feed_lines(self, lines: list[str]) -> None:
        """Parse lines and apply their records (one lock hold per batch)."""
        now = self.clock()
        events: list[Event] = []
        with self.lock:
            for line in lines:
                for record in self.parser.feed_line(line):
                    events += self.state.on_log_record(record, now)
        _emit(events)

    def flush_parser(self) -> None:
        """Apply records the parser still holds (end of input)."""
        now = self.clock()
        with self.lock:
            events = [e for r in self.parser.flush() for e in self.state.on_log_record(r, now)]
        _emit(events)

    def read_log_once(self) -> None:
        """Read what the log source has now and report the source's health."""
        assert self.lines is not None
        started = time.perf_counter()
        try:
            batch = self.lines.poll()
            ok, error = self.lines.up, self.lines.last_error
        except Exception as exc:  # a source bug must not kill the sidecar
            batch, ok, error = [], False, f"{type(exc).__name__}: {exc}"
        if batch:
            self.feed_lines(batch)
            self.lines.commit()
        with self.lock:
            events = self.state.on_source("log", ok, self.clock(), time.perf_counter() - started, error)
        _emit(events)

    def scrape_once(self) -> None:
        """One scrape applied to the state."""
        assert self.scraper is not None
        try:
            outcome = self.scraper.scrape()
        except Exception as exc:
            outcome = ScrapeOutcome(False, None, f"{type(exc).__name__}: {exc}", 0.0)
        now = self.clock()
        with self.lock:
            events = self.state.on_source("metrics", outcome.ok, now, outcome.duration_seconds, outcome.error)
            if outcome.ok and outcome.snapshot is not None:
                events += self.state.on_scrape(outcome.snapshot, now)
        _emit(events)

    # ------------------------------------------------------------------ threads

    def _log_loop(self) -> None:
        assert self.lines is not None
        while not self.stopping.is_set():
            self.read_log_once()
            if self.lines.done:
                self.flush_parser()
                self.log_finished.set()
                return
            self.lines.wait(1.0)

    def _scrape_loop(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            self.scrape_once()
            self.stopping.wait(max(0.0, self.scrape_interval - (time.monotonic() - started)))

    def start(self) -> Sidecar:
        """Start serving and reading."""
        self.server.start()
        if self.lines is not None:
            self._threads.append(threading.Thread(target=self._log_loop, name="kvwatch-log", daemon=True))
        if self.scraper is not None:
            self._threads.append(threading.Thread(target=self._scrape_loop, name="kvwatch-scrape", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop the threads, persist the log position and close the server."""
        self.stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.lines is not None:
            self.lines.close()
        self.server.close()


def _emit(events: list[Event]) -> None:
    for event in events:
        level = logging.WARNING if event.kind in ("mismatch", "error") or "down" in event.message else logging.INFO
        log.log(level, "%s: %s", event.kind, event.message)


def configure_logging() -> None:
    """kvwatch's own log on stderr: one line per event, UTC timestamps."""
    handler = logging.StreamHandler()
    formatter = logging.Formatter("%(asctime)s %(levelname)s kvwatch %(message)s", "%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger("kvwatch")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
