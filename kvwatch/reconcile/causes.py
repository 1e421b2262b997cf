"""THE cause table: why a vLLM server behaved as it did, and what to do about it.

One row per cause, in the order they are tried (CONTRACTS "Extensions (2026-12)": the verdict order
failed_start, crashed, stalled, memory_bound, seq_bound, preempting, queued, ok, idle, unknown). Each row
holds the evidence rule that recognises it, the sentence that explains it (with the numbers), the
advice for it, and whether it is the KV pool (only then do the capacity levers apply, and then always).

Every rule follows vLLM's own semantics, cited beside it; no constant here was tuned on a log. The
thresholds are the contract's (the 60 s window and 0.9 KV threshold of kvwatch.reconcile.saturation,
"two or more consecutive records" for anything sustained) or vLLM's own checks.

``ProgressTracker`` is the bounded state the rules need that the analyze document does not keep
(records in order: which engine stopped producing tokens, whether an OOM came during CUDA-graph
capture, how long the queue was during memory-bound stretches). ``analyze`` and the sidecar feed it
the same records, so a postmortem and ``kvwatch_diagnosis{cause}`` name the same cause.

Pure: no I/O and no clock; request content never reaches anything here (records carry none).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvwatch.reconcile import facts as F
from kvwatch.reconcile import stalls
from kvwatch.reconcile.facts import ServerFacts, as_number
from kvwatch.reconcile.graph_memory import GraphFinding, capture_finding, estimate_applied, estimate_finding
from kvwatch.records import ErrorRecord, LogTime, StatsRecord

# vLLM's stats interval, the time base between two records when the log has no timestamps: V1
# VLLM_LOG_STATS_INTERVAL defaults to 10.0 s (vllm/envs.py, 0.32.0); V0 logged every 5 s
# (_LOCAL_LOGGING_INTERVAL_SEC, vllm/engine/metrics.py), so 10 s is the conservative choice.
NOMINAL_INTERVAL_S = 10.0
SUSTAINED_RECORDS = 2  # CONTRACTS: a state counts when it holds for two or more consecutive records
SUSTAINED_SECONDS = 60.0  # CONTRACTS: stalled is no tokens "for >= 2 consecutive records / 60 s"
MAX_ERRORS = 50  # errors kept in order for the rules (the document keeps its own capped list)


# --------------------------------------------------------------------------------------------
# What the rules read
# --------------------------------------------------------------------------------------------


def _stated(value: Any) -> Any:
    """A stated fact as the rules read it: a boolean is no size, count or name (None)."""
    return None if isinstance(value, bool) else value


@dataclass(frozen=True, slots=True)
class SeenError:
    """One capacity error, OOM or engine death, with where in the server's life it came."""

    kind: str
    message: str  # vLLM's own text (records never carry request content)
    ts: str | None
    served: bool  # stats records of this run came before it: the server had been serving
    during_capture: bool  # after CUDA-graph capture began and before it finished
    run: int = 0  # which server start it belongs to


@dataclass
class _Streak:
    """Consecutive records of one engine that show one condition."""

    records: int = 0
    seconds: float = 0.0
    start_ts: LogTime | None = None
    running: int = 0
    best_records: int = 0
    best_seconds: float = 0.0
    best_start_ts: LogTime | None = None
    best_running: int = 0
    preemptions: int = 0
    best_preemptions: int = 0
    implied: int = 0  # records counted that the log does not hold (implied by a DEBUG-level record)
    best_implied: int = 0

    def add(
        self, holds: bool, dt: float, ts: LogTime | None, running: int, preempted: int, implied: bool = False
    ) -> None:
        if not holds:
            self.records = 0
            return
        if self.records == 0:
            self.seconds, self.start_ts, self.running, self.preemptions, self.implied = 0.0, ts, 0, 0, 0
        else:
            self.seconds += dt
        self.records += 1
        self.implied += implied
        self.running = max(self.running, running)
        self.preemptions += preempted
        if (self.records, self.seconds) > (self.best_records, self.best_seconds):
            self.best_records, self.best_seconds = self.records, self.seconds
            self.best_start_ts, self.best_running = self.start_ts, self.running
            self.best_preemptions, self.best_implied = self.preemptions, self.implied


@dataclass
class _EngineProgress:
    last_t: float | None = None
    stalled: _Streak = field(default_factory=_Streak)  # running, and no token in or out
    looping: _Streak = field(default_factory=_Streak)  # preempting, and no decode progress
    starved: _Streak = field(default_factory=_Streak)  # prefilling, and no decode progress
    decoded: bool = False  # a record showed every running request advancing: decode was under way
    # Its memory-bound records: the episode's peak AND mean queue for the summary.
    mb_records: int = 0
    mb_waiting_sum: int = 0
    mb_waiting_peak: int = 0
    mb_running_peak: int = 0
    mb_kv_peak: float | None = None
    # The fastest it worked (evidence.TokenRateBound): throughput maxima and the most one interval held.
    max_prompt_tps: float = 0.0
    max_gen_tps: float = 0.0
    max_prompt_tokens: float = 0.0
    max_gen_tokens: float = 0.0


class ProgressTracker:
    """Records in order -> the facts the cause rules need beyond the analyze document."""

    def __init__(self, *, live: bool = False) -> None:
        # live (the sidecar): the current state matters, so a restart forgets the last run's errors
        # and a streak counts only while it lasts; a postmortem keeps the worst of the whole log.
        self.live = live
        self.errors: list[SeenError] = []
        self.errors_total = 0
        self.run = 0  # server starts seen (RunStartRecords)
        # Runs that got going: served (stats records) or finished starting (ready / serving lines). An
        # error's run is judged at the end, since what shows the run served may follow the error
        # (EngineCore's OOM comes before the API server's "AsyncLLM output_handler failed").
        self.runs_going: set[int] = set()
        # Runs with evidence of a start (startup lines, startup traceback frames, a start-failure
        # line): an OOM in such a run that never got going was an OOM at start.
        self.runs_starting: set[int] = set()
        self.capturing = False  # CUDA-graph capture began and has not finished (this run)
        self.ready_in_run = False  # this run's engine finished starting (checks passed, graphs captured)
        self.stats_in_run = 0
        self.stats_total = 0
        # The smallest "Available KV cache memory" of this start over its workers: V1 checks every
        # worker's figure (kv_cache_utils.py get_kv_cache_configs, 0.11: "Check if the available
        # memory is enough for each worker"), so one TP rank at <= 0 fails the start even when
        # another rank, printed last, had room (the document keeps the last figure only).
        self.kv_memory_min_in_run: float | None = None
        self.preemption_field_seen = False  # a V1 stats record stated "Preemptions: N" (0.11.1+)
        self.v0_stats = False  # a V0 stats record (it states Swapped; V1 has no swap)
        self.engines: dict[tuple[str | None, int | None], _EngineProgress] = {}
        self.ring = stalls.RingBufferStall()  # vLLM's own 60 s waits with requests in flight

    # ---- input ---------------------------------------------------------------------------------
    def on_run_start(self) -> None:
        """A new server start: startup phases begin again."""
        self.capturing = False
        self.stats_in_run = 0
        self.ready_in_run = False
        self.kv_memory_min_in_run = None
        self.ring.reset(keep_best=not self.live)
        self.run += 1
        if self.live:
            self.errors.clear()
            self.runs_going.clear()
            self.runs_starting.clear()
            self.engines.clear()

    def on_fact(self, name: str, value: object, ts: LogTime | None = None) -> None:
        """A startup fact: tracks CUDA-graph capture (kvwatch.parse.logpatterns graph_capture_*);
        and the runtime facts of a stall vLLM states (kvwatch.reconcile.stalls), with their time."""
        if not name.startswith("runtime."):
            self.runs_starting.add(self.run)  # every other fact comes from a startup line
        if name == stalls.RING_WAIT_FIELD and isinstance(value, int | float) and not isinstance(value, bool):
            self.ring.on_wait(float(value), ts)
        elif name == stalls.OFFLINE_TOTAL_FIELD and isinstance(value, int):
            self.ring.on_offline(self.ring.offline_done_stated, value)
        elif name == stalls.OFFLINE_DONE_FIELD and isinstance(value, int):
            self.ring.offline_done_stated = value
        if name == F.KV_CACHE_MEMORY and isinstance(value, int | float) and not isinstance(value, bool):
            low = self.kv_memory_min_in_run
            self.kv_memory_min_in_run = float(value) if low is None else min(low, float(value))
        if name == F.GRAPH_CAPTURE_STARTED:
            self.capturing = True
        elif name == F.GRAPH_CAPTURE_FINISHED:  # "Graph capturing finished ..., took X GiB"
            # Capture runs after the KV cache is allocated, so the start passed vLLM's KV checks.
            self.capturing = False
            self.ready_in_run = True
            self.runs_going.add(self.run)
        elif name in (F.ENGINE_READY, F.SERVING):  # "init engine ... took", "output_handler failed"
            self.ready_in_run = True
            self.runs_going.add(self.run)

    def on_error(self, rec: ErrorRecord) -> None:
        """An error record, with whether the server had served and whether capture was under way."""
        self.errors_total += 1
        # vLLM's start-failure lines, and errors only a start raises, say the run was starting.
        if rec.kind in ("other", "kv_insufficient", "no_kv_memory", "startup_memory") or "warming up" in rec.message:
            self.runs_starting.add(self.run)
        seen = SeenError(
            rec.kind,
            rec.message,
            _iso(rec.ts),
            self.stats_in_run > 0,
            self.capturing and self.stats_in_run == 0,
            self.run,
        )
        if self.errors and (self.errors[-1].kind, self.errors[-1].message) == (seen.kind, seen.message):
            return  # one error repeated by every worker or by a traceback chain
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(seen)

    def on_stats(
        self,
        rec: StatsRecord,
        state: str,
        preempted: int,
        source: str | None = None,
        dt: float | None = None,
        t: float | None = None,
    ) -> None:
        """One stats record with the saturation state it showed and the preemptions since the last
        (``dt``: seconds since the previous one, where the caller knows better than the stamps; ``t``:
        ``rec.ts.seconds()`` when the caller has it already).

        Runs once per stats record of a big log: fields are unpacked once and a streak is touched
        only while its condition holds or right after (the common record touches none)."""
        self.stats_in_run += 1
        self.stats_total += 1
        if self.stats_in_run == 1:
            self.runs_going.add(self.run)
        _, ts, engine, _, running_or_none, waiting_or_none, swapped, _, preemptions = rec[:9]
        prompt, gen = rec[14], rec[15]
        if preemptions is not None:
            self.preemption_field_seen = True
        if swapped is not None:
            self.v0_stats = True
        eng = self.engines.get((source, engine))
        if eng is None:
            eng = self.engines[(source, engine)] = _EngineProgress()
        if t is None and ts is not None:
            t = ts.seconds()
        if dt is None:
            last = eng.last_t
            dt = t - last if t is not None and last is not None and t >= last else NOMINAL_INTERVAL_S
            if dt < 1.0:
                # vLLM's logger never prints two records of an engine within a second (its interval
                # is VLLM_LOG_STATS_INTERVAL, 10 s; V0 5 s): stamps that close (records glued on one
                # line, second-resolution stamps) do not give the interval, so the nominal one
                # stands in, as when there are no stamps. (A caller's dt, a scrape's, is kept.)
                dt = NOMINAL_INTERVAL_S
        eng.last_t = t
        if prompt:
            eng.max_prompt_tps = max(eng.max_prompt_tps, prompt)
            eng.max_prompt_tokens = max(eng.max_prompt_tokens, prompt * dt)
        if gen:
            eng.max_gen_tps = max(eng.max_gen_tps, gen)
            eng.max_gen_tokens = max(eng.max_gen_tokens, gen * dt)
        running = running_or_none or 0
        waiting = waiting_or_none or 0
        self.ring.on_stats((source, engine), running, waiting, bool(prompt) or bool(gen), swapped is not None)
        # "No decode progress": a decode step gives every decoding request one token (V1
        # gpu_model_runner.execute_model samples one token per scheduled request; V0 likewise), so
        # fewer tokens over the interval than requests running means they did not all advance once.
        # (A caller's dt under a second, scrapes that close, counts as one second, as before.)
        no_progress = gen is not None and running > 0 and gen * (dt if dt > 1.0 else 1.0) < running
        # Stalled: requests in the engine (running, or waiting with nothing running to wait for) and
        # not one token in or out: the scheduler admits a waiting request whenever blocks and budget
        # allow (V1 scheduler.py schedule(); V0 _schedule_prefills), so an idle engine with a queue
        # and an engine whose running requests produce nothing have both stopped stepping.
        stalled = gen == 0.0 and not prompt and (running > 0 or waiting > 0)
        if stalled or eng.stalled.records:
            held = running if running > waiting else waiting
            if stalled and not eng.stalled.records and rec.debug_level:
                # vLLM logs a stats record at DEBUG only when the interval before it had no tokens
                # either (StatsRecord.debug_level), and that interval's INFO record is the one an
                # INFO log may lack: it is the streak's first record.
                eng.stalled.add(True, 0.0, ts, held, 0, implied=True)
            eng.stalled.add(stalled, dt, ts, held, preempted)
        looping = no_progress and preempted > 0
        if looping or eng.looping.records:
            eng.looping.add(looping, dt, ts, running, preempted)
        # Starved needs decode to COLLAPSE: progress before, then none while prompts are processed.
        # A burst's first records (every running request still prefilling) are no collapse.
        starved = no_progress and bool(prompt) and eng.decoded
        if starved or eng.starved.records:
            eng.starved.add(starved, dt, ts, running, preempted)
        if not no_progress and gen is not None and running > 0:
            eng.decoded = True
        if state == "memory_bound":
            eng.mb_records += 1
            eng.mb_waiting_sum += waiting
            eng.mb_waiting_peak = max(eng.mb_waiting_peak, waiting)
            eng.mb_running_peak = max(eng.mb_running_peak, running)
            kv = rec.kv_usage_pct
            if kv is not None and (eng.mb_kv_peak is None or kv > eng.mb_kv_peak):
                eng.mb_kv_peak = kv

    # ---- output --------------------------------------------------------------------------------
    def memory_bound(self) -> tuple[int | None, _EngineProgress] | None:
        """(engine, its progress) of the engine memory-bound longest, None when none was; engines
        are judged apart (CONTRACTS: nothing sums or averages across engines)."""
        best: tuple[int | None, _EngineProgress] | None = None
        for (_, engine), eng in self.engines.items():
            if eng.mb_records and (
                best is None or (eng.mb_records, eng.mb_waiting_peak) > (best[1].mb_records, best[1].mb_waiting_peak)
            ):
                best = (engine, eng)
        return best

    def for_engine(self, key: tuple[str | None, int | None]) -> ProgressTracker:
        """This tracker with only one engine's records: the same errors, start and stall evidence
        (a start, an OOM or a stuck step is the server's), one engine's streaks and episodes."""
        view = copy.copy(self)
        view.engines = {key: self.engines[key]} if key in self.engines else {}
        return view

    def token_rates(self) -> tuple[float, float, float, float] | None:
        """(prompt tokens/s, generation tokens/s, most prompt tokens in one interval, most generation
        tokens in one interval), each summed over the engines' maxima; None without stats records."""
        if not self.engines:
            return None
        engines = self.engines.values()
        return (
            sum(e.max_prompt_tps for e in engines),
            sum(e.max_gen_tps for e in engines),
            sum(e.max_prompt_tokens for e in engines),
            sum(e.max_gen_tokens for e in engines),
        )

    def streak(self, name: str) -> _Streak | None:
        """The longest streak of ``name`` (stalled, looping, starved) over the engines, if sustained."""
        best: _Streak | None = None
        for eng in self.engines.values():
            s: _Streak = getattr(eng, name)
            if self.live and s.records < SUSTAINED_RECORDS:
                continue  # over: the sidecar shows the state now
            if s.best_records >= SUSTAINED_RECORDS and (best is None or s.best_records > best.best_records):
                best = s
        return best


def _iso(ts: LogTime | None) -> str | None:
    return ts.iso() if ts is not None else None


@dataclass(frozen=True, slots=True)
class Case:
    """Everything the rules read: the analyze document's facts plus the tracker's."""

    saturation: str  # the saturation verdict (memory_bound ... idle, unknown)
    doc: Mapping[str, Any]
    facts: ServerFacts  # what the server stated (kvwatch.reconcile.facts): rules read its attributes
    progress: ProgressTracker
    worst: StatsRecord | None = None  # the memory-bound record with the highest KV usage
    worst_pool: int | None = None

    def fact(self, name: str) -> Any:
        """A startup fact by its dotted document field, or None: for a row written against those
        names (``ServerFacts.stated``); the rules here read ``self.facts`` attributes."""
        return _stated(self.facts.stated(name))

    def num(self, name: str) -> float | None:
        """A numeric startup fact by its dotted document field, or None (see ``fact``)."""
        return as_number(self.fact(name))

    def section(self, *path: str) -> Any:
        """A nested key of the document (``requests``, ``preemptions.from_metrics`` ...), or None."""
        node: Any = self.doc
        for key in path:
            if not isinstance(node, Mapping):
                return None
            node = node.get(key)
        return node

    def errors(self, *kinds: str) -> list[SeenError]:
        """The errors of the given kinds, in order."""
        return [e for e in self.progress.errors if e.kind in kinds]

    # ---- derived figures, each from the best evidence -----------------------------------------
    def pool_tokens(self) -> int | None:
        """The KV pool in tokens: vLLM's printed size, else blocks x block size."""
        tokens = as_number(self.facts.capacity.kv_cache_tokens)
        if tokens:
            return int(tokens)
        blocks, size = (
            as_number(self.facts.capacity.gpu_blocks),
            as_number(self.facts.capacity.block_size) or as_number(self.facts.config.block_size),
        )
        if blocks and size:
            return int(blocks * size)
        cc = self.section("cache_config")
        if isinstance(cc, Mapping) and isinstance(cc.get("kv_cache_size_tokens"), int | float):
            return int(cc["kv_cache_size_tokens"])
        return None

    def version(self) -> tuple[int, ...] | None:
        """vLLM's version as the log states it, (major, minor, patch), or None."""
        m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", str(_stated(self.facts.config.vllm_version) or ""))
        return tuple(int(g or 0) for g in m.groups()) if m else None

    def preemptions(self) -> tuple[int | None, str, bool]:
        """(count, source, exact): the metrics' reset-aware increase, else what the log states, else
        None (not in this log). ``exact`` is False for V0's warnings, a lower bound."""
        from_metrics = self.section("preemptions", "from_metrics")
        if isinstance(from_metrics, int | float) and not isinstance(from_metrics, bool):
            return int(from_metrics), "metrics", True
        pre = self.section("preemptions") or {}
        warnings, cumulative, from_stats = pre.get("warnings") or 0, pre.get("max_cumulative"), pre.get("from_stats")
        if warnings:
            # V0 scheduler.py warns when num_cumulative_preemption % 50 == 0 counting from the 1st
            # (the 1st, 51st, ...), stating the total: up to 49 more may follow the last one.
            return max(int(warnings), int(cumulative or 0)), "log", False
        version = self.version()
        # V1 0.11.1+ prints "Preemptions: N" for an interval with N > 0 (v1/metrics/loggers.py), but its
        # absence proves nothing: the real 0.32 CPU seed run preempted 14 requests (its counter) and
        # its log has no such part, nor has the open-loop run's (2 by the counter). The reason is in
        # vLLM 0.32.0 itself: LoggingStatLogger.log() calls _update_stats(), whose _reset() zeroes
        # num_preemptions before the `if self.num_preemptions > 0` that would print it, so the part
        # never appears. The same order is in every release since the part was added (0.12-era
        # loggers.py read through 0.32.0), and the fix is still open upstream
        # (https://github.com/vllm-project/vllm/pull/38452), so only a fork that carries it states one.
        # Only a stated count is a count.
        if self.progress.preemption_field_seen:
            return int(from_stats or 0), "log", True
        if self.progress.v0_stats and version is not None and (0, 4, 3) <= version < (0, 11):
            return 0, "log", True  # V0 0.4.3+ warns on the 1st preemption: none were logged, none happened
        return None, "log", False  # a V1 log never states its preemptions (above): not in this log

    def request_tokens(self, p95: bool = False) -> tuple[float | None, str]:
        """(tokens of one request, basis): prompt + generation means from the histograms (their p95
        footprint first with ``p95``), else the pool's use per running request at the memory-bound
        peak (pool x usage / running)."""
        req = self.section("requests")
        if isinstance(req, Mapping):
            fp = req.get("footprint_tokens_p95")
            if p95 and isinstance(fp, int | float) and fp > 0:
                return float(fp), "histograms (p95)"
            p = (req.get("prompt_tokens") or {}).get("mean")
            g = (req.get("generation_tokens") or {}).get("mean")
            if isinstance(p, int | float) and isinstance(g, int | float) and p + g > 0:
                return float(p + g), "histograms"
            fp = req.get("footprint_tokens_p95")
            if isinstance(fp, int | float) and fp > 0:
                return float(fp), "histograms (p95)"
        w = self.worst
        pool = self.worst_pool or self.pool_tokens()
        if w is not None and pool and w.running and w.kv_usage_pct:
            return pool * w.kv_usage_pct / 100.0 / w.running, "pool x usage / running"
        return None, ""

    def finished(self) -> int | None:
        """Requests finished over the evidence (the metrics' counters), or None."""
        value = self.section("requests", "finished")
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Match:
    """What a rule found: the explaining sentence and the facts behind it."""

    sentence: str
    evidence: tuple[dict[str, Any], ...] = ()
    verdict: str | None = None  # where a row's verdict depends on the evidence (failed_start or crashed)


def _ev(what: str, value: Any, source: str = "log", ts: str | None = None) -> dict[str, Any]:
    return {"what": what, "value": value, "source": source, "ts": ts}


def _g(x: float) -> str:
    return f"{x:,.2f}".rstrip("0").rstrip(".") if abs(x) < 100 else f"{x:,.0f}"


# --------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------


def _start_errors(case: Case, *kinds: str) -> list[SeenError]:
    """Start errors no stats record followed: the server (this run of it) never served."""
    serving = {id(e) for e in _serving_errors(case, *kinds)}
    return [e for e in case.progress.errors if e.kind in kinds and id(e) not in serving]


# Deaths vLLM reports only for an engine that had started: V1 engine/core.py run_engine_core logs
# "EngineCore failed to start." for a startup exception and "EngineCore encountered a fatal error."
# only from the busy loop; the client raises EngineDeadError once a started engine is gone; V0's
# AsyncEngineDeadError / MQEngineDeadError and the launcher's "terminating server process" meet
# requests. ("EngineCore hit an exception", 0.7-0.8, said both, so it proves nothing.)
_DEATH_AFTER_START = ("EngineDeadError", "encountered a fatal error", "terminating server process")


def _serving_errors(case: Case, *kinds: str) -> list[SeenError]:
    """Errors of a run that got going (served, or finished starting): a crash, not a failed start."""
    going = case.progress.runs_going
    dead = {
        e.run
        for e in case.progress.errors
        if e.kind == "engine_dead" and any(w in e.message for w in _DEATH_AFTER_START)
    }
    return [e for e in case.progress.errors if e.kind in kinds and (e.served or e.run in going or e.run in dead)]


def _never_served(case: Case) -> bool:
    """The last start neither served nor finished starting: numbers alone may then say it failed."""
    return case.progress.stats_in_run == 0 and not case.progress.ready_in_run


_NEEDED_V1 = re.compile(r"\((-?[\d.]+) ?Gi?B KV cache is needed, .*?available KV cache memory \((-?[\d.]+) ?Gi?B\)")
_STORED_V0 = re.compile(r"stored in KV cache \((\d+)\)")


def _max_model_len_exceeds_pool(case: Case) -> Match | None:
    # V1 kv_cache_utils.py _check_enough_kv_cache_memory: needed memory for one max_model_len request
    # > available -> ValueError "To serve at least one request with the model's max seq len ...";
    # V0 worker.py raise_if_cache_size_invalid: max_model_len > block_size x num_gpu_blocks. V0
    # 0.6.3+ prints "Maximum concurrency for N tokens per request: R x" before that check, so R < 1
    # (and > 0) is the same failure known from the numbers alone.
    errs = _start_errors(case, "kv_insufficient")
    mml = as_number(case.facts.config.max_seq_len) or as_number(case.facts.capacity.max_concurrency_tokens_per_request)
    pool = case.pool_tokens()
    ratio = as_number(case.facts.capacity.max_concurrency_ratio)
    ev: list[dict[str, Any]] = []
    if errs:
        ev.append(_ev("start error", errs[0].message, ts=errs[0].ts))
    # Numbers alone only where they are the check: V0 computes both the ratio and its check from
    # num_gpu_blocks x block_size (executor_base.py, worker.py). V1 prints "KV cache size: N tokens"
    # and its ratio AFTER check_enough_kv_cache_memory passed, and a sliding-window or hybrid model
    # starts with a ratio below 1 (a real 0.8 Gemma 3 start: 0.21x, then graph capture and serving).
    v0_numbers = as_number(case.facts.capacity.kv_cache_tokens) is None and _never_served(case)
    if ratio is not None and 0 < ratio < 1 and v0_numbers:
        ev.append(_ev("max concurrency at max_model_len", ratio))
    if pool and mml and pool < mml and v0_numbers:
        ev.append(_ev("KV pool tokens", pool))
    if not ev:
        return None
    if mml:
        ev.append(_ev("max_model_len", int(mml)))
    fits = ""
    if errs:  # the figures of the failing start are in vLLM's sentence (facts may be another run's)
        v1 = _NEEDED_V1.search(errs[0].message)
        v0 = _STORED_V0.search(errs[0].message)
        # vLLM prints the GiB figures with format_gib, round(b / GiB, 2) (vllm/utils/mem_utils.py,
        # 0.32.0): a pool of a few MiB reads "0.0 GiB ... is needed ... available (0.0 GiB)", which
        # says nothing, so the pool's tokens (when stated) tell it instead.
        if v1 and float(v1.group(1)) > 0:
            fits = f"; it needs {v1.group(1)} GiB of KV cache and {v1.group(2)} GiB is available"
        elif v0:
            fits = f"; the pool holds {int(v0.group(1)):,} tokens"
    if not fits and pool:
        fits = f"; the pool holds {pool:,} tokens"
    elif ratio is not None and 0 < ratio < 1 and mml:
        fits = f"; the pool holds about {int(ratio * mml):,} tokens ({ratio:.2f}x)"
    length = f"max_model_len {int(mml):,}" if mml else "max_model_len"
    return Match(
        f"failed start: one request of {length} does not fit in the KV pool{fits}, so vLLM refused to start",
        tuple(ev),
    )


def _no_kv_memory(case: Case) -> Match | None:
    # V1 kv_cache_utils.py _check_enough_kv_cache_memory: available_memory <= 0 -> "No available
    # memory for the cache blocks"; V0 worker.py raise_if_cache_size_invalid: num_gpu_blocks <= 0.
    # The numbers say the same when the traceback was cut: KV memory <= 0, 0 blocks, 0.00x.
    ev: list[dict[str, Any]] = []
    errs = _start_errors(case, "no_kv_memory")
    if errs:
        ev.append(_ev("start error", errs[0].message, ts=errs[0].ts))
    kv = as_number(case.facts.capacity.kv_cache_memory_gib)
    low = case.progress.kv_memory_min_in_run
    if low is not None and (kv is None or low < kv):
        kv = low  # the worker with the least: vLLM checks each one
    blocks = as_number(case.facts.capacity.gpu_blocks)
    ratio = as_number(case.facts.capacity.max_concurrency_ratio)
    if _never_served(case):
        if kv is not None and kv <= 0:
            ev.append(_ev("KV cache memory (GiB)", kv))
        if blocks is not None and blocks <= 0:
            ev.append(_ev("KV blocks", int(blocks)))
        if ratio is not None and ratio <= 0:
            ev.append(_ev("max concurrency", ratio))
    if not ev:
        return None
    weights = as_number(case.facts.capacity.weights_gib)
    util = as_number(case.facts.config.gpu_memory_utilization)
    total = as_number(case.facts.memory.total_gib)
    parts = []
    if weights is not None:
        parts.append(f"the weights take {_g(weights)} GiB")
    if total is not None and util is not None:
        parts.append(f"of a {_g(total * util)} GiB budget ({_g(total)} GiB x {util:g})")
    budget = (" (" + " ".join(parts) + ")") if parts else ""
    figure = f" ({_g(kv)} GiB)" if kv is not None and kv <= 0 else ""
    # gpu_worker.py determine_available_memory subtracts the CUDA-graph estimate from the budget before
    # the check where VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on (default from 0.21; see
    # graph_memory.estimate_applied): a share of the shortfall the log names.
    estimate = as_number(case.facts.capacity.cuda_graph_estimate_gib)
    graphs = ""
    if estimate is not None and estimate > 0 and estimate_applied(case.version()):
        graphs = (
            f"; vLLM's CUDA-graph estimate ({_g(estimate)} GiB) was taken from the budget first"
            " (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 shows the start without it)"
        )
        ev.append(_ev("CUDA graph memory estimate (GiB)", estimate))
    return Match(
        f"failed start: nothing is left for the KV cache{figure} after the weights and activations{budget}{graphs}",
        tuple(ev),
    )


def _other_process(case: Case) -> Match | None:
    # V1 worker/utils.py (gpu_worker.py 0.9.1-0.13) refuses to start when free memory at startup is
    # below gpu_memory_utilization x total: the rest is held by other processes (vLLM has loaded
    # nothing yet). V0 0.6.4 logs initial_memory_usage (total - free before profiling, weights
    # included): more than the weights plus the share vLLM leaves to others ((1 - utilization) x
    # total) is memory this server does not own, and it shrinks the pool or stops the start.
    errs = case.errors("startup_memory")
    total = as_number(case.facts.memory.total_gib)
    util = as_number(case.facts.config.gpu_memory_utilization)
    free = as_number(case.facts.memory.startup_free_gib)
    initial = as_number(case.facts.memory.initial_usage_gib)
    weights = as_number(case.facts.capacity.weights_gib)
    ev: list[dict[str, Any]] = []
    held: float | None = None
    if errs and "profiling" not in errs[0].message:
        ev.append(_ev("start error", errs[0].message, ts=errs[0].ts))
        if free is not None and total is not None:
            held = total - free
    elif free is not None and total is not None and util is not None and free < util * total:
        held = total - free
        ev.append(_ev("free memory at startup (GiB)", free))
    elif (
        initial is not None
        and weights is not None
        and total is not None
        and util is not None
        and initial - weights > (1.0 - util) * total
    ):
        held = initial - weights
        ev.append(_ev("initial memory usage (GiB)", initial))
        ev.append(_ev("weights (GiB)", weights))
    if not ev:
        return None
    amount = f" {_g(held)} GiB of" if held is not None else ""
    where = f" of {_g(total)} GiB" if total is not None else ""
    return Match(
        f"another process holds{amount} the device's memory{where} at startup, memory vLLM was told it could use",
        tuple(ev),
    )


def _failed_start(m: Match | None) -> Match | None:
    """The same finding as the cause of a start that failed (its sentence says so)."""
    return Match("failed start: " + m.sentence, m.evidence) if m is not None else None


def _graph_estimate(case: Case) -> GraphFinding | None:
    # kvwatch.reconcile.graph_memory: only the estimate (profile_cudagraph_memory) is subtracted from
    # the KV budget, and only where VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on (default 0.21+).
    total, util = as_number(case.facts.memory.total_gib), as_number(case.facts.config.gpu_memory_utilization)
    return estimate_finding(
        as_number(case.facts.capacity.cuda_graph_estimate_gib),
        applied=estimate_applied(case.version()),
        kv_gib=as_number(case.facts.capacity.kv_cache_memory_gib),
        budget_gib=total * util if total is not None and util is not None else None,
    )


def _graph_estimate_wrong(case: Case) -> Match | None:
    """The estimate's finding as a warning, whatever the cause."""
    f = _graph_estimate(case)
    if f is None:
        return None
    value = as_number(case.facts.capacity.cuda_graph_estimate_gib)
    return Match(f.sentence, (_ev("CUDA graph memory estimate (GiB)", value),))


def _graph_capture_wrong(case: Case) -> Match | None:
    """A negative capture figure ("took X GiB", "X GiB for CUDAGraph memory"): a warning only, since
    capture_model runs after the pool is allocated (graph_memory.capture_finding)."""
    value = as_number(case.facts.capacity.cuda_graph_gib)
    f = capture_finding(value)
    return Match(f.sentence, (_ev("CUDA graph capture (GiB)", value),)) if f is not None else None


def _graph_estimate_cause(case: Case) -> Match | None:
    # The estimate is the cause only where it sized the pool (subtracted from the budget): then the
    # memory it mis-stated running out (a start error of memory, an OOM while serving) is its doing;
    # and a negative one is the finding of a log that shows only the start (no stats record: the
    # pool's size is all there is to judge). A run that served is judged by how it served, with the
    # estimate as a warning.
    f = _graph_estimate(case)
    if f is None or not f.sized_pool:
        return None
    value = as_number(case.facts.capacity.cuda_graph_estimate_gib)
    ev: list[dict[str, Any]] = [_ev("CUDA graph memory estimate (GiB)", value)]
    kv = as_number(case.facts.capacity.kv_cache_memory_gib)
    if kv is not None:
        ev.append(_ev("KV cache memory (GiB)", kv))
    if _start_errors(case, "oom", "no_kv_memory", "kv_insufficient"):
        return Match("failed start: " + f.sentence, tuple(ev), "failed_start")
    if _serving_errors(case, "oom"):
        return Match("crashed: " + f.sentence, tuple(ev), "crashed")
    if f.negative and case.saturation == "unknown" and not case.progress.stats_total:
        return Match(f.sentence, tuple(ev), "unknown")
    return None


def _graph_capture_oom(case: Case) -> Match | None:
    # V0 model_runner.py / V1 gpu_model_runner.py capture_model: graphs are captured after the KV
    # cache is allocated, so their memory comes out of what gpu_memory_utilization left outside the
    # pool; vLLM's own hint for this ("If out-of-memory error occurs during cudagraph capture,
    # consider decreasing `gpu_memory_utilization` or switching to eager mode. You can also reduce the
    # `max_num_seqs`") is the advice.
    errs = [e for e in _start_errors(case, "oom") if e.during_capture]
    if not errs:
        return None
    return Match(
        "failed start: CUDA ran out of memory while capturing CUDA graphs, after the KV cache took its share",
        (_ev("OOM during graph capture", errs[0].message, ts=errs[0].ts),),
    )


def _start_oom(case: Case) -> Match | None:
    starting = case.progress.runs_starting
    errs = [e for e in _start_errors(case, "oom") if e.run in starting]
    if not errs:
        return None
    e = errs[0]
    where = "during startup" + (
        "" if as_number(case.facts.capacity.weights_gib) is not None else " (no weights line before it)"
    )
    if "warming up" in e.message:  # V1 gpu_model_runner.py _dummy_sampler_run: max_num_seqs dummy requests
        where = "warming up the sampler with max_num_seqs dummy requests"
    return Match(f"failed start: out of memory {where}", (_ev("OOM at start", e.message, ts=e.ts),))


def _oom_phase_unknown(case: Case) -> Match | None:
    # An OOM with nothing around it that says whether the server had started or served: not guessed.
    errs = _start_errors(case, "oom")
    if not errs:
        return None
    return Match(
        "out of memory; the log does not show whether the server had started (give the whole log from the start)",
        (_ev("OOM", errs[0].message, ts=errs[0].ts),),
    )


def _start_other(case: Case) -> Match | None:
    errs = _start_errors(case, "other", "engine_dead", "startup_memory")
    if not errs:
        return None
    # vLLM's own first error, unless it is only the wrapper V1 puts around any startup exception
    # (engine/core.py "EngineCore failed to start.", the API server's "Engine core initialization
    # failed.", 0.7-0.8 "EngineCore hit an exception"): the sentence that says why is the one to read,
    # even when no row names it.
    root = next((e for e in errs if e.message not in _START_WRAPPERS), None)
    said = f"; vLLM said: '{root.message}'" if root is not None else ""
    return Match(
        f"failed start: the engine never served{said}; no row of kvwatch's cause table names this cause",
        (_ev("start error", (root or errs[0]).message, ts=(root or errs[0]).ts),),
    )


_START_WRAPPERS = frozenset(
    {"EngineCore failed to start.", "Engine core initialization failed.", "EngineCore hit an exception"}
)


def _serving_oom(case: Case) -> Match | None:
    errs = _serving_errors(case, "oom")
    if not errs:
        return None
    return Match(
        "crashed: the server was serving when CUDA ran out of memory outside the KV pool",
        (_ev("OOM while serving", errs[0].message, ts=errs[0].ts),),
    )


def _engine_dead(case: Case) -> Match | None:
    errs = _serving_errors(case, "engine_dead", "other")
    if not errs:
        return None
    return Match(
        "crashed: the engine died after serving, and every request from then on fails",
        (_ev("engine death", errs[0].message, ts=errs[0].ts),),
    )


def _streak_match(case: Case, name: str, text: Callable[[Any], str]) -> Match | None:
    s = case.progress.streak(name)
    if s is None:
        return None
    secs = f" over {s.best_seconds:,.0f} s" if s.best_seconds else ""
    ev = (
        _ev("consecutive records", s.best_records, ts=_iso(s.best_start_ts)),
        _ev("running requests", s.best_running),
    )
    return Match(text(s).format(records=s.best_records, secs=secs, running=s.best_running), ev)


def _preemption_loop(case: Case) -> Match | None:
    # V1 scheduler.py _preempt_request sets num_computed_tokens = 0: a preempted request recomputes
    # its whole prompt, so a pool that cannot hold the running set preempts and recomputes forever.
    # vLLM 0.32.0's FCFS scheduler cannot get there: schedule() serves self.running oldest first and
    # preempts self.running[-1], a request alone always fits (get_kv_cache_configs refuses a pool
    # smaller than one max_model_len request), so the oldest advances every step. A real 0.32.0 storm
    # (tests/fixtures/incidents/recorded/) preempted 386 times at ~900 tokens/s. The row stays for
    # releases and forks whose scheduler differs; it is judged only on what the records show.
    return _streak_match(
        case,
        "looping",
        lambda s: (
            f"stalled: preemptions looped for {{records}} records{{secs}} ({s.best_preemptions} preemptions) "
            "while {running} requests ran and hardly a token came out"
        ),
    )


def _ring_buffer_stall(case: Case) -> Match | None:
    # vLLM's own 60 s notice that no step result came back while requests were in flight
    # (kvwatch.reconcile.stalls: shm_broadcast.py MessageQueue, VLLM_RINGBUFFER_WARNING_INTERVAL).
    ring = case.progress.ring
    stall = ring.current() if case.progress.live else ring.best
    if stall is None or stall[0] < SUSTAINED_SECONDS:
        return None
    seconds, warnings, in_flight, start = stall
    return Match(
        f"stalled: {in_flight:,} requests in flight and no engine step finished for {seconds:,.0f} s"
        f" (vLLM waited on its workers' message queue: 'No available shared memory broadcast block' x{warnings})",
        (
            _ev("seconds vLLM waited for a step", round(seconds, 1), ts=_iso(start)),
            _ev("requests in flight", in_flight),
        ),
    )


def _engine_hang(case: Case) -> Match | None:
    return _streak_match(
        case,
        "stalled",
        lambda s: (
            "stalled: {running} requests in the engine and 0.0 tokens/s in and out for {records} records{secs}"
            + (
                f" ({s.best_implied} of them implied: vLLM logs a record at DEBUG only after a tokenless interval)"
                if s.best_implied
                else ""
            )
        ),
    ) or _ring_buffer_stall(case)


def _longest_metrics_episode(case: Case) -> Mapping[str, Any] | None:
    """The metrics' memory-bound episode with the most samples (its peak and mean queue), or None."""
    eps = case.section("saturation", "metrics_episodes")
    if not isinstance(eps, list):
        return None
    keys = ("peak_waiting", "mean_waiting", "samples", "peak_kv_usage_pct")
    usable = [e for e in eps if isinstance(e, Mapping) and all(isinstance(e.get(k), int | float) for k in keys)]
    return max(usable, key=lambda e: (e["samples"], e["peak_waiting"])) if usable else None


def _kv_pool_too_small(case: Case) -> Match | None:
    # CONTRACTS "Saturation": waiting > 0, running < max_num_seqs and KV usage peaked >= 0.9 in W.
    if case.saturation != "memory_bound":
        return None
    mb = case.progress.memory_bound()
    ev: list[dict[str, Any]] = []
    if mb is not None:
        engine, p = mb
        mean_waiting = p.mb_waiting_sum / p.mb_records
        kv = p.mb_kv_peak or 0.0
        where = f" (engine {engine})" if len(case.progress.engines) > 1 and engine is not None else ""
        text = (
            f"memory-bound{where}: up to {p.mb_running_peak:,} running and {p.mb_waiting_peak:,} waiting "
            f"(mean {mean_waiting:.1f} over {p.mb_records} records) at up to {kv:.1f} % KV usage"
        )
        ev += [
            _ev("peak waiting while memory-bound", p.mb_waiting_peak),
            _ev("mean waiting while memory-bound", round(mean_waiting, 2)),
            _ev("peak KV usage %", kv),
        ]
    elif ep := _longest_metrics_episode(case):
        # No log records: the scrapes' own episode (evidence.py, judged by the same definition) has
        # the queue's peak and mean over its samples; never one sample's queue.
        text = (
            f"memory-bound: up to {ep['peak_waiting']:,} waiting (mean {ep['mean_waiting']:.1f} over "
            f"{ep['samples']} scrapes) at up to {ep['peak_kv_usage_pct']:.1f} % KV usage"
        )
        ev += [
            _ev("peak waiting while memory-bound", ep["peak_waiting"], source="metrics"),
            _ev("mean waiting while memory-bound", ep["mean_waiting"], source="metrics"),
            _ev("peak KV usage %", ep["peak_kv_usage_pct"], source="metrics"),
        ]
    else:
        text = "memory-bound: requests waited while the KV cache was full"
    n, source, exact = case.preemptions()
    finished = case.finished()
    preempted = case.section("requests", "preempted")
    req, basis = case.request_tokens()
    if n is None:
        text += "; preemptions are not in this log (give the scrapes or --prometheus)"
    elif n:
        if isinstance(preempted, int | float) and finished:
            text += f"; {int(preempted)} of {finished} requests were preempted and recomputed"
            if int(preempted) != n:
                text += f" ({n} preemptions)"
        elif finished:
            text += f"; {'' if exact else 'at least '}{n} preemptions among {finished} finished requests"
        else:
            text += f"; {'' if exact else 'at least '}{n} preemptions"
        prompt = case.section("requests", "prompt_tokens", "mean")
        if isinstance(prompt, int | float) and prompt > 0:
            # _preempt_request resets num_computed_tokens: at least the prompt is computed again.
            text += f" (at least {n * prompt:,.0f} prompt tokens computed twice)"
        ev.append(_ev("preemptions", n, source=source))
    else:
        text += "; no preemptions"
    pool = case.worst_pool or case.pool_tokens()
    if pool and req:
        if basis.startswith("histograms"):
            text += f"; the {pool:,}-token pool holds {pool / req:.1f} requests of {req:,.0f} tokens"
        else:  # an estimate from one record: say so
            text += f"; the {pool:,}-token pool holds about {pool / req:.1f} requests of ~{req:,.0f} tokens"
        ev.append(_ev("request tokens (" + basis + ")", round(req, 1), source="metrics" if "hist" in basis else "log"))
        ev.append(_ev("KV pool tokens", pool))
    return Match(text, tuple(ev))


def _preemption_storm(case: Case) -> Match | None:
    # V1 scheduler.py schedule(): a request is preempted only when allocate_slots finds no free KV
    # block for a running request, so sustained preemption is the KV pool (CONTRACTS "preempting").
    n, source, exact = case.preemptions()
    if case.saturation == "unknown" and not case.progress.stats_total and n:
        # No stats records, only V0's preemption warnings: the one thing the log shows is the pool
        # running out (V0 scheduler.py _preempt: "not enough KV cache space").
        return Match(
            f"{'' if exact else 'at least '}{n} preemptions for lack of KV cache space; no stats records show"
            " the load around them",
            (_ev("preemptions", n, source=source),),
        )
    if case.saturation != "preempting":
        return None
    count = f"{'' if exact else 'at least '}{n} preemptions" if n else "preemptions"
    # The log's peak and the scrapes' (engines[].max_kv_usage_pct): stats lines every 10 s and
    # scrapes at other instants each miss the other's peaks (a real 0.32 run: 25.8 % in the log,
    # 90.3 % in a scrape taken while four requests decoded).
    peaks = [case.section("stats", "max", "kv_usage_pct")]
    peaks += [e.get("max_kv_usage_pct") for e in case.section("engines") or [] if isinstance(e, Mapping)]
    seen = [p for p in peaks if isinstance(p, int | float) and not isinstance(p, bool)]
    at = f" with KV usage up to {max(seen):.1f} %" if seen else ""
    return Match(
        f"preempting: {count} in consecutive windows{at}: running requests outgrow the pool and are recomputed",
        (_ev("preemptions", n, source=source),),
    )


def _seq_limit(case: Case) -> Match | None:
    # CONTRACTS "Saturation" seq_bound: running >= max_num_seqs while requests wait (V1 scheduler.py
    # stops admitting at len(self.running) == self.max_num_running_reqs).
    if case.saturation != "seq_bound":
        return None
    mns = _stated(case.facts.config.max_num_seqs)
    mx = case.section("stats", "max") or {}
    peak = mx.get("kv_usage_pct")
    return Match(
        f"seq-bound: up to {mx.get('running')} running (max_num_seqs {mns}) and {mx.get('waiting')} waiting"
        + (f"; KV usage peaked at only {peak:.1f} %" if isinstance(peak, int | float) else ""),
        (_ev("max_num_seqs", mns), _ev("peak running", mx.get("running"))),
    )


def _prefill_starves_decode(case: Case) -> Match | None:
    # Long prompts fill each step's token budget (max_num_batched_tokens; V0 without chunked
    # prefill runs prefill-only steps, scheduler.py _schedule_default), so running requests stop
    # advancing: fewer generated tokens over the interval than requests running, while prompt
    # tokens flow, for two or more consecutive records.
    prompt = case.section("requests", "prompt_tokens", "mean")
    long = f" (prompts of {prompt:,.0f} tokens on average)" if isinstance(prompt, int | float) else ""
    return _streak_match(
        case,
        "starved",
        lambda s: (
            "prefill-bound: for {records} records{secs} prompt tokens were processed while the {running} running "
            f"requests produced fewer tokens than there were requests{long}"
        ),
    )


def _queued_low_kv(case: Case) -> Match | None:
    if case.saturation != "queued":
        return None
    mx = case.section("stats", "max") or {}
    # Scrapes without a log have no stats records: their engines' peaks stand in (evidence.py).
    engines = [e for e in case.section("engines") or [] if isinstance(e, Mapping)]
    waits = [w for w in [mx.get("waiting"), *(e.get("max_waiting") for e in engines)] if isinstance(w, int | float)]
    kvs = [
        k for k in [mx.get("kv_usage_pct"), *(e.get("max_kv_usage_pct") for e in engines)] if isinstance(k, int | float)
    ]
    waiting = int(max(waits)) if waits else None
    peak = max(kvs) if kvs else None
    return Match(
        f"queued: up to {waiting if waiting is not None else 'an unknown number of'} requests waiting while KV "
        "usage peaked at only "
        + (f"{peak:.1f} %" if peak is not None else "an unknown level")
        + "; the queue is not explained by KV memory",
        (_ev("peak waiting", waiting), _ev("peak KV usage %", peak)),
    )


def _healthy(case: Case) -> Match | None:
    if case.saturation not in ("ok", "idle"):
        return None
    mx = case.section("stats", "max") or {}
    if case.saturation == "idle":
        return Match(f"idle: nothing ran or waited in {case.section('stats', 'count')} stats records")
    peak = mx.get("kv_usage_pct")
    return Match(
        f"ok: up to {mx.get('running')} running and nothing waiting for long"
        + (f"; KV usage peaked at {peak:.1f} %" if isinstance(peak, int | float) else "")
    )


def _unknown(case: Case) -> Match | None:
    return Match("no stats records: the log does not show how the server was loaded")


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """One row: a cause kvwatch can name, how it is recognised, and what to do about it."""

    id: str
    verdict: str
    rule: Callable[[Case], Match | None]
    advice: tuple[str, ...]
    kv_pool: bool = False  # the KV pool is the cause: the capacity levers apply (and always do)
    why: str = ""


_SHRINK_START = (
    "lower --gpu-memory-utilization (e.g. by 0.05): the KV pool takes less and leaves the headroom the "
    "failing allocation needed",
    "--enforce-eager: no CUDA graphs, so none of their memory",
    "lower --max-num-seqs (and --max-num-batched-tokens): fewer graph sizes and a smaller activation peak",
)

CAUSES: tuple[Cause, ...] = (
    # ---- failed_start: the server never served --------------------------------------------------
    Cause(
        "memory_held_by_other_process",
        "failed_start",
        lambda c: _failed_start(_other_process(c)) if not c.progress.stats_total else None,
        (
            "free the device: find the other process with nvidia-smi (or rocm-smi) and stop it, or give this "
            "server its own GPU",
            "or lower --gpu-memory-utilization to what is actually free (free / total)",
        ),
        why="V1 worker/utils.py startup check; V0 0.6.4 initial_memory_usage",
    ),
    Cause(
        "oom_during_graph_capture",
        "failed_start",
        _graph_capture_oom,
        _SHRINK_START,
        why="capture_model runs after the KV cache is allocated",
    ),
    Cause(
        "negative_cuda_graph_estimate",
        "failed_start",
        _graph_estimate_cause,
        # vLLM's own levers for a wrong estimate (0.22.0): VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
        # stops the subtraction, and its warning says the graphs then need a lower
        # --gpu-memory-utilization; --kv-cache-memory-bytes (arg_utils.py, 0.10.2-0.22.0) skips
        # profiling; the pool is not grown by any of them.
        (
            "set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 and lower --gpu-memory-utilization by what the graphs "
            "really take, so the pool is not sized from the wrong estimate",
            "or pass --kv-cache-memory-bytes no larger than the pool less the estimate's surplus (the pool the "
            "budget gives without it), leaving the graphs their own memory",
            "make sure no other process allocates or frees device memory while vLLM profiles",
            "--enforce-eager avoids CUDA-graph memory altogether",
        ),
        why="gpu_worker.py determine_available_memory subtracts the estimate from the KV budget (default 0.21+)",
    ),
    Cause(
        "max_model_len_exceeds_pool",
        "failed_start",
        _max_model_len_exceeds_pool,
        (
            "lower --max-model-len to what the pool holds (vLLM's own 'estimated maximum model length')",
            "or grow the pool: the levers below",
        ),
        kv_pool=True,
        why="kv_cache_utils.py check_enough_kv_cache_memory; V0 worker.py raise_if_cache_size_invalid",
    ),
    Cause(
        "no_kv_memory_after_weights",
        "failed_start",
        _no_kv_memory,
        (
            "the weights and activations use the whole budget: shard the model (--tensor-parallel-size) or load "
            "quantised weights",
            "raise --gpu-memory-utilization only if nothing else uses the device",
            "lower --max-num-batched-tokens / --max-num-seqs to shrink the activation peak",
        ),
        why="kv_cache_utils.py _check_enough_kv_cache_memory available_memory <= 0",
    ),
    Cause("oom_at_start", "failed_start", _start_oom, _SHRINK_START, why="an OOM before any stats record"),
    Cause(
        "start_failed",
        "failed_start",
        _start_other,
        ("read the EngineCore traceback above 'Engine core initialization failed' for the root error",),
    ),
    # ---- crashed: it served, then died ------------------------------------------------------------
    Cause(
        "oom_while_serving",
        "crashed",
        _serving_oom,
        (
            "lower --gpu-memory-utilization so activations of the largest batch fit outside the pool",
            "lower --max-num-batched-tokens (the largest step's activations) or --max-num-seqs",
        ),
    ),
    Cause(
        "oom_phase_unknown",
        "unknown",
        _oom_phase_unknown,
        (
            "at startup: lower --gpu-memory-utilization, or --enforce-eager, or fewer --max-num-seqs",
            "while serving: lower --max-num-batched-tokens / --max-num-seqs so the largest step fits",
        ),
    ),
    Cause(
        "engine_dead",
        "crashed",
        _engine_dead,
        (
            "read the EngineCore traceback before the EngineDeadError: it names the root error",
            "restart the server; requests after the death all failed",
        ),
    ),
    # ---- stalled: requests run, no tokens come out ------------------------------------------------
    Cause(
        "preemption_loop",
        "stalled",
        _preemption_loop,
        (
            "the pool cannot hold the running requests: lower --max-num-seqs so fewer run at once",
            "or grow the pool: the levers below",
        ),
        kv_pool=True,
        why="scheduler.py _preempt_request recomputes from token 0",
    ),
    Cause(
        "engine_hang",
        "stalled",
        _engine_hang,
        (
            "the engine stopped stepping with requests in flight: take py-spy dump of the EngineCore process",
            "check for a stuck collective (NCCL_DEBUG=INFO) or a hung device, then restart",
        ),
    ),
    # ---- saturation ------------------------------------------------------------------------------
    Cause(
        "kv_pool_too_small",
        "memory_bound",
        _kv_pool_too_small,
        ("grow the pool or shrink the requests: the levers below, largest first",),
        kv_pool=True,
    ),
    Cause("seq_limit", "seq_bound", _seq_limit, ("raise --max-num-seqs: the KV pool has room for more",)),
    Cause(
        "preemption_storm",
        "preempting",
        _preemption_storm,
        ("grow the pool (the levers below) or lower --max-num-seqs so running requests fit",),
        kv_pool=True,
    ),
    Cause(
        "prefill_starves_decode",
        "queued",
        _prefill_starves_decode,
        (
            "lower --max-num-batched-tokens so each step mixes fewer prompt tokens with the decodes",
            "or serve long prompts on separate replicas (disaggregated prefill)",
        ),
    ),
    Cause(
        "queued_not_kv",
        "queued",
        _queued_low_kv,
        (
            "the KV cache is not the limit: check --max-num-batched-tokens (the token budget per step), LoRA "
            "slots (--max-loras) and structured-output compile time",
        ),
    ),
    Cause("healthy", "ok", _healthy, ()),
    Cause("unknown", "unknown", _unknown, ("give kvwatch the whole log, the /metrics scrapes or --prometheus",)),
)

_EVENT_VERDICTS = ("failed_start", "crashed", "stalled")
CAUSE_IDS: tuple[str, ...] = tuple(c.id for c in CAUSES)
KV_POOL_CAUSES: frozenset[str] = frozenset(c.id for c in CAUSES if c.kv_pool)

# Accounting that looks wrong, stated whatever the cause (each one sentence).
_WARNINGS: tuple[Callable[[Case], Match | None], ...] = (_graph_estimate_wrong, _graph_capture_wrong, _other_process)


# --------------------------------------------------------------------------------------------
# The diagnosis
# --------------------------------------------------------------------------------------------


def classify(case: Case) -> tuple[Cause, Match]:
    """The first row whose rule matches (``unknown`` always does)."""
    for cause in CAUSES:
        m = cause.rule(case)
        if m is not None:
            return cause, m
    raise AssertionError("the unknown row always matches")  # pragma: no cover


def diagnose(case: Case, levers: Callable[[], list[Any]] | None = None) -> dict[str, Any]:
    """The ``diagnosis`` object: {verdict, cause, summary, evidence, levers, advice, warnings}."""
    cause, m = classify(case)
    # failed_start, crashed and stalled come before the saturation verdicts (CONTRACTS order); the
    # rest describe a saturation state, which stays the one definition's (kvwatch.reconcile.saturation).
    verdict = m.verdict or (cause.verdict if cause.verdict in _EVENT_VERDICTS else case.saturation)
    rows: list[Any] = []
    if cause.kv_pool:
        rows = list(levers()) if levers is not None else []
        if not rows:
            rows = fallback_levers(case)
    warnings = []
    for rule in _WARNINGS:
        w = rule(case)
        if w is not None and w.sentence not in m.sentence:
            warnings.append(w.sentence[0].upper() + w.sentence[1:] + ".")
    return {
        "verdict": verdict,
        "cause": cause.id,
        "summary": m.sentence,
        "evidence": list(m.evidence),
        "levers": rows,
        "advice": list(cause.advice),
        "warnings": warnings,
        "engines": engine_causes(case),
    }


def engine_causes(case: Case) -> list[dict[str, Any]]:
    """One cause per engine when a log has several (data parallel): each engine's own saturation
    verdict and streaks through the same table, the server's start, errors and stalls shared
    (docs/contracts.md "diagnosis.engines"); empty for one engine, where the diagnosis is its own."""
    engines = case.section("stats", "engines")
    if not isinstance(engines, list) or len(engines) < 2:
        return []
    out: list[dict[str, Any]] = []
    for e in engines:
        if not isinstance(e, Mapping):
            continue
        key = (e.get("source"), e.get("engine"))
        sub = Case(str(e.get("verdict") or "unknown"), case.doc, case.facts, case.progress.for_engine(key))
        cause, m = classify(sub)
        verdict = m.verdict or (cause.verdict if cause.verdict in _EVENT_VERDICTS else sub.saturation)
        out.append({"engine": e.get("engine"), "source": e.get("source"), "verdict": verdict, "cause": cause.id})
    return out


def live_cause(facts: ServerFacts, progress: ProgressTracker, state: str) -> str:
    """The cause id of the sidecar's current state (``kvwatch_diagnosis{cause}``): the same table
    over the facts and tracker the live state keeps (no document: only the id is exported)."""
    return classify(Case(state, {}, facts, progress))[0].id


def fallback_levers(case: Case) -> list[dict[str, Any]]:
    """Lever rows when the capacity model has too little (no model, no bytes/token): sized from the
    pool and the best request size, each saying what it needs when the log lacks it."""
    pool = case.worst_pool or case.pool_tokens()
    req, basis = case.request_tokens()
    base = pool / req if pool and req else None
    kv_gib = as_number(case.facts.capacity.kv_cache_memory_gib)
    weights = as_number(case.facts.capacity.weights_gib)
    total = as_number(case.facts.memory.total_gib)
    kv_dtype = str(_stated(case.facts.config.kv_cache_dtype) or "auto")

    def row(lever: str, multiplier: float | None, note: str) -> dict[str, Any]:
        conc = base * multiplier if base is not None and multiplier is not None else None
        return {
            "lever": lever,
            "kv_bytes_per_token": None,
            "pool_tokens": int(pool * multiplier) if pool and multiplier is not None else None,
            "max_concurrency": round(conc, 4) if conc is not None else None,
            "multiplier": round(multiplier, 4) if multiplier is not None else None,
            "basis": f"request ({basis})" if basis else None,
            "note": note,
        }

    fp8 = "fp8" in kv_dtype
    grow = (kv_gib + 0.05 * total) / kv_gib if kv_gib and kv_gib > 0 and total else None

    def freed(fraction: float) -> float | None:
        # a 16-bit checkpoint: fp8 weights free half of them, int4 three quarters, all to the pool
        return (kv_gib + weights * fraction) / kv_gib if kv_gib and kv_gib > 0 and weights else None

    return [
        row(
            "fp8_kv_cache",
            1.0 if fp8 else 2.0,
            "the KV cache is already fp8" if fp8 else "--kv-cache-dtype fp8: half the bytes per token",
        ),
        row(
            "int4_weights",
            freed(0.75),
            "quantised weights free memory for the pool" + ("" if weights else "; needs the weights' size"),
        ),
        row(
            "fp8_weights",
            freed(0.5),
            "fp8 weights free half of 16-bit weights" + ("" if weights else "; needs the weights' size"),
        ),
        row("prefix_caching", None, "helps only as much as requests share a prefix (--enable-prefix-caching)"),
        row(
            "gpu_memory_utilization_plus_0_05",
            grow,
            "+0.05 of the device to the pool" + ("" if grow else "; needs the device's total memory"),
        ),
        row("tensor_parallel_x2", None, "needs the model (--model) to know its KV heads"),
        row("fewer_prompt_tokens", None, "shorter prompts (or lower max_tokens) fit more requests in the same pool"),
    ]


def case_from_document(
    doc: Mapping[str, Any],
    facts: ServerFacts,
    progress: ProgressTracker,
    saturation: str,
    worst: StatsRecord | None = None,
    worst_pool: int | None = None,
) -> Case:
    """The rules' input for an analyze document (``facts`` are the log's dotted facts)."""
    return Case(saturation, doc, facts, progress, worst, worst_pool)
