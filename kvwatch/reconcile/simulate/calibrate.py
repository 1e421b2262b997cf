"""Engine, workload and step-time model read from the evidence (a log's facts and saved scrapes).

Pure: the command reads the files and hands over an analyze document (the log's facts) and one
``EvidencePoint`` per scrape. Everything here is a reading of what vLLM itself reported:

- engine: blocks, block size, max_num_seqs, max_num_batched_tokens, prefix caching, max_model_len
  from the log's startup lines (the analyze reader's ``capacity`` and ``config``);
- workload: prompt and output sizes as Δsum/Δcount of ``vllm:request_prompt_tokens`` /
  ``vllm:request_generation_tokens``; the shared prefix from Δprefix_cache_hits per first admission;
  arrivals(t) = running + waiting + finished (every request that reached the engine), so the load's
  end is where arrivals stop growing; a closed loop of users = running + waiting while a queue
  exists, else an open loop at arrivals / duration;
- step time: seconds = a·steps + b·prefill tokens + c·decodes + d·context tokens, fitted by
  non-negative least squares over the scrape intervals in which the engine was busy (steps from
  ``vllm:iteration_tokens_total``, decodes from ``vllm:generation_tokens_total``, prefill tokens =
  step tokens - decodes, context tokens ≈ steps x KV blocks in use x block size); an interval that
  ends with the server idle (the drain's last) only bounds the busy time, and no model may need
  longer for it (it is the one interval whose batch shrinks, so it tells a cost per step from a cost
  per sequence: the seed run's steady intervals all carry 4.5-5 sequences per step).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import UnusableInput
from kvwatch.parse.scrapeseries import TimingSeries
from kvwatch.reconcile.simulate.engine import EngineConfig, StepTime, Workload, simulate
from kvwatch.reconcile.simulate.rules import V0_32_0, SchedulerRules
from kvwatch.reconcile.simulate.sizes import SizeDist, from_buckets
from kvwatch.records import MetricsSnapshot

# vLLM's own defaults where a log does not print a setting (vllm/config/scheduler.py 0.32.0:
# max_num_seqs 256 on CPU/GPU usage contexts; V1 enables prefix caching by default).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class EvidencePoint:
    """What one scrape says, reduced to what calibration reads; ``t`` in seconds since the load began."""

    t: float
    running: float
    waiting: float
    kv_usage: float | None
    preemptions: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    prompt_count: float | None
    prompt_sum: float | None
    gen_count: float | None
    gen_sum: float | None
    timing: TimingSeries
    # cumulative (le, count) of vllm:request_prompt_tokens / _generation_tokens, engines summed
    prompt_buckets: tuple[tuple[float, float], ...] = ()
    gen_buckets: tuple[tuple[float, float], ...] = ()


def evidence_point(t: float, snap: MetricsSnapshot, timing: TimingSeries) -> EvidencePoint | None:
    """One scrape's point: the engines of one server summed (None if the scrape has no vLLM gauges)."""
    engines = snap.engines
    if not engines or all(e.running is None and e.waiting is None for e in engines):
        return None

    def total(attr: str) -> float | None:
        vals = [getattr(e, attr) for e in engines if getattr(e, attr) is not None]
        return sum(vals) if vals else None

    def hist(attr: str, part: str) -> float | None:
        vals = [getattr(getattr(e, attr), part) for e in engines if getattr(e, attr) is not None]
        vals = [v for v in vals if v is not None]
        return sum(vals) if vals else None

    def buckets(attr: str) -> tuple[tuple[float, float], ...]:
        layouts = [getattr(e, attr).buckets for e in engines if getattr(e, attr) is not None]
        layouts = [b for b in layouts if b]
        if not layouts or any([le for le, _c in b] != [le for le, _c in layouts[0]] for b in layouts):
            return ()
        return tuple((le, sum(b[i][1] for b in layouts)) for i, (le, _c) in enumerate(layouts[0]))

    usages = [e.kv_usage_ratio for e in engines if e.kv_usage_ratio is not None]
    return EvidencePoint(
        t=t,
        running=total("running") or 0.0,
        waiting=total("waiting") or 0.0,
        kv_usage=statistics.fmean(usages) if usages else None,
        preemptions=total("preemptions_total"),
        prefix_queries=total("prefix_cache_queries_total"),
        prefix_hits=total("prefix_cache_hits_total"),
        prompt_count=hist("request_prompt_tokens", "count"),
        prompt_sum=hist("request_prompt_tokens", "sum"),
        gen_count=hist("request_generation_tokens", "count"),
        gen_sum=hist("request_generation_tokens", "sum"),
        timing=timing,
        prompt_buckets=buckets("request_prompt_tokens"),
        gen_buckets=buckets("request_generation_tokens"),
    )


@dataclass(frozen=True, slots=True)
class Observed:
    """The run itself as its scrapes state it (what the calibration replay is compared with)."""

    requests_sent: int
    preemptions: int | None
    max_running: int
    mean_running: float
    mean_waiting: float
    prefix_hit_pct: float | None
    drain_end_s: float | None
    load_end_s: float
    sample_at: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Calibration:
    """Everything read from the evidence."""

    engine: EngineConfig
    workload: Workload
    step_time: StepTime
    observed: Observed
    vllm_version: str | None
    sources: tuple[str, ...]  # one short phrase per reading, for the output


def _pos(x: Any) -> int | None:
    if isinstance(x, bool) or x is None:
        return None
    try:
        v = int(x)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def engine_from_facts(doc: Mapping[str, Any], pool_tokens: int | None = None) -> EngineConfig:
    """The engine settings a log's startup lines state (``pool_tokens`` overrides the pool)."""
    cap = doc.get("capacity") or {}
    cfg = doc.get("config") or {}
    bs = _pos(cap.get("block_size")) or _pos(cfg.get("block_size")) or DEFAULT_BLOCK_SIZE
    blocks = _pos(cap.get("gpu_blocks"))
    if blocks is None and _pos(cap.get("kv_cache_tokens")):
        blocks = int(cap["kv_cache_tokens"]) // bs
    if pool_tokens is not None:
        if pool_tokens <= 0:
            raise UnusableInput(
                f"--pool-tokens {pool_tokens}: a KV pool of 0 tokens holds no request; give a positive size"
            )
        blocks = pool_tokens // bs
    if blocks is None:
        raise UnusableInput(
            "the evidence states no KV pool (no 'KV cache size' / 'num_gpu_blocks' line); pass --pool-tokens N"
        )
    if blocks < 2:
        raise UnusableInput(
            f"a KV pool of {blocks} block(s) holds no request (vLLM keeps one null block); "
            "vLLM refuses to start with it"
        )
    max_len = _pos(cfg.get("max_seq_len")) or _pos((cap.get("max_concurrency") or {}).get("tokens_per_request"))
    prefix = cfg.get("enable_prefix_caching")
    return EngineConfig(
        blocks=blocks,
        block_size=bs,
        max_num_seqs=_pos(cfg.get("max_num_seqs")) or DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens=_pos(cfg.get("max_num_batched_tokens")) or 8192,
        prefix_caching=True if prefix is None else bool(prefix),
        max_model_len=max_len or blocks * bs,
    )


def _delta(points: Sequence[EvidencePoint], attr: str) -> float | None:
    vals = [getattr(p, attr) for p in points if getattr(p, attr) is not None]
    return vals[-1] - vals[0] if len(vals) >= 2 else None


def _arrivals(p: EvidencePoint) -> float | None:
    fin = p.timing.finished if p.timing.finished is not None else p.gen_count
    return None if fin is None else p.running + p.waiting + fin


def workload_from_points(points: Sequence[EvidencePoint], engine: EngineConfig) -> tuple[Workload, list[str]]:
    """The workload the scrapes imply (see the module docstring), and how each number was read."""
    why: list[str] = []
    d_count = _delta(points, "prompt_count")
    d_sum = _delta(points, "prompt_sum")
    g_count = _delta(points, "gen_count")
    g_sum = _delta(points, "gen_sum")
    if not d_count or d_sum is None or not g_count or g_sum is None:
        raise UnusableInput(
            "the scrapes show no finished request (vllm:request_prompt_tokens did not grow); "
            "give scrapes spanning the load, or --prompt-tokens and --output-tokens"
        )
    prompt = round(d_sum / d_count)
    output = round(g_sum / g_count)
    why.append(f"prompt {prompt:,} / output {output:,} tokens = Δsum/Δcount of the request histograms")
    dists = _size_dists(points, engine)
    for name, dist in zip(("prompt", "output"), dists, strict=True):
        if dist is not None:
            why.append(
                f"{name} sizes drawn from the histogram's {len(dist.pieces)} filled buckets "
                f"({dist.low:,}-{dist.high:,} tokens, uniform within each, kept to the mean)"
            )

    shared = 0
    dq, dh = _delta(points, "prefix_queries"), _delta(points, "prefix_hits")
    if engine.prefix_caching and dq and dh:
        admissions = dq / prompt  # queries count num_tokens of first admissions only
        if admissions > 1:
            # The first request of a prefix misses; each later one hits the shared full blocks.
            per_hit = dh / (admissions - 1)
            shared = round(per_hit / engine.block_size) * engine.block_size
            why.append(f"shared prefix {shared:,} tokens = Δhits per later admission, in whole blocks")

    arrivals = [(p.t, a) for p in points if (a := _arrivals(p)) is not None]
    total = arrivals[-1][1] if arrivals else d_count
    load_end, complete_at = _load_end(points)
    # In a closed loop each user has one request out at a time, so running + waiting never exceeds
    # the users, and while requests wait it stays there: an answer's user sends again at once (only
    # the answers on their way back are missing). An open loop's arrivals do not wait for answers
    # (vllm bench serve draws Poisson gaps up front: benchmarks/serve.py get_request), so the count
    # climbs while they outpace the engine and falls when they don't. A steady count is a closed loop.
    # "Steady" allows a few answers on their way back at a scrape instant (the count dips below the
    # users now and then: the prefix run reads 20, 20, 20, 19, 20, 18, 20, 17, ...); an open loop's
    # count passes its peak once (the open-loop run: 7, 13, 14, 23, 29, 38, 42, 38, ...).
    queued = [p.running + p.waiting for p in points if p.waiting >= 1 and p.t <= load_end]
    slack = max(2.0, 0.1 * max(queued)) if queued else 0.0
    at_ceiling = sum(1 for q in queued if max(queued) - q <= slack)
    if len(queued) >= 2 and 2 * at_ceiling >= len(queued) + 1:
        users = round(max(queued))
        why.append(f"closed loop of {users} users = most running + waiting while requests waited (steady)")
        end = _closed_loop_end(arrivals, load_end, complete_at)
        why.append(
            f"no new request after {end:.0f} s = where the arrivals' steady rate reaches their total, "
            f"between the scrapes at {load_end:.0f} and {complete_at:.0f} s"
        )
        wl = Workload("closed", users, None, prompt, output, shared, end)
        return replace(wl, prompt_dist=dists[0], output_dist=dists[1]), why
    # Open: the first arrival came between the last scrape that saw none and the next, the last one
    # between load_end and the scrape that saw them all; midpoints of both gaps bound the sending.
    base = arrivals[0][1] if arrivals else 0.0
    start = 0.0
    for (t0, a0), (t1, a1) in itertools.pairwise(arrivals):
        if a0 <= base < a1:
            start = (t0 + t1) / 2
            break
    end = (load_end + complete_at) / 2 if complete_at > load_end else load_end
    sent = round(total - base)
    rate = sent / (end - start) if end > start else 0.0
    seen = f"the count in the engine ranged {min(queued):.0f}-{max(queued):.0f}" if queued else "no queue seen"
    why.append(f"open loop at {rate:.3g} req/s = {sent} arrivals over {start:.0f}-{end:.0f} s ({seen})")
    # An open-loop client sends a number of requests (vllm bench serve --num-prompts), not for a
    # time: the replay sends the run's count at the rate, however long its Poisson draw takes.
    why.append(f"{sent} requests in all = the arrivals the scrapes saw")
    last = points[-1].t
    wl = Workload("open", None, rate, prompt, output, shared, last, max_requests=sent or None, start_s=start)
    return replace(wl, prompt_dist=dists[0], output_dist=dists[1]), why


def _closed_loop_end(arrivals: Sequence[tuple[float, float]], load_end: float, complete_at: float) -> float:
    """When a closed loop stopped sending: its arrivals grow at a steady rate (one per answer) until
    then, so the end is where that rate, carried on from the last scrape short of the total, reaches
    the total, held inside the scrape gap where the count stopped. The first scrape's jump (every
    user's first request at once) is left out of the rate."""
    if complete_at <= load_end or len(arrivals) < 2:
        return load_end
    total = arrivals[-1][1]
    before = [(t, a) for t, a in arrivals if t <= load_end]
    first = next(((t, a) for t, a in before if a > 0), None)
    if first is None or len(before) < 2 or load_end <= first[0]:
        return load_end
    a_end = before[-1][1]
    rate = (a_end - first[1]) / (load_end - first[0])
    if rate <= 0:
        return load_end
    return min(complete_at, load_end + (total - a_end) / rate)


def _size_dists(points: Sequence[EvidencePoint], engine: EngineConfig) -> tuple[SizeDist | None, SizeDist | None]:
    """The spread of prompt and output sizes the histograms show over the run (None: no spread)."""
    cap = engine.max_model_len - 1  # vLLM refuses longer prompts; outputs are held per request
    out: list[SizeDist | None] = []
    for attr, part in (("prompt_buckets", "prompt"), ("gen_buckets", "gen")):
        filled = [p for p in points if getattr(p, attr)]
        if len(filled) < 2:
            out.append(None)
            continue
        a, b = filled[0], filled[-1]
        # The same two scrapes' Δsum/Δcount: the mean a uniform draw per bucket would miss.
        s0, s1 = getattr(a, f"{part}_sum"), getattr(b, f"{part}_sum")
        c0, c1 = getattr(a, f"{part}_count"), getattr(b, f"{part}_count")
        mean = (s1 - s0) / (c1 - c0) if None not in (s0, s1, c0, c1) and c1 > c0 else None
        out.append(from_buckets(getattr(a, attr), getattr(b, attr), cap, mean))
    return out[0], out[1]


def _load_end(points: Sequence[EvidencePoint]) -> tuple[float, float]:
    """(the last scrape that had not seen every arrival yet, the first that had): the load ended between."""
    arrivals = [(p.t, a) for p in points if (a := _arrivals(p)) is not None]
    if not arrivals:
        return points[-1].t, points[-1].t
    total = arrivals[-1][1]
    for (t0, a0), (t1, a1) in itertools.pairwise(arrivals):
        if a0 < total <= a1:
            return t0, t1
    return points[-1].t, points[-1].t


def _solve(rows: list[list[float]], ys: list[float], cols: tuple[int, ...]) -> list[float] | None:
    n = len(cols)
    a = [[sum(r[i] * r[j] for r in rows) for j in cols] for i in cols]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in cols]
    # Gaussian elimination with partial pivoting (4 unknowns at most).
    for k in range(n):
        piv = max(range(k, n), key=lambda i: abs(a[i][k]))
        if abs(a[piv][k]) < 1e-300:
            return None
        a[k], a[piv] = a[piv], a[k]
        b[k], b[piv] = b[piv], b[k]
        for i in range(k + 1, n):
            f = a[i][k] / a[k][k]
            for j in range(k, n):
                a[i][j] -= f * a[k][j]
            b[i] -= f * b[k]
    x = [0.0] * n
    for k in reversed(range(n)):
        x[k] = (b[k] - sum(a[k][j] * x[j] for j in range(k + 1, n))) / a[k][k]
    return x


def nnls(rows: list[list[float]], ys: list[float], bounds: Sequence[tuple[list[float], float]] = ()) -> list[float]:
    """Non-negative least squares over every subset of columns, the subset chosen by BIC.

    In a steady run steps, tokens and context grow together from interval to interval, so several
    subsets fit almost equally well and the full one splits the time arbitrarily (a run of pure
    decode steps "explained" by prefill tokens). The Bayesian information criterion,
    n ln(RSS / n) + k ln(n), keeps a term only when the data need it.

    ``bounds``: (row, seconds) of intervals in which the engine was busy for *at most* that long
    (the server went idle before the interval ended). A subset whose model needs longer for one of
    them is refused, whatever its BIC: it contradicts what the engine did. When every subset does,
    the bounds are ignored rather than leave no model.
    """
    if bounds:
        unbounded = nnls(rows, ys, ())
        if all(sum(r[j] * unbounded[j] for j in range(len(r))) <= limit for r, limit in bounds):
            return unbounded
    m = len(rows[0])
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(m)]
    scaled = [[r[j] / scale[j] for j in range(m)] for r in rows]
    best: tuple[float, list[float]] | None = None
    for k in range(1, m + 1):
        for cols in itertools.combinations(range(m), k):
            x = _solve(scaled, ys, cols)
            if x is None or any(v < 0 for v in x):
                continue
            full = [0.0] * m
            for c, v in zip(cols, x, strict=True):
                full[c] = v
            if any(sum(r[j] * full[j] / scale[j] for j in range(m)) > limit for r, limit in bounds):
                continue
            err = sum((sum(r[j] * full[j] for j in range(m)) - y) ** 2 for r, y in zip(scaled, ys, strict=True))
            n = len(ys)
            bic = n * math.log(max(err, 1e-300) / n) + k * math.log(n)
            if best is None or bic < best[0] - 1e-9:
                best = (bic, full)
    if best is None:
        return nnls(rows, ys, ()) if bounds else [0.0] * m
    return [v / scale[j] for j, v in enumerate(best[1])]


def step_time_from_points(points: Sequence[EvidencePoint], engine: EngineConfig) -> tuple[StepTime, str]:
    """Fit the step-time model over the busy scrape intervals (see the module docstring)."""
    rows: list[list[float]] = []
    ys: list[float] = []
    bounds: list[tuple[list[float], float]] = []
    held_tokens = (engine.blocks - 1) * engine.block_size
    for p, q in itertools.pairwise(points):
        dt = q.t - p.t
        if dt <= 0 or p.running + p.waiting <= 0:
            continue
        # An interval that ends idle (the drain's last) was busy for an unknown part of dt: not a
        # timing, but an upper bound. It is the one interval where the batch shrinks to nothing,
        # so it tells a per-step cost from a per-sequence one, which the steady intervals
        # (always about the same batch) cannot.
        idle_at_end = q.running <= 0 and q.waiting <= 0
        steps = _d(p.timing.steps, q.timing.steps)
        tokens = _d(p.timing.step_tokens, q.timing.step_tokens)
        gen = _d(p.timing.generation_tokens, q.timing.generation_tokens)
        if gen is None:
            continue
        if steps is None or tokens is None:
            # Releases without the iteration histogram: one decode per running request per step.
            steps = gen / max(1.0, (p.running + q.running) / 2)
            prefill = max(0.0, (_d(p.prompt_sum, q.prompt_sum) or 0.0))
        else:
            prefill = max(0.0, tokens - gen)
        if steps <= 0:
            continue
        usage = (
            statistics.fmean(u for u in (p.kv_usage, q.kv_usage) if u is not None)
            if (p.kv_usage is not None or q.kv_usage is not None)
            else 0.0
        )
        row = [steps, prefill, gen, steps * usage * held_tokens]
        if idle_at_end:
            bounds.append((row, dt))
        elif q.running > 0:
            rows.append(row)
            ys.append(dt)
    if len(rows) < 2:
        raise UnusableInput(
            "the scrapes have fewer than two busy intervals to time the engine by; "
            "give the scrapes saved during the load (e.g. every 10 s)"
        )
    a, b, c, d = nnls(rows, ys, bounds)
    how = f"step time fitted over {len(rows)} busy scrape intervals"
    if bounds:
        how += f", no longer than the {len(bounds)} that ended idle"
    return StepTime(a, b, c, d), how


def _d(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def observed_from_points(points: Sequence[EvidencePoint], load_end: float) -> Observed:
    """The run as its scrapes report it."""
    first, last = points[0], points[-1]
    arrivals = _arrivals(last)
    sent = round(arrivals - (_arrivals(first) or 0.0)) if arrivals is not None else 0
    pre = None
    if first.preemptions is not None and last.preemptions is not None:
        pre = round(last.preemptions - first.preemptions)
    hit = None
    dq, dh = _delta(points, "prefix_queries"), _delta(points, "prefix_hits")
    if dq:
        hit = 100.0 * (dh or 0.0) / dq
    drained = [p.t for p in points if p.running == 0 and p.waiting == 0 and p.t > load_end]
    return Observed(
        requests_sent=sent,
        preemptions=pre,
        max_running=int(max(p.running for p in points)),
        mean_running=statistics.fmean(p.running for p in points),
        mean_waiting=statistics.fmean(p.waiting for p in points),
        prefix_hit_pct=hit,
        drain_end_s=drained[0] if drained else None,
        load_end_s=load_end,
        sample_at=tuple(p.t for p in points),
    )


def _scaled(step: StepTime, k: float) -> StepTime:
    return StepTime(
        step.per_step_s * k, step.per_prefill_token_s * k, step.per_decode_s * k, step.per_context_token_s * k
    )


def _match_closed_loop_throughput(
    engine: EngineConfig, workload: Workload, step: StepTime, rules: SchedulerRules, observed: Observed
) -> tuple[StepTime, bool]:
    """The step time scaled so a closed loop's replay sends as many requests as the run did.

    In a closed loop every answer sends the next request, so the requests sent over the load are
    its throughput; the drain hardly tells the speed (a faster engine answers more, and so has more
    in flight at the load's end: on the seed run's evidence a 10 % faster step moves the drain by
    under 1 %, and the requests by 10 %). The scale is bisected in [0.7, 1.4] of the drain-scaled
    model, and kept only when the bracket holds the run's count.
    """
    want = observed.requests_sent

    def sent(k: float) -> int:
        return simulate(engine, workload, _scaled(step, k), rules, sample_at=observed.sample_at).sent

    lo, hi = 0.7, 1.4  # a larger k is a slower engine: fewer requests
    at_one = sent(1.0)
    if abs(at_one - want) <= 0.02 * want:
        return step, False
    if at_one < want:
        hi = 1.0
        if sent(lo) < want:
            return step, False
    else:
        lo = 1.0
        if sent(hi) > want:
            return step, False
    for _ in range(6):
        mid = (lo + hi) / 2
        if sent(mid) < want:
            hi = mid
        else:
            lo = mid
    return _scaled(step, (lo + hi) / 2), True


def calibrate(
    doc: Mapping[str, Any],
    points: Sequence[EvidencePoint],
    pool_tokens: int | None = None,
    rules: SchedulerRules = V0_32_0,
) -> Calibration:
    """Engine, workload, step time and the observed run from a log's facts and its scrapes.

    The interval fit is noisy on a shared machine (steps, tokens and context move together), so
    the fitted model is then scaled as a whole until the replay drains when the run drained: the
    run's own drain is the one figure that integrates every step of it. A closed loop is then
    scaled again until it sends the run's requests (``_match_closed_loop_throughput``): its drain
    barely depends on the speed, its request count does.
    """
    if len(points) < 2:
        raise UnusableInput(
            "simulate needs at least two saved /metrics scrapes of the run (the log alone states no request "
            "sizes); give the scrapes, or --prompt-tokens, --output-tokens and --users/--rate"
        )
    pts = sorted(points, key=lambda p: p.t)
    engine = engine_from_facts(doc, pool_tokens)
    workload, why = workload_from_points(pts, engine)
    step, how = step_time_from_points(pts, engine)
    observed = observed_from_points(pts, _load_end(pts)[0])
    drain = observed.drain_end_s
    if drain:
        for _ in range(2):
            replay = simulate(engine, workload, step, rules, sample_at=observed.sample_at)
            if replay.end_s <= 0:
                break
            k = min(2.0, max(0.5, drain / replay.end_s))
            step = _scaled(step, k)
        how += f"; scaled so the replay drains at {drain:.0f} s as the run did"
    if workload.kind == "closed" and observed.requests_sent > 0:
        step, matched = _match_closed_loop_throughput(engine, workload, step, rules, observed)
        if matched:
            how += f", then so it answers the run's {observed.requests_sent} requests"
    version = (doc.get("config") or {}).get("vllm_version")
    return Calibration(engine, workload, step, observed, version, (*why, how))
