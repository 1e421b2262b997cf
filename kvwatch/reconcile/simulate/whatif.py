"""The what-if outcomes of a window of live evidence: the sidecar's ``kvwatch_whatif_*`` gauges.

Pure. The same path ``kvwatch simulate EVIDENCE...`` takes with no workload flag (calibration on
the scrapes, the observed workload, then each ``capacity`` lever), on what the sidecar has kept:
the server's facts (log startup lines and ``vllm:cache_config_info``) and one ``EvidencePoint`` per
scrape of the window. Instants are rebased to the window's first scrape: a live server's load has
no known start, so the window's start is the load's.

CPU is bounded (the sidecar runs this in the background once a minute, kvwatch.sidecar): the load
is at most ``MAX_LOAD_SECONDS`` and no scenario simulates more than ``MAX_SIM_SECONDS``
(benchmarks/whatif_cost.py measures the cost).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import UnusableInput
from kvwatch.reconcile.facts import ServerFacts
from kvwatch.reconcile.simulate.calibrate import EvidencePoint, calibrate
from kvwatch.reconcile.simulate.rules import rules_for
from kvwatch.reconcile.simulate.scenarios import Scenario, fits, lever_scenarios, run

#: The longest load simulated (the window's last 5 minutes of arrivals): a 256-sequence server
#: steps ~20,000 times a simulated minute-and-a-bit, so a 10-minute window cost twice the CPU for
#: means that a 5-minute one already settles (benchmarks/whatif_cost.py).
MAX_LOAD_SECONDS = 300.0
#: No scenario simulates past this (a lever that livelocks, a queue that never drains).
MAX_SIM_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class WhatifOutcome:
    """One scenario's simulated outcome: "observed" or a capacity lever."""

    lever: str
    waiting: float
    preemptions_per_100_requests: float | None


def facts_document(facts: ServerFacts) -> dict[str, Any]:
    """The analyze-document sections calibration and the levers read, from the live facts.

    Without a log, the pool and prefix caching from ``vllm:cache_config_info`` (as simulate does).
    """
    capacity = facts.capacity_section()
    config = facts.config_section()
    if capacity.get("gpu_blocks") is None and facts.metric("num_gpu_blocks") is not None:
        capacity["gpu_blocks"] = facts.metric("num_gpu_blocks")
        capacity["block_size"] = capacity.get("block_size") or facts.metric("block_size")
    if config.get("enable_prefix_caching") is None and facts.metric("enable_prefix_caching") is not None:
        config["enable_prefix_caching"] = facts.metric("enable_prefix_caching")
    return {"capacity": capacity, "config": config}


def rebased(points: Sequence[EvidencePoint]) -> list[EvidencePoint]:
    """The points in time order, instants in seconds since the first."""
    pts = sorted(points, key=lambda p: p.t)
    if not pts:
        return []
    t0 = pts[0].t
    return [replace(p, t=p.t - t0) for p in pts]


def _scenarios(
    doc: Mapping[str, Any],
    points: Sequence[EvidencePoint],
    arch: Any,
    rows: Sequence[Mapping[str, Any]] | None,
    *,
    seed: int,
    max_load_s: float | None,
    max_sim_s: float | None,
) -> tuple[dict[str, Any], list[Scenario]]:
    from kvwatch.reconcile.capacity import RequestShape, levers_for_analysis

    if len(points) < 2:
        raise UnusableInput("fewer than two scrapes to calibrate on")
    version = (doc.get("config") or {}).get("vllm_version")
    rules = rules_for(version if isinstance(version, str) else None, from_flag=False).rules
    cal = calibrate(doc, points, rules=rules)
    engine, workload, step = cal.engine, cal.workload, cal.step_time
    if max_load_s is not None and workload.duration_s > max_load_s:
        workload = replace(workload, duration_s=max_load_s)
    problem = fits(engine, workload)
    if problem is not None:
        raise UnusableInput(problem)
    gaps = [b - a for a, b in zip(cal.observed.sample_at, cal.observed.sample_at[1:], strict=False) if b > a]
    every = statistics.median(gaps) if gaps else 10.0
    observed = run(
        engine, workload, step, rules, sample_every_s=every, time_weighted=False, seed=seed, max_sim_s=max_sim_s
    )
    if rows is None:
        shape = RequestShape(workload.prompt_tokens, workload.output_tokens, workload.shared_prefix_tokens)
        rows = levers_for_analysis(doc, arch, shape)
    levers = lever_scenarios(
        engine,
        workload,
        step,
        rules,
        rows,
        only=None,
        sample_every_s=every,
        time_weighted=False,
        seed=seed,
        max_sim_s=max_sim_s,
    )
    return observed, levers


def scenario_results(
    doc: Mapping[str, Any],
    points: Sequence[EvidencePoint],
    arch: Any = None,
    *,
    seed: int = 0,
    max_load_s: float | None = None,
    max_sim_s: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Scenario name -> ``kvwatch.simulate/1`` result, for the scenarios that can be simulated.

    ``points`` are in seconds since the load began (``rebased`` for a live window). Raises
    UnusableInput when the evidence cannot calibrate (too few scrapes, no finished request, no
    pool): the caller shows nothing rather than a guess.
    """
    observed, levers = _scenarios(doc, points, arch, None, seed=seed, max_load_s=max_load_s, max_sim_s=max_sim_s)
    out = {"observed": observed}
    out.update({s.name: s.result for s in levers if s.result is not None})
    return out


def lever_outcomes(
    doc: Mapping[str, Any], points: Sequence[EvidencePoint], rows: Sequence[Mapping[str, Any]], *, seed: int = 0
) -> tuple[dict[str, Any], dict[str, Scenario]]:
    """The observed scenario's result and one simulated ``Scenario`` per lever row given (by name).

    The rows are the caller's (analyze's diagnosis levers), so each outcome belongs to the row it
    is shown beside; a row simulate cannot simulate has ``result`` None and a note saying why.
    """
    observed, levers = _scenarios(
        doc, points, None, rows, seed=seed, max_load_s=MAX_LOAD_SECONDS, max_sim_s=MAX_SIM_SECONDS
    )
    return observed, {s.name: s for s in levers}


def outcomes(
    facts: ServerFacts, points: Sequence[EvidencePoint], arch: Any = None, *, seed: int = 0
) -> tuple[WhatifOutcome, ...]:
    """The live window's what-ifs: mean waiting and preemptions per 100 requests per scenario."""
    results = scenario_results(
        facts_document(facts),
        rebased(points),
        arch,
        seed=seed,
        max_load_s=MAX_LOAD_SECONDS,
        max_sim_s=MAX_SIM_SECONDS,
    )
    out = []
    for name, r in results.items():
        waiting = r.get("mean_waiting")
        if isinstance(waiting, int | float):
            pre = r.get("preemptions_per_100_requests")
            out.append(WhatifOutcome(name, float(waiting), float(pre) if isinstance(pre, int | float) else None))
    return tuple(out)
