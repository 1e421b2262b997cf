"""The sidecar's live state: log records and scrapes in, one consistent view out.

Owns, per (model_name, engine): the observed scheduler numbers (from /metrics when fresh, else
from the log), the saturation state (kvwatch.reconcile.saturation), reset-aware preemption
counters, the observed request footprint, and the reconcile ratios of what vLLM reports against
what the model's config.json predicts. It hands the exporter a ``LiveView`` of that, by meaning;
kvwatch.export.exposition chooses the metric names and labels.

No I/O and no clock: every call takes ``now`` (seconds, wall clock) from the caller. Not
thread-safe by itself; the wiring serialises calls with one lock.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvwatch import __version__
from kvwatch.histogram import bucket_delta, bucket_quantile
from kvwatch.parse.provenance import valid_label_value
from kvwatch.reconcile.causes import ProgressTracker, live_cause
from kvwatch.reconcile.expectation import request_from_histograms, request_from_stats
from kvwatch.reconcile.facts import FactsBuilder, ServerFacts
from kvwatch.reconcile.pool import RequestShape
from kvwatch.reconcile.saturation import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW_SECONDS,
    Observation,
    SaturationJudge,
)
from kvwatch.reconcile.simulate.calibrate import EvidencePoint, evidence_point
from kvwatch.reconcile.window import RequestSizeWindow
from kvwatch.records import (
    EngineSample,
    ErrorRecord,
    FactRecord,
    HistogramSummary,
    LogRecord,
    MetricsSnapshot,
    PreemptionRecord,
    PrefixHitRecord,
    RunStartRecord,
    StatsRecord,
)

GIB = 1 << 30
MISMATCH_TOLERANCE = 0.02  # a reconcile ratio further than 2 % from 1 is logged (once per cause)
MAX_ENGINES = 64  # label cardinality bound: engines are DP ranks, never request-derived
FOOTPRINT_WINDOW_SECONDS = 600.0  # request sizes are judged over the last 10 minutes of scrapes
#: An engine /metrics stopped reporting (a DP rank gone, a server replaced) is dropped after this
#: long without it, in scrapes: ceil(ENGINE_EXPIRY_SECONDS / scrape interval) unless configured.
ENGINE_EXPIRY_SECONDS = 300.0

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SourceView:
    """How one source (``log``, ``metrics``) is doing: up, errors so far, last read's duration."""

    source: str
    up: float
    errors: float
    duration: float | None
    last_success: float | None


@dataclass(frozen=True, slots=True)
class EngineView:
    """What the live state knows about one (model_name, engine), by meaning; None: not known.

    Pairs are (label value, value): the source of a pool figure, the basis of a concurrency, a
    lever, a reconcile check, the quantile of a request size. The exporter
    (kvwatch.export.exposition) chooses the metric names and label names.
    """

    model_name: str
    engine: str
    pool_tokens: tuple[tuple[str, float], ...]
    bytes_per_token: tuple[tuple[str, float], ...]
    pool_bytes: tuple[tuple[str, float], ...]
    max_num_seqs: float | None
    request_tokens: tuple[tuple[str, float], ...]
    max_concurrency: tuple[tuple[str, float | None], ...]
    whatif: tuple[tuple[str, float], ...]
    reconcile: tuple[tuple[str, float], ...]
    running: float | None
    waiting: float | None
    kv_usage: float | None
    kv_usage_peak: float | None
    state: str | None
    preemptions: tuple[tuple[str, float], ...]
    last_stats_at: float | None
    cause: str | None = None  # the cause table's id for the current state (kvwatch.reconcile.causes)
    # The simulated outcome per scenario ("observed" or a capacity lever) of the last what-if
    # recompute (kvwatch.reconcile.simulate.whatif); empty when the window could not calibrate.
    whatif_waiting: tuple[tuple[str, float], ...] = ()
    whatif_preemptions_per_100: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class LiveView:
    """The whole state at one instant, for the exporter: kvwatch's version, sources, engines."""

    version: str
    sources: tuple[SourceView, ...]
    record_counts: tuple[tuple[str, float], ...]
    engines: tuple[EngineView, ...]
    http_drops: tuple[tuple[str, float], ...] = ()  # kvwatch's own server: dropped connections by reason
    whatif_errors: float | None = None  # failed what-if recomputes, once the wiring runs them


@dataclass(frozen=True, slots=True)
class Event:
    """Something worth one line of kvwatch's own log (state change, mismatch, source change)."""

    kind: str  # "state", "mismatch", "source", "restart"
    message: str


@dataclass(frozen=True, slots=True)
class Expected:
    """What the model's config predicts, given the server's settings (the capacity model's).

    ``bytes_per_token`` is per GPU. ``pool_tokens`` is the pool vLLM would print for the KV memory
    it reported (or for its --num-gpu-blocks-override) and ``max_concurrency_at_max_model_len``
    the "Maximum concurrency" it would print for that pool: both from
    ``kvwatch.reconcile.expectation``, per vLLM version and KV-cache group layout (sliding-window
    and hybrid models included). ``pool_tokens_for(kv_bytes)`` is the older form of the first, for
    callers that pass only it. ``concurrency_at(pool_tokens)`` is vLLM's startup figure for an
    observed pool. ``whatif(pool_tokens, request)`` gives the what-if table for a request size.
    All optional: without a config.json there is no expectation.
    """

    bytes_per_token: float | None
    pool_tokens_for: Callable[[float], float] | None = None
    whatif: Callable[[float, RequestShape], dict[str, float]] | None = None
    pool_tokens: float | None = None
    max_concurrency_at_max_model_len: float | None = None
    concurrency_at: Callable[[float], float | None] | None = None
    printed_bytes_per_token: float | None = None  # what KV memory / printed pool tokens should read


ExpectedFactory = Callable[[ServerFacts], Expected | None]
"""Builds the expectation from the server's facts known so far (kv_cache_dtype, tp, block size, ...)."""


class _Counter:
    """A kvwatch counter fed from a source counter that may reset (vLLM restarts)."""

    __slots__ = ("last", "total")

    def __init__(self) -> None:
        self.total: float | None = None
        self.last: float | None = None

    def observe_cumulative(self, value: float) -> float:
        """Feed the source's cumulative value; returns the increase it represents."""
        if self.total is None or self.last is None:
            self.total, self.last = value, value
            return 0.0
        increase = value if value < self.last else value - self.last  # a drop is a restart
        self.total += increase
        self.last = value
        return increase

    def add(self, amount: float) -> None:
        """Add an increase (per-interval counts such as V1's "Preemptions: N")."""
        self.total = (self.total or 0.0) + amount

    def restarted(self) -> None:
        """The source restarted: its next cumulative value counts from zero."""
        if self.last is not None:
            self.last = 0.0


@dataclass
class _Engine:
    engine: str
    model_name: str | None = None
    judge: SaturationJudge = field(default_factory=SaturationJudge)
    state: str | None = None
    log_stats: StatsRecord | None = None
    log_stats_at: float | None = None
    busy_stats: StatsRecord | None = None  # the last stats record with requests running
    scrape: EngineSample | None = None
    scrape_at: float | None = None
    preempt_metrics: _Counter = field(default_factory=_Counter)
    preempt_log: _Counter = field(default_factory=_Counter)
    pending_preemptions: float = 0.0
    footprint: RequestSizeWindow = field(default_factory=lambda: RequestSizeWindow(FOOTPRINT_WINDOW_SECONDS))
    missed_scrapes: int = 0  # successful scrapes in a row that did not report this engine
    # The window's scrapes as the simulator's calibration reads them (only from a reader that
    # times the run, and only for a scrape of one engine: the timing counters are server-wide).
    evidence: deque[EvidencePoint] = field(default_factory=deque)
    whatif: tuple[tuple[str, float, float | None], ...] = ()  # (scenario, waiting, preemptions/100)


class LiveState:
    """The reconciler: ``on_log_record`` / ``on_scrape`` in, ``samples()`` and events out."""

    def __init__(
        self,
        *,
        expected: ExpectedFactory | None = None,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        threshold: float = DEFAULT_THRESHOLD,
        scrape_interval: float = 5.0,
        max_num_seqs: int | None = None,
        engine_expiry_scrapes: int | None = None,
    ) -> None:
        self._expected_factory = expected
        self.engine_expiry_scrapes = engine_expiry_scrapes or max(1, math.ceil(ENGINE_EXPIRY_SECONDS / scrape_interval))
        self.window_seconds = window_seconds
        self.threshold = threshold
        self.scrape_interval = scrape_interval
        self._max_num_seqs_override = max_num_seqs
        self.server = FactsBuilder()
        self.engines: dict[str, _Engine] = {}
        self.record_counts: dict[str, float] = {}
        self.sources: dict[str, dict[str, float | None]] = {}
        self._source_up: dict[str, bool] = {}
        self._mismatch_logged: set[tuple[str, str]] = set()  # (engine, check), said once each
        self._expected: dict[str | None, tuple[ServerFacts, Expected | None]] = {}  # per engine key
        self.progress = ProgressTracker(live=True)  # the cause table's facts (kvwatch_diagnosis)
        # Fed by the HTTP server's threads without the wiring's lock: guarded on its own.
        self._http_drops: dict[str, float] = {}
        self._http_lock = threading.Lock()
        self.whatif_errors: float | None = None  # set by the wiring that runs the what-if recompute

    # ------------------------------------------------------------------ inputs

    def on_log_record(self, record: LogRecord, now: float) -> list[Event]:
        """Apply one parsed log record."""
        events: list[Event] = []
        if isinstance(record, StatsRecord):
            self._count("stats")
            eng = self._engine(str(record.engine if record.engine is not None else 0))
            eng.log_stats, eng.log_stats_at = record, now
            if record.running:
                eng.busy_stats = record
            if record.preemptions:
                eng.preempt_log.add(record.preemptions)
                eng.pending_preemptions += record.preemptions
            if not self._metrics_fresh(eng, now):
                events += self._judge(eng, now)
        elif isinstance(record, FactRecord):
            self._count("startup")
            self.server.add(record)
            events += self._reconcile_events()
        elif isinstance(record, PreemptionRecord):
            self._count("preemption")
            eng = self._engine("0")
            if record.cumulative is not None:
                before = eng.preempt_log.total
                eng.preempt_log.observe_cumulative(record.cumulative)
                if before is None:  # V0 logs every 50th: the first warning states the total so far
                    eng.preempt_log.total = float(record.cumulative)
                eng.pending_preemptions += 1
        elif isinstance(record, RunStartRecord):
            self._count("run_start")
            self.server.start_run()
            for eng in self.engines.values():
                eng.preempt_metrics.restarted()
                eng.preempt_log.restarted()
            events.append(Event("restart", "vLLM started (a new startup block in the log)"))
        elif isinstance(record, ErrorRecord):
            self._count("error")
            events.append(Event("error", f"vLLM reported {record.kind}: {record.message[:200]}"))
        elif isinstance(record, PrefixHitRecord):
            self._count("prefix_hit")
        self._track_cause(record)
        return events

    def on_scrape(self, snapshot: MetricsSnapshot, now: float) -> list[Event]:
        """Apply one successful /metrics scrape."""
        events: list[Event] = []
        if snapshot.cache_config:
            self.server.set_cache_config(snapshot.cache_config)
        for sample in snapshot.engines:
            eng = self._engine(sample.engine or "0")
            if sample.model_name:
                eng.model_name = sample.model_name
            before = eng.preempt_metrics.total
            if sample.preemptions_total is not None:
                eng.pending_preemptions += eng.preempt_metrics.observe_cumulative(sample.preemptions_total)
            self._track_scrape(eng, sample, now, (eng.preempt_metrics.total or 0.0) - (before or 0.0))
            eng.scrape, eng.scrape_at = sample, now
            eng.missed_scrapes = 0
            # Several (model_name, engine) pairs of one scrape land on one engine: one is kept per
            # scrape, the one eng.scrape holds. Keeping all of them kept every sample of a huge
            # answer for the 10-minute window, pinning the memory its parse had used (215 MiB
            # after one 29 MB scrape of 863 model names; benchmarks/scrape_memory.py).
            eng.footprint.add(now, sample)
            self._keep_evidence(eng, snapshot, sample, now)
            events += self._judge(eng, now)
        events += self._expire_engines({s.engine or "0" for s in snapshot.engines}, now)
        events += self._reconcile_events()
        return events

    def _keep_evidence(self, eng: _Engine, snapshot: MetricsSnapshot, sample: EngineSample, now: float) -> None:
        if snapshot.timing is None or len(snapshot.engines) != 1:
            # Several engines share one set of timing counters: no engine's own step time is known.
            eng.evidence.clear()
            return
        point = evidence_point(now, MetricsSnapshot(engines=(sample,)), snapshot.timing)
        if point is None:
            return
        if eng.evidence and eng.evidence[-1].t >= now:
            eng.evidence.clear()  # the clock went back: the window starts again
        eng.evidence.append(point)
        while eng.evidence and now - eng.evidence[0].t > FOOTPRINT_WINDOW_SECONDS:
            eng.evidence.popleft()

    def whatif_inputs(self) -> list[tuple[str, ServerFacts, tuple[EvidencePoint, ...]]]:
        """Per engine: the facts and the window's evidence points, copied (a recompute runs unlocked)."""
        return [(key, self.engine_facts(eng), tuple(eng.evidence)) for key, eng in sorted(self.engines.items())]

    def set_whatif(self, engine: str, outcomes: tuple[tuple[str, float, float | None], ...]) -> None:
        """Store one engine's recomputed what-ifs (empty: none known; the gauges go absent)."""
        eng = self.engines.get(engine)
        if eng is not None:
            eng.whatif = outcomes

    def _expire_engines(self, reported: set[str], now: float) -> list[Event]:
        """Drop engines /metrics has stopped reporting for ``engine_expiry_scrapes`` scrapes.

        Only engines a scrape once reported, and only on scrapes that reported some engine (an
        answer with no vLLM series at all, a server starting, says nothing about which engines
        exist). An engine the log still reports within the same age stays: the log is a source too.
        Without this, fleet sums kept adding a gone rank's last values forever.
        """
        if not reported:
            return []
        if len(self.engines) >= MAX_ENGINES and "overflow" in self.engines:
            reported = reported | {"overflow"}
        events = []
        max_age = self.engine_expiry_scrapes * self.scrape_interval
        for key, eng in list(self.engines.items()):
            if key in reported or eng.scrape_at is None:
                continue
            eng.missed_scrapes += 1
            log_recent = eng.log_stats_at is not None and now - eng.log_stats_at < max_age
            if eng.missed_scrapes >= self.engine_expiry_scrapes and not log_recent:
                del self.engines[key]
                events.append(
                    Event(
                        "source",
                        f"engine {key} ({self._model_name(eng)}): not in /metrics for {eng.missed_scrapes} "
                        "scrapes; its series are dropped",
                    )
                )
        return events

    def on_source(
        self, source: str, ok: bool, now: float, duration: float, error: str | None = None, ended: bool = False
    ) -> list[Event]:
        """Record the outcome of one read of a source (``log`` or ``metrics``)."""
        info = self.sources.setdefault(source, {"up": 0.0, "duration": None, "last_success": None, "errors": 0.0})
        info["up"] = 1.0 if ok else 0.0
        info["duration"] = duration
        if ok:
            info["last_success"] = now
        elif error is not None:  # down without an error is "no data yet" (file not there yet)
            info["errors"] = (info["errors"] or 0.0) + 1
        was = self._source_up.get(source)
        self._source_up[source] = ok
        if was is ok or (was is None and ok):
            return []
        if ok:
            return [Event("source", f"source {source} recovered")]
        if ended:
            return [Event("source", f"source {source} ended (end of input)")]
        if error is None:
            return [Event("source", f"source {source} has no data yet (waiting for it to appear)")]
        return [Event("source", f"source {source} down: {error}")]

    def on_http_drop(self, reason: str) -> None:
        """kvwatch's own HTTP server dropped a connection (aborted, timeout, over_limit, tls_error).

        Thread-safe on its own (called from the server's threads): a flood of clients is one
        counter, never a log line.
        """
        with self._http_lock:
            self._http_drops[reason] = self._http_drops.get(reason, 0.0) + 1

    # ------------------------------------------------------------------ derived values

    def facts(self) -> ServerFacts:
        """What the server stated about itself so far (log facts and cache_config_info)."""
        return self.server.facts()

    def engine_facts(self, eng: _Engine | None) -> ServerFacts:
        """What one engine stated in the current server run: its own data-parallel lines over the
        run's (kvwatch.reconcile.facts.FactsBuilder.facts_for); the server's without an engine."""
        if eng is None:
            return self.facts()
        return self.server.facts_for(int(eng.engine) if eng.engine.isdigit() else None)

    def max_num_seqs(self, eng: _Engine | None = None) -> int | None:
        """vLLM's max_num_seqs: the override, the (engine's) log args, or None."""
        if self._max_num_seqs_override is not None:
            return self._max_num_seqs_override
        return self.engine_facts(eng).max_num_seqs

    def pool_tokens(self, eng: _Engine | None = None) -> dict[str, float]:
        """Pool size in tokens by source: log, metrics, config (expected); one engine's with ``eng``."""
        facts = self.engine_facts(eng)
        out: dict[str, float] = {}
        if facts.log_pool_tokens is not None:
            out["log"] = facts.log_pool_tokens
        if facts.metrics_pool_tokens is not None:
            out["metrics"] = facts.metrics_pool_tokens
        expected = self.expected(eng)
        kv_bytes = facts.kv_memory_bytes
        override = facts.override_blocks
        size = facts.block_size
        if expected and expected.pool_tokens is not None:
            out["config"] = expected.pool_tokens
        elif override is not None and size:
            # --num-gpu-blocks-override replaces vLLM's computed pool: the expectation is the override.
            out["config"] = override * size
        elif expected and expected.pool_tokens_for and kv_bytes is not None:
            out["config"] = expected.pool_tokens_for(kv_bytes)
        return out

    def kv_memory_bytes(self) -> float | None:
        """KV-cache memory vLLM reports (log GiB, or cache_config's kv_cache_memory_bytes)."""
        return self.facts().kv_memory_bytes

    def bytes_per_token(self, eng: _Engine | None = None) -> dict[str, float]:
        """KV bytes per token by source: config (expected) and observed (log memory / log pool);
        one engine's with ``eng`` (a data-parallel rank prints its own memory and pool)."""
        facts = self.engine_facts(eng)
        out: dict[str, float] = {}
        expected = self.expected(eng)
        if expected and expected.bytes_per_token:
            out["config"] = expected.bytes_per_token
        kv_bytes = facts.kv_memory_bytes
        pool = self.pool_tokens(eng)
        observed_pool = pool.get("log") or pool.get("metrics")
        computed = facts.computed_blocks
        block_size = facts.config_block_size
        if computed is not None and block_size:
            # With an override, the KV memory held the blocks vLLM computed before overriding.
            observed_pool = computed * block_size
        elif facts.override_blocks is not None:
            observed_pool = None  # the pool is the override, unrelated to the memory figure
        if kv_bytes and observed_pool:
            out["observed"] = kv_bytes / observed_pool
        return out

    def max_model_len(self) -> float | None:
        """max_model_len as the log or the concurrency line states it."""
        value = self.facts().max_model_len
        return float(value) if value is not None else None

    def request_tokens(self, eng: _Engine) -> dict[str, float]:
        """Observed KV footprint of one request (prompt + generation) at p50 and p95."""
        if len(eng.footprint) >= 2:
            first, last = eng.footprint[0][1], eng.footprint[-1][1]
        elif eng.footprint:
            first, last = None, eng.footprint[-1][1]
        else:
            return self._footprint_from_log(eng)
        out: dict[str, float] = {}
        for q, label in ((0.5, "0.5"), (0.95, "0.95")):
            total = 0.0
            for attr in ("request_prompt_tokens", "request_generation_tokens"):
                new = getattr(last, attr)
                old = getattr(first, attr) if first is not None else None
                value = _window_quantile(q, new, old)
                if value is None:
                    return self._footprint_from_log(eng)
                total += value
            out[label] = total
        return out

    def _footprint_from_log(self, eng: _Engine) -> dict[str, float]:
        """pool x usage / running: what the running requests held on average at the last stats
        record that had any (log only); the same record analyze's what-if basis reads."""
        stats = eng.busy_stats
        pool = self.pool_tokens(eng)
        tokens = pool.get("log") or pool.get("metrics")
        if not stats or not tokens or not stats.running or stats.kv_usage_pct is None:
            return {}
        per_request = tokens * stats.kv_usage_pct / 100.0 / stats.running
        return {"0.5": per_request, "0.95": per_request} if per_request > 0 else {}

    def request_shape(self, eng: _Engine) -> RequestShape | None:
        """The request size the what-ifs are computed for, and where it came from.

        The p95 of vLLM's prompt and of its generation token histograms over the window (kept
        apart, so a prompt lever changes only the prompt), else the log's pool x KV usage /
        running (``kvwatch.reconcile.expectation.request_from_stats``, the rule analyze uses too).
        """
        if eng.footprint:
            first = eng.footprint[0][1] if len(eng.footprint) >= 2 else None
            last = eng.footprint[-1][1]
            parts = []
            for attr in ("request_prompt_tokens", "request_generation_tokens"):
                old = getattr(first, attr) if first is not None else None
                parts.append(_window_quantile(0.95, getattr(last, attr), old))
            shape = request_from_histograms(parts[0], parts[1])
            if shape is not None:
                return shape
        pool = self.pool_tokens(eng)
        return request_from_stats(pool.get("log") or pool.get("metrics"), eng.busy_stats)

    def expected(self, eng: _Engine | None = None) -> Expected | None:
        """The config.json expectation for the facts known now (rebuilt when they change); one
        engine's with ``eng``, from the KV memory that engine's own rank profiled."""
        if self._expected_factory is None:
            return None
        facts = self.engine_facts(eng)
        key = eng.engine if eng is not None else None
        cached = self._expected.get(key)
        if cached is None or cached[0] != facts:
            if len(self._expected) > MAX_ENGINES:
                self._expected.clear()  # engines come and go (expiry); never more than the label bound
            cached = self._expected[key] = (facts, self._expected_factory(facts))
        return cached[1]

    # ------------------------------------------------------------------ output

    def view(self, now: float) -> LiveView:
        """Everything the exporter shows, computed now from the latest state (names: kvwatch.export)."""
        sources = tuple(
            SourceView(source, info["up"] or 0.0, info["errors"] or 0.0, info["duration"], info["last_success"])
            for source, info in sorted(self.sources.items())
        )
        facts = self.facts()
        engines = self.engines or ({"0": self._engine("0")} if self.server.stated else {})
        views = []
        for eng in sorted(engines.values(), key=lambda e: e.engine):
            # The engine's own facts (a DP rank prints its own pool), else the server's.
            own = self.engine_facts(eng)
            expected = self.expected(eng)
            bpt = self.bytes_per_token(eng)
            mns = self.max_num_seqs(eng)
            pool = self.pool_tokens(eng)
            kv_bytes = own.kv_memory_bytes
            pool_bytes: list[tuple[str, float]] = []
            if kv_bytes is not None and own.override_blocks is None:
                # With --num-gpu-blocks-override the memory figure is what was available, not the pool.
                pool_bytes.append(("log", kv_bytes))
            if bpt.get("config") and pool.get("config"):
                pool_bytes.append(("config", bpt["config"] * pool["config"]))
            observed_pool = pool.get("metrics") or pool.get("log")
            req = self.request_tokens(eng)
            concurrency: list[tuple[str, float | None]] = []
            whatif: tuple[tuple[str, float], ...] = ()
            if observed_pool:
                concurrency.append(("max_model_len", self._concurrency_at_len(observed_pool)))
            if observed_pool and req.get("0.95"):
                concurrency.append(("observed_p95", observed_pool / req["0.95"]))
                shape = self.request_shape(eng)
                if expected and expected.whatif and shape is not None:
                    whatif = tuple(sorted(expected.whatif(observed_pool, shape).items()))
            running, waiting, kv_ratio = self._observed(eng, now)
            preemptions = tuple(
                (source, counter.total)
                for source, counter in (("log", eng.preempt_log), ("metrics", eng.preempt_metrics))
                if counter.total is not None
            )
            views.append(
                EngineView(
                    model_name=self._model_name(eng),
                    engine=eng.engine,
                    pool_tokens=tuple(sorted(pool.items())),
                    bytes_per_token=tuple(sorted(bpt.items())),
                    pool_bytes=tuple(pool_bytes),
                    max_num_seqs=float(mns) if mns is not None else None,
                    request_tokens=tuple(sorted(req.items())),
                    max_concurrency=tuple(concurrency),
                    whatif=whatif,
                    reconcile=tuple(sorted(self.reconcile_ratios(eng).items())),
                    running=running,
                    waiting=waiting,
                    kv_usage=kv_ratio,
                    kv_usage_peak=eng.judge.peak_kv_usage(),
                    state=eng.state,
                    preemptions=preemptions,
                    last_stats_at=eng.log_stats_at,
                    cause=live_cause(facts, self.progress, eng.state or "unknown"),
                    whatif_waiting=tuple((name, waiting) for name, waiting, _p in eng.whatif),
                    whatif_preemptions_per_100=tuple((name, p) for name, _w, p in eng.whatif if p is not None),
                )
            )
        with self._http_lock:
            drops = tuple(sorted(self._http_drops.items()))
        return LiveView(
            __version__, sources, tuple(sorted(self.record_counts.items())), tuple(views), drops, self.whatif_errors
        )

    def reconcile_ratios(self, eng: _Engine | None = None) -> dict[str, float]:
        """observed / expected for pool_tokens, bytes_per_token and max_concurrency; one engine's
        with ``eng``: each data-parallel rank profiles its own GPU and prints its own pool and
        concurrency (vLLM 0.32.0 v1/engine/core.py ``EngineCore._initialize_kv_caches`` runs per
        rank), so a rank whose GPU another process shares differs alone."""
        out: dict[str, float] = {}
        pool = self.pool_tokens(eng)
        observed_pool = pool.get("log") or pool.get("metrics")
        if observed_pool and pool.get("config"):
            out["pool_tokens"] = observed_pool / pool["config"]
        bpt = self.bytes_per_token(eng)
        expected = self.expected(eng)
        # Sliding-window and hybrid pools print fewer tokens than they store: compare like with like.
        against = (expected.printed_bytes_per_token if expected else None) or bpt.get("config")
        if bpt.get("observed") and against:
            out["bytes_per_token"] = bpt["observed"] / against
        printed = self.engine_facts(eng).printed_max_concurrency
        expected_conc = expected.max_concurrency_at_max_model_len if expected else None
        if expected_conc is None and pool.get("config"):
            expected_conc = self._concurrency_at_len(pool["config"])
        if printed and expected_conc:
            out["max_concurrency"] = printed / expected_conc
        return out

    def _concurrency_at_len(self, pool_tokens: float) -> float | None:
        """vLLM's startup concurrency figure for a pool: the capacity model's when a config is known."""
        expected = self.expected()
        if expected is not None and expected.concurrency_at is not None:
            return expected.concurrency_at(pool_tokens)
        facts = self.facts()
        mml = facts.max_model_len
        return _concurrency_at_len(pool_tokens, mml, facts.block_size) if mml else None

    # ------------------------------------------------------------------ crash-restart

    def checkpoint(self) -> dict[str, object]:
        """The counters the log has fed so far, to be saved in the same write as the log position.

        A restart resumes reading at the saved position with these values, so a line read again
        after a SIGKILL (up to the commit interval) adds nothing that was already counted, and
        Prometheus sees one continuous counter rather than a reset (which ``increase()`` would
        add on top of the re-read lines).
        """
        return {
            "log_records": dict(self.record_counts),
            "preemptions_log": {
                e: [eng.preempt_log.total, eng.preempt_log.last]
                for e, eng in self.engines.items()
                if eng.preempt_log.total is not None
            },
        }

    def restore_checkpoint(self, saved: dict[str, object]) -> bool:
        """Resume the counters of ``checkpoint()``; False (nothing changed) if ``saved`` is malformed."""
        records, preempt = saved.get("log_records"), saved.get("preemptions_log")
        if not isinstance(records, dict) or not isinstance(preempt, dict):
            return False
        counts = {str(k): float(v) for k, v in records.items() if _num(v) is not None and float(v) >= 0}
        totals: dict[str, tuple[float, float | None]] = {}
        for engine, pair in preempt.items():
            if not (isinstance(pair, list) and len(pair) == 2 and _num(pair[0]) is not None):
                return False
            totals[str(engine)[:64]] = (float(pair[0]), _num(pair[1]))
        self.record_counts.update(counts)
        for engine, (total, last) in totals.items():
            eng = self._engine(engine)
            eng.preempt_log.total, eng.preempt_log.last = total, last
        return True

    # ------------------------------------------------------------------ internals

    def _engine(self, engine: str) -> _Engine:
        eng = self.engines.get(engine)
        if eng is None:
            if len(self.engines) >= MAX_ENGINES:
                engine = "overflow"  # bound the label set; DP ranks never get near this
                eng = self.engines.get(engine)
                if eng is not None:
                    return eng
            eng = _Engine(engine, judge=SaturationJudge(self.window_seconds, self.threshold, None))
            self.engines[engine] = eng
        return eng

    def _model_name(self, eng: _Engine) -> str:
        if eng.model_name:
            return eng.model_name[:200]
        # From the log: only a value a model name can have (kvwatch.parse.provenance).
        value = self.facts().model_name
        if isinstance(value, str) and valid_label_value(value):
            return value[:200]
        return "unknown"

    def _metrics_fresh(self, eng: _Engine, now: float) -> bool:
        return eng.scrape_at is not None and now - eng.scrape_at <= 3 * self.scrape_interval

    def _observed(self, eng: _Engine, now: float) -> tuple[float | None, float | None, float | None]:
        if self._metrics_fresh(eng, now) and eng.scrape is not None:
            s = eng.scrape
            return s.running, s.waiting, s.kv_usage_ratio
        if eng.log_stats is not None:
            st = eng.log_stats
            kv = st.kv_usage_pct / 100.0 if st.kv_usage_pct is not None else None
            return _f(st.running), _f(st.waiting), kv
        if eng.scrape is not None:
            s = eng.scrape
            return s.running, s.waiting, s.kv_usage_ratio
        return None, None, None

    def _judge(self, eng: _Engine, now: float) -> list[Event]:
        eng.judge.max_num_seqs = self.max_num_seqs(eng)
        running, waiting, kv = self._observed(eng, now)
        capacity = None
        if self._metrics_fresh(eng, now) and eng.scrape is not None:
            capacity = eng.scrape.waiting_capacity
        obs = Observation(now, running, waiting, kv, eng.pending_preemptions, capacity)
        eng.pending_preemptions = 0.0
        state = eng.judge.observe(obs)
        if state == eng.state:
            return []
        before, eng.state = eng.state, state
        peak = eng.judge.peak_kv_usage()
        detail = f"running {_fmt(running)}, waiting {_fmt(waiting)}, KV usage {_pct(kv)}%, peak {_pct(peak)}%"
        return [
            Event("state", f"engine {eng.engine} ({self._model_name(eng)}): {before or 'start'} -> {state} ({detail})")
        ]

    def _reconcile_events(self) -> list[Event]:
        events = []
        # Data-parallel ranks each print their own memory and pool; until a rank has printed its
        # pool its facts mix with another rank's (the run's last values), so only ranks that did
        # are held against the expectation. One engine: the server's facts, as vLLM printed them.
        ranks = self.server.engines_with_own_pool()
        engines: list[_Engine | None] = (
            [self._engine(str(rank)) for rank in ranks] if ranks else list(self.engines.values()) or [None]
        )
        for eng in engines:
            key = eng.engine if eng is not None else "0"
            # One engine (the usual server) keeps the plain message; data-parallel ranks are named.
            where = f"engine {key} ({self._model_name(eng)}): " if eng is not None and len(engines) > 1 else ""
            for check, ratio in self.reconcile_ratios(eng).items():
                if abs(ratio - 1.0) > MISMATCH_TOLERANCE and (key, check) not in self._mismatch_logged:
                    self._mismatch_logged.add((key, check))
                    events.append(
                        Event(
                            "mismatch",
                            f"{where}{check}: vLLM reports {ratio:.3f}x what config.json predicts; "
                            f"likely cause: {self._likely_cause(check, ratio)}",
                        )
                    )
        return events

    def _likely_cause(self, check: str, ratio: float) -> str:
        facts = self.facts()
        dtype = str(facts.config.kv_cache_dtype or facts.metric("cache_dtype") or "auto")
        tp = _num(facts.config.tensor_parallel_size) or 1
        if check == "bytes_per_token" and 0.45 < ratio < 0.55:
            return "fp8 KV cache in use but not in the expectation (pass --kv-cache-dtype)"
        if check == "bytes_per_token" and 1.9 < ratio < 2.1 and dtype.startswith("fp8"):
            return "fp8 KV cache requested but not applied by vLLM"
        if check == "bytes_per_token" and tp > 1 and abs(ratio - tp) < 0.1 * tp:
            return f"tensor-parallel split: KV heads per GPU differ from total/{int(tp)}"
        if facts.override_blocks is not None:
            return "--num-gpu-blocks-override replaced the computed pool"
        return "block size, memory profiling or a hybrid layout differs from the config's assumptions"

    def _track_cause(self, record: LogRecord) -> None:
        """Feed the cause table's tracker the record (after the state it produced)."""
        p = self.progress
        if isinstance(record, StatsRecord):
            eng = self._engine(str(record.engine if record.engine is not None else 0))
            p.on_stats(record, eng.state or "unknown", record.preemptions or 0, "log")
        elif isinstance(record, FactRecord):
            p.on_fact(record.field, record.value, record.ts)
        elif isinstance(record, ErrorRecord):
            p.on_error(record)
        elif isinstance(record, RunStartRecord):
            p.on_run_start()

    def _track_scrape(self, eng: _Engine, sample: EngineSample, now: float, preempted: float) -> None:
        """A scrape as a stats record for the tracker: token rates from the counters' increase."""
        prev, at = eng.scrape, eng.scrape_at
        if prev is None or at is None or now <= at:
            return
        dt = now - at

        def rate(new: float | None, old: float | None) -> float | None:
            return max(0.0, new - old) / dt if new is not None and old is not None else None

        rec = StatsRecord(
            0,
            None,
            None,
            None,
            int(sample.running) if sample.running is not None else None,
            int(sample.waiting) if sample.waiting is not None else None,
            kv_usage_pct=sample.kv_usage_ratio * 100.0 if sample.kv_usage_ratio is not None else None,
            prompt_tps=rate(sample.prompt_tokens_total, prev.prompt_tokens_total),
            gen_tps=rate(sample.generation_tokens_total, prev.generation_tokens_total),
        )
        self.progress.on_stats(rec, eng.state or "unknown", int(max(0.0, preempted)), f"metrics:{eng.engine}", dt)

    def _count(self, kind: str) -> None:
        self.record_counts[kind] = self.record_counts.get(kind, 0.0) + 1


def _window_quantile(q: float, new: HistogramSummary | None, old: HistogramSummary | None) -> float | None:
    """The q-quantile of what a histogram observed between two scrapes (or since start).

    Prometheus' interpolation, except where the rank falls in the +Inf bucket: vLLM's token
    buckets end at 1-2-5 steps (5,000 for a 9,216-token max_model_len; vllm/v1/metrics/buckets.py
    build_buckets in 0.32.0), so histogram_quantile would answer "5,000" for 7,500-token prompts.
    The histogram cannot resolve that quantile, so None: the caller falls back to the footprint
    the log measures (pool x usage / running). The window's mean was used here once and called
    the p95 -- 7,028 where the true p95 was 8,208, so every observed_p95 figure read ~17 % high.
    """
    if new is None or not new.buckets:
        return None
    buckets = new.buckets
    count, total = new.count, new.sum
    if old is not None and old.buckets:
        delta = bucket_delta(new.buckets, old.buckets)
        if delta and delta[-1][1] > 0:
            buckets = delta
            if count is not None and old.count is not None and total is not None and old.sum is not None:
                count, total = count - old.count, total - old.sum
    value = bucket_quantile(q, buckets)
    if value is None:
        return None
    finite = [(le, c) for le, c in buckets if math.isfinite(le)]
    if finite and math.isinf(buckets[-1][0]) and finite[-1][1] < q * buckets[-1][1]:
        return None  # the rank is above the last finite bound: only "more than it" is known
    return value


def _concurrency_at_len(pool_tokens: float, max_model_len: float, block_size: float | None) -> float:
    """vLLM's startup figure: blocks / cdiv(max_model_len, block_size) (tokens / len without blocks)."""
    if block_size:
        return (pool_tokens // block_size) / math.ceil(max_model_len / block_size)
    return pool_tokens / max_model_len


def _num(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def _f(value: int | None) -> float | None:
    return float(value) if value is not None else None


def _pct(ratio: float | None) -> str:
    return _fmt(ratio * 100 if ratio is not None else None)


def _fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
