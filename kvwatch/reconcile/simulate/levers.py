"""The simulated outcome beside each of analyze's levers (``diagnosis.levers[].simulated``).

Pure. ``kvwatch analyze`` hands over its document (the diagnosis already decided by the cause
table: lever rows only where the cause is the KV pool) and the evidence the simulator can
calibrate on: one ``EvidencePoint`` per saved scrape or per Prometheus instant, with the reason
when there is none. Each lever row then gets ``simulated`` {mean_waiting,
preemptions_per_100_requests, e2e_p95_s} and ``simulated_why_not`` (one sentence, null when
simulated); ``diagnosis.simulation`` holds the observed scenario to compare with and why nothing
was simulated, or is null when the cause has no levers.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import KvwatchError
from kvwatch.parse.scrapeseries import read_timing, scraped_at
from kvwatch.reconcile.simulate.calibrate import EvidencePoint, evidence_point
from kvwatch.reconcile.simulate.whatif import MAX_LOAD_SECONDS, lever_outcomes, rebased
from kvwatch.records import EngineSample, HistogramSummary, MetricsSnapshot, TimingSeries

LOG_ONLY = (
    "a log states no request sizes: give the /metrics scrapes saved during the load, or --prometheus "
    "(the request-size histograms)"
)


@dataclass(frozen=True, slots=True)
class SimulationEvidence:
    """What analyze can calibrate the simulator on: points in seconds since the first, or why not."""

    points: tuple[EvidencePoint, ...] = ()
    why_not: str | None = LOG_ONLY


def from_scrapes(scrapes: Sequence[tuple[str, float | None, MetricsSnapshot]]) -> SimulationEvidence:
    """Saved scrapes as (text, modification time or None, snapshot): instants as ``kvwatch simulate``
    reads them (the "# scraped at t=+Xs" line, else the modification time)."""
    if not scrapes:
        return SimulationEvidence()
    points = []
    for text, mtime, snapshot in scrapes:
        at = scraped_at(text)
        if at is None:
            at = mtime
        if at is None:
            return SimulationEvidence(
                (), "the scrapes' instants are unknown (no '# scraped at t=+Xs' line, equal modification times)"
            )
        point = evidence_point(at, snapshot, read_timing(text))
        if point is not None:
            points.append(point)
    if len({p.t for p in points}) < len(points):
        return SimulationEvidence((), "two scrapes share one instant; save each with its time")
    return _enough(points)


History = Sequence[tuple[str | None, Sequence[tuple[float | None, EngineSample]]]]


def from_history(timelines: History) -> SimulationEvidence:
    """Prometheus history as (engine, [(t, sample)]) per timeline; one engine only (the timing
    counters are server-wide; several engines' sums are not one scheduler).

    The history reader asks for the gauges at the full step and the counters and histograms at a
    coarse one (kvwatch.sources.prometheus.read_history: their increase is what analyze needs),
    so they arrive as separate samples. Each gauge instant gets the cumulative values linearly
    interpolated between the coarse instants around it (exact at the range's ends, where the
    coarse points land): the workload's deltas stay exact, per-interval rates are smoothed.
    """
    if not timelines:
        return SimulationEvidence()
    if len(timelines) > 1:
        return SimulationEvidence((), f"{len(timelines)} engines in the history: the simulator replays one scheduler")
    rows = [(t, s) for t, s in timelines[0][1] if t is not None]
    fine = [(t, s) for t, s in rows if s.running is not None or s.waiting is not None]
    coarse = [(t, s) for t, s in rows if s.request_prompt_tokens is not None or s.generation_tokens_total is not None]
    points = []
    for t, sample in fine:
        merged = _with_counters(sample, t, coarse) if coarse else sample
        # No iteration histogram in the history: steps from the decodes (calibrate's rule).
        timing = TimingSeries(generation_tokens=merged.generation_tokens_total)
        point = evidence_point(t, MetricsSnapshot(engines=(merged,)), timing)
        if point is not None:
            points.append(point)
    return _enough(points)


_COUNTERS = ("generation_tokens_total", "prompt_tokens_total", "prefix_cache_queries_total", "prefix_cache_hits_total")
_HISTOGRAMS = ("request_prompt_tokens", "request_generation_tokens")


def _with_counters(sample: EngineSample, t: float, coarse: list[tuple[float, EngineSample]]) -> EngineSample:
    """``sample`` with each counter and histogram count/sum interpolated at ``t`` from ``coarse``."""
    i = bisect.bisect_right([c[0] for c in coarse], t)
    before = coarse[max(0, i - 1)]
    after = coarse[min(i, len(coarse) - 1)]
    if before[0] > t:  # t precedes every coarse point: the first one's values
        after = before
    w = 0.0 if after[0] == before[0] else (t - before[0]) / (after[0] - before[0])

    def lerp(a: float | None, b: float | None) -> float | None:
        if a is None or b is None:
            return a if b is None else b
        return a + (b - a) * min(1.0, max(0.0, w))

    fields: dict[str, Any] = {}
    for name in _COUNTERS:
        if getattr(sample, name) is None:
            fields[name] = lerp(getattr(before[1], name), getattr(after[1], name))
    for name in _HISTOGRAMS:
        a, b = getattr(before[1], name), getattr(after[1], name)
        if getattr(sample, name) is None and (a is not None or b is not None):
            fields[name] = HistogramSummary(
                lerp(a.count if a else None, b.count if b else None),
                lerp(a.sum if a else None, b.sum if b else None),
                (),
            )
    return replace(sample, **fields)


def _enough(points: list[EvidencePoint]) -> SimulationEvidence:
    if len(points) < 2:
        return SimulationEvidence((), "fewer than two scrapes with vLLM's gauges: nothing to calibrate on")
    return SimulationEvidence(tuple(rebased(points)), None)


def _brief(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return {
        "mean_waiting": result.get("mean_waiting"),
        "preemptions_per_100_requests": result.get("preemptions_per_100_requests"),
        "e2e_p95_s": (result.get("e2e_s") or {}).get("p95"),
    }


def attach(doc: dict[str, Any], evidence: SimulationEvidence, seed: int = 0) -> None:
    """Add ``simulated`` / ``simulated_why_not`` to each lever row and ``diagnosis.simulation``."""
    diag = doc["diagnosis"]
    if not diag.get("levers"):
        diag["simulation"] = None  # the cause is not the KV pool: no lever to simulate
        return
    rows = [r for r in diag["levers"] if isinstance(r, dict)]
    why_not = evidence.why_not
    observed: dict[str, Any] | None = None
    scenarios: dict[str, Any] = {}
    if why_not is None:
        try:
            obs, scenarios = lever_outcomes(doc, evidence.points, rows, seed=seed)
        except KvwatchError as exc:
            why_not = str(exc)
        else:
            observed = _brief(obs)
    for row in rows:
        sc = scenarios.get(str(row.get("lever")))
        row["simulated"] = _brief(sc.result) if sc is not None else None
        if row["simulated"] is not None:
            row["simulated_why_not"] = None
        else:
            reason = sc.note if sc is not None else "not a lever simulate knows"
            if sc is not None and reason == str(row.get("note") or "") and "needs" not in reason:
                # The row's note says what the lever does, not what sizing it needs: say that.
                reason = "the pool this lever gives is not known (capacity could not size it from the evidence)"
            row["simulated_why_not"] = why_not or reason
    diag["simulation"] = {
        "observed": observed,
        "why_not": why_not,
        "max_load_s": MAX_LOAD_SECONDS,
        "seed": seed,
    }
