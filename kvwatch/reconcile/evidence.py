"""Metrics evidence (saved ``/metrics`` scrapes or Prometheus history) -> the analyze document's
metrics keys (CONTRACTS.md "kvwatch.analyze/1 additions"): ``preemptions.from_metrics``,
``requests``, ``latency``, ``prefix_cache``, ``engines`` and the metrics half of ``evidence``.

Input is one ordered timeline of :class:`TimedSample` per (instance, model_name, engine); sources
(saved files, the Prometheus HTTP API) build them, nothing here reads a file, the network or a
clock. Every figure is a delta over the evidence, never a scrape's absolute value, because a
counter's value at the first scrape includes whatever happened before the incident:

- counters: reset-aware increase (a value below its predecessor is a restart: the new value is
  what the new process counted), as Prometheus' ``increase()`` treats resets, without its
  extrapolation to the range's edges (a count of preemptions stays an integer);
- histograms: the same per bucket, ``_sum`` and ``_count``; a mean is Δsum / Δcount exactly;
- quantiles: Prometheus' interpolation (kvwatch.parse.histogram), except that a rank falling in
  the +Inf bucket cannot be resolved: vLLM's token buckets are 1-2-5 steps up to max_model_len
  (vllm/v1/metrics/buckets.py, build_buckets / histogram_buckets in 0.32.0), so with a
  9,216-token max_model_len the last finite bound is 5,000 and every 7,500-token prompt is only
  known to be above it. Such a quantile is null with its lower bound and the reason, never the
  mean under the quantile's name.

Engines are judged one by one (the one saturation definition, kvwatch.reconcile.saturation), and
nothing averages percentages across engines; counts (preemptions, requests, tokens) add up.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from kvwatch.parse.histogram import bucket_quantile
from kvwatch.reconcile.saturation import VERDICT_ORDER, SaturationJudge, verdict
from kvwatch.records import EngineSample, HistogramSummary, MetricsSnapshot

# When scrapes carry no time of their own (saved files whose modification times were lost in a
# copy), consecutive samples are this far apart for the saturation window: vLLM's own stats
# interval (vllm/v1/metrics/loggers.py LoggingStatLogger, 10 s) and the usual scrape interval.
NOMINAL_INTERVAL_S = 10.0

EngineKey = tuple[str | None, str | None, str | None]  # (instance, model_name, engine)


class TimedSample(NamedTuple):
    """One look at one engine: when (Unix seconds, None when unknown) and what /metrics said.

    A NamedTuple, like StatsRecord (kvwatch/records.py says why): a day of one engine at 15 s is
    5,760 of them, built from the (t, sample) pairs a source hands over at C speed.
    """

    t: float | None
    sample: EngineSample


@dataclass(frozen=True, slots=True)
class EngineTimeline:
    """The ordered samples of one (instance, model_name, engine) from one kind of evidence."""

    instance: str | None
    model_name: str | None
    engine: str | None
    source: str  # "metrics" (saved scrapes) or "prometheus"
    samples: tuple[TimedSample, ...]


@dataclass(frozen=True, slots=True)
class Increase:
    """A histogram's observations over the evidence: Δcount, Δsum and Δ(cumulative bucket)."""

    count: float
    sum: float
    buckets: tuple[tuple[float, float], ...]


def iso_utc(t: float | None) -> str | None:
    """Unix seconds as ISO-8601 with the year, in UTC (``2026-11-29T14:45:07Z``)."""
    if t is None or not math.isfinite(t):
        return None
    stamp = datetime.fromtimestamp(t, UTC)
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    if stamp.microsecond:
        text += f".{stamp.microsecond // 1000:03d}"
    return text + "Z"


# --------------------------------------------------------------------------------------------
# Deltas
# --------------------------------------------------------------------------------------------


def counter_increase(values: Iterable[float | None]) -> float | None:
    """Reset-aware increase of a counter over its samples in order; None when never present.

    A drop is a restart (vLLM's counters start at 0 with the process), so the value after the
    drop is what the new process counted. The first sample is the baseline.
    """
    prev: float | None = None
    total = 0.0
    seen = False
    for v in values:
        if v is None or not math.isfinite(v):
            continue
        if prev is not None:
            total += v - prev if v >= prev else v
        prev = v
        seen = True
    return total if seen else None


def histogram_increase(hists: Iterable[HistogramSummary | None]) -> Increase | None:
    """Reset-aware increase of one histogram over its samples in order; None when never present.

    A reset shows as a lower ``_count`` (or any lower bucket): the new sample is then all new.
    """
    prev_count: float | None = None
    prev_sum = 0.0
    prev_buckets: dict[float, float] | None = None
    count = total = 0.0
    buckets: dict[float, float] = {}
    for h in hists:
        if h is None:
            continue
        if h.count is not None and h.sum is not None and prev_count is not None:
            reset = h.count < prev_count
            count += h.count - (0.0 if reset else prev_count)
            total += h.sum - (0.0 if reset else prev_sum)
        if h.count is not None and h.sum is not None:
            prev_count, prev_sum = h.count, h.sum
        # Buckets may come less often than _sum/_count (Prometheus history reads them at a coarser
        # step, kvwatch.sources.prometheus): their increase is taken between the samples that have them.
        if not h.buckets:
            continue
        if prev_buckets is not None:
            old = prev_buckets
            reset_b = any(c < old.get(le, 0.0) for le, c in h.buckets)
            for le, c in h.buckets:
                buckets[le] = buckets.get(le, 0.0) + c - (0.0 if reset_b else old.get(le, 0.0))
        else:
            for le, _c in h.buckets:
                buckets.setdefault(le, 0.0)
        prev_buckets = dict(h.buckets)
    if prev_count is None:
        return None
    return Increase(count, total, tuple(sorted(buckets.items())))


def merge_increases(parts: Iterable[Increase | None]) -> Increase | None:
    """Observations of several engines together (counts add up; buckets when their bounds agree)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    bounds = {tuple(le for le, _ in p.buckets) for p in present}
    buckets: tuple[tuple[float, float], ...] = ()
    if len(bounds) == 1:
        merged: dict[float, float] = {}
        for p in present:
            for le, c in p.buckets:
                merged[le] = merged.get(le, 0.0) + c
        buckets = tuple(sorted(merged.items()))
    return Increase(sum(p.count for p in present), sum(p.sum for p in present), buckets)


def quantile(inc: Increase, q: float) -> tuple[float | None, float | None, str | None]:
    """(value, lower bound, reason) of the q-quantile of what was observed.

    value is Prometheus' interpolation when the rank falls in a finite bucket. When it falls in
    the +Inf bucket the value is None and the lower bound is the last finite bucket bound, with
    the reason: the histogram cannot say more.
    """
    if inc.count <= 0 or not inc.buckets:
        return None, None, None
    buckets = inc.buckets
    total = buckets[-1][1]
    if total <= 0:
        return None, None, None
    finite = [(le, c) for le, c in buckets if math.isfinite(le)]
    rank = q * total
    if math.isinf(buckets[-1][0]) and finite and finite[-1][1] < rank:
        last = finite[-1][0]
        share = (total - finite[-1][1]) / total * 100.0
        return (
            None,
            last,
            f"{share:.0f} % of the observations lie above vLLM's last finite bucket ({last:,.0f}): "
            f"the p{q * 100:.0f} is only known to exceed it",
        )
    if not finite:
        return None, None, "the histogram has only its +Inf bucket"
    return bucket_quantile(q, buckets), None, None


def _round(value: float | None, digits: int) -> float | None:
    if value is None:
        return None
    rounded = round(value, digits)
    return float(int(rounded)) if rounded == int(rounded) else rounded


def distribution(inc: Increase | None, quantiles: Sequence[float] = (0.5, 0.95), digits: int = 1) -> dict[str, Any]:
    """``{mean, p50, p95}`` of a histogram's increase (nulls when absent), with additive ``count``
    and, for an unresolvable quantile, ``pNN_lower_bound`` and ``note``."""
    doc: dict[str, Any] = {"mean": None}
    for q in quantiles:
        doc[f"p{q * 100:.0f}"] = None
    doc["count"] = None
    if inc is None:
        return doc
    doc["count"] = int(inc.count) if inc.count == int(inc.count) else inc.count
    if inc.count > 0:
        doc["mean"] = _round(inc.sum / inc.count, digits)  # Δsum / Δcount, exact
    notes = []
    for q in quantiles:
        name = f"p{q * 100:.0f}"
        value, bound, reason = quantile(inc, q)
        doc[name] = _round(value, digits)
        if bound is not None:
            doc[f"{name}_lower_bound"] = bound
        if reason:
            notes.append(reason)
    if notes:
        doc["note"] = notes[-1]
    return doc


# --------------------------------------------------------------------------------------------
# One engine
# --------------------------------------------------------------------------------------------


@dataclass
class _Judged:
    states: list[str]
    episodes: list[dict[str, Any]]
    times_known: bool


def _judge(
    timeline: EngineTimeline, max_num_seqs: int | None, window_s: float | None, threshold: float | None
) -> _Judged:
    """The saturation state at each sample (the one definition), and the memory-bound episodes."""
    judge = SaturationJudge(max_num_seqs=max_num_seqs)
    if window_s is not None:
        judge.window_seconds = window_s
    if threshold is not None:
        judge.threshold = threshold
    times_known = all(s.t is not None for s in timeline.samples)
    states: list[str] = []
    episodes: list[dict[str, Any]] = []
    episode: dict[str, Any] | None = None
    prev_preemptions: float | None = None
    prev_generated: float | None = None
    for i, ts in enumerate(timeline.samples):
        s = ts.sample
        if s.running is None and s.waiting is None:
            continue  # a coarse Prometheus point with only histograms
        t = ts.t if times_known and ts.t is not None else i * NOMINAL_INTERVAL_S
        preempted = 0.0
        if s.preemptions_total is not None:
            if prev_preemptions is not None:
                preempted = s.preemptions_total - prev_preemptions
                if preempted < 0:
                    preempted = s.preemptions_total
            prev_preemptions = s.preemptions_total
        # vllm:num_requests_running is the scheduler's count at the last step before the scrape
        # (v1/metrics/loggers.py PrometheusStatLogger.record sets it from SchedulerStats), while
        # vllm:generation_tokens_total adds every token sampled in between (v1/metrics/stats.py
        # IterationStats.update_from_output). Generation tokens since the last sample mean requests
        # ran in the interval, so a sample that finds the server empty (short requests, a client
        # that paces itself) is not an idle interval: it counts as one request running.
        running = s.running
        generated = s.generation_tokens_total
        if generated is not None:
            if prev_generated is not None and generated > prev_generated and not running and not s.waiting:
                running = 1.0
            prev_generated = generated
        state = judge.observe_values(t, running, s.waiting, s.kv_usage_ratio, preempted, s.waiting_capacity)
        states.append(state)
        kv_pct = s.kv_usage_ratio * 100.0 if s.kv_usage_ratio is not None else None
        if state == "memory_bound":
            if episode is None:
                episode = {
                    "start_ts": ts.t,
                    "end_ts": ts.t,
                    "peak_waiting": 0,
                    "peak_kv_usage_pct": None,
                    "mean_waiting": 0.0,
                    "samples": 0,
                    "engine": timeline.engine,
                    "instance": timeline.instance,
                    "source": timeline.source,
                }
                episodes.append(episode)
            episode["end_ts"] = ts.t
            episode["samples"] += 1
            episode["peak_waiting"] = max(episode["peak_waiting"], int(s.waiting or 0))
            episode["mean_waiting"] += s.waiting or 0.0
            if kv_pct is not None and (episode["peak_kv_usage_pct"] is None or kv_pct > episode["peak_kv_usage_pct"]):
                episode["peak_kv_usage_pct"] = round(kv_pct, 1)
        elif episode is not None:
            episode["end_ts"] = ts.t  # it lasts until the sample that shows it over
            episode = None
    for ep in episodes:
        ep["start_ts"], ep["end_ts"] = iso_utc(ep["start_ts"]), iso_utc(ep["end_ts"])
        ep["mean_waiting"] = round(ep["mean_waiting"] / ep["samples"], 1) if ep["samples"] else None
    return _Judged(states, episodes, times_known)


def _peaks(samples: Sequence[TimedSample]) -> dict[str, Any]:
    running = [s.sample.running for s in samples if s.sample.running is not None]
    waiting = [s.sample.waiting for s in samples if s.sample.waiting is not None]
    kv = [s.sample.kv_usage_ratio for s in samples if s.sample.kv_usage_ratio is not None]
    return {
        "max_running": int(max(running)) if running else None,
        "max_waiting": int(max(waiting)) if waiting else None,
        "mean_waiting": round(sum(waiting) / len(waiting), 1) if waiting else None,
        "max_kv_usage_pct": round(max(kv) * 100.0, 1) if kv else None,
    }


@dataclass(frozen=True, slots=True)
class EngineFigures:
    """What the evidence says about one engine, before it is rendered."""

    timeline: EngineTimeline
    preemptions: float | None
    prompt: Increase | None
    generation: Increase | None
    num_preemptions: Increase | None
    ttft: Increase | None
    e2e: Increase | None
    queue: Increase | None
    prefix_queries: float | None
    prefix_hits: float | None
    judged: _Judged


def engine_figures(
    timeline: EngineTimeline,
    *,
    max_num_seqs: int | None = None,
    window_s: float | None = None,
    threshold: float | None = None,
) -> EngineFigures:
    """Deltas and saturation of one engine's timeline."""
    samples = [ts.sample for ts in timeline.samples]

    def hist(name: str) -> Increase | None:
        return histogram_increase(getattr(s, name) for s in samples)

    return EngineFigures(
        timeline=timeline,
        preemptions=counter_increase(s.preemptions_total for s in samples),
        prompt=hist("request_prompt_tokens"),
        generation=hist("request_generation_tokens"),
        num_preemptions=hist("request_num_preemptions"),
        ttft=hist("ttft_seconds"),
        e2e=hist("e2e_latency_seconds"),
        queue=hist("queue_time_seconds"),
        prefix_queries=counter_increase(s.prefix_cache_queries_total for s in samples),
        prefix_hits=counter_increase(s.prefix_cache_hits_total for s in samples),
        judged=_judge(timeline, max_num_seqs, window_s, threshold),
    )


def _preempted_requests(inc: Increase | None) -> int | None:
    """Finished requests that were preempted at least once, when the histogram says so exactly.

    vllm:request_num_preemptions (V1 0.30+, observed once per finished request in
    PrometheusStatLogger.record, vllm/v1/metrics/loggers.py) has its first bucket at le=1
    (REQUEST_NUM_PREEMPTIONS_BUCKETS, vllm/v1/metrics/buckets.py), so 0 and 1 share a bucket.
    When every request is in it, each was preempted 0 or 1 times and Δsum counts them; otherwise
    the count of preempted requests is not in the histogram (null).
    """
    if inc is None:
        return None
    if inc.count == 0:
        return 0
    first = next(((le, c) for le, c in inc.buckets if le >= 1.0), None)
    if first is not None and first[0] == 1.0 and first[1] == inc.count:
        return round(inc.sum)
    return None


def _requests(
    prompt: Increase | None, generation: Increase | None, num_preemptions: Increase | None
) -> dict[str, Any] | None:
    if prompt is None and generation is None:
        return None
    p = distribution(prompt)
    g = distribution(generation)
    footprint = None
    if p["p95"] is not None and g["p95"] is not None:
        # An upper estimate: the p95 of a sum is at most the sum of the p95s.
        footprint = p["p95"] + g["p95"]
    doc: dict[str, Any] = {
        "finished": p["count"] if p["count"] is not None else g["count"],
        "prompt_tokens": p,
        "generation_tokens": g,
        "footprint_tokens_p95": footprint,
        "preempted": _preempted_requests(num_preemptions),
    }
    if footprint is None and p["mean"] is not None and g["mean"] is not None:
        doc["footprint_tokens_mean"] = _round(p["mean"] + g["mean"], 1)
        doc["footprint_note"] = "p95 not resolvable from vLLM's buckets; the mean (Δsum/Δcount) is exact"
    return doc


def _latency(ttft: Increase | None, e2e: Increase | None, queue: Increase | None) -> dict[str, Any] | None:
    if ttft is None and e2e is None and queue is None:
        return None
    q = distribution(queue, (0.95,), digits=3)
    return {
        "ttft_s": distribution(ttft, digits=3),
        "e2e_s": distribution(e2e, digits=3),
        "queue_s": q,
    }


def _prefix(queries: float | None, hits: float | None) -> dict[str, Any] | None:
    if queries is None or hits is None:
        return None
    return {
        "hit_pct": round(hits / queries * 100.0, 1) if queries > 0 else None,
        "queries": int(queries),
        "hits": int(hits),
    }


def _sustained_verdict(states: list[str]) -> str:
    return verdict(states) if states else "unknown"


def _engine_document(fig: EngineFigures) -> dict[str, Any]:
    tl = fig.timeline
    times = [s.t for s in tl.samples if s.t is not None]
    doc: dict[str, Any] = {
        "engine": tl.engine,
        "model_name": tl.model_name,
        "instance": tl.instance,
        "source": tl.source,
        "verdict": _sustained_verdict(fig.judged.states),
        "samples": len(fig.judged.states),
        "first_ts": iso_utc(min(times)) if times else None,
        "last_ts": iso_utc(max(times)) if times else None,
        "preemptions": int(fig.preemptions) if fig.preemptions is not None else None,
        **_peaks(tl.samples),
        "requests": _requests(fig.prompt, fig.generation, fig.num_preemptions),
        "latency": _latency(fig.ttft, fig.e2e, fig.queue),
        "prefix_cache": _prefix(fig.prefix_queries, fig.prefix_hits),
        "episodes": fig.judged.episodes,
    }
    return doc


@dataclass(frozen=True, slots=True)
class MetricsEvidence:
    """The metrics keys of the analyze document, from every engine's figures."""

    figures: tuple[EngineFigures, ...]

    def from_metrics(self) -> int | None:
        """Reset-aware preemptions over the evidence, summed over engines (null when no engine
        exposes vllm:num_preemptions)."""
        values = [f.preemptions for f in self.figures if f.preemptions is not None]
        return round(sum(values)) if values else None

    def requests(self) -> dict[str, Any] | None:
        """``requests`` of the document: every engine's finished requests together."""
        return _requests(
            merge_increases(f.prompt for f in self.figures),
            merge_increases(f.generation for f in self.figures),
            merge_increases(f.num_preemptions for f in self.figures),
        )

    def latency(self) -> dict[str, Any] | None:
        """``latency`` of the document: TTFT, end-to-end and queue time of every engine's requests."""
        return _latency(
            merge_increases(f.ttft for f in self.figures),
            merge_increases(f.e2e for f in self.figures),
            merge_increases(f.queue for f in self.figures),
        )

    def prefix_cache(self) -> dict[str, Any] | None:
        """Δhits / Δqueries × 100 over every engine (a ratio of sums, never a mean of ratios)."""
        queries = [f.prefix_queries for f in self.figures if f.prefix_queries is not None]
        hits = [f.prefix_hits for f in self.figures if f.prefix_hits is not None]
        if not queries or not hits:
            return None
        return _prefix(sum(queries), sum(hits))

    def engines(self) -> list[dict[str, Any]]:
        """One entry per (instance, model, engine), each judged on its own."""
        return [_engine_document(f) for f in self.figures]

    def verdict(self) -> str:
        """The first of VERDICT_ORDER any engine shows for a sustained stretch; ``unknown``."""
        verdicts = {_sustained_verdict(f.judged.states) for f in self.figures}
        for state in VERDICT_ORDER:
            if state in verdicts:
                return state
        return "unknown"

    def episodes(self) -> list[dict[str, Any]]:
        """Every engine's memory-bound episodes, in engine order."""
        return [ep for f in self.figures for ep in f.judged.episodes]

    def memory_bound_samples(self) -> int:
        """Samples judged memory_bound, over every engine."""
        return sum(s == "memory_bound" for f in self.figures for s in f.judged.states)

    def time_span(self) -> tuple[float | None, float | None]:
        """Earliest and latest sample time, when the samples carry times."""
        times = [s.t for f in self.figures for s in f.timeline.samples if s.t is not None]
        return (min(times), max(times)) if times else (None, None)

    def samples(self) -> int:
        """Samples read, over every engine (each scrape or Prometheus step counts once per engine)."""
        return sum(len(f.timeline.samples) for f in self.figures)


def metrics_evidence(
    timelines: Iterable[EngineTimeline],
    *,
    max_num_seqs: int | None = None,
    window_s: float | None = None,
    threshold: float | None = None,
) -> MetricsEvidence:
    """Figures for every engine timeline (see the module docstring)."""
    return MetricsEvidence(
        tuple(engine_figures(tl, max_num_seqs=max_num_seqs, window_s=window_s, threshold=threshold) for tl in timelines)
    )


def metrics_summary(ev: MetricsEvidence, verdict_name: str) -> str:
    """One plain sentence for a document whose only evidence is metrics (no log stats records)."""
    engines = ev.engines()
    running = [e["max_running"] for e in engines if e["max_running"] is not None]
    waiting = [e["max_waiting"] for e in engines if e["max_waiting"] is not None]
    kv = [e["max_kv_usage_pct"] for e in engines if e["max_kv_usage_pct"] is not None]
    where = f" over {len(engines)} engines" if len(engines) > 1 else ""
    parts = [
        f"{verdict_name.replace('_', '-')}{where} (from /metrics):"
        f" up to {max(running) if running else '?'} running, {max(waiting) if waiting else '?'} waiting,"
        f" KV usage peaked at {max(kv) if kv else '?'} %"
    ]
    pre = ev.from_metrics()
    req = ev.requests()
    if pre is not None:
        finished = req["finished"] if req else None
        parts.append(f"{pre:,} preemptions" + (f" over {finished:,} finished requests" if finished is not None else ""))
    if req and req["prompt_tokens"]["mean"] is not None and req["generation_tokens"]["mean"] is not None:
        parts.append(
            f"requests averaged {req['prompt_tokens']['mean']:,.0f} prompt + "
            f"{req['generation_tokens']['mean']:,.0f} generated tokens"
        )
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# Saved scrapes -> timelines
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScrapeReading:
    """One saved scrape, read: its name, file time, process start stamp and snapshot."""

    name: str
    mtime: float | None
    created: float | None  # the serving process's start (kvwatch.parse.scrapes.creation_stamp)
    snapshot: MetricsSnapshot


def _progress(snap: MetricsSnapshot) -> float:
    """How far one process's counters had got: they only grow until it restarts."""
    total = 0.0
    for e in snap.engines:
        for v in (e.preemptions_total, e.prompt_tokens_total, e.generation_tokens_total, e.prefix_cache_queries_total):
            total += v or 0.0
        for h in (e.request_prompt_tokens, e.request_generation_tokens):
            total += (h.count or 0.0) if h is not None else 0.0
    return total


@dataclass(frozen=True, slots=True)
class TokenRateBound:
    """The fastest the log says the server processed tokens: each stats record's "Avg prompt/
    generation throughput" is the tokens of its interval over that interval (V1
    v1/metrics/loggers.py LoggingStatLogger._get_throughput, V0 engine/metrics.py likewise). Rates
    are the engines' maxima summed, and ``*_tokens`` the most one interval held (rate x interval),
    also summed over engines."""

    prompt_tps: float
    generation_tps: float
    prompt_tokens: float
    generation_tokens: float


def _times_contradict(ordered: Sequence[ScrapeReading], bound: TokenRateBound) -> bool:
    """Whether the files' times are too close for the tokens the scrapes' counters say were processed.

    Any window [a, b] of a log is covered by whole stats intervals inside it plus at most two it
    overlaps, so at most rate_max x (b - a) + 2 x tokens_max (the most one interval held) were
    processed in it, however long the idle gaps between records. A copy
    or a git checkout stamps every file within milliseconds; counters that grew by more than that
    between the first and the last scrape prove the stamps are not the scrapes' times.
    """
    first, last = ordered[0].mtime, ordered[-1].mtime
    if first is None or last is None:
        return False
    span = last - first
    for attr, rate, most in (
        ("prompt_tokens_total", bound.prompt_tps, bound.prompt_tokens),
        ("generation_tokens_total", bound.generation_tps, bound.generation_tokens),
    ):
        by_engine: dict[tuple[str | None, str | None], list[float | None]] = {}
        for r in ordered:
            for e in r.snapshot.engines:
                by_engine.setdefault((e.model_name, e.engine), []).append(getattr(e, attr))
        grown = sum(counter_increase(values) or 0.0 for values in by_engine.values())
        if grown > rate * span + 2 * most:
            return True
    return False


def order_scrapes(
    readings: Sequence[ScrapeReading], bound: TokenRateBound | None = None
) -> tuple[list[ScrapeReading], str | None]:
    """Scrapes in the order they were taken, and where their times come from.

    Order: by process (the ``_created`` stamp: a restart starts later), then by the counters'
    progress within one process, then by modification time, then by input order. Times are the
    files' modification times only when those are distinct, agree with that order (a copy or
    a git checkout gives every file the same time, or times in copy order), and leave room for the
    tokens the counters grew by at the fastest rate the log shows (``bound``, when a log of the
    run is given); otherwise None: the samples are then spaced NOMINAL_INTERVAL_S apart for the
    saturation window and carry no timestamp.
    """
    indexed = list(enumerate(readings))
    indexed.sort(
        key=lambda ir: (
            ir[1].created if ir[1].created is not None else -math.inf,
            _progress(ir[1].snapshot),
            ir[1].mtime if ir[1].mtime is not None else math.inf,
            ir[0],
        )
    )
    ordered = [r for _i, r in indexed]
    mtimes = [r.mtime for r in ordered]
    if (
        len(ordered) > 1
        and all(m is not None for m in mtimes)
        and all(
            a < b  # type: ignore[operator]
            for a, b in itertools.pairwise(mtimes)
        )
    ):
        return (ordered, None) if bound is not None and _times_contradict(ordered, bound) else (ordered, "mtime")
    if len(ordered) == 1 and mtimes[0] is not None:
        return ordered, "mtime"
    return ordered, None


def scrape_timelines(
    readings: Sequence[ScrapeReading], bound: TokenRateBound | None = None
) -> tuple[list[EngineTimeline], str | None]:
    """One timeline per (model_name, engine) of the saved scrapes, in the order they were taken."""
    ordered, time_source = order_scrapes(readings, bound)
    by_key: dict[tuple[str | None, str | None], list[TimedSample]] = {}
    for r in ordered:
        t = r.mtime if time_source == "mtime" else None
        for e in r.snapshot.engines:
            by_key.setdefault((e.model_name, e.engine), []).append(TimedSample(t, e))
    timelines = [
        EngineTimeline(None, model, engine, "metrics", tuple(samples)) for (model, engine), samples in by_key.items()
    ]
    return timelines, time_source


# --------------------------------------------------------------------------------------------
# The document
# --------------------------------------------------------------------------------------------

NOT_IN_LOG = "not in this log; give the scrapes or --prometheus"


@dataclass(frozen=True, slots=True)
class EvidenceInputs:
    """What metrics evidence was read besides the logs (the ``evidence`` key of the document)."""

    scrapes: int = 0
    prometheus: dict[str, Any] | None = None  # {url, selector, start, end, step}
    time_source: str | None = None  # "mtime" (saved scrapes), "prometheus", or None (unknown)
    cache_configs: tuple[dict[str, Any], ...] = ()  # typed vllm:cache_config_info labels seen


def _verdict_rank(name: str) -> int:
    return VERDICT_ORDER.index(name) if name in VERDICT_ORDER else len(VERDICT_ORDER)


def _log_engines(doc: dict[str, Any]) -> list[dict[str, Any]]:
    model = doc["config"].get("served_model_name") or doc["config"].get("model")
    return [
        {
            "engine": str(e["engine"]) if e["engine"] is not None else None,
            "model_name": model,
            "instance": e["source"],
            "source": "log",
            "verdict": e["verdict"],
            "samples": e["count"],
            "max_running": e["max_running"],
            "max_waiting": e["max_waiting"],
            "max_kv_usage_pct": e["max_kv_usage_pct"],
        }
        for e in doc["stats"]["engines"]
    ]


def fill_from_cache_config(doc: dict[str, Any], configs: Sequence[dict[str, Any]]) -> list[str]:
    """Fill the pool and cache settings the log does not state from vllm:cache_config_info
    (the labels vLLM sets once the KV cache is sized: vllm/v1/metrics/loggers.py, 0.9.0+), in
    place; returns the dotted keys filled. Only when every engine's labels agree, and never the
    pool's bytes under --num-gpu-blocks-override (the label keeps the memory vLLM had, 1 GiB in
    the seed run, not the 40 MiB its 1,280 blocks hold)."""
    keys = (
        "num_gpu_blocks",
        "block_size",
        "kv_cache_size_tokens",
        "kv_cache_memory_bytes",
        "num_gpu_blocks_override",
        "gpu_memory_utilization",
        "enable_prefix_caching",
        "cache_dtype",
    )
    # Only vLLM's own labels are compared: a Prometheus adds instance, job, pod ... per target.
    present = [{k: c.get(k) for k in keys} for c in configs if c]
    if not present or any(c != present[0] for c in present[1:]):
        return []
    c = present[0]
    blocks, block_size = c.get("num_gpu_blocks"), c.get("block_size")
    tokens = c.get("kv_cache_size_tokens")
    if tokens is None and isinstance(blocks, int) and isinstance(block_size, int):
        tokens = blocks * block_size
    memory = c.get("kv_cache_memory_bytes")
    values: dict[tuple[str, str], Any] = {
        ("capacity", "gpu_blocks"): blocks,
        ("capacity", "block_size"): block_size,
        ("capacity", "kv_cache_tokens"): tokens,
        ("capacity", "kv_cache_memory_gib"): (
            round(memory / 2**30, 4)
            if isinstance(memory, int | float) and c.get("num_gpu_blocks_override") is None
            else None
        ),
        ("config", "block_size"): block_size,
        ("config", "gpu_memory_utilization"): c.get("gpu_memory_utilization"),
        ("config", "enable_prefix_caching"): c.get("enable_prefix_caching"),
        ("config", "kv_cache_dtype"): c.get("cache_dtype"),
    }
    filled = []
    for (section, key), value in values.items():
        if value is not None and doc[section].get(key) is None:
            doc[section][key] = value
            filled.append(f"{section}.{key}")
    return filled


def join_engines(metric_engines: list[dict[str, Any]], log_engines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (instance, model, engine): a log's engine joins the saved scrapes' engine
    of the same number and model (the scrapes name no instance, nor does one server's log).

    The joined entry keeps the metrics' figures, adds the log's under ``log``, and takes the
    verdict earlier in VERDICT_ORDER, each judged by the one saturation definition.
    """
    out = [dict(e) for e in metric_engines]
    for log in log_engines:
        match = next(
            (
                e
                for e in out
                if e["source"] == "metrics"
                and e["engine"] == (log["engine"] if log["engine"] is not None else "0")
                and (log["model_name"] is None or e["model_name"] in (None, log["model_name"]))
                and "log" not in e
            ),
            None,
        )
        if match is None:
            out.append(log)
            continue
        match["log"] = {k: v for k, v in log.items() if k not in ("engine", "model_name", "source")}
        match["source"] = "metrics+log"
        if _verdict_rank(log["verdict"]) < _verdict_rank(match["verdict"]):
            match["verdict"] = log["verdict"]
    return out


def apply_metrics(doc: dict[str, Any], ev: MetricsEvidence | None, inputs: EvidenceInputs) -> None:
    """Fill the metrics keys of an analyze document built from the logs (in place).

    Every key is present; null where the evidence does not state it. The log's verdict stands
    unless the metrics show a state earlier in VERDICT_ORDER (a log cut short, or none at all).
    """
    first, last = ev.time_span() if ev is not None else (None, None)
    log_first, log_last = doc["stats"]["first_ts"], doc["stats"]["last_ts"]
    filled = fill_from_cache_config(doc, inputs.cache_configs)
    doc["capacity"]["pool_memory_gib"] = pool_memory_gib(doc["capacity"])
    doc["evidence"] = {
        "log_records": doc["records_total"],
        "scrapes": inputs.scrapes,
        "prometheus": inputs.prometheus,
        "first_ts": iso_utc(first) if first is not None else log_first,
        "last_ts": iso_utc(last) if last is not None else log_last,
        "metrics_samples": ev.samples() if ev is not None else 0,
        "metrics_time_source": inputs.time_source,
        "filled_from_metrics": filled,
    }
    from_metrics = ev.from_metrics() if ev is not None else None
    doc["preemptions"]["from_metrics"] = from_metrics
    if from_metrics is None:
        doc["preemptions"]["note"] = NOT_IN_LOG
    doc["requests"] = ev.requests() if ev is not None else None
    doc["latency"] = ev.latency() if ev is not None else None
    prefix = ev.prefix_cache() if ev is not None else None
    if prefix is not None:
        prefix["source"] = "prometheus" if inputs.prometheus else "metrics"
    else:
        last_stats = doc["stats"]["last"]
        hit = last_stats.get("prefix_hit_pct") if last_stats else None
        prefix = {"hit_pct": hit, "source": "log" if hit is not None else None}
    doc["prefix_cache"] = prefix
    metric_engines = ev.engines() if ev is not None else []
    doc["engines"] = join_engines(metric_engines, _log_engines(doc))
    if ev is not None:
        doc["saturation"]["metrics_episodes"] = ev.episodes()
        doc["saturation"]["memory_bound_samples"] = ev.memory_bound_samples()
    diag = doc["diagnosis"]
    if ev is None or not metric_engines:
        return
    metrics_verdict = ev.verdict()
    if metrics_verdict != "unknown" and _verdict_rank(metrics_verdict) < _verdict_rank(diag["verdict"]):
        diag["verdict"] = metrics_verdict
        diag["summary"] = metrics_summary(ev, metrics_verdict)
        return
    req = doc["requests"]
    if from_metrics is not None and diag["verdict"] in ("memory_bound", "preempting", "seq_bound", "queued"):
        finished = req["finished"] if req else None
        preempted = req["preempted"] if req else None
        if preempted is not None and finished:
            diag["summary"] += f"; {preempted:,} of {finished:,} requests were preempted and recomputed"
        elif finished:
            diag["summary"] += f"; {from_metrics:,} preemptions over {finished:,} finished requests"
        else:
            diag["summary"] += f"; {from_metrics:,} preemptions"


def pool_memory_gib(capacity: dict[str, Any]) -> float | None:
    """The KV pool's real size in GiB: what vLLM's block count occupies, not the memory it had.

    With ``--num-gpu-blocks-override`` vLLM allocates the override's blocks whatever memory it
    profiled (vllm/v1/core/kv_cache_utils.py in 0.32.0: may_override_num_blocks replaces the
    num_blocks that get_kv_cache_config_from_groups computed as available_memory // bytes per
    block). So one block is kv_cache_memory / computed blocks, and the pool is that x the blocks
    in use: the seed run's 1 GiB held 32,768 blocks, the override kept 1,280 = 40 MiB.
    """
    memory = capacity.get("kv_cache_memory_gib")
    blocks, computed = capacity.get("gpu_blocks"), capacity.get("computed_gpu_blocks")
    if not isinstance(memory, int | float):
        return None
    if isinstance(blocks, int) and isinstance(computed, int) and computed > 0 and blocks != computed:
        return round(memory * blocks / computed, 6)
    return float(memory)


# --------------------------------------------------------------------------------------------
# Years for year-less log stamps
# --------------------------------------------------------------------------------------------

_YEARLESS = re.compile(r"^--(\d\d)-(\d\d)(T.*)$")


def _with_year(month: int, day: int, reference: datetime, *, after: bool) -> int | None:
    """The year that puts MM-DD nearest ``reference`` on the side it must lie (a day's slack for
    time zones): after the process start, or before the file was last written."""
    for year in (reference.year, reference.year - 1, reference.year + 1):
        try:
            stamp = datetime(year, month, day, tzinfo=UTC)
        except ValueError:  # 02-29 outside a leap year
            continue
        delta = (stamp - reference).total_seconds()
        if (after and -86400 <= delta < 330 * 86400) or (not after and -330 * 86400 < delta <= 86400):
            return year
    return None


def infer_years(doc: dict[str, Any], *, created: float | None, log_mtime: float | None) -> None:
    """Give the document's year-less log stamps (vLLM prints ``MM-DD HH:MM:SS``) their year, in place.

    From the scrapes' ``_created`` stamps when given (the serving process started then, so its
    log lines come after), else from the log file's modification time (its lines were written
    before). ``evidence.year_inferred_from`` says which; stamps that already had a year (a
    docker/kubectl RFC 3339 prefix) are left alone, and nothing changes when neither is known.
    """
    if created is not None:
        reference, after, source = datetime.fromtimestamp(created, UTC), True, "scrapes' _created stamps"
    elif log_mtime is not None:
        reference, after, source = datetime.fromtimestamp(log_mtime, UTC), False, "the log file's modification time"
    else:
        doc["evidence"]["year_inferred_from"] = None
        return
    changed = False

    def fix(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, str):
            m = _YEARLESS.match(value)
            if m:
                year = _with_year(int(m.group(1)), int(m.group(2)), reference, after=after)
                if year is not None:
                    changed = True
                    return f"{year:04d}-{m.group(1)}-{m.group(2)}{m.group(3)}"
            return value
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    for key in list(doc):
        if key not in ("inputs", "config", "errors"):  # vLLM's own text and paths stay as written
            doc[key] = fix(doc[key])
    doc["evidence"]["year_inferred_from"] = source if changed else None
