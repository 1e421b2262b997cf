"""The capacity model applied to a running server: its stated facts in, expectations and levers out.

One set of functions serves ``kvwatch capacity --from-log``, ``kvwatch analyze``'s levers and the
sidecar's reconcile ratios and what-ifs, so the three agree on the same run:

- ``deployment_from_facts``: how the server was launched and its measured pool, as a Deployment;
- ``expectation``: what config.json predicts for that server (bytes/token, the pool vLLM would
  print for its KV memory, the concurrency at max_model_len vLLM would print), per vLLM version,
  sliding-window and hybrid groups included;
- ``lever_rows``: the what-if table for the server's pool and a request size (its basis);
- ``request_basis``: the one rule for that request size (vLLM's request histograms on /metrics,
  else the log's pool x KV usage / running);
- ``check_against_facts``: vLLM's printed pool and concurrency next to kvwatch's prediction.

Pure: no files, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvwatch.errors import UsageError
from kvwatch.reconcile.architecture import Architecture, resolve_model
from kvwatch.reconcile.facts import GIB, ServerFacts, as_int, as_number, as_positive_int
from kvwatch.reconcile.levers import LeverRow, levers, unknown_row
from kvwatch.reconcile.model_catalogue import known
from kvwatch.reconcile.pool import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KV_CACHE_DTYPE_BYTES,
    CapacityEstimate,
    Deployment,
    RequestShape,
    blocks_range_from_gib,
    deployment_layout,
    estimate,
    kv_bytes_per_token,
    max_concurrency_at_max_model_len,
    printed_tokens_for,
)

if TYPE_CHECKING:  # an annotation only: `kvwatch capacity` need not build the log records (start-up)
    from kvwatch.records import StatsRecord

# ---------------------------------------------------------------------------------------------
# The server as a Deployment
# ---------------------------------------------------------------------------------------------


def deployment_from_facts(
    facts: ServerFacts, arch: Architecture | None = None, request: RequestShape | None = None
) -> Deployment:
    """A Deployment from the server's stated config and its measured pool.

    The pool is the first the log states of: blocks, tokens, KV memory; then cache_config_info's.
    """
    cap, cfg = facts.capacity, facts.config
    blocks = as_int(cap.gpu_blocks)
    tokens = as_int(cap.kv_cache_tokens)
    gib = as_number(cap.kv_cache_memory_gib)
    if blocks is None and tokens is None and gib is None:
        blocks = as_int(facts.metric("num_gpu_blocks"))
        tokens = None if blocks is not None else as_int(facts.metric("kv_cache_size_tokens"))
    block_size = facts.block_size
    weights_gib = as_number(cap.weights_gib)
    kv_dtype = facts.kv_cache_dtype
    util = as_number(cfg.gpu_memory_utilization)
    prefix = cfg.enable_prefix_caching
    return Deployment(
        kv_cache_dtype=kv_dtype if kv_dtype and kv_dtype.lower() in KV_CACHE_DTYPE_BYTES else "auto",
        tp=facts.tensor_parallel_size or 1,
        pp=as_positive_int(cfg.pipeline_parallel_size) or 1,
        block_size=block_size or DEFAULT_BLOCK_SIZE,
        max_model_len=facts.max_model_len,
        max_num_batched_tokens=facts.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        prefix_caching=prefix if isinstance(prefix, bool) else True,
        pool_blocks=blocks,
        pool_tokens=tokens if blocks is None else None,
        pool_bytes=int(gib * GIB) if blocks is None and tokens is None and gib is not None else None,
        gpu_memory_utilization=util if util is not None and 0 < util <= 1 else DEFAULT_GPU_MEMORY_UTILIZATION,
        weights_bytes=int(weights_gib * GIB) if weights_gib is not None else None,
        request=request,
        vllm_version=facts.vllm_version,
        quantization=cfg.quantization if isinstance(cfg.quantization, str) else None,
    )


def observed_architecture(facts: ServerFacts) -> Architecture | None:
    """Without a model: a one-layer stand-in with the observed bytes/token (KV memory / tokens)."""
    cap = facts.capacity
    gib = as_number(cap.kv_cache_memory_gib)
    tokens = as_int(cap.kv_cache_tokens)
    blocks = as_int(cap.gpu_blocks)
    bs = as_int(cap.block_size) or as_int(facts.config.block_size)
    if tokens is None and blocks is not None and bs:
        tokens = blocks * bs
    computed = facts.computed_blocks
    if computed is not None and bs:
        tokens = computed * bs  # the KV memory held the computed blocks, not the override
    if gib is None or not tokens:
        return None
    per_token = gib * GIB / tokens
    head_dim = max(1, round(per_token / 4))  # 2 (K and V) x 2 bytes x 1 head x 1 layer
    return Architecture(
        name="observed",
        architecture_class="observed",
        layer_kinds=("full",),
        num_attention_heads=1,
        kv_heads=1,
        head_dim=head_dim,
        dtype="bfloat16",
        source="KV memory / pool tokens from the log",
    )


def model_from_facts(facts: ServerFacts) -> Architecture | None:
    """The model the log names (``config.model``), if kvwatch knows it and the log agrees.

    Only the engine config's model counts: a served name is the operator's label (the seed run
    serves a 4-layer model as "llama-3.1-8b-sim"). When the log states both KV memory and pool
    tokens and their ratio is not within 2x of the model's bytes/token, the name is not trusted.
    """
    name = facts.model
    if name is None:
        return None
    try:
        arch = resolve_model(name, catalogue_lookup=known)
    except UsageError:
        return None
    gib = as_number(facts.capacity.kv_cache_memory_gib)
    tokens = as_int(facts.capacity.kv_cache_tokens)
    if gib is not None and tokens:
        dep = deployment_from_facts(facts, arch)
        try:
            expected = kv_bytes_per_token(arch, kv_cache_dtype=dep.kv_cache_dtype, tp=dep.tp, pp=dep.pp)
        except UsageError:
            return None
        if not 0.5 <= gib * GIB / tokens / expected <= 2.0:
            return None
    return arch


# ---------------------------------------------------------------------------------------------
# What config.json predicts for the server
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expectation:
    """config.json's prediction for one server, in the units vLLM prints.

    ``pool_tokens`` is what vLLM's "KV cache size: N tokens" line would print for the KV memory it
    reported (or for a --num-gpu-blocks-override); ``max_concurrency_at_max_model_len`` what its
    "Maximum concurrency for L tokens per request" would print for that pool.
    """

    bytes_per_token: float
    pool_tokens: float | None
    max_concurrency_at_max_model_len: float | None
    estimate: CapacityEstimate
    # What KV memory / printed pool tokens should read. With one full-attention group that is
    # bytes_per_token; with sliding-window or Mamba groups vLLM prints int(concurrency x
    # max_model_len) tokens (0.21+), not the tokens the memory stores, so the quotient is the
    # memory over the pool this model predicts vLLM prints.
    printed_bytes_per_token: float | None = None


def expected_estimate(arch: Architecture, facts: ServerFacts, **overrides: Any) -> CapacityEstimate:
    """The config.json estimate under the server's settings, its pool *predicted* from KV memory.

    With a KV-memory figure (log, else cache_config_info) the pool is computed from it, so
    observed/expected compares vLLM's block count with kvwatch's; a --num-gpu-blocks-override
    is the pool itself; otherwise the printed blocks/tokens are taken. ``overrides`` replace
    Deployment fields (flags).
    """
    dep = deployment_from_facts(facts, arch)
    override = facts.override_blocks
    kv_bytes = facts.kv_memory_bytes
    if override is not None:
        dep = replace(dep, pool_blocks=int(override), pool_tokens=None, pool_bytes=None)
    elif kv_bytes is not None:
        dep = replace(dep, pool_blocks=None, pool_tokens=None, pool_bytes=int(kv_bytes))
    return estimate(arch, replace(dep, **overrides) if overrides else dep)


def expectation(arch: Architecture, facts: ServerFacts) -> Expectation:
    """What config.json predicts for this server; raises UsageError on settings it cannot size."""
    est = expected_estimate(arch, facts)
    predicted = est.pool_source in ("bytes", "blocks") and (
        facts.kv_memory_bytes is not None or facts.override_blocks is not None
    )
    pool_tokens = float(est.pool_tokens) if predicted and est.pool_tokens else None
    kv_bytes = facts.kv_memory_bytes
    printed: float | None = float(est.kv_bytes_per_token)
    if not est.layout.uniform:
        printed = kv_bytes / pool_tokens if kv_bytes and pool_tokens and facts.override_blocks is None else None
    return Expectation(
        bytes_per_token=float(est.kv_bytes_per_token),
        pool_tokens=pool_tokens,
        max_concurrency_at_max_model_len=est.max_concurrency_at_max_model_len if predicted else None,
        estimate=est,
        printed_bytes_per_token=printed,
    )


def concurrency_at_max_model_len(arch: Architecture | None, facts: ServerFacts, pool_tokens: float) -> float | None:
    """vLLM's startup concurrency figure for a pool of ``pool_tokens`` (per version and KV groups).

    Without a model, one uniform group: blocks / cdiv(max_model_len, block_size).
    """
    max_len = facts.max_model_len
    if not max_len:
        return None
    if arch is not None:
        try:
            est = estimate(
                arch, replace(deployment_from_facts(facts, arch), pool_blocks=None, pool_tokens=int(pool_tokens))
            )
        except (UsageError, ArithmeticError):
            return None
        return est.max_concurrency_at_max_model_len
    size = facts.block_size
    if size:
        return (pool_tokens // size) / -(-max_len // size)
    return pool_tokens / max_len


# ---------------------------------------------------------------------------------------------
# The request size behind every what-if, and the levers
# ---------------------------------------------------------------------------------------------


def request_from_histograms(prompt_p95: float | None, output_p95: float | None) -> RequestShape | None:
    """The observed request: p95 of vLLM's prompt and generation token histograms (/metrics)."""
    if prompt_p95 is None or output_p95 is None or prompt_p95 + output_p95 <= 0:
        return None
    return RequestShape(round(prompt_p95), round(output_p95), source="metrics")


def request_from_stats(pool_tokens: float | None, stats: StatsRecord | None) -> RequestShape | None:
    """The observed request from the log alone: what the running requests hold on average.

    pool x KV usage / running of one stats record; vLLM's log does not split prompt from output,
    so the whole footprint is the request and the prompt lever cannot be sized on it.
    """
    if not stats or not pool_tokens or not stats.running or stats.kv_usage_pct is None:
        return None
    per_request = pool_tokens * stats.kv_usage_pct / 100.0 / stats.running
    if per_request < 1:
        return None
    return RequestShape(round(per_request), 0, source="log")


def lever_rows(
    facts: ServerFacts,
    arch: Architecture | None,
    request: RequestShape | None = None,
    pool_tokens: float | None = None,
) -> list[LeverRow]:
    """The what-if table for this server: its pool (or ``pool_tokens``) and ``request`` as the basis.

    Without ``arch`` the rows use the observed bytes/token and the tensor-parallel row says it
    needs the model. [] when nothing is known; a log's odd numbers (a PP size larger than the
    model, ...) give [] rather than an error.
    """
    model = arch or observed_architecture(facts)
    if model is None:
        return []
    dep = deployment_from_facts(facts, arch, request)
    if pool_tokens is not None and pool_tokens != facts.log_pool_tokens:
        dep = replace(dep, pool_blocks=None, pool_bytes=None, pool_tokens=int(pool_tokens))
    try:
        rows = levers(model, dep)
    except (UsageError, ArithmeticError, ValueError):
        return []
    if arch is None:
        needs = "needs the model (--model) to know its KV heads"
        rows = [unknown_row(r.lever, needs) if r.lever == "tensor_parallel_x2" else r for r in rows]
    return rows


def whatif_concurrency(rows: list[LeverRow]) -> dict[str, float]:
    """Lever -> projected max concurrency, for the rows on a request basis (the sidecar's gauges)."""
    return {r.lever: r.max_concurrency for r in rows if r.max_concurrency is not None and r.basis == "request"}


# ---------------------------------------------------------------------------------------------
# vLLM's printed figures against the prediction
# ---------------------------------------------------------------------------------------------


def check_against_facts(facts: ServerFacts, arch: Architecture, dep: Deployment | None = None) -> dict[str, Any]:
    """vLLM's printed pool and concurrency next to kvwatch's prediction.

    The pool is predicted from vLLM's own "KV cache memory" figure; since the printed GiB is
    rounded to 0.01, the prediction is a block range, and it matches when the printed block count
    lies within one block of that range. The concurrency at max_model_len is predicted from the
    printed block count with vLLM's formula and matches when equal to 2 decimals. A
    --num-gpu-blocks-override replaces the computed pool, so the printed pool is then not vLLM's
    computed one (``capacity.computed_gpu_blocks``, when the reader provides it, is used instead).
    """
    dep = dep or deployment_from_facts(facts, arch)
    layout = deployment_layout(arch, dep)
    cap = facts.capacity
    gib = as_number(cap.kv_cache_memory_gib)
    printed_blocks = as_int(cap.gpu_blocks)
    computed_blocks = facts.computed_blocks
    printed_tokens = as_int(cap.kv_cache_tokens)
    ratio = as_number(cap.max_concurrency_ratio)
    max_len = as_int(cap.max_concurrency_tokens_per_request) or dep.max_model_len
    if printed_blocks is None and printed_tokens is not None and layout.uniform:
        printed_blocks = printed_tokens // layout.block_size
    out: dict[str, Any] = {
        "kv_cache_memory_gib": cap.kv_cache_memory_gib,
        "gpu_blocks": printed_blocks,
        "computed_gpu_blocks": computed_blocks,
        "kv_cache_tokens": printed_tokens,
        "block_size": layout.block_size,
        "max_concurrency": cap.max_concurrency_ratio,
        "tokens_per_request": max_len,
        "predicted_blocks_range": None,
        "predicted_tokens_range": None,
        "pool_within_one_block": None,
        "predicted_max_concurrency_range": None,
        "predicted_max_concurrency": None,
        "max_concurrency_matches": None,
    }
    mnbt = dep.max_num_batched_tokens
    if gib is not None:
        low, high = blocks_range_from_gib(layout, gib)
        out["predicted_blocks_range"] = [low, high]
        against = computed_blocks if computed_blocks is not None else printed_blocks
        if against is not None:
            out["pool_within_one_block"] = low - 1 <= against <= high + 1
        elif printed_tokens is not None:
            # Non-uniform layouts print tokens only; which formula depends on the version.
            lows = printed_tokens_for(layout, max(0, low - 1), max_len, mnbt, dep.vllm_version)
            highs = printed_tokens_for(layout, high + 1, max_len, mnbt, dep.vllm_version)
            out["predicted_tokens_range"] = [min(lows), max(highs)]
            out["pool_within_one_block"] = any(a <= printed_tokens <= b for a, b in zip(lows, highs, strict=True))
        if max_len and printed_blocks is None:
            conc = [
                max_concurrency_at_max_model_len(layout, b, max_len, mnbt, dep.vllm_version)
                for b in (max(0, low - 1), high + 1)
            ]
            out["predicted_max_concurrency_range"] = [round(conc[0], 2), round(conc[1], 2)]
            if ratio is not None:
                out["max_concurrency_matches"] = (
                    out["predicted_max_concurrency_range"][0]
                    <= round(ratio, 2)
                    <= out["predicted_max_concurrency_range"][1]
                )
    if printed_blocks is not None and max_len:
        predicted = max_concurrency_at_max_model_len(layout, printed_blocks, max_len, mnbt, dep.vllm_version)
        out["predicted_max_concurrency"] = round(predicted, 2)
        if ratio is not None:
            out["max_concurrency_matches"] = round(predicted, 2) == round(ratio, 2)
    return out
