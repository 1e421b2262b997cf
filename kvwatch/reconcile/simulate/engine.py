"""A step-level replay of vLLM's V1 scheduler over a synthetic workload (pure: no clock, no I/O).

One loop iteration is one engine step of vllm/v1/core/sched/scheduler.py ``Scheduler.schedule()``
followed by ``Scheduler.update_from_output()`` (0.32.0), with the switches of ``rules.py``:

1. one token budget per step (``max_num_batched_tokens``);
2. running requests first, in list order: a decode asks for 1 token, a prefill for the rest of its
   prompt capped by the budget (chunked prefill);
3. ``KVCacheManager.allocate_slots``: cdiv(computed + new, block_size) blocks in all; when short,
   the victim (``self.running.pop()``, the newest) is preempted again and again until it fits; if the
   victim is the request itself, the running loop stops for this step;
4. ``_preempt_request``: blocks freed, computed tokens 0, to the head of the waiting queue;
5. waiting requests are admitted only if nothing was preempted in the step, FCFS, head of line,
   while running < max_num_seqs and budget remains; the prefix-cache hit (capped at
   num_tokens - 1) is looked up for every request whose computed count is 0, resumed ones too;
6. the full-sequence gate: free blocks must cover cdiv(num_tokens, block_size) minus hit blocks
   plus evictable hit blocks (``get_num_blocks_to_allocate``) plus the watermark.

What vLLM reports is reproduced the way vLLM reports it: gauges are the state after a step, read
at the evidence's scrape instants; a preemption reaches the counter with the victim's next token
(v1/metrics/stats.py ``update_from_events``); prefix queries/hits count first admissions only.

Memory stays flat in the simulated duration: finished requests leave nothing behind but counters
and fixed-size latency histograms.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvwatch.reconcile.simulate.blockpool import BlockPool
from kvwatch.reconcile.simulate.rules import SchedulerRules
from kvwatch.reconcile.simulate.sizes import SizeDist


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine settings the scheduler's decisions depend on."""

    blocks: int  # num_gpu_blocks, including vLLM's null block
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefix_caching: bool
    max_model_len: int

    @property
    def pool_tokens(self) -> int:
        """What vLLM's "KV cache size: N tokens" line prints: blocks x block_size."""
        return self.blocks * self.block_size


@dataclass(frozen=True, slots=True)
class Workload:
    """Who sends what: a closed loop of ``users`` (each sends again as soon as an answer returns) or
    an open loop at ``rate_per_s`` (Poisson) from ``start_s``; no new request after ``duration_s``
    (both seconds on the evidence's clock). Every request has ``prompt_tokens`` + ``output_tokens``
    unless ``prompt_dist`` / ``output_dist`` give a spread to draw each request's sizes from."""

    kind: str  # "closed" | "open"
    users: int | None
    rate_per_s: float | None
    prompt_tokens: int
    output_tokens: int
    shared_prefix_tokens: int
    duration_s: float
    max_requests: int | None = None
    start_s: float = 0.0
    prompt_dist: SizeDist | None = None
    output_dist: SizeDist | None = None


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds one engine step takes: fixed + per prefill token + per decode + per context token."""

    per_step_s: float
    per_prefill_token_s: float
    per_decode_s: float
    per_context_token_s: float

    def of(self, prefill_tokens: int, decodes: int, context_tokens: int) -> float:
        """The step time of one step with these totals."""
        return (
            self.per_step_s
            + self.per_prefill_token_s * prefill_tokens
            + self.per_decode_s * decodes
            + self.per_context_token_s * context_tokens
        )


@dataclass(frozen=True, slots=True)
class Sample:
    """vLLM's gauges and counters as a scrape at ``t`` would read them."""

    t: float
    running: int
    waiting: int
    kv_usage: float
    preemptions: int
    finished: int
    sent: int


class LatencyHistogram:
    """Fixed log-spaced buckets (2 % wide, 1 ms .. 1e6 s): p95 within 2 % and memory flat."""

    __slots__ = ("counts", "n", "total")
    _LO = 1e-3
    _RATIO = math.log(1.02)
    _N = 1100

    def __init__(self) -> None:
        self.counts = [0] * self._N
        self.n = 0
        self.total = 0.0

    def add(self, x: float) -> None:
        """Record one value."""
        i = 0 if x <= self._LO else min(self._N - 1, 1 + int(math.log(x / self._LO) / self._RATIO))
        self.counts[i] += 1
        self.n += 1
        self.total += x

    def mean(self) -> float | None:
        """The exact mean (the sum is kept exactly)."""
        return self.total / self.n if self.n else None

    def quantile(self, q: float) -> float | None:
        """The bucket's upper edge where the cumulative count reaches q."""
        if not self.n:
            return None
        want = q * self.n
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= want:
                return self._LO * math.exp(self._RATIO * i)
        return None


@dataclass
class SimResult:
    """What one simulation produced (the command renders it as a kvwatch.simulate/1 result)."""

    sent: int = 0
    finished: int = 0
    preemptions: int = 0  # as vllm:num_preemptions_total counts them (on the victim's next token)
    preemption_events: int = 0  # as the scheduler made them
    max_running: int = 0
    samples: list[Sample] = field(default_factory=list)
    prefix_queries: int = 0
    prefix_hits: int = 0
    ttft: LatencyHistogram = field(default_factory=LatencyHistogram)
    e2e: LatencyHistogram = field(default_factory=LatencyHistogram)
    generated_tokens: int = 0
    computed_prompt_tokens: int = 0
    steps: int = 0
    end_s: float = 0.0  # when the last request finished (the drain's end)
    last_send_s: float = 0.0
    running_time_integral: float = 0.0
    waiting_time_integral: float = 0.0


class _Req:
    __slots__ = (
        "arrival",
        "blocks",
        "computed",
        "first_token",
        "hashed",
        "num_output",
        "output",
        "pending_report",
        "preemptions",
        "prefix_blocks",
        "prompt",
        "refused_at",
        "rid",
    )

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, prefix_blocks: int) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.prefix_blocks = prefix_blocks  # full blocks wholly inside the shared prefix
        self.num_output = 0
        self.computed = 0
        self.blocks: list[int] = []
        self.hashed = 0  # how many of self.blocks carry a hash
        self.preemptions = 0
        self.pending_report = 0
        self.first_token = False
        self.refused_at = -1  # pool.releases when admission was last refused

    def key(self, j: int) -> int:
        # vLLM's chained block hash: equal iff every token up to the block's end is equal. Blocks
        # wholly inside the shared prefix are the same for every request (key j); any later block
        # follows a random suffix, so it is this request's own ((rid + 1) << 24 | j; a request has
        # fewer than 2**24 blocks).
        return j if j < self.prefix_blocks else ((self.rid + 1) << 24) | j


def simulate(
    engine: EngineConfig,
    workload: Workload,
    step_time: StepTime,
    rules: SchedulerRules,
    *,
    sample_at: Sequence[float] | None = None,
    sample_every_s: float = 10.0,
    seed: int = 0,
    max_sim_s: float | None = None,
) -> SimResult:
    """Run the workload through the scheduler until every request sent has finished.

    ``sample_at``: the instants (seconds since the load started) at which to read the gauges, as the
    evidence's scrapes did; without it a grid every ``sample_every_s`` through the drain, plus one
    sample at its end. ``max_sim_s`` bounds a run that would never drain (a livelock).
    """
    bs = engine.block_size
    pool = BlockPool(engine.blocks, engine.prefix_caching)
    caching = engine.prefix_caching
    watermark_blocks = int(rules.watermark * engine.blocks)
    budget_full = engine.max_num_batched_tokens
    max_seqs = engine.max_num_seqs
    max_len = engine.max_model_len
    hit_cap = 1 if rules.hit_cap_minus_one else 0
    rng = random.Random(seed)
    res = SimResult()
    prefix_blocks = workload.shared_prefix_tokens // bs if caching else 0
    # Sizes come from their own generator, so a spread never moves the arrival draws of a seed.
    size_rng = random.Random(f"sizes:{seed}")
    prompt_sampler = workload.prompt_dist.sampler(size_rng) if workload.prompt_dist else None
    output_sampler = workload.output_dist.sampler(size_rng) if workload.output_dist else None

    running: list[_Req] = []
    waiting: deque[_Req] = deque()
    arrivals: list[tuple[float, int]] = []  # (time, tiebreak)
    next_rid = 0
    duration = workload.duration_s
    cap = workload.max_requests

    def can_send(t: float) -> bool:
        return t < duration and (cap is None or res.sent < cap)

    def send(t: float) -> None:
        nonlocal next_rid
        res.sent += 1
        res.last_send_s = max(res.last_send_s, t)
        heapq.heappush(arrivals, (t, next_rid))
        next_rid += 1

    if workload.kind == "closed":
        for _ in range(workload.users or 0):
            if can_send(workload.start_s):
                send(workload.start_s)
    else:
        rate = workload.rate_per_s or 0.0
        if rate > 0:
            t0 = workload.start_s + rng.expovariate(rate)
            if can_send(t0):
                send(t0)

    explicit = sorted(sample_at) if sample_at is not None else None
    si = 0
    next_grid = 0.0
    now = 0.0
    reported = 0
    usable = engine.blocks - 1
    # The gauges as they stand after the last completed step (what a scrape during a step reads).
    st_run = st_wait = st_rep = st_fin = st_sent = 0
    st_free = usable

    def next_sample() -> float:
        if explicit is not None:
            return explicit[si] if si < len(explicit) else math.inf
        return next_grid

    def sample_until(t_end: float) -> float:
        # Every scrape instant before t_end reads the state after the last completed step.
        nonlocal si, next_grid
        usage = 1.0 - st_free / usable
        if explicit is not None:
            while si < len(explicit) and explicit[si] < t_end:
                res.samples.append(Sample(explicit[si], st_run, st_wait, usage, st_rep, st_fin, st_sent))
                si += 1
        else:
            while next_grid < t_end:
                res.samples.append(Sample(next_grid, st_run, st_wait, usage, st_rep, st_fin, st_sent))
                next_grid += sample_every_s
        return next_sample()

    def free_req(r: _Req) -> None:
        # single_type_kv_cache_manager.py SingleTypeKVCacheManager.free: reversed, tail blocks first.
        pool.release(reversed(r.blocks))
        r.blocks = []
        r.hashed = 0

    def hash_full_blocks(r: _Req, upto: int) -> None:
        # kv_cache_manager.py allocate_slots -> coordinator.cache_blocks(request, min(computed + new,
        # num_tokens)): full blocks are hashed when allocated, before the step computes them, so a
        # request admitted later in the same step already hits them.
        full = min(upto, r.prompt + r.num_output) // bs
        if full > r.hashed:
            blocks = r.blocks
            own = (r.rid + 1) << 24
            pb = r.prefix_blocks
            for j in range(r.hashed, full):
                b = blocks[j]
                k = j if j < pb else own | j
                if k not in cached:  # BlockPool.set_key, inlined (the hot loop)
                    keys[b] = k
                    cached[k] = b
            r.hashed = full

    keys, cached = pool.key, pool.cached
    per_step = step_time.per_step_s
    per_prefill = step_time.per_prefill_token_s
    per_decode = step_time.per_decode_s
    per_ctx = step_time.per_context_token_s
    victim_newest = rules.victim == "newest"
    admit_after_preemption = rules.admit_after_preemption
    gate = rules.full_sequence_gate
    first_only = rules.hits_first_admission_only
    lag_counter = rules.preemption_counted_on_resume
    t_sample = next_sample()
    while True:
        while arrivals and arrivals[0][0] <= now:
            t_arr, rid = heapq.heappop(arrivals)
            prompt = prompt_sampler.draw() if prompt_sampler else workload.prompt_tokens
            output = output_sampler.draw() if output_sampler else workload.output_tokens
            # A drawn size is held to what vLLM 0.32.0 lets run: a longer prompt is refused
            # (vllm/renderers/params.py _token_len_check), and no request grows past max_model_len
            # (Scheduler.schedule caps num_new_tokens at max_model_len - computed - 1).
            prompt = min(prompt, max_len - 1)
            output = max(1, min(output, max_len - prompt))
            waiting.append(_Req(rid, t_arr, prompt, output, prefix_blocks))
            if workload.kind == "open":
                nxt = t_arr + rng.expovariate(workload.rate_per_s or 1.0)
                if can_send(nxt):
                    send(nxt)
        if not running and not waiting:
            if not arrivals:
                break
            nt = arrivals[0][0]
            if t_sample < nt:
                t_sample = sample_until(nt)
            now = nt
            continue
        if max_sim_s is not None and now > max_sim_s:
            break

        # ---- pure-decode stretch: many steps in one go (exactly what step-by-step would do) -------
        if len(running) <= budget_full and _all_decoding(running):
            k = _decode_stretch(running, waiting, pool, max_seqs, bs)
            if k > 1:
                t_stop = min(t_sample, arrivals[0][0]) if arrivals else t_sample
                n = len(running)
                base_ctx = sum(r.computed for r in running) + n
                fixed = per_step + per_decode * n
                elapsed = 0.0
                steps = 0
                while steps < k:
                    dt = fixed + per_ctx * (base_ctx + steps * n)
                    if now + elapsed + dt >= t_stop:
                        break
                    elapsed += dt
                    steps += 1
                if steps > 1:
                    for r in running:
                        grow = -(-(r.computed + steps) // bs) - len(r.blocks)
                        if grow > 0:
                            r.blocks.extend(pool.take(grow))
                        r.computed += steps
                        r.num_output += steps
                        if caching:
                            hash_full_blocks(r, r.computed)
                        if r.pending_report:
                            reported += r.pending_report
                            r.pending_report = 0
                    res.generated_tokens += n * steps
                    res.running_time_integral += n * elapsed
                    res.waiting_time_integral += len(waiting) * elapsed
                    res.steps += steps
                    now += elapsed
                    st_run, st_wait, st_free, st_rep = n, len(waiting), pool.nfree, reported
                    continue

        # ---- Scheduler.schedule() -------------------------------------------------------------
        budget = budget_full
        sched: list[_Req] = []
        sched_n: list[int] = []
        preempted_any = False
        prefill = decodes = context = recompute = 0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            c = r.computed
            num_tokens = r.prompt + r.num_output
            new = num_tokens - c
            if new == 1 and c < len(r.blocks) * bs:
                # A decode whose slot is already allocated: allocate_slots needs no block.
                if caching and (c + 1) % bs == 0:
                    hash_full_blocks(r, c + 1)
                sched.append(r)
                sched_n.append(1)
                decodes += 1
                context += c + 1
                budget -= 1
                i += 1
                continue
            new = min(new, budget)
            new = min(new, max_len - c - 1)
            if new <= 0:
                i += 1
                continue
            need = -(-(c + new) // bs) - len(r.blocks)
            ok = True
            while need > pool.nfree:
                if victim_newest:
                    victim = running.pop()
                else:
                    victim = running.pop(0)
                    i -= 1
                    for k2, sr in enumerate(sched):
                        if sr is victim:
                            vn = sched_n[k2]
                            budget += vn
                            if vn == 1 and sr.computed == sr.prompt + sr.num_output - 1:
                                decodes -= 1
                            else:
                                prefill -= vn
                            context -= sr.computed + vn
                            del sched[k2]
                            del sched_n[k2]
                            break
                free_req(victim)
                victim.computed = 0
                victim.preemptions += 1
                if lag_counter:
                    victim.pending_report += 1
                else:
                    reported += 1
                res.preemption_events += 1
                waiting.appendleft(victim)
                preempted_any = True
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            if need > 0:
                r.blocks.extend(pool.take(need))
            if caching:
                hash_full_blocks(r, c + new)
            sched.append(r)
            sched_n.append(new)
            if new == 1 and c == num_tokens - 1:
                decodes += 1
            else:
                prefill += new
                if r.preemptions:
                    recompute += new
            context += c + new
            budget -= new
            i += 1

        if not preempted_any or admit_after_preemption:
            while budget > 0 and waiting and len(running) < max_seqs:
                r = waiting[0]
                if r.refused_at == pool.releases:
                    # Refused since the last release: free blocks only fell and hits only shrank,
                    # so the answer is the same (saves the hash walk on every step).
                    break
                num_tokens = r.prompt + r.num_output
                hit_blocks: list[int] = []
                if caching and r.computed == 0:
                    limit = (num_tokens - hit_cap) // bs
                    hit_blocks = pool.lookup(r.key(j) for j in range(limit))
                hit_tokens = len(hit_blocks) * bs
                evictable = pool.evictable(hit_blocks) if hit_blocks else 0
                wm = watermark_blocks if running else 0
                free_now = pool.nfree
                if gate:
                    full_need = -(-min(num_tokens, max_len) // bs) - len(hit_blocks) + evictable
                    if full_need + wm > free_now:
                        r.refused_at = pool.releases
                        break
                new = min(num_tokens - hit_tokens, budget)
                need = -(-(hit_tokens + new) // bs) - len(hit_blocks) + evictable
                if need + wm > free_now:
                    r.refused_at = pool.releases
                    break
                waiting.popleft()
                if hit_blocks:
                    pool.touch(hit_blocks)
                r.blocks = hit_blocks
                r.hashed = len(hit_blocks)
                fresh = need - evictable
                if fresh > 0:
                    r.blocks.extend(pool.take(fresh))
                r.computed = hit_tokens
                if caching:
                    hash_full_blocks(r, hit_tokens + new)
                    if r.preemptions == 0 or not first_only:
                        res.prefix_queries += num_tokens
                        res.prefix_hits += hit_tokens
                running.append(r)
                sched.append(r)
                sched_n.append(new)
                if new == 1 and hit_tokens == num_tokens - 1:
                    decodes += 1
                else:
                    prefill += new
                    if r.preemptions:
                        recompute += new
                context += hit_tokens + new
                budget -= new

        if not sched and not preempted_any:
            # Nothing can run: only possible when one request cannot fit the pool at all (the
            # command refuses such workloads before simulating); stop instead of spinning.
            break

        # ---- the step runs ----------------------------------------------------------------------
        # The model was fitted on vLLM's counters, which never count recomputed prompt tokens
        # (v1/core/sched/scheduler.py sets prefill_stats only while num_preemptions <= 0): so it is
        # applied to the same counts, and recompute's cost stays inside what the fit absorbed.
        dt = per_step + per_prefill * (prefill - recompute) + per_decode * decodes + per_ctx * context
        if t_sample < now + dt:
            t_sample = sample_until(now + dt)
        res.running_time_integral += len(running) * dt
        res.waiting_time_integral += len(waiting) * dt
        now += dt
        res.steps += 1
        res.computed_prompt_tokens += prefill

        # ---- Scheduler.update_from_output() ------------------------------------------------------
        finished_any = False
        for r, n in zip(sched, sched_n, strict=True):
            r.computed += n
            if r.computed >= r.prompt + r.num_output:
                r.num_output += 1
                res.generated_tokens += 1
                if not r.first_token:
                    r.first_token = True
                    res.ttft.add(now - r.arrival)
                if r.pending_report:
                    reported += r.pending_report
                    r.pending_report = 0
                if r.num_output >= r.output:
                    finished_any = True
                    free_req(r)
                    res.finished += 1
                    res.e2e.add(now - r.arrival)
                    res.end_s = now
                    if workload.kind == "closed" and can_send(now):
                        send(now)
        if finished_any:
            running = [r for r in running if r.num_output < r.output]
        res.max_running = max(res.max_running, len(running))
        st_run, st_wait, st_free, st_rep, st_fin, st_sent = (
            len(running),
            len(waiting),
            pool.nfree,
            reported,
            res.finished,
            res.sent,
        )

    res.preemptions = reported
    # Scrapes after the drain read the idle server.
    sample_until(math.inf if explicit is not None else now + 1e-9)
    if explicit is None:
        res.samples.append(Sample(now, st_run, st_wait, 1.0 - st_free / usable, st_rep, st_fin, st_sent))
    return res


def _all_decoding(running: list[_Req]) -> bool:
    # A chunk that ended one token short of the prompt also leaves computed == num_tokens - 1, but
    # its next step yields the first token (TTFT), so only requests past their first token qualify.
    return all(r.first_token and r.computed == r.prompt + r.num_output - 1 for r in running)


def _decode_stretch(running: list[_Req], waiting: deque[_Req], pool: BlockPool, max_seqs: int, bs: int) -> int:
    """How many steps from now are plain decodes with nothing else possible: nobody finishes (the
    finishing step runs normally), nothing can be admitted (the queue is empty, full, or its head was
    refused since the last release, and nothing is released until someone finishes), and the new
    blocks all those steps need fit the free blocks (so no allocation fails and nobody is preempted)."""
    if waiting and len(running) < max_seqs and waiting[0].refused_at != pool.releases:
        return 0
    k = min(r.output - r.num_output for r in running) - 1
    free = pool.num_free()
    while k > 1:
        need = 0
        for r in running:
            g = -(-(r.computed + k) // bs) - len(r.blocks)
            if g > 0:
                need += g
        if need <= free:
            return k
        k //= 2
    return k


def _fields(s: Sample) -> tuple[int, int, float, int, int, int]:
    return (s.running, s.waiting, s.kv_usage, s.preemptions, s.finished, s.sent)
