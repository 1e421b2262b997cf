"""``kvwatch capacity`` (the napkin math) and ``kvwatch fleet`` (GPUs for a peak).

Flags -> a ``Deployment`` -> ``kvwatch.reconcile.capacity.estimate`` / ``levers`` -> a
``kvwatch.capacity/1`` document, printed as JSON or as a table. ``--from-log`` reads the pool, the
config and the model through the analyze reader and adds an ``observed`` block that holds the
prediction against what vLLM printed (docs/vllm-formats.md §7.5: a printed GiB pins the pool only to a
few blocks, so the prediction is a range).
"""

from __future__ import annotations

import json
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvwatch.errors import UsageError
from kvwatch.reconcile import model_catalogue as catalogue
from kvwatch.reconcile.architecture import Architecture, resolve_model
from kvwatch.reconcile.capacity import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_OVERHEAD_GIB,
    GIB,
    CapacityEstimate,
    Deployment,
    LeverRow,
    RequestShape,
    check_against_log,
    deployment_from_analysis,
    document_basis,
    estimate,
    levers,
)
from kvwatch.reconcile.fleet import DEFAULT_SENSITIVITY, FleetPlan, plan_fleet

SCHEMA = "kvwatch.capacity/1"


class Format(StrEnum):
    """Output formats."""

    text = "text"
    json = "json"


def _gib_to_bytes(flag: str, value: float | None) -> int | None:
    if value is None:
        return None
    if value < 0:
        raise UsageError(f"{flag} must not be negative, got {value}")
    return round(value * GIB)


def _positive(flag: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{flag} must be positive, got {value}")


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


# ---------------------------------------------------------------------------------------------
# --from-log
# ---------------------------------------------------------------------------------------------


def _analyze(path: str) -> dict[str, Any]:
    """The kvwatch.analyze/1 document of one log (the analyze reader owns the parsing)."""
    if path != "-" and not Path(path).is_file():
        raise UsageError(f"--from-log {path}: no such file; give a saved vLLM log")
    try:
        from kvwatch.batch import analyze_paths
    except ImportError:
        raise UsageError("--from-log needs the analyze reader, which this build lacks; use --kv-cache-gib") from None
    doc: dict[str, Any] = analyze_paths([path])
    return doc


# ---------------------------------------------------------------------------------------------
# The document
# ---------------------------------------------------------------------------------------------


def capacity_document(
    arch: Architecture, dep: Deployment, est: CapacityEstimate, rows: list[LeverRow]
) -> dict[str, Any]:
    """The ``kvwatch.capacity/1`` document (docs/contracts.md; extra fields are additive)."""
    layout = est.layout
    req = est.request
    return {
        "schema": SCHEMA,
        "model": {
            "name": arch.name,
            "layers": arch.layers,
            "attention_layers": arch.attention_layers,
            "kv_heads": arch.kv_heads,
            "head_dim": arch.head_dim,
            "attention": arch.attention,
            "dtype": arch.dtype,
            "architecture": arch.architecture_class,
            "sliding_window": arch.sliding_window,
            "sliding_layers": sum(1 for k in arch.layer_kinds if k == "sliding"),
            "mamba_layers": sum(1 for k in arch.layer_kinds if k == "mamba"),
            "source": arch.source,
        },
        "kv_cache_dtype": dep.kv_cache_dtype,
        "tensor_parallel_size": dep.tp,
        "pipeline_parallel_size": dep.pp,
        "kv_bytes_per_token": est.kv_bytes_per_token,
        "pool": {
            "bytes": est.pool_bytes,
            "tokens": est.pool_tokens,
            "blocks": est.pool_blocks,
            "block_size": layout.block_size,
            "source": est.pool_source,
            "weights_bytes_per_gpu": est.weights_bytes,
            "kv_cache_groups": len(layout.groups),
        },
        "request": {
            "prompt_tokens": req.prompt_tokens if req else None,
            "output_tokens": req.output_tokens if req else None,
            "shared_prefix_tokens": req.shared_prefix_tokens if req else None,
            "tokens": est.request_tokens,
            "bytes": est.request_bytes,
            # Additive: where the request size came from (flags, or the log's pool x KV usage /
            # running when --from-log gives no --prompt-tokens: the basis analyze and watch use).
            "source": (req.source or "flags") if req else None,
        },
        "max_model_len": est.max_model_len,
        "max_concurrency": _r(est.max_concurrency),
        "max_concurrency_at_max_model_len": _r(est.max_concurrency_at_max_model_len),
        "levers": [r.as_dict() for r in rows],
    }


def _fmt_int(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def _fmt_float(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def render_text(doc: dict[str, Any]) -> str:
    """The table a person reads at a glance."""
    m, pool, req = doc["model"], doc["pool"], doc["request"]
    lines = [
        f"{m['name']}: {m['attention']}, {m['layers']} layers ({m['attention_layers']} with KV), "
        f"{m['kv_heads']} KV heads x {m['head_dim']}, {m['dtype']}",
        f"  numbers from      {m['source']}",
        f"  KV cache dtype    {doc['kv_cache_dtype']}   TP {doc['tensor_parallel_size']}   "
        f"PP {doc['pipeline_parallel_size']}   block {pool['block_size']} tokens",
        f"  KV per token      {doc['kv_bytes_per_token']:,} B per GPU ({doc['kv_bytes_per_token'] / 1024:,.1f} KiB)",
    ]
    if pool["blocks"] is None:
        lines.append("  pool              - (give --gpu-memory-gib, --kv-cache-gib, --kv-cache-tokens or --from-log)")
    else:
        lines.append(
            f"  pool              {pool['bytes'] / GIB:,.2f} GiB -> {pool['blocks']:,} blocks of {pool['block_size']} "
            f"-> {pool['tokens']:,} tokens  (from {pool['source'].replace('_', ' ')})"
        )
    if req["tokens"] is not None and req.get("source") == "log":
        lines.append(
            f"  request           {req['tokens']:,} tokens each, held per running request at the log's last "
            f"busy stats record (pool x KV usage / running)"
        )
    elif req["tokens"] is not None:
        lines.append(
            f"  request           {req['prompt_tokens']:,} prompt + {req['output_tokens']:,} output"
            f" - {req['shared_prefix_tokens']:,} shared = {req['tokens']:,} tokens each "
            f"({req['bytes'] / GIB:,.2f} GiB of KV for one whole request)"
        )
        lines.append(f"  max concurrency   {_fmt_float(doc['max_concurrency'])} requests of that size")
    if doc["max_model_len"]:
        lines.append(
            f"  at max_model_len  {_fmt_float(doc['max_concurrency_at_max_model_len'])}x for "
            f"{doc['max_model_len']:,} tokens per request (vLLM's startup line)"
        )
    obs = doc.get("observed")
    if obs:
        lines.append(
            f"  vLLM printed      {_fmt_float(obs['kv_cache_memory_gib'])} GiB, {_fmt_int(obs['gpu_blocks'])} blocks, "
            f"{_fmt_int(obs['kv_cache_tokens'])} tokens, {_fmt_float(obs['max_concurrency'])}x; predicted blocks "
            f"{obs['predicted_blocks_range'] or '-'}, {_fmt_float(obs['predicted_max_concurrency'])}x"
        )
    if doc.get("memory") is not None or doc.get("start") is not None:  # else render_memory adds no line
        from kvwatch.commands.capacity_memory import render_memory  # local: start-up

        lines.extend(render_memory(doc))
    lines.append("")
    header = f"  {'lever':<34}{'bytes/token':>12}{'pool tokens':>14}{'concurrency':>13}{'x':>7}  note"
    lines.append(header)
    for row in doc["levers"]:
        lines.append(
            f"  {row['lever']:<34}{_fmt_int(row['kv_bytes_per_token']):>12}{_fmt_int(row['pool_tokens']):>14}"
            f"{_fmt_float(row['max_concurrency']):>13}{_fmt_float(row['multiplier']):>7}  {row['note']}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def capacity(
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "--model-config", help="Catalogue name, Hugging Face id (local cache), config.json or folder."
        ),
    ] = None,
    gpu_memory_gib: Annotated[
        float | None,
        typer.Option(
            help="GPU memory per card as CUDA reports it, GiB (a 24 GB RTX 3090 is 23.58): the pool is vLLM's "
            "memory profile predicted from config.json, or G x U - W - O with --overhead-gib."
        ),
    ] = None,
    gpu_memory_utilization: Annotated[
        float | None, typer.Option(help=f"vLLM's --gpu-memory-utilization (default {DEFAULT_GPU_MEMORY_UTILIZATION}).")
    ] = None,
    weights_gib: Annotated[
        float | None, typer.Option(help="Weights per GPU, GiB (default: catalogue parameters x dtype / (TP x PP)).")
    ] = None,
    overhead_gib: Annotated[
        float | None,
        typer.Option(help=f"Non-KV memory: activations, CUDA graphs, non-torch, GiB (default {DEFAULT_OVERHEAD_GIB})."),
    ] = None,
    kv_cache_gib: Annotated[float | None, typer.Option(help="Measured KV memory per GPU, GiB (vLLM's figure).")] = None,
    kv_cache_tokens: Annotated[int | None, typer.Option(help="Measured pool in tokens (vLLM's KV cache size).")] = None,
    from_log: Annotated[
        str | None, typer.Option(help="A vLLM log: pool, config and model as `kvwatch analyze` reads them.")
    ] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option(help="auto | fp8 | fp8_e4m3 | fp8_e5m2 (default auto).")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="Tensor-parallel size (default 1).")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pipeline-parallel size (default 1).")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per KV block (default 16).")] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="vLLM's --max-model-len (default: the model's max_position_embeddings).")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option(help="Bounds sliding-window layers per request (default 8192).")
    ] = None,
    prompt_tokens: Annotated[int | None, typer.Option(help="Prompt tokens of a typical request.")] = None,
    output_tokens: Annotated[int | None, typer.Option(help="Output tokens of a typical request.")] = None,
    shared_prefix_tokens: Annotated[int, typer.Option(help="Prompt tokens every request shares.")] = 0,
    prefix_caching: Annotated[
        bool | None, typer.Option("--prefix-caching/--no-prefix-caching", help="Store the shared prefix once (on).")
    ] = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="vLLM's --max-num-seqs (default: the version's, by GPU size).")
    ] = None,
    vllm_version: Annotated[
        str | None, typer.Option(help="The vLLM release whose memory profile to predict (default: the newest read).")
    ] = None,
    enforce_eager: Annotated[
        bool, typer.Option("--enforce-eager", help="vLLM's --enforce-eager: no CUDA graphs to budget.")
    ] = False,
    quantization: Annotated[
        str | None, typer.Option(help="vLLM's --quantization (default: the config's quantization_config).")
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="vLLM's --dtype (default: the config's torch_dtype).")] = None,
    list_models: Annotated[bool, typer.Option("--list-models", help="List the built-in catalogue and exit.")] = False,
    output_format: Annotated[Format, typer.Option("--format", help="text or json.")] = Format.text,
) -> None:
    """KV bytes per token, the pool, max concurrency and the levers that move it."""
    if list_models:
        for entry in catalogue.CATALOGUE:
            typer.echo(f"{entry.model_id:<40} {entry.citation}")
        return
    pools = [
        f
        for f, v in (("--kv-cache-gib", kv_cache_gib), ("--kv-cache-tokens", kv_cache_tokens), ("--from-log", from_log))
        if v is not None
    ]
    if len(pools) > 1:
        raise UsageError(f"give one measured pool, not {' and '.join(pools)}")
    for flag, value in (
        ("--tp", tp),
        ("--pp", pp),
        ("--block-size", block_size),
        ("--max-model-len", max_model_len),
        ("--kv-cache-tokens", kv_cache_tokens),
        ("--max-num-batched-tokens", max_num_batched_tokens),
        ("--max-num-seqs", max_num_seqs),
    ):
        _positive(flag, value)
    if (prompt_tokens is None) != (output_tokens is None):
        raise UsageError("give --prompt-tokens and --output-tokens together (use 0 for none)")
    request = None
    if prompt_tokens is not None and output_tokens is not None:
        if prompt_tokens < 0 or output_tokens < 0 or prompt_tokens + output_tokens == 0:
            raise UsageError("--prompt-tokens and --output-tokens must be >= 0 and not both 0")
        if not 0 <= shared_prefix_tokens <= prompt_tokens:
            raise UsageError(
                f"--shared-prefix-tokens {shared_prefix_tokens} must be within the prompt (0..{prompt_tokens})"
            )
        request = RequestShape(prompt_tokens, output_tokens, shared_prefix_tokens, source="flags")
    elif shared_prefix_tokens:
        raise UsageError("--shared-prefix-tokens needs --prompt-tokens and --output-tokens")

    doc_log: dict[str, Any] | None = None
    dep = Deployment()
    if from_log is not None:
        doc_log = _analyze(from_log)
        dep = deployment_from_analysis(doc_log)
        if request is None:
            # The same request size analyze and the sidecar compute their what-ifs for.
            request = document_basis(doc_log)
        if model is None:
            model = (doc_log.get("config") or {}).get("model")
            if not model:
                raise UsageError(f"--from-log {from_log}: the log names no model; pass --model")
    if model is None:
        raise UsageError("--model is required: a catalogue name, a config.json or a model folder (see --list-models)")
    arch = resolve_model(model)

    changes: dict[str, Any] = {}
    settings: tuple[tuple[str, object], ...] = (
        ("kv_cache_dtype", kv_cache_dtype),
        ("tp", tp),
        ("pp", pp),
        ("block_size", block_size),
        ("max_model_len", max_model_len),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("prefix_caching", prefix_caching),
        ("gpu_memory_utilization", gpu_memory_utilization),
    )
    for key, setting in settings:
        if setting is not None:
            changes[key] = setting
    if request is not None:
        changes["request"] = request
    if gpu_memory_gib is not None:
        changes["gpu_memory_bytes"] = _gib_to_bytes("--gpu-memory-gib", gpu_memory_gib)
    if weights_gib is not None:
        changes["weights_bytes"] = _gib_to_bytes("--weights-gib", weights_gib)
    if overhead_gib is not None:
        changes["overhead_bytes"] = _gib_to_bytes("--overhead-gib", overhead_gib)
    if kv_cache_gib is not None:
        changes["pool_bytes"] = _gib_to_bytes("--kv-cache-gib", kv_cache_gib)
    if kv_cache_tokens is not None:
        changes["pool_tokens"] = kv_cache_tokens
    if vllm_version is not None:
        changes["vllm_version"] = vllm_version
    if quantization is not None:
        changes["quantization"] = quantization
    dep = replace(dep, **changes)

    # The memory profile predicted from config.json replaces the flat overhead unless the user
    # gave the overhead or measured pool themselves.
    # local, and only when used: a given pool needs no config.json or per-version budget (start-up)
    if (dep.gpu_memory_bytes is not None and overhead_gib is None and not pools) or doc_log is not None:
        from kvwatch.commands import capacity_memory

    profile = None
    if dep.gpu_memory_bytes is not None and overhead_gib is None and not pools:
        profile = capacity_memory.predict(
            model,
            capacity_memory.MemoryInputs(
                gpu_memory_bytes=dep.gpu_memory_bytes,
                utilization=dep.gpu_memory_utilization,
                tp=dep.tp,
                pp=dep.pp,
                max_model_len=dep.max_model_len or arch.max_position_embeddings,
                max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs,
                vllm_version=dep.vllm_version,
                enforce_eager=enforce_eager,
                quantization=quantization,
                dtype=dtype,
                weights_bytes=dep.weights_bytes,
            ),
        )
        dep = replace(
            dep,
            pool_bytes=max(0, profile.kv_memory_bytes),
            weights_bytes=profile.weights_bytes,
            overhead_bytes=profile.non_kv_bytes - profile.weights_bytes,
            max_num_batched_tokens=profile.max_num_batched_tokens,
        )

    est = estimate(arch, dep)
    doc = capacity_document(arch, dep, est, levers(arch, dep))
    doc["memory"] = capacity_memory.measured_memory(doc_log) if doc_log is not None else None
    doc["start"] = None
    if profile is not None:
        doc["pool"]["source"] = "memory_profile"
        doc["memory"] = capacity_memory.memory_block(profile)
        verdict = capacity_memory.start_of(profile, est, arch.max_position_embeddings)
        doc["start"] = verdict.as_dict() if verdict else None
    if doc_log is not None:
        doc["observed"] = check_against_log(doc_log, arch, dep)
    if output_format is Format.json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        typer.echo(render_text(doc))


def _parse_sensitivity(text: str | None) -> tuple[int, ...]:
    if text is None:
        return DEFAULT_SENSITIVITY
    try:
        values = tuple(int(part.replace("_", "").strip()) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--sensitivity {text!r}: give comma-separated token counts, e.g. 4000,8000,32000") from None
    if not values:
        raise UsageError("--sensitivity is empty; give comma-separated token counts, e.g. 4000,8000,32000")
    return values


def render_fleet(plan: FleetPlan) -> str:
    """The fleet plan as a few lines and a sensitivity table."""
    lines = [
        f"peak {plan.peak_concurrent:,} concurrent x {plan.avg_context:,} tokens x {plan.kv_bytes_per_token:,} B/token",
        f"  per request       {plan.per_request_bytes:,} B ({plan.per_request_bytes / GIB:,.2f} GiB)",
        f"  cache needed      {plan.cache_needed_bytes:,} B ({plan.cache_needed_bytes / 1e9:,.1f} GB)",
        f"  usable per GPU    {plan.usable_cache_bytes:,} B ({plan.usable_cache_bytes / 1e9:,.1f} GB)",
        f"  GPUs              {plan.gpus:,}",
        "",
        f"  {'avg context':>12}{'GPUs':>10}",
    ]
    lines += [f"  {c:>12,}{g:>10,}" for c, g in plan.sensitivity]
    return "\n".join(lines)


def fleet(
    peak_concurrent: Annotated[int, typer.Option(help="Conversations in flight at the peak.")],
    avg_context: Annotated[int, typer.Option(help="Average tokens held per conversation (prompt + output).")],
    kv_bytes_per_token: Annotated[int | None, typer.Option(help="KV bytes per token (or --model).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model to take bytes/token from.")] = None,
    kv_cache_dtype: Annotated[str, typer.Option(help="With --model: auto | fp8 ...")] = "auto",
    usable_cache_gib: Annotated[float | None, typer.Option(help="KV cache per GPU, GiB (2^30).")] = None,
    usable_cache_gb: Annotated[float | None, typer.Option(help="KV cache per GPU, GB (10^9).")] = None,
    sensitivity: Annotated[str | None, typer.Option(help="Context lengths to try, e.g. 4000,8000,32000.")] = None,
    output_format: Annotated[Format, typer.Option("--format", help="text or json.")] = Format.text,
) -> None:
    """GPUs needed for the KV cache of a peak of concurrent conversations, with sensitivity."""
    if (kv_bytes_per_token is None) == (model is None):
        raise UsageError("give exactly one of --kv-bytes-per-token and --model")
    if (usable_cache_gib is None) == (usable_cache_gb is None):
        raise UsageError("give exactly one of --usable-cache-gib and --usable-cache-gb")
    if kv_bytes_per_token is None:
        assert model is not None
        arch = resolve_model(model)
        from kvwatch.reconcile.capacity import kv_bytes_per_token as per_token

        kv_bytes_per_token = per_token(arch, kv_cache_dtype=kv_cache_dtype)
    if usable_cache_gib is not None:
        usable = round(usable_cache_gib * GIB)
    else:
        assert usable_cache_gb is not None
        usable = round(usable_cache_gb * 10**9)
    plan = plan_fleet(
        peak_concurrent=peak_concurrent,
        avg_context=avg_context,
        kv_bytes_per_token=kv_bytes_per_token,
        usable_cache_bytes=usable,
        sensitivity=_parse_sensitivity(sensitivity),
    )
    if output_format is Format.json:
        typer.echo(json.dumps(plan.as_dict(), indent=2))
    else:
        typer.echo(render_fleet(plan))
