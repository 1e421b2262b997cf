"""``kvwatch simulate EVIDENCE...``: vLLM's scheduler replayed on the observed workload.

Wires files -> (log: the analyze reader; scrapes: the metrics parser) -> calibration -> the
simulator -> a ``kvwatch.simulate/1`` document (CONTRACTS.md) or a table. EVIDENCE is any mix of
saved vLLM logs and saved ``/metrics`` scrapes, told apart by content. A scrape's instant is the
"# scraped at t=+Xs" first line a saving script wrote, else the file's modification time.
``--prometheus`` reads the same history analyze reads (kvwatch.commands.history.engine_history: one
query per vLLM series over the range) and turns one engine's samples into the same
``EvidencePoint`` records (kvwatch.reconcile.simulate.levers.from_history); a log among EVIDENCE
still gives the engine's settings, else ``vllm:cache_config_info`` from the history does.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvwatch import cli_options as opt
from kvwatch.commands.history import PrometheusQuery, engine_history, prometheus_query
from kvwatch.errors import UnusableInput, UsageError
from kvwatch.parse.metrics import read_exposition
from kvwatch.parse.scrapeseries import read_timing, scraped_at
from kvwatch.reconcile.simulate.calibrate import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_SEQS,
    Calibration,
    EvidencePoint,
    calibrate,
    engine_from_facts,
    evidence_point,
)
from kvwatch.reconcile.simulate.engine import EngineConfig, StepTime, Workload, simulate
from kvwatch.reconcile.simulate.rules import rules_for
from kvwatch.reconcile.simulate.scenarios import Scenario, fits, lever_scenarios, result_dict, run
from kvwatch.reconcile.simulate.sizes import SizeDist, from_range_ratio

SCHEMA = "kvwatch.simulate/1"
# Without evidence there is nothing to time the engine by: a nominal step (stated in the output).
NOMINAL_STEP = StepTime(0.01, 0.0001, 0.0, 0.0)
SNIFF_BYTES = 1 << 16


class Format(StrEnum):
    """Output formats."""

    text = "text"
    json = "json"


def _is_scrape(head: str) -> bool:
    # An exposition declares or writes vLLM series at the start of a line; a log never does (its
    # lines start with a level, a timestamp or a process prefix).
    return "# TYPE vllm:" in head or "\nvllm:" in head or head.startswith("vllm:") or "# TYPE ray_vllm:" in head


def _facts_from_cache_config(config: dict[str, Any]) -> dict[str, Any]:
    """Without a log: the pool and switches vLLM's ``vllm:cache_config_info`` labels state."""
    memory = config.get("kv_cache_memory_bytes")
    return {
        "capacity": {
            "gpu_blocks": config.get("num_gpu_blocks"),
            "block_size": config.get("block_size"),
            "kv_cache_tokens": config.get("kv_cache_size_tokens"),
            "kv_cache_memory_gib": memory / 2**30 if isinstance(memory, (int, float)) else None,
        },
        "config": {"enable_prefix_caching": config.get("enable_prefix_caching")},
    }


def _read_evidence(paths: list[str]) -> tuple[list[str], list[EvidencePoint], list[str], dict[str, Any]]:
    """Logs (paths), scrape points, notes, and the first scrape's vllm:cache_config_info labels."""
    cache_config: dict[str, Any] = {}
    logs: list[str] = []
    points: list[EvidencePoint] = []
    notes: list[str] = []
    mtimes: list[tuple[str, float, str]] = []
    for path in paths:
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such file; give saved vLLM logs and /metrics scrapes")
        try:
            with open(path, "rb") as fh:
                head = fh.read(SNIFF_BYTES).decode("utf-8", "replace")
        except OSError as exc:
            raise UsageError(f"{path}: cannot read it ({exc.strerror})") from None
        if _is_scrape(head):
            text = Path(path).read_text("utf-8", "replace")
            at = scraped_at(text)
            if at is None:
                mtimes.append((path, os.path.getmtime(path), text))
                continue
            snap = read_exposition(text).snapshot
            if snap.cache_config and not cache_config:
                cache_config.update(snap.cache_config)
            point = evidence_point(at, snap, read_timing(text))
            if point is not None:
                points.append(point)
        else:
            logs.append(path)
    if mtimes:
        if points:
            raise UsageError("some scrapes carry '# scraped at t=+Xs' and some do not; give one kind")
        base = min(m for _p, m, _t in mtimes)
        if len({m for _p, m, _t in mtimes}) < len(mtimes):
            raise UnusableInput(
                "the scrapes' instants are unknown (no '# scraped at' line, equal modification times); "
                "save each with its time, e.g. a first line '# scraped at t=+10.0s'"
            )
        for _path, m, text in mtimes:
            point = evidence_point(m - base, read_exposition(text).snapshot, read_timing(text))
            if point is not None:
                points.append(point)
        notes.append("scrape instants from the files' modification times")
    return logs, points, notes, cache_config


def _analyze(logs: list[str]) -> dict[str, Any]:
    if not logs:
        return {}
    from kvwatch.batch import analyze_paths

    doc: dict[str, Any] = analyze_paths(logs)
    return doc


def _arch(model_config: str | None, model: str | None) -> Any:
    if not (model_config or model):
        return None
    from kvwatch.reconcile.architecture import resolve_model

    return resolve_model(model_config or model)  # type: ignore[arg-type]


def _nonneg(flag: str, value: float | None) -> None:
    if value is not None and value < 0:
        raise UsageError(f"{flag} must not be negative, got {value}")


def simulate_command(
    evidence: Annotated[
        list[str] | None,
        typer.Argument(metavar="EVIDENCE...", help="Saved vLLM logs and /metrics scrapes of one run."),
    ] = None,
    users: Annotated[int | None, typer.Option("--users", help="Closed loop: this many users.")] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Open loop: requests per second (Poisson).")] = None,
    prompt_tokens: Annotated[int | None, typer.Option("--prompt-tokens", help="Prompt tokens per request.")] = None,
    output_tokens: Annotated[int | None, typer.Option("--output-tokens", help="Output tokens per request.")] = None,
    shared_prefix_tokens: Annotated[
        int | None,
        typer.Option("--shared-prefix-tokens", help="Tokens at the start of every prompt that are the same."),
    ] = None,
    pool_tokens: Annotated[
        int | None, typer.Option("--pool-tokens", help="KV pool in tokens (default: the log's).")
    ] = None,
    duration: Annotated[
        float | None, typer.Option("--duration", help="Seconds of load (no new request after).")
    ] = None,
    range_ratio: Annotated[
        float | None,
        typer.Option(
            "--range-ratio",
            metavar="R",
            help="Draw each prompt and output uniformly within +-R of its mean (as vllm bench serve "
            "--random-range-ratio does).",
        ),
    ] = None,
    lever: Annotated[
        list[str] | None, typer.Option("--lever", help="Simulate only this capacity lever (repeatable).")
    ] = None,
    vllm_version: Annotated[str | None, typer.Option("--vllm-version", help="Scheduler rules of this release.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the open-loop arrivals.")] = 0,
    model_config: Annotated[
        str | None, typer.Option("--model-config", metavar="FILE", help="The model's config.json, for the levers.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", metavar="NAME", help="A catalogue model, for the levers.")
    ] = None,
    output_format: Annotated[Format, typer.Option("--format", help="text or json (kvwatch.simulate/1).")] = Format.text,
    **prometheus_flags: Any,  # --prometheus URL and its range: commands.history.prometheus_query's
) -> None:
    """vLLM's scheduler replayed: calibrated on the evidence, then the workload and each lever simulated."""
    for flag, v in (
        ("--users", users),
        ("--rate", rate),
        ("--prompt-tokens", prompt_tokens),
        ("--output-tokens", output_tokens),
        ("--shared-prefix-tokens", shared_prefix_tokens),
        ("--duration", duration),
    ):
        _nonneg(flag, v)
    if users is not None and rate is not None:
        raise UsageError("give --users (closed loop) or --rate (open loop), not both")
    if range_ratio is not None and not 0 <= range_ratio < 1:
        raise UsageError(f"--range-ratio must be in [0, 1) (vllm bench serve's limits), got {range_ratio}")
    if pool_tokens is not None and pool_tokens <= 0:
        raise UsageError(f"--pool-tokens {pool_tokens}: a KV pool of 0 tokens holds no request; give a positive size")
    if model_config and model:
        raise UsageError("give --model-config FILE or --model NAME, not both")
    query = prometheus_query(**prometheus_flags)
    history = _prometheus_points(query) if query is not None else None
    doc = _build(
        evidence or [],
        users=users,
        rate=rate,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        shared_prefix_tokens=shared_prefix_tokens,
        pool_tokens=pool_tokens,
        duration=duration,
        range_ratio=range_ratio,
        levers=lever,
        vllm_version=vllm_version,
        seed=seed,
        arch=_arch(model_config, model),
        history=history,
    )
    text = json.dumps(doc, indent=2) if output_format is Format.json else render_text(doc)
    sys.stdout.write(text + "\n")


opt.share_options(simulate_command, prometheus_query)


def _apply_flags(
    wl: Workload,
    users: int | None,
    rate: float | None,
    prompt: int | None,
    output: int | None,
    shared: int | None,
    duration: float | None,
    range_ratio: float | None = None,
) -> Workload:
    # An open-loop run's replay sends its own count of requests (the client's --num-prompts); a
    # closed loop of users, or an explicit duration, sends for a time instead.
    if users is not None:
        wl = replace(wl, kind="closed", users=users, rate_per_s=None, max_requests=None)
    if rate is not None:
        wl = replace(wl, kind="open", rate_per_s=rate, users=None)
    # A size given by flag is every request's size: the evidence's spread no longer applies.
    if prompt is not None:
        wl = replace(wl, prompt_tokens=prompt, prompt_dist=None)
    if output is not None:
        wl = replace(wl, output_tokens=output, output_dist=None)
    if range_ratio is not None:
        wl = replace(
            wl,
            prompt_dist=from_range_ratio(wl.prompt_tokens, range_ratio),
            output_dist=from_range_ratio(wl.output_tokens, range_ratio),
        )
    if shared is not None:
        wl = replace(wl, shared_prefix_tokens=shared)
    if duration is not None:
        wl = replace(wl, duration_s=duration, max_requests=None)
    if wl.shared_prefix_tokens > wl.prompt_tokens:
        raise UsageError(
            f"--shared-prefix-tokens {wl.shared_prefix_tokens:,} is longer than the prompt ({wl.prompt_tokens:,}); "
            "the shared prefix is part of the prompt"
        )
    if wl.prompt_tokens <= 0 or wl.output_tokens <= 0:
        raise UsageError("a request needs at least 1 prompt and 1 output token (--prompt-tokens, --output-tokens)")
    return wl


def _build(
    paths: list[str],
    *,
    users: int | None,
    rate: float | None,
    prompt_tokens: int | None,
    output_tokens: int | None,
    shared_prefix_tokens: int | None,
    pool_tokens: int | None,
    duration: float | None,
    range_ratio: float | None = None,
    levers: list[str] | None,
    vllm_version: str | None,
    seed: int,
    arch: Any,
    history: tuple[list[EvidencePoint], dict[str, Any], str] | None = None,
) -> dict[str, Any]:
    logs, points, notes, cache_config = _read_evidence(paths)
    if history is not None:
        if points:
            raise UsageError("give saved scrapes or --prometheus, not both (a log may come with either)")
        points, history_config, what = history
        if history_config and not cache_config:
            cache_config.update(history_config)
        notes.append(what)
    facts = _analyze(logs)
    if not logs and cache_config.get("num_gpu_blocks"):
        facts = _facts_from_cache_config(cache_config)
        notes.append(
            "no log: pool and prefix caching from vllm:cache_config_info; max_num_seqs and "
            "max_num_batched_tokens at vLLM's defaults (256, 8,192)"
        )
    stats_count = (facts.get("stats") or {}).get("count") or 0
    cal: Calibration | None = None
    if paths and not points and not stats_count:
        raise UnusableInput(
            f"{', '.join(paths)}: no vLLM stats lines and no /metrics scrapes; give the server's log "
            "and the scrapes saved during the load"
        )
    early_version = vllm_version or (facts.get("config") or {}).get("vllm_version")
    choice = rules_for(early_version, from_flag=vllm_version is not None)
    rules = choice.rules
    if len(points) == 1 and prompt_tokens is None:
        raise UnusableInput(
            "one /metrics scrape states no rates; give two or more saved during the load (e.g. every 10 s)"
        )
    if len(points) >= 2:
        cal = calibrate(facts, points, rules=rules)
        engine = cal.engine
        base = cal.workload
        step = cal.step_time
        notes.extend(cal.sources)
    else:
        if prompt_tokens is None or output_tokens is None or (users is None and rate is None):
            what = "the log states no request sizes" if paths else "no evidence given"
            raise UnusableInput(
                f"{what}; give the run's /metrics scrapes, or --prompt-tokens, --output-tokens and --users or --rate"
            )
        if facts:
            engine = engine_from_facts(facts, pool_tokens)
        elif pool_tokens is None:
            raise UnusableInput("no evidence and no pool: give a vLLM log, or --pool-tokens N")
        else:
            bs = DEFAULT_BLOCK_SIZE
            engine = EngineConfig(pool_tokens // bs, bs, DEFAULT_MAX_NUM_SEQS, 8192, True, pool_tokens)
            notes.append("engine at vLLM's defaults (block 16, max_num_seqs 256, 8,192 batched tokens, prefix caching)")
        base = Workload("closed", 1, None, prompt_tokens, output_tokens, 0, 600.0)
        step = NOMINAL_STEP
        notes.append("step time nominal (no scrapes to time the engine by): times are not this server's")
    if choice.note:
        notes.append(choice.note)
    if engine.blocks < 2:
        raise UnusableInput(f"a KV pool of {engine.pool_tokens} tokens holds no request; vLLM refuses to start with it")

    workload = _apply_flags(
        base, users, rate, prompt_tokens, output_tokens, shared_prefix_tokens, duration, range_ratio
    )
    scen_engine = replace(engine, blocks=pool_tokens // engine.block_size) if pool_tokens and cal else engine
    problem = fits(scen_engine, workload)
    if problem is not None:
        raise UnusableInput(f"{problem}; change --prompt-tokens/--output-tokens or the pool")

    every = 10.0
    time_weighted = cal is None
    calibration: dict[str, Any] | None = None
    if cal is not None:
        gaps = [b - a for a, b in zip(cal.observed.sample_at, cal.observed.sample_at[1:], strict=False) if b > a]
        every = statistics.median(gaps) if gaps else 10.0
        replay = simulate(engine, cal.workload, step, rules, sample_at=cal.observed.sample_at, seed=seed)
        got = result_dict(replay)
        # Like for like: the observed max is the most the scrapes saw, so the replay's is too.
        got["max_running"] = max((s.running for s in replay.samples), default=0)
        obs = cal.observed
        calibration = {
            "step_time": {
                "per_step_s": round(step.per_step_s, 6),
                "per_prefill_token_s": round(step.per_prefill_token_s, 9),
                "per_decode_s": round(step.per_decode_s, 6),
                "per_context_token_s": round(step.per_context_token_s, 12),
            },
            "observed": {
                "requests_sent": obs.requests_sent,
                "preemptions": obs.preemptions,
                "max_running": obs.max_running,
                "mean_running": round(obs.mean_running, 2),
                "mean_waiting": round(obs.mean_waiting, 2),
                "prefix_hit_pct": None if obs.prefix_hit_pct is None else round(obs.prefix_hit_pct, 2),
                "drain_end_s": obs.drain_end_s,
                "scrapes": len(obs.sample_at),
            },
            "simulated": {
                k: got[k]
                for k in (
                    "requests_sent",
                    "preemptions",
                    "max_running",
                    "mean_running",
                    "mean_waiting",
                    "prefix_hit_pct",
                    "drain_end_s",
                )
            },
        }

    observed_result = run(
        scen_engine, workload, step, rules, sample_every_s=every, time_weighted=time_weighted, seed=seed
    )
    own = (
        workload.prompt_tokens
        + workload.output_tokens
        - (workload.shared_prefix_tokens if scen_engine.prefix_caching else 0)
    )
    scenarios: list[dict[str, Any]] = [
        {
            "name": "observed",
            "changes": _changes(base, workload, engine, scen_engine),
            "result": observed_result,
            "static_max_concurrency": round(scen_engine.pool_tokens / own, 2) if own > 0 else None,
            "note": "",
        }
    ]
    rows = _lever_rows(facts, arch, workload, engine, scen_engine)
    for s in lever_scenarios(
        scen_engine,
        workload,
        step,
        rules,
        rows,
        only=levers,
        sample_every_s=every,
        time_weighted=time_weighted,
        seed=seed,
    ):
        scenarios.append(_scenario_dict(s))
    if levers:
        known = {str(r.get("lever")) for r in rows}
        unknown = [n for n in levers if n not in known]
        if unknown:
            raise UsageError(
                f"--lever {unknown[0]}: not a lever; use one of {', '.join(sorted(known)) or 'the capacity levers'}"
            )

    return {
        "schema": SCHEMA,
        "vllm_version": rules.version,
        "engine": {
            "pool_tokens": scen_engine.pool_tokens,
            "blocks": scen_engine.blocks,
            "block_size": scen_engine.block_size,
            "max_num_seqs": scen_engine.max_num_seqs,
            "max_num_batched_tokens": scen_engine.max_num_batched_tokens,
            "prefix_caching": scen_engine.prefix_caching,
            "max_model_len": scen_engine.max_model_len,
        },
        "workload": {
            "kind": workload.kind,
            "users": workload.users,
            "rate_per_s": None if workload.rate_per_s is None else round(workload.rate_per_s, 4),
            "prompt_tokens": workload.prompt_tokens,
            "output_tokens": workload.output_tokens,
            "shared_prefix_tokens": workload.shared_prefix_tokens,
            "duration_s": round(workload.duration_s, 1),
            "requests": workload.max_requests,  # a count-bounded load (an open-loop run's own count), or null
            # [smallest, largest] drawn when requests differ in size (the histograms' spread or
            # --range-ratio); null when every request has the mean size
            "prompt_tokens_range": _range(workload.prompt_dist),
            "output_tokens_range": _range(workload.output_dist),
            "source": "evidence" if cal is not None and workload == base else ("evidence+flags" if cal else "flags"),
        },
        "calibration": calibration,
        "scenarios": scenarios,
        "seed": seed,
        "notes": notes,
    }


def _prometheus_points(query: PrometheusQuery) -> tuple[list[EvidencePoint], dict[str, Any], str]:
    """One engine's Prometheus history as evidence points, its cache_config_info, and a note."""
    from kvwatch.reconcile.simulate.levers import from_history

    timelines, info = engine_history(query)
    where = f"{info['url']} {info['start']} .. {info['end']}" + (f" {query.selector}" if query.selector else "")
    if not timelines:
        raise UnusableInput(f"{where}: no vLLM series matched; check --selector and the time range")
    evidence = from_history([(tl.engine, [(ts.t, ts.sample) for ts in tl.samples]) for tl in timelines])
    if evidence.why_not is not None:
        raise UnusableInput(f"{where}: {evidence.why_not}; narrow --selector to one engine")
    configs = info.get("cache_configs") or []
    step_note = f"step {info['step']} s" if info.get("step") else "its scrape interval"
    note = (
        f"evidence: Prometheus history, {len(evidence.points)} samples at {step_note}; "
        "engine steps estimated from the decodes (no iteration histogram in the history)"
    )
    return list(evidence.points), dict(configs[0]) if configs else {}, note


def _range(dist: SizeDist | None) -> list[int] | None:
    return None if dist is None else [dist.low, dist.high]


def _changes(base: Workload, wl: Workload, engine: EngineConfig, scen: EngineConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in (
        "kind",
        "users",
        "rate_per_s",
        "prompt_tokens",
        "output_tokens",
        "shared_prefix_tokens",
        "duration_s",
    ):
        if getattr(base, field) != getattr(wl, field):
            out[field] = getattr(wl, field)
    for field, dist in (("prompt_tokens_range", wl.prompt_dist), ("output_tokens_range", wl.output_dist)):
        if dist != getattr(base, field.replace("tokens_range", "dist")):
            out[field] = _range(dist)
    if scen.blocks != engine.blocks:
        out["pool_tokens"] = scen.pool_tokens
    return out


def _lever_rows(
    facts: dict[str, Any], arch: Any, wl: Workload, engine: EngineConfig, scen: EngineConfig
) -> list[dict[str, Any]]:
    from kvwatch.reconcile.capacity import RequestShape, levers_for_analysis

    shape = RequestShape(wl.prompt_tokens, wl.output_tokens, wl.shared_prefix_tokens)
    rows = levers_for_analysis(facts, arch, shape) if facts else []
    if scen.blocks != engine.blocks:
        # --pool-tokens: each lever scales the given pool as it scales the logged one.
        ratio = scen.blocks / engine.blocks
        rows = [dict(r, pool_tokens=int(r["pool_tokens"] * ratio)) if r.get("pool_tokens") else r for r in rows]
    return rows


def _scenario_dict(s: Scenario) -> dict[str, Any]:
    return {
        "name": s.name,
        "changes": s.changes,
        "result": s.result,
        "static_max_concurrency": s.static_max_concurrency,
        "note": s.note,
    }


def _fmt(x: Any, spec: str = "") -> str:
    if x is None:
        return "-"
    return format(x, spec) if spec else str(x)


def render_text(doc: dict[str, Any]) -> str:
    """The table an operator reads: one row per scenario, the static ceiling beside the outcome."""
    e, w = doc["engine"], doc["workload"]
    who = f"{w['users']} users" if w["kind"] == "closed" else f"{w['rate_per_s']} req/s"
    lines = [
        f"vLLM {doc['vllm_version']} scheduler, pool {e['pool_tokens']:,} tokens "
        f"({e['blocks']:,} x {e['block_size']}), "
        f"max_num_seqs {e['max_num_seqs']}, {e['max_num_batched_tokens']:,} batched tokens, "
        f"prefix caching {'on' if e['prefix_caching'] else 'off'}",
        f"workload: {who}, {w['prompt_tokens']:,} prompt + {w['output_tokens']:,} output tokens "
        f"({w['shared_prefix_tokens']:,} shared), "
        + (f"{w['requests']:,} requests" if w.get("requests") else f"{w['duration_s']:g} s of load"),
    ]
    spread = [
        f"{what} {r[0]:,}-{r[1]:,}"
        for what, r in (("prompts", w.get("prompt_tokens_range")), ("outputs", w.get("output_tokens_range")))
        if r
    ]
    if spread:
        lines.append(f"sizes drawn per request: {', '.join(spread)} tokens (held to max_model_len)")
    cal = doc.get("calibration")
    if cal:
        o, s = cal["observed"], cal["simulated"]
        lines.append("")
        lines.append("calibration (the run replayed)   observed   simulated")
        for k, label in (
            ("requests_sent", "requests sent"),
            ("preemptions", "preemptions"),
            ("max_running", "max running"),
            ("mean_running", "mean running (scrapes)"),
            ("mean_waiting", "mean waiting (scrapes)"),
            ("prefix_hit_pct", "prefix hit %"),
            ("drain_end_s", "drain ends at s"),
        ):
            lines.append(f"  {label:<30} {_fmt(o.get(k)):>9}   {_fmt(s.get(k)):>9}")
    lines.append("")
    head = (
        f"{'scenario':<34}{'ceiling':>8}{'done':>6}{'preempt/100':>12}{'run':>6}{'wait':>7}"
        f"{'hit%':>7}{'ttft p95':>10}{'e2e p95':>9}{'tok/s':>8}"
    )
    lines.append(head)
    for sc in doc["scenarios"]:
        r = sc["result"]
        ceiling = _fmt(sc.get("static_max_concurrency"), ".2f")
        if r is None:
            lines.append(f"{sc['name']:<34}{ceiling:>8}  not simulated: {sc['note']}")
            continue
        cells = (
            f"{r['requests_finished']:>6}",
            f"{_fmt(r['preemptions_per_100_requests'], '.1f'):>12}",
            f"{_fmt(r['mean_running'], '.1f'):>6}",
            f"{_fmt(r['mean_waiting'], '.1f'):>7}",
            f"{_fmt(r['prefix_hit_pct'], '.1f'):>7}",
            f"{_fmt(r['ttft_s']['p95'], '.1f'):>10}",
            f"{_fmt(r['e2e_s']['p95'], '.1f'):>9}",
            f"{_fmt(r['tokens_per_s'], '.0f'):>8}",
        )
        lines.append(f"{sc['name']:<34}{ceiling:>8}" + "".join(cells))
    lines.append("")
    where = "at the scrape instants" if cal else "time-weighted"
    lines.append(f"ceiling = capacity's static max concurrency; run/wait = means {where}; times in s")
    for n in doc.get("notes") or []:
        lines.append(f"note: {n}")
    return "\n".join(lines)
