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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import KvwatchError
from kvwatch.parse.scrapeseries import read_timing, scraped_at
from kvwatch.reconcile.simulate.calibrate import EvidencePoint, evidence_point
from kvwatch.reconcile.simulate.whatif import MAX_LOAD_SECONDS, lever_outcomes, rebased
from kvwatch.records import EngineSample, MetricsSnapshot, TimingSeries

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


def from_history(
    timelines: Sequence[tuple[str | None, Sequence[tuple[float | None, EngineSample]]]],
) -> SimulationEvidence:
    """Prometheus history as (engine, [(t, sample)]) per timeline; one engine only (the timing
    counters are server-wide; several engines' sums are not one scheduler)."""
    if not timelines:
        return SimulationEvidence()
    if len(timelines) > 1:
        return SimulationEvidence((), f"{len(timelines)} engines in the history: the simulator replays one scheduler")
    points = []
    for t, sample in timelines[0][1]:
        if t is None:
            continue
        # Prometheus history has no iteration histogram query: steps from the decodes (calibrate's rule).
        timing = TimingSeries(generation_tokens=sample.generation_tokens_total)
        point = evidence_point(t, MetricsSnapshot(engines=(sample,)), timing)
        if point is not None:
            points.append(point)
    return _enough(points)


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
