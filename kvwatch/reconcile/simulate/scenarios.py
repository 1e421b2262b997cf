"""Scenarios: the observed workload (changed by flags) and each ``capacity`` lever, simulated.

Pure. A lever that changes the KV pool (fp8 KV cache, int4/fp8 weights, +0.05 utilisation, TP x2)
becomes the pool ``capacity`` computes for it; prefix caching flips the engine's switch; fewer
prompt tokens shortens the prompt by a quarter; halving max_model_len changes nothing the scheduler
reads for requests that fit (vLLM's admission and allocation depend on each request's own length),
so it is simulated unchanged unless the workload no longer fits, when vLLM would refuse every request.
Compute speed is held at the calibrated step time for every lever (quantised weights or TP would
also change it; that is not modelled and the note says so).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.reconcile.simulate.engine import EngineConfig, SimResult, StepTime, Workload, simulate
from kvwatch.reconcile.simulate.rules import SchedulerRules

POOL_LEVERS = ("fp8_kv_cache", "int4_weights", "fp8_weights", "gpu_memory_utilization_plus_0_05", "tensor_parallel_x2")
SPEED_NOTE = "step time held at the calibrated one (a faster engine is not modelled)"


@dataclass(frozen=True, slots=True)
class Scenario:
    """One simulated what-if: its name, what changed, the outcome (None if it cannot be simulated)."""

    name: str
    changes: dict[str, Any]
    result: dict[str, Any] | None
    static_max_concurrency: float | None
    note: str


def _r(x: float | None, d: int = 3) -> float | None:
    return None if x is None else round(x, d)


def _quantile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def result_dict(res: SimResult, time_weighted: bool = False) -> dict[str, Any]:
    """A kvwatch.simulate/1 ``result`` block (means over the sample instants, as vLLM's gauges read)."""
    samples = res.samples
    if time_weighted and res.end_s > 0:
        mean_running = res.running_time_integral / res.end_s
        mean_waiting = res.waiting_time_integral / res.end_s
    else:
        mean_running = statistics.fmean(s.running for s in samples) if samples else 0.0
        mean_waiting = statistics.fmean(s.waiting for s in samples) if samples else 0.0
    usage = [s.kv_usage for s in samples]
    return {
        "requests_sent": res.sent,
        "requests_finished": res.finished,
        "preemptions": res.preemptions,
        "preemptions_per_100_requests": _r(100.0 * res.preemptions / res.finished, 2) if res.finished else None,
        "max_running": res.max_running,
        "mean_running": _r(mean_running, 2),
        "mean_waiting": _r(mean_waiting, 2),
        "prefix_hit_pct": _r(100.0 * res.prefix_hits / res.prefix_queries, 2) if res.prefix_queries else None,
        "kv_usage_p50": _r(_quantile(usage, 0.5), 4),
        "kv_usage_p95": _r(_quantile(usage, 0.95), 4),
        "ttft_s": {"mean": _r(res.ttft.mean()), "p95": _r(res.ttft.quantile(0.95))},
        "e2e_s": {"mean": _r(res.e2e.mean()), "p95": _r(res.e2e.quantile(0.95))},
        "tokens_per_s": _r(res.generated_tokens / res.end_s, 1) if res.end_s > 0 else None,
        "drain_end_s": _r(res.end_s, 1),
        "engine_steps": res.steps,
    }


def fits(engine: EngineConfig, workload: Workload) -> str | None:
    """Why this workload can never run on this engine (vLLM would refuse or livelock), or None.

    With a spread of sizes the largest draw decides (the engine holds a draw to max_model_len, so
    only the mean sizes are refused for it)."""
    total = workload.prompt_tokens + workload.output_tokens
    if total > engine.max_model_len:
        return (
            f"a request of {workload.prompt_tokens:,} + {workload.output_tokens:,} tokens exceeds max_model_len "
            f"{engine.max_model_len:,}: vLLM refuses it"
        )
    if workload.prompt_dist is not None or workload.output_dist is not None:
        prompt = workload.prompt_dist.high if workload.prompt_dist else workload.prompt_tokens
        output = workload.output_dist.high if workload.output_dist else workload.output_tokens
        total = min(prompt + output, engine.max_model_len)
    usable = (engine.blocks - 1) * engine.block_size
    if total > usable:
        return (
            f"a request of {total:,} tokens exceeds the whole KV pool ({usable:,} usable tokens): it can never finish"
        )
    return None


def run(
    engine: EngineConfig,
    workload: Workload,
    step: StepTime,
    rules: SchedulerRules,
    *,
    sample_every_s: float,
    time_weighted: bool,
    seed: int,
    max_sim_s: float | None = None,
) -> dict[str, Any]:
    """Simulate one scenario and return its result block (``max_sim_s`` bounds its simulated time)."""
    res = simulate(engine, workload, step, rules, sample_every_s=sample_every_s, seed=seed, max_sim_s=max_sim_s)
    return result_dict(res, time_weighted)


def lever_scenarios(
    engine: EngineConfig,
    workload: Workload,
    step: StepTime,
    rules: SchedulerRules,
    lever_rows: Sequence[Mapping[str, Any]],
    *,
    only: Sequence[str] | None,
    sample_every_s: float,
    time_weighted: bool,
    seed: int,
    max_sim_s: float | None = None,
) -> list[Scenario]:
    """One scenario per capacity lever (or the ``only`` ones), in capacity's order."""
    out: list[Scenario] = []
    for row in lever_rows:
        name = str(row.get("lever"))
        if only and name not in only:
            continue
        ceiling = row.get("max_concurrency")
        note = str(row.get("note") or "")
        eng, wl = engine, workload
        changes: dict[str, Any] = {}
        if name in POOL_LEVERS:
            tokens = row.get("pool_tokens")
            if not isinstance(tokens, int) or tokens <= 0:
                out.append(Scenario(name, {}, None, ceiling, note or "capacity cannot size this lever"))
                continue
            blocks = tokens // engine.block_size
            if blocks == engine.blocks:
                note = (note + "; " if note else "") + "the pool does not change"
            eng = replace(engine, blocks=blocks)
            changes = {"pool_tokens": blocks * engine.block_size}
            note = (note + "; " if note else "") + SPEED_NOTE
        elif name == "prefix_caching":
            eng = replace(engine, prefix_caching=not engine.prefix_caching)
            changes = {"prefix_caching": eng.prefix_caching}
            note = "prefix caching turned " + ("on" if eng.prefix_caching else "off (it is on in the evidence)")
        elif name == "fewer_prompt_tokens":
            prompt = workload.prompt_tokens * 3 // 4
            wl = replace(
                workload,
                prompt_tokens=prompt,
                shared_prefix_tokens=min(workload.shared_prefix_tokens, prompt),
                # a spread is drawn per request, so it shrinks too (else the lever changes nothing)
                prompt_dist=workload.prompt_dist.scaled(0.75) if workload.prompt_dist else None,
            )
            changes = {"prompt_tokens": prompt}
            note = f"prompt {workload.prompt_tokens:,} -> {prompt:,} tokens (-25 %)"
        elif name == "max_model_len_half":
            half = engine.max_model_len // 2
            eng = replace(engine, max_model_len=half)
            changes = {"max_model_len": half}
            # vLLM 0.32.0 refuses a prompt longer than max_model_len (vllm/renderers/params.py
            # _token_len_check: len(tokens) > max_input_tokens, which is max_model_len); the engine
            # would hold such a draw to the limit instead and replay requests the real server never runs.
            refused = workload.prompt_dist.share_at_least(half + 1) if workload.prompt_dist else 0.0
            refusal = None
            if workload.prompt_tokens + workload.output_tokens > half:
                refusal = (
                    f"requests of {workload.prompt_tokens + workload.output_tokens:,} tokens exceed {half:,}: "
                    "vLLM would refuse every one"
                )
            elif refused > 0:
                refusal = f"{refused:.0%} of the prompts drawn are longer than {half:,} tokens: vLLM would refuse them"
            if refusal is not None:
                out.append(Scenario(name, changes, None, ceiling, refusal))
                continue
            note = "changes only vLLM's startup ratio: admission and allocation read each request's own length"
        else:
            out.append(Scenario(name, {}, None, ceiling, note or "not a lever simulate knows"))
            continue
        why_not = fits(eng, wl)
        if why_not is not None:
            out.append(Scenario(name, changes, None, ceiling, why_not))
            continue
        result = run(
            eng,
            wl,
            step,
            rules,
            sample_every_s=sample_every_s,
            time_weighted=time_weighted,
            seed=seed,
            max_sim_s=max_sim_s,
        )
        out.append(Scenario(name, changes, result, ceiling, note))
    return out
