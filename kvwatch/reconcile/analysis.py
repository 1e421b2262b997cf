"""Log records -> the ``kvwatch.analyze/1`` document (docs/contracts.md), with saturation and diagnosis.

``Analysis`` folds records in input order with bounded state (counters, last/max values, one
SaturationJudge per engine, a capped list of episodes and errors), so a 4 M-line log needs no more
memory than a 2 M-line one. The whole postmortem in one call (files -> parser -> this) is
``kvwatch.batch.analyze_paths``, the batch wiring beside the sidecar's.

Data-parallel engines stay separate: saturation is judged per (input, engine) and nothing averages
or sums percentages across engines. Values the log does not state stay null; nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvwatch.reconcile.causes import ProgressTracker, case_from_document, diagnose
from kvwatch.reconcile.evidence import EvidenceInputs, MetricsEvidence, apply_metrics

# CAPACITY_KEYS / CONFIG_KEYS: re-exported for modules that imported them from here.
from kvwatch.reconcile.facts import CAPACITY_KEYS, CONFIG_KEYS, FactsBuilder, ServerFacts  # noqa: F401
from kvwatch.reconcile.saturation import VERDICT_ORDER, SaturationJudge
from kvwatch.reconcile.stalls import STALL_FIELDS
from kvwatch.records import (
    ErrorRecord,
    FactRecord,
    LogRecord,
    LogTime,
    PreemptionRecord,
    PrefixHitRecord,
    RunStartRecord,
    StatsRecord,
)

SCHEMA = "kvwatch.analyze/1"
MAX_ERRORS = 200  # errors kept in the document; more are counted in errors_total
MAX_EPISODES = 200  # memory-bound episodes kept with their times; all are counted in seconds/records
NOMINAL_INTERVAL_S = 10.0  # V1's stats interval, the time base when a log has no timestamps

STATS_LAST_KEYS = (
    "engine",
    "running",
    "waiting",
    "swapped",
    "deferred",
    "preemptions",
    "kv_usage_pct",
    "cpu_kv_usage_pct",
    "prefix_hit_pct",
    "external_prefix_hit_pct",
    "prompt_tps",
    "gen_tps",
)


def levers_hook(doc: dict[str, Any], model: str | None) -> list[Any]:
    """What could be changed to fix the diagnosis (CONTRACTS: "levers as in the capacity issue").

    Filled by the capacity model (kvwatch.reconcile.expectation) from ``doc`` (the log's pool and config) and
    ``model`` (a model name or config.json path from ``--model``/``--model-config``, else the
    model the log names): one row per lever, as ``kvwatch capacity`` prints them.
    """
    from kvwatch.reconcile.capacity import analysis_levers  # local: analyze without a model needs none of it

    return analysis_levers(doc, model)


def _iso(ts: LogTime | None) -> str | None:
    return ts.iso() if ts is not None else None


class _Sustained:
    """``saturation.verdict`` computed incrementally (same rules, constant memory); the fold of each
    state is inlined in ``Analysis._stats``, which runs once per stats record."""

    def __init__(self) -> None:
        self.count = 0
        self.prev: str | None = None
        self.first: str | None = None
        self.sustained: set[str] = set()

    def verdict(self) -> str:
        if self.count == 0:
            return "unknown"
        sustained = self.sustained or ({self.prev} if self.count == 1 and self.prev else set())
        for state in VERDICT_ORDER:
            if state in sustained:
                return state
        return self.prev or "unknown"


@dataclass
class _Episode:
    engine: int | None
    source: str | None
    start: LogTime | None
    end: LogTime | None
    peak_waiting: int = 0
    peak_kv_usage_pct: float | None = None
    records: int = 0


TIMELINE_BUCKETS = 48  # columns of the timeline an on-call engineer reads at a glance


class Timeline:
    """A bounded timeline of one engine: at most 2 x TIMELINE_BUCKETS buckets, each the peaks of
    consecutive stats records. When full, neighbours merge, so memory stays constant."""

    def __init__(self, size: int = TIMELINE_BUCKETS) -> None:
        self.size = size
        self.step = 1  # records per bucket
        # [first ts, last ts, records, peak running, peak waiting, peak KV usage %]
        self.buckets: list[list[Any]] = []

    def add(self, rec: StatsRecord) -> None:
        """Fold one stats record into the last bucket or a new one."""
        buckets = self.buckets
        if not buckets or buckets[-1][2] >= self.step:
            buckets.append([rec.ts, rec.ts, 1, rec.running, rec.waiting, rec.kv_usage_pct])
            if len(buckets) >= 2 * self.size:
                self._merge()
            return
        last = buckets[-1]
        last[1] = rec.ts
        last[2] += 1
        # _max inlined: this runs once per stats record.
        v = rec.running
        if v is not None and (last[3] is None or v > last[3]):
            last[3] = v
        v = rec.waiting
        if v is not None and (last[4] is None or v > last[4]):
            last[4] = v
        kv = rec.kv_usage_pct
        if kv is not None and (last[5] is None or kv > last[5]):
            last[5] = kv

    def _merge(self) -> None:
        """Halve the buckets: neighbours merge, each bucket covers twice the records."""
        if len(self.buckets) >= 2 * self.size:
            merged = []
            for a, b in zip(self.buckets[::2], self.buckets[1::2], strict=False):
                merged.append([a[0], b[1], a[2] + b[2], _max(a[3], b[3]), _max(a[4], b[4]), _max(a[5], b[5])])
            if len(self.buckets) % 2:
                merged.append(self.buckets[-1])
            self.buckets = merged
            self.step *= 2

    def document(self) -> list[dict[str, Any]]:
        """The buckets as JSON objects (peaks, never averages)."""
        return [
            {
                "start_ts": _iso(b[0]),
                "end_ts": _iso(b[1]),
                "records": b[2],
                "peak_running": b[3],
                "peak_waiting": b[4],
                "peak_kv_usage_pct": b[5],
            }
            for b in self.buckets
        ]


_Num = TypeVar("_Num", int, float)


@dataclass
class _EngineState:
    """Saturation bookkeeping of one (input, engine)."""

    judge: SaturationJudge
    verdict: _Sustained = field(default_factory=_Sustained)
    index: int = 0
    episode: _Episode | None = None
    count: int = 0
    max_running: int | None = None
    max_waiting: int | None = None
    max_kv: float | None = None
    last_state: str | None = None
    last_t: float = float("-inf")
    timeline: Timeline = field(default_factory=Timeline)


def _peak(values: Iterable[_Num | None]) -> _Num | None:
    """The largest of the values that are not None (None if all are)."""
    return max((v for v in values if v is not None), default=None)


def _max(a: Any, b: Any) -> Any:
    if b is None:
        return a
    return b if a is None or b > a else a


class Analysis:
    """Folds log records, in input order, into the analyze document."""

    def __init__(self, *, window_seconds: float | None = None, threshold: float | None = None) -> None:
        self.inputs: list[dict[str, Any]] = []
        self.runs = 0
        self._run_open: dict[str | None, bool] = {}
        self.stats_count = 0
        self.last: StatsRecord | None = None
        self.last_busy: StatsRecord | None = None
        self.first_ts: LogTime | None = None
        self.last_ts: LogTime | None = None
        self.warnings = 0
        self.max_cumulative: int | None = None
        self.from_stats = 0
        self.server = FactsBuilder()
        self.errors: list[dict[str, Any]] = []
        self.errors_total = 0
        self.prefix_hit_v0: PrefixHitRecord | None = None
        self.last_prefix_hit_v0: float | None = None  # V0's separate hit rate of the last stats record
        self._last_was_stats: dict[str | None, bool] = {}
        self.records_total = 0
        self._engines: dict[tuple[str | None, int | None], _EngineState] = {}
        self._pending_preemptions: dict[str | None, int] = {}
        self.episodes: list[_Episode] = []
        self.episodes_total = 0
        self.mb_seconds = 0.0
        self.mb_seconds_known = True
        self.mb_records = 0
        # The memory-bound record with the highest KV usage: the numbers behind the summary.
        self.worst: StatsRecord | None = None
        self.worst_pool: int | None = None
        self._window = window_seconds
        self._threshold = threshold
        # Each engine's max_num_seqs in the current run (its own facts), kept for the hot path.
        self._max_num_seqs: dict[int | None, int | None] = {}
        # What the levers' simulated outcome calibrates on (kvwatch.reconcile.simulate.levers);
        # None: the log alone (no request sizes).
        self.simulation_evidence: Any = None
        self.progress = ProgressTracker()  # what the cause table needs beyond the document

    # ---- input -------------------------------------------------------------------------------

    # The whole input's peaks are the peaks of its (input, engine) states: every stats record
    # reaches exactly one of them, so they are kept there once, not twice per record.
    @property
    def max_running(self) -> int | None:
        """Most requests running in any stats record (None: no record stated it)."""
        return _peak(s.max_running for s in self._engines.values())

    @property
    def max_waiting(self) -> int | None:
        """Most requests waiting in any stats record."""
        return _peak(s.max_waiting for s in self._engines.values())

    @property
    def max_kv(self) -> float | None:
        """Highest KV usage (percent) in any stats record."""
        return _peak(s.max_kv for s in self._engines.values())

    def add_input(self, path: str, lines: int, nbytes: int) -> None:
        """Record one input's size (``inputs`` of the document)."""
        self.inputs.append({"path": path, "lines": lines, "bytes": nbytes})

    def add(self, records: Iterable[LogRecord], source: str | None = None) -> None:
        """Fold records of one input, in order."""
        stats = self._stats
        last_was_stats = self._last_was_stats
        for rec in records:
            self.records_total += 1
            if type(rec) is StatsRecord:  # nearly every record of a big log: the short way
                stats(rec, source)
                last_was_stats[source] = True
                continue
            if isinstance(rec, StatsRecord):
                self._stats(rec, source)
            elif isinstance(rec, FactRecord):
                if rec.field in STALL_FIELDS:  # a stall's evidence, the tracker's alone (a tqdm bar per line)
                    self.progress.on_fact(rec.field, rec.value, rec.ts)
                    last_was_stats[source] = False
                    continue
                self.server.add(rec)
                self.progress.on_fact(rec.field, rec.value, rec.ts)
                self._max_num_seqs.clear()
                self._open_run(source)
            elif isinstance(rec, RunStartRecord):
                self.runs += 1
                self._run_open[source] = True
                self.server.start_run()
                self._max_num_seqs.clear()
                self.progress.on_run_start()
            elif isinstance(rec, PreemptionRecord):
                self._open_run(source)
                self.warnings += 1
                self._pending_preemptions[source] = self._pending_preemptions.get(source, 0) + 1
                self.max_cumulative = _max(self.max_cumulative, rec.cumulative)
            elif isinstance(rec, ErrorRecord):
                self._open_run(source)
                self._error(rec, source)
                self.progress.on_error(rec)
            elif isinstance(rec, PrefixHitRecord):
                self.prefix_hit_v0 = rec
                if self._last_was_stats.get(source) and self.last is not None and self.last.prefix_hit_pct is None:
                    # V0 (0.5.5-0.10.2) logs the hit rate as a second record of the same stats
                    # interval, right after the main line: it is that record's prefix_hit_pct.
                    self.last_prefix_hit_v0 = rec.gpu_pct
            if not isinstance(rec, PrefixHitRecord):
                self._last_was_stats[source] = isinstance(rec, StatsRecord)

    def _open_run(self, source: str | None) -> None:
        # A log with no startup block is one run; RunStartRecords add the later ones.
        if not self._run_open.get(source):
            self._run_open[source] = True
            self.runs += 1

    def _error(self, rec: ErrorRecord, source: str | None) -> None:
        self.errors_total += 1
        if self.errors and self.errors[-1]["kind"] == rec.kind and self.errors[-1]["message"] == rec.message:
            return  # the same error repeated by a traceback chain or by every worker
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(
                {"kind": rec.kind, "line": rec.line, "message": rec.message, "ts": _iso(rec.ts), "source": source}
            )

    def _stats(self, rec: StatsRecord, source: str | None) -> None:
        # Runs once per stats record (tens of thousands per GB of log): helpers (_max,
        # _Sustained.add, Timeline.add's common case) are inlined here, fields read by unpacking.
        if not self._run_open.get(source):
            self._open_run(source)
        self.stats_count += 1
        self.last = rec
        self.last_prefix_hit_v0 = None
        _, ts, engine, _, running, waiting, _, deferred, preemptions, kv_pct = rec[:10]
        if running:
            self.last_busy = rec  # the last record with requests running: the what-if basis
        if ts is not None:
            self.first_ts = self.first_ts or ts
            self.last_ts = ts
        if preemptions:
            self.from_stats += preemptions

        # ---- saturation of this (input, engine) ----
        state = self._engines.get((source, engine))
        mns = self._max_num_seqs
        max_num_seqs = mns[engine] if engine in mns else self._engine_max_num_seqs(engine)
        if state is None:
            judge = SaturationJudge(max_num_seqs=max_num_seqs)
            self._configure(judge)
            state = self._engines[(source, engine)] = _EngineState(judge)
        judge = state.judge
        judge.max_num_seqs = max_num_seqs
        if ts is not None:
            t = ts.seconds()
            if t < state.last_t - 1.0:
                # Time went backwards (logs concatenated out of order, a year-less stamp across
                # New Year): the window's time base is gone, start it afresh.
                judge = state.judge = SaturationJudge(max_num_seqs=max_num_seqs)
                self._configure(judge)
            state.last_t = t
        else:
            t = state.index * NOMINAL_INTERVAL_S
            self.mb_seconds_known = False
        state.index += 1
        preempted = preemptions or 0
        if self._pending_preemptions:
            preempted += self._pending_preemptions.pop(source, 0)
        # vLLM 0.20+ counts deferred requests in "Waiting" and states them apart: only the rest
        # wait for capacity (CONTRACTS "Saturation": only capacity waiting counts).
        capacity_waiting = max(0, waiting - deferred) if waiting is not None and deferred is not None else None
        verdict_state = judge.observe_values(
            t,
            running,
            waiting,
            kv_pct / 100.0 if kv_pct is not None else None,
            float(preempted),
            capacity_waiting,
        )
        sustained = state.verdict  # the _Sustained fold: here only, once per stats record
        if sustained.prev == verdict_state:
            sustained.sustained.add(verdict_state)
        elif sustained.count == 0:
            sustained.first = verdict_state
        sustained.prev = verdict_state
        sustained.count += 1
        state.count += 1
        state.last_state = verdict_state
        self.progress.on_stats(rec, verdict_state, int(preempted), source, t=t if ts is not None else None)
        if running is not None and (state.max_running is None or running > state.max_running):
            state.max_running = running
        if waiting is not None and (state.max_waiting is None or waiting > state.max_waiting):
            state.max_waiting = waiting
        if kv_pct is not None and (state.max_kv is None or kv_pct > state.max_kv):
            state.max_kv = kv_pct
        timeline = state.timeline
        buckets = timeline.buckets
        if buckets and buckets[-1][2] < timeline.step:  # Timeline.add: the record joins the last bucket
            last = buckets[-1]
            last[1] = ts
            last[2] += 1
            if running is not None and (last[3] is None or running > last[3]):
                last[3] = running
            if waiting is not None and (last[4] is None or waiting > last[4]):
                last[4] = waiting
            if kv_pct is not None and (last[5] is None or kv_pct > last[5]):
                last[5] = kv_pct
        else:
            timeline.add(rec)
        ep = state.episode
        if verdict_state == "memory_bound":
            self.mb_records += 1
            if ep is None:
                ep = state.episode = _Episode(engine, source, ts, ts)
                self.episodes_total += 1
                if len(self.episodes) < MAX_EPISODES:
                    self.episodes.append(ep)
            else:
                self._close_interval(ep, ts)
            ep.records += 1
            ep.peak_waiting = max(ep.peak_waiting, waiting or 0)
            ep.peak_kv_usage_pct = _max(ep.peak_kv_usage_pct, kv_pct)
            if self.worst is None or (kv_pct or 0, waiting or 0) > (
                self.worst.kv_usage_pct or 0,
                self.worst.waiting or 0,
            ):
                self.worst = rec
                pool = self.server.facts_for(engine).capacity.kv_cache_tokens  # this engine's, this run's
                self.worst_pool = pool if isinstance(pool, int) else None
        elif ep is not None:
            # The episode lasts until the record that shows it over.
            self._close_interval(ep, ts)
            state.episode = None

    def _engine_max_num_seqs(self, engine: int | None) -> int | None:
        value = self._max_num_seqs[engine] = self.server.facts_for(engine).max_num_seqs
        return value

    def _configure(self, judge: SaturationJudge) -> None:
        if self._window is not None:
            judge.window_seconds = self._window
        if self._threshold is not None:
            judge.threshold = self._threshold

    def _close_interval(self, ep: _Episode, ts: LogTime | None) -> None:
        if ts is not None and ep.end is not None:
            self.mb_seconds += max(0.0, ts.seconds() - ep.end.seconds())
        ep.end = ts

    # ---- output ------------------------------------------------------------------------------
    def verdict(self) -> str:
        """The first of VERDICT_ORDER any engine shows for a sustained stretch; ``unknown``."""
        verdicts = {s.verdict.verdict() for s in self._engines.values()}
        for state in VERDICT_ORDER:
            if state in verdicts:
                return state
        return "unknown"

    def whatif_basis(self) -> dict[str, Any] | None:
        """The request size the levers are computed for: the log's last stats record with requests
        running, by the rule the sidecar applies to the same record (pool x KV usage / running),
        so a postmortem and the live what-ifs agree. Additive key of the analyze document; null
        without one."""
        from kvwatch.reconcile.expectation import request_from_stats  # local: see levers_hook

        shape = request_from_stats(self.server.facts().log_pool_tokens, self.last_busy)
        if shape is None:
            return None
        return {"prompt_tokens": shape.prompt_tokens, "output_tokens": shape.output_tokens, "source": shape.source}

    def server_facts(self) -> ServerFacts:
        """What the server stated about itself, as one record."""
        return self.server.facts()

    def summary(self, verdict: str) -> str:
        """One plain sentence with the numbers behind the verdict."""
        pool = self.server.facts().capacity.kv_cache_tokens
        if verdict == "memory_bound" and self.worst is not None:
            w = self.worst
            kv = w.kv_usage_pct or 0.0
            where = f" (engine {w.engine})" if len(self._engines) > 1 and w.engine is not None else ""
            text = f"memory-bound{where}: {w.running} running, {w.waiting} waiting at {kv:.1f} % KV usage"
            pool_at = self.worst_pool or (pool if isinstance(pool, int) else None)
            if pool_at and w.running:
                per_request = pool_at * kv / 100.0 / w.running
                if per_request > 0:
                    fits = pool_at / per_request
                    text += (
                        f"; the {pool_at:,}-token pool holds about {fits:.1f} requests of ~{per_request:,.0f} tokens"
                    )
            return text
        if verdict == "unknown":
            if self.errors:
                e = self.errors[0]
                return f"no stats records; the log shows a {e['kind']} error at line {e['line']}"
            return "no stats records: the log does not show how the server was loaded"
        peak = f"{self.max_kv:.1f} %" if self.max_kv is not None else "unknown"
        if verdict == "seq_bound":
            limit = self.server.facts().config.max_num_seqs
            return (
                f"seq-bound: up to {self.max_running} running (max_num_seqs {limit}), "
                f"up to {self.max_waiting} waiting; KV usage peaked at {peak}"
            )
        if verdict == "queued":
            return (
                f"queued: up to {self.max_waiting} waiting while KV usage peaked at only {peak}; "
                "the queue is not explained by KV memory"
            )
        if verdict == "preempting":
            n = self.warnings + self.from_stats
            return f"preempting: {n} preemption records; KV usage peaked at {peak}"
        if verdict == "ok":
            return f"ok: up to {self.max_running} running and nothing waiting for long; KV usage peaked at {peak}"
        return f"idle: nothing ran or waited in {self.stats_count} stats records"

    def document(
        self, model: str | None = None, metrics: tuple[MetricsEvidence | None, EvidenceInputs] | None = None
    ) -> dict[str, Any]:
        """The ``kvwatch.analyze/1`` document: every key present, null when not stated.

        ``metrics`` is the evidence of saved scrapes or Prometheus history (kvwatch.reconcile.evidence).
        """
        last = self.last
        last_doc: dict[str, Any] | None = None
        if last is not None:
            last_doc = {k: getattr(last, k) for k in STATS_LAST_KEYS}
            if last_doc["prefix_hit_pct"] is None:
                last_doc["prefix_hit_pct"] = self.last_prefix_hit_v0
            last_doc.update(
                ts=_iso(last.ts),
                line=last.line,
                device=last.device,
                source=last.source,
                engines_aggregated=last.engines_aggregated,
                mm_cache_hit_pct=last.mm_cache_hit_pct,
            )
        else:
            last_doc = dict.fromkeys(STATS_LAST_KEYS)
        facts = self.server.facts()
        capacity = facts.capacity_section()
        config = facts.config_section()
        verdict = self.verdict()
        engines = [
            {
                "source": src,
                "engine": eng,
                "count": st.count,
                "max_running": st.max_running,
                "max_waiting": st.max_waiting,
                "max_kv_usage_pct": st.max_kv,
                "verdict": st.verdict.verdict(),
                "last_state": st.last_state,
                "timeline": st.timeline.document(),
            }
            for (src, eng), st in self._engines.items()
        ]
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "inputs": self.inputs,
            "runs": max(self.runs, 1),
            "stats": {
                "count": self.stats_count,
                "last": last_doc,
                "max": {"running": self.max_running, "waiting": self.max_waiting, "kv_usage_pct": self.max_kv},
                "first_ts": _iso(self.first_ts),
                "last_ts": _iso(self.last_ts),
                "engines": engines,
                "prefix_cache_hit_v0": (
                    {"gpu_pct": self.prefix_hit_v0.gpu_pct, "cpu_pct": self.prefix_hit_v0.cpu_pct}
                    if self.prefix_hit_v0
                    else None
                ),
            },
            "preemptions": {
                "warnings": self.warnings,
                "max_cumulative": self.max_cumulative,
                "from_stats": self.from_stats,
            },
            "capacity": capacity,
            "config": config,
            "whatif_basis": self.whatif_basis(),
            "errors": self.errors,
            "errors_total": self.errors_total,
            "saturation": {
                "memory_bound_seconds": (
                    round(self.mb_seconds, 3) if self.mb_seconds_known or not self.mb_records else None
                ),
                "memory_bound_records": self.mb_records,
                "episodes": [
                    {
                        "start_ts": _iso(e.start),
                        "end_ts": _iso(e.end),
                        "peak_waiting": e.peak_waiting,
                        "peak_kv_usage_pct": e.peak_kv_usage_pct,
                        "engine": e.engine,
                        "source": e.source,
                        "records": e.records,
                    }
                    for e in self.episodes
                ],
                "episodes_total": self.episodes_total,
            },
            "diagnosis": {"verdict": verdict, "summary": self.summary(verdict), "levers": []},
            "records_total": self.records_total,
        }
        # The metrics' evidence first (it may judge a worse verdict from the scrapes), then the
        # cause table over the whole document.
        apply_metrics(doc, *(metrics or (None, EvidenceInputs())))
        self.diagnose(doc, model, doc["diagnosis"]["verdict"])
        return doc

    def diagnose(self, doc: dict[str, Any], model: str | None = None, verdict: str | None = None) -> None:
        """Set ``doc["diagnosis"]`` from the cause table (kvwatch.reconcile.causes), reading whatever
        evidence the document holds (``requests``, ``preemptions.from_metrics`` ... when present):
        call it again after adding evidence to the document."""
        saturation = verdict or self.verdict()
        case = case_from_document(doc, self.server.facts(), self.progress, saturation, self.worst, self.worst_pool)
        # The levers are sized from the best request-size evidence (histograms, else pool x usage /
        # running), which the capacity model reads as requests.p95_tokens.
        sized = doc
        tokens, _ = case.request_tokens(p95=True)
        stated = doc.get("requests")
        measured = _histogram_basis(stated)
        if measured is not None:
            # The histograms measured every request; the log's basis is one stats record's pool x
            # usage / running (on the open-loop fixture 6,676 tokens where the requests held 6,804).
            doc["whatif_basis"] = sized["whatif_basis"] = measured
        if tokens and not (isinstance(stated, dict) and "p95_tokens" in stated):
            sized = {**doc, "requests": {**(doc.get("requests") or {}), "p95_tokens": round(tokens)}}
        levers = levers_hook(sized, model)  # always: an unresolvable --model is the user's error
        doc["diagnosis"] = diagnose(case, lambda: levers)
        if not doc["diagnosis"]["levers"]:
            doc["diagnosis"]["simulation"] = None  # the cause is not the KV pool: nothing to simulate
        else:
            from kvwatch.reconcile.simulate.levers import SimulationEvidence, attach  # local: only with levers

            attach(doc, self.simulation_evidence or SimulationEvidence())


def _histogram_basis(requests: Any) -> dict[str, Any] | None:
    """The what-if request from vLLM's request histograms (the sidecar's rule,
    expectation.request_from_histograms: prompt and generation p95), else their exact means where
    a p95 is beyond the buckets (all mass above vLLM's last finite bucket); None without them."""
    from kvwatch.reconcile.expectation import request_from_histograms  # local: see levers_hook

    if not isinstance(requests, dict):
        return None
    shape = None
    parts = [requests.get(k) or {} for k in ("prompt_tokens", "generation_tokens")]
    p95s = [part.get("p95") for part in parts]
    if all(isinstance(v, int | float) for v in p95s):
        shape = request_from_histograms(p95s[0], p95s[1])
    else:
        means = [part.get("mean") for part in parts]
        if all(isinstance(v, int | float) for v in means):
            shape = request_from_histograms(means[0], means[1])
    if shape is None:
        return None
    return {"prompt_tokens": shape.prompt_tokens, "output_tokens": shape.output_tokens, "source": "metrics"}
