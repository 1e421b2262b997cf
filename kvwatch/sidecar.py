"""The sidecar: the one place where sources, parser, reconciler and exporter are wired together.

Threads: one reads the log source (follow, stdin, child output or replay) and feeds each line
through the log parser into the live state; one scrapes /metrics every interval; one recomputes
the what-ifs (vLLM's scheduler simulated on the window's evidence, kvwatch_whatif_* gauges) at
most once a minute, holding the lock only to copy the evidence in and the outcomes out; the HTTP
server renders the state at Prometheus' scrape time. One lock serialises access to the state. A failing
source is reported (``kvwatch_source_up``, one line in kvwatch's log on failure and on recovery)
and never stops the others.

kvwatch's own log: one line per state change, source failure/recovery and capacity mismatch;
never one per record, and never request content.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry

from kvwatch.errors import KvwatchError, UsageError
from kvwatch.export.collector import StateCollector
from kvwatch.export.exposition import samples
from kvwatch.export.server import MetricsServer
from kvwatch.reconcile.live import Event, Expected, LiveState
from kvwatch.records import LogRecord, TimingSeries
from kvwatch.settings import WatchSettings
from kvwatch.sources import scanner
from kvwatch.sources.lines import LineSource
from kvwatch.sources.pieces import CLOSED, continued_lines
from kvwatch.sources.scanner import anchored_lines

if TYPE_CHECKING:
    from kvwatch.export.webconfig import WebConfig
    from kvwatch.parse.metrics import ExpositionReading
    from kvwatch.reconcile.architecture import Architecture
    from kvwatch.reconcile.facts import ServerFacts
    from kvwatch.reconcile.pool import RequestShape
    from kvwatch.reconcile.simulate.calibrate import EvidencePoint
    from kvwatch.reconcile.simulate.whatif import WhatifOutcome
    from kvwatch.sources.child import ChildProcess
    from kvwatch.sources.scrape import MetricsScraper

log = logging.getLogger("kvwatch")

# The log position is saved at most this often (and at shutdown): saving it for every batch cost
# more CPU than parsing at 500 lines/s. A SIGKILL can therefore re-read up to a second of lines.
COMMIT_INTERVAL_SECONDS = 1.0


#: The what-ifs are simulated at most this often: each recompute costs a simulation per lever
#: (benchmarks/whatif_cost.py), and a minute is finer than a window of 10 minutes changes.
WHATIF_INTERVAL_SECONDS = 60.0
#: The share of one core the what-ifs may take: after a recompute that cost C CPU seconds the
#: next waits at least C / WHATIF_CPU_SHARE (a big server's window stretches the interval
#: rather than the sidecar's footprint).
WHATIF_CPU_SHARE = 0.05

WhatifFunction = Callable[["ServerFacts", "tuple[EvidencePoint, ...]"], "tuple[WhatifOutcome, ...]"]
"""The server's facts and one engine's window of evidence -> its simulated what-ifs."""


#: A scrape answer above this size is followed by ``release_memory()``; vLLM's own is 20-60 KB.
RELEASE_AFTER_BYTES = 1 << 20


def release_memory() -> None:
    """Collect garbage and return freed heap pages to the OS (glibc ``malloc_trim``).

    glibc keeps freed memory for reuse, and after a large free raises its mmap threshold, so a
    32 MiB buffer freed once stays in RSS; ``malloc_trim(0)`` releases every whole free page.
    A no-op where there is no glibc (musl, macOS): RSS then stays at its high-water mark.
    """
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


class LineParser(Protocol):
    """The log parser's incremental face (kvwatch.parse.log.LogParser)."""

    def feed_line(self, line: str, lineno: int | None = None) -> list[LogRecord]:
        """Records completed by this line."""
        ...

    def feed_lines(
        self,
        lines: list[str],
        anchored: list[bool],
        pieces: Collection[int] = (),
        streams: Sequence[str] | None = None,
    ) -> list[LogRecord]:
        """Records completed by these lines; ``anchored[i]``: line i holds a prefilter anchor;
        ``pieces``: the lines that continue one a container runtime cut; ``streams``: each
        line's pipe, where the source read a process's stdout and stderr apart."""
        ...

    def finish(self) -> list[LogRecord]:
        """Records still held (a stats record awaiting a possible continuation line)."""
        ...


class Sidecar:
    """Runs the threads and serves /metrics until ``stop()``."""

    def __init__(
        self,
        state: LiveState,
        *,
        parser: LineParser,
        lines: LineSource | None,
        scraper: MetricsScraper | None,
        listen: str,
        scrape_interval: float = 5.0,
        clock: Callable[[], float] = time.time,
        web_config: WebConfig | None = None,
        whatif: WhatifFunction | None = None,
        whatif_interval: float = WHATIF_INTERVAL_SECONDS,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.state = state
        self.parser = parser
        self._open_streams = CLOSED  # container-runtime streams cut mid-line (kvwatch.sources.pieces)
        self.lines = lines
        self.scraper = scraper
        self.scrape_interval = scrape_interval
        self.clock = clock
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StateCollector(lambda now: samples(self.state, now), self.lock, clock))
        self.server = MetricsServer(
            self.registry,
            listen,
            healthy=lambda: not self.stopping.is_set(),
            web_config=web_config,
            on_drop=self.state.on_http_drop,
        )
        self.whatif = whatif
        self.whatif_interval = whatif_interval
        self._whatif_at: float | None = None
        self._whatif_gap = whatif_interval  # the interval, stretched by the last recompute's CPU cost
        self.cpu_clock = cpu_clock
        self.whatif_cpu_seconds: float | None = None  # the last recompute's CPU cost (this thread)
        if whatif is not None:
            state.whatif_errors = 0.0
        self._threads: list[threading.Thread] = []
        self._uncommitted = False
        self._last_commit = 0.0
        self.log_finished = threading.Event()

    # ------------------------------------------------------------------ steps (also driven by tests)

    def feed_lines(self, lines: list[str], streams: Sequence[str] | None = None) -> None:
        """Parse lines and apply their records (one lock hold per batch); ``streams``: each line's
        pipe, where the source read them apart (``Line.stream``)."""
        now = self.clock()
        events: list[Event] = []
        # The scanner marks the few lines that can say something (one compiled pass over the
        # batch); the parser passes the others by, as the analyze reader does.
        partials: list[int] = []
        anchored = anchored_lines(lines, partials)
        cont: list[int] = []
        if partials or self._open_streams:
            # A piece that continues a line the container runtime cut is no line: what it holds
            # (a client's text, perhaps a forged header) is passed by, as analyze does.
            cont, self._open_streams = continued_lines(lines, partials, self._open_streams)
            if cont:
                lines = list(lines)
                for i in cont:
                    lines[i] = ""
                    anchored[i] = False
        with self.lock:
            for record in self.parser.feed_lines(lines, anchored, frozenset(cont), streams):
                events += self.state.on_log_record(record, now)
        _emit(events)

    def flush_parser(self) -> None:
        """Apply records the parser still holds (end of input)."""
        now = self.clock()
        with self.lock:
            events = [e for r in self.parser.finish() for e in self.state.on_log_record(r, now)]
        _emit(events)

    def read_log_once(self) -> None:
        """Read what the log source has now and report the source's health."""
        assert self.lines is not None
        started = time.perf_counter()
        error: str | None
        ended = False
        try:
            polled = self.lines.poll()
            batch = [line.text for line in polled]
            # A child's two pipes: its lines know theirs (a file's runtime tags its own lines).
            streams = [line.stream for line in polled] if polled and polled[0].stream else None
        except Exception as exc:  # a source bug must not kill the sidecar
            batch, streams, ok, error = [], None, False, f"{type(exc).__name__}: {exc}"
        else:
            status = self.lines.status()
            ok, error, ended = status.up, status.last_error, status.eof
        if batch:
            self.feed_lines(batch, streams)
            self._uncommitted = True
        if self._uncommitted and time.monotonic() - self._last_commit >= COMMIT_INTERVAL_SECONDS:
            self._commit()
        with self.lock:
            events = self.state.on_source("log", ok, self.clock(), time.perf_counter() - started, error, ended)
        _emit(events)

    def _commit(self) -> None:
        assert self.lines is not None
        if hasattr(self.lines, "checkpoint"):  # a followed file: counters saved with its position
            with self.lock:
                self.lines.checkpoint = self.state.checkpoint()
        try:
            self.lines.commit()
        except Exception as exc:  # a full disk must not stop the sidecar; the source reports it
            log.warning("source: log position not saved: %s", exc)
        self._uncommitted = False
        self._last_commit = time.monotonic()

    def scrape_once(self) -> None:
        """One scrape applied to the state."""
        assert self.scraper is not None
        try:
            outcome = self.scraper.scrape()
        except Exception as exc:  # the scraper never raises by contract; a bug must not stop the sidecar
            from kvwatch.sources.scrape import ScrapeResult

            outcome = ScrapeResult(False, None, f"{type(exc).__name__}: {exc}", 0.0, self.clock())
        now = self.clock()
        with self.lock:
            events = self.state.on_source("metrics", outcome.ok, now, outcome.duration_seconds, outcome.error)
            if outcome.ok and outcome.snapshot is not None:
                events += self.state.on_scrape(outcome.snapshot, now)
        _emit(events)
        if outcome.body_bytes > RELEASE_AFTER_BYTES or not outcome.complete:
            # A huge answer (or one cut off at the scraper's cap) was parsed or buffered: give
            # the memory back rather than keep the high-water mark for the sidecar's life.
            release_memory()

    def recompute_whatif_once(self) -> bool:
        """Simulate each engine's what-ifs from its window; False if the last was too recent.

        "Too recent": under ``whatif_interval`` ago, or under the last recompute's CPU cost divided
        by WHATIF_CPU_SHARE.

        Never raises: evidence that cannot calibrate leaves the gauges absent; any other error is
        one line in kvwatch's log and one count in kvwatch_whatif_errors_total, and the gauges go
        absent too (never a stale or a 0 figure).
        """
        if self.whatif is None:
            return False
        now = self.clock()
        if self._whatif_at is not None and 0 <= now - self._whatif_at < self._whatif_gap:
            return False
        self._whatif_at = now
        cpu_started = self.cpu_clock()
        with self.lock:
            inputs = self.state.whatif_inputs()
        results: list[tuple[str, tuple[tuple[str, float, float | None], ...]]] = []
        failed = 0
        for engine, facts, points in inputs:
            outcome: tuple[tuple[str, float, float | None], ...] = ()
            if len(points) >= 2:
                try:
                    got = self.whatif(facts, points)
                except KvwatchError:
                    pass  # not enough evidence in the window (idle, starting, no finished request)
                except Exception as exc:  # a simulator bug must not stop the sidecar
                    failed += 1
                    log.warning("whatif: engine %s: recompute failed: %s: %s", engine, type(exc).__name__, exc)
                else:
                    outcome = tuple((o.lever, o.waiting, o.preemptions_per_100_requests) for o in got)
            results.append((engine, outcome))
        with self.lock:
            for engine, outcome in results:
                self.state.set_whatif(engine, outcome)
            self.state.whatif_errors = (self.state.whatif_errors or 0.0) + failed
        cost = max(0.0, self.cpu_clock() - cpu_started)
        self.whatif_cpu_seconds = cost
        self._whatif_gap = max(self.whatif_interval, cost / WHATIF_CPU_SHARE)
        return True

    # ------------------------------------------------------------------ threads

    def _log_loop(self) -> None:
        assert self.lines is not None
        while not self.stopping.is_set():
            self.read_log_once()
            if self.lines.status().eof:
                self.flush_parser()
                self.log_finished.set()
                return
            self.lines.wait(1.0)

    def _scrape_loop(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            self.scrape_once()
            # The scraper backs off after failures (doubling up to its maximum); else the interval.
            delay = self.scraper.next_delay() if self.scraper is not None else self.scrape_interval
            self.stopping.wait(max(0.0, delay - (time.monotonic() - started)))

    def _whatif_loop(self) -> None:
        # Wakes every interval; recompute_whatif_once itself skips a turn the CPU budget has not earned.
        while not self.stopping.wait(self.whatif_interval):
            try:
                self.recompute_whatif_once()
            except Exception as exc:  # the recompute never raises by contract; a bug must not end the thread
                log.warning("whatif: recompute failed: %s: %s", type(exc).__name__, exc)

    def start(self) -> Sidecar:
        """Start serving and reading."""
        self.server.start()
        if self.lines is not None:
            self._threads.append(threading.Thread(target=self._log_loop, name="kvwatch-log", daemon=True))
        if self.scraper is not None:
            self._threads.append(threading.Thread(target=self._scrape_loop, name="kvwatch-scrape", daemon=True))
        if self.scraper is not None and self.whatif is not None:
            self._threads.append(threading.Thread(target=self._whatif_loop, name="kvwatch-whatif", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop the threads, persist the log position and close the server."""
        self.stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.lines is not None:
            if self._uncommitted:
                self._commit()
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


# ---------------------------------------------------------------------- construction from settings


def line_source_for(settings: WatchSettings) -> LineSource | None:
    """The log source the settings ask for: replay, stdin, a followed file, or none."""
    if settings.replay is not None:
        from kvwatch.sources.replay import ReplaySource

        if not settings.replay.is_file():
            raise UsageError(f"--replay {settings.replay}: no such file; give a saved vLLM log")
        return ReplaySource(settings.replay, settings.speed)
    if settings.log == "-":
        from kvwatch.sources.stdin import StdinSource

        return StdinSource()
    if settings.log is not None:
        from kvwatch.sources.tail import LogFollower

        path = Path(settings.log)
        if path.is_dir():
            raise UsageError(f"--log {path} is a directory; give the vLLM log file")
        return LogFollower(
            path, state_dir=settings.state_dir, from_start=settings.from_start, poll_interval=settings.poll_interval
        )
    return None


def build_sidecar(settings: WatchSettings, lines: LineSource | None, log_name: str | None = None) -> Sidecar:
    """Everything ``kvwatch watch`` runs, started: sources, parser, reconciler, server."""
    from kvwatch.parse.log import LogParser

    configure_logging()
    # The followed lines' scanner, compiled by a short-lived interpreter now rather than here at the
    # first batch: the compiler's memory never joins the sidecar's (kvwatch.sources.scanner).
    scanner.compile_out_of_process()
    scanner.name()
    arch = _architecture(settings)
    state = LiveState(
        expected=lambda facts: expected_for(arch or _model_named_in_log(facts), facts, settings),
        # A replay at X times the pace fits the window's worth of records into W / X seconds.
        window_seconds=settings.window / (settings.speed if settings.replay is not None else 1.0),
        threshold=settings.threshold,
        scrape_interval=settings.scrape_interval,
        max_num_seqs=settings.max_num_seqs,
        engine_expiry_scrapes=settings.engine_expiry_scrapes,
    )
    restored = getattr(lines, "restored_checkpoint", None)
    if isinstance(restored, dict) and not state.restore_checkpoint(restored):
        log.warning("source: counters saved with the log position are malformed; they restart from 0")
    scraper = None
    if settings.metrics_url:
        from kvwatch.sources.scrape import MetricsScraper

        verify: bool | str = False if settings.insecure else (str(settings.ca_file) if settings.ca_file else True)
        scraper = MetricsScraper(
            settings.metrics_url,
            timeout=settings.scrape_timeout,
            bearer_token=settings.bearer_token,
            verify=verify,
            interval=settings.scrape_interval,
            reader=read_exposition_timed,  # the wiring hands the source its parser
        )
    web_config = None
    if settings.web_config_file is not None:
        from kvwatch.export.webconfig import load_web_config

        try:
            web_config = load_web_config(settings.web_config_file)
        except UsageError:
            if lines is not None:
                lines.close()
            raise
    try:
        sidecar = Sidecar(
            state,
            parser=LogParser(),
            lines=lines,
            scraper=scraper,
            listen=settings.listen,
            scrape_interval=settings.scrape_interval,
            web_config=web_config,
            whatif=lambda facts, points: whatif_outcomes(facts, points, arch or _model_named_in_log(facts)),
        )
    except OSError as exc:
        if lines is not None:
            lines.close()
        raise UsageError(f"cannot listen on {settings.listen}: {exc.strerror or exc}; pick another --listen") from None
    log.info(
        "start: listening on %s%s (log: %s, metrics: %s, model: %s)",
        settings.listen,
        _protection(web_config),
        settings.replay or settings.log or log_name or "none",
        _redact(settings.metrics_url),
        arch.name if arch is not None else "from the log",
    )
    return sidecar.start()


def read_exposition_timed(text: str) -> ExpositionReading:
    """The vLLM reader plus the counters that time the run (the what-if simulation's evidence)."""
    from dataclasses import replace

    from kvwatch.parse.metrics import read_exposition
    from kvwatch.parse.scrapeseries import read_timing

    reading = read_exposition(text)
    timing: TimingSeries = read_timing(text)
    return replace(reading, snapshot=replace(reading.snapshot, timing=timing))


def whatif_outcomes(
    facts: ServerFacts, points: tuple[EvidencePoint, ...], arch: Architecture | None
) -> tuple[WhatifOutcome, ...]:
    """One engine's what-ifs (kvwatch.reconcile.simulate.whatif), imported when first run."""
    from kvwatch.reconcile.simulate import whatif

    return whatif.outcomes(facts, points, arch)


def _protection(web_config: WebConfig | None) -> str:
    if web_config is None:
        return ""
    parts = [p for p, on in (("TLS", web_config.tls is not None), ("basic auth", web_config.basic_auth_users)) if on]
    return f" with {' and '.join(parts)}" if parts else ""


def _architecture(settings: WatchSettings) -> Architecture | None:
    from kvwatch.reconcile.architecture import resolve_model

    if settings.model_config_path is not None:
        return resolve_model(str(settings.model_config_path))
    if settings.model is not None:
        return resolve_model(settings.model)
    return None


def _redact(url: str | None) -> str:
    if not url:
        return "none"
    from kvwatch.sources.scrape import redact

    return redact(url)


def _model_named_in_log(facts: ServerFacts) -> Architecture | None:
    """Without --model/--model-config: the model the log names, when kvwatch knows it (catalogue,
    HF cache or a readable path) and the log's own KV figures agree with it."""
    from kvwatch.reconcile.expectation import model_from_facts

    return model_from_facts(facts)


def expected_for(arch: Architecture | None, facts: ServerFacts, settings: WatchSettings) -> Expected | None:
    """The config.json expectation under the server's settings as known now (log, cache_config, flags).

    Every number comes from the one capacity model (kvwatch.reconcile.expectation), the same
    functions ``kvwatch capacity`` and ``kvwatch analyze`` call.
    """
    from kvwatch.reconcile import expectation as model

    if arch is None:
        return None
    known = facts.with_flags(settings.kv_cache_dtype, settings.tensor_parallel_size)
    try:
        expected = model.expectation(arch, known)
    except UsageError as exc:
        log.warning("mismatch: no expectation from %s: %s", arch.name, exc)
        return None

    def pool_tokens_for(kv_bytes: float) -> float:
        est = model.expected_estimate(arch, known, pool_blocks=None, pool_tokens=None, pool_bytes=int(kv_bytes))
        return float(est.pool_tokens or 0)

    def whatif(pool_tokens: float, request: RequestShape) -> dict[str, float]:
        """Max concurrency for the observed request size if one lever were pulled."""
        return model.whatif_concurrency(model.lever_rows(known, arch, request, pool_tokens))

    def concurrency_at(pool_tokens: float) -> float | None:
        return model.concurrency_at_max_model_len(arch, known, pool_tokens)

    return Expected(
        bytes_per_token=expected.bytes_per_token,
        pool_tokens_for=pool_tokens_for,
        whatif=whatif,
        pool_tokens=expected.pool_tokens,
        max_concurrency_at_max_model_len=expected.max_concurrency_at_max_model_len,
        concurrency_at=concurrency_at,
        printed_bytes_per_token=expected.printed_bytes_per_token,
    )


def child_process(argv: list[str]) -> ChildProcess:
    """Wrapper mode: ``argv`` (vLLM) as a child whose output is passed through and read (not started)."""
    from kvwatch.sources.child import ChildProcess

    return ChildProcess(argv)
