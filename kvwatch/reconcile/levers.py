"""The levers: what one change to the deployment would do to the KV pool and concurrency.

A table, one row per lever (``LEVERS``): its name, the function that applies it to a deployment,
in the order every report shows them. Each lever starts from the same pool in bytes (so a pool
measured in tokens moves correctly when bytes/token change) and is applied alone. Every row says
its basis: the request size it was computed for and where that size came from, or vLLM's
max_model_len figure when no request size is known.

Pure: built on ``kvwatch.reconcile.pool.estimate``; no files, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.reconcile.architecture import Architecture
from kvwatch.reconcile.pool import (
    FP8_BYTES_PER_PARAM,
    GIB,
    INT4_BYTES_PER_PARAM,
    QUANTIZATION_BYTES_PER_PARAM,
    CapacityEstimate,
    Deployment,
    RequestShape,
    estimate,
    kv_dtype_bytes,
)


@dataclass(frozen=True, slots=True)
class LeverRow:
    """One "what if": the new bytes/token, pool, concurrency and its ratio to today."""

    lever: str
    kv_bytes_per_token: int | None
    pool_tokens: int | None
    max_concurrency: float | None
    multiplier: float | None
    basis: str | None  # "request" (a stated request size) or "max_model_len"
    note: str = ""
    request: RequestShape | None = None  # the request size of a "request" basis, with its source

    def as_dict(self) -> dict[str, Any]:
        """The JSON row (kvwatch.capacity/1 levers[])."""
        req = self.request if self.basis == "request" else None
        return {
            "lever": self.lever,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "pool_tokens": self.pool_tokens,
            "max_concurrency": _round(self.max_concurrency),
            "multiplier": _round(self.multiplier),
            "basis": self.basis,
            "note": self.note,
            # Additive: the request size behind a "request" basis and where it came from.
            "basis_request": (
                {
                    "prompt_tokens": req.prompt_tokens,
                    "output_tokens": req.output_tokens,
                    "shared_prefix_tokens": req.shared_prefix_tokens,
                    "source": req.source,
                }
                if req is not None
                else None
            ),
        }


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


@dataclass(frozen=True, slots=True)
class LeverContext:
    """What every lever starts from: the model, today's deployment and estimate, the pooled deployment."""

    arch: Architecture
    dep: Deployment
    base: CapacityEstimate
    pooled: Deployment  # dep with its pool as bytes and the GPU-memory source removed


def _basis(est: CapacityEstimate) -> tuple[float | None, str | None]:
    if est.max_concurrency is not None:
        return est.max_concurrency, "request"
    if est.max_concurrency_at_max_model_len is not None:
        return est.max_concurrency_at_max_model_len, "max_model_len"
    return None, None


def _row(lever: str, est: CapacityEstimate, base: CapacityEstimate, note: str = "") -> LeverRow:
    base_value, basis = _basis(base)
    value = est.max_concurrency if basis == "request" else est.max_concurrency_at_max_model_len
    multiplier: float | None = None
    if value is not None and base_value:
        multiplier = value / base_value
    elif est.pool_tokens is not None and base.pool_tokens:
        multiplier = est.pool_tokens / base.pool_tokens
    return LeverRow(lever, est.kv_bytes_per_token, est.pool_tokens, value, multiplier, basis, note, est.request)


def _unchanged(lever: str, base: CapacityEstimate, note: str) -> LeverRow:
    return _row(lever, base, base, note)


def _unknown(lever: str, note: str) -> LeverRow:
    return LeverRow(lever, None, None, None, None, None, note)


def _fp8_kv_cache(name: str, c: LeverContext) -> LeverRow:
    if kv_dtype_bytes(c.dep.kv_cache_dtype, c.arch) == 1:
        return _unchanged(name, c.base, f"the KV cache is already 1 byte ({c.dep.kv_cache_dtype})")
    est = estimate(c.arch, replace(c.pooled, kv_cache_dtype="fp8"))
    return _row(name, est, c.base, "--kv-cache-dtype fp8: 1 byte per element")


def _weights(target: float) -> Callable[[str, LeverContext], LeverRow]:
    def lever(name: str, c: LeverContext) -> LeverRow:
        weights = c.base.weights_bytes
        if weights is None:
            return _unknown(name, "needs the weights size: pass --weights-gib or a catalogue model")
        quant = (c.dep.quantization or "").lower()
        current = QUANTIZATION_BYTES_PER_PARAM.get(quant) or c.arch.weight_bytes_per_param or float(c.arch.dtype_bytes)
        new_weights = int(weights * target / current)
        if new_weights >= weights:
            return _unchanged(name, c.base, f"weights are already {current:g} bytes/parameter or less")
        freed = weights - new_weights
        pooled = replace(c.pooled, pool_bytes=(c.pooled.pool_bytes or 0) + freed, weights_bytes=new_weights)
        note = f"weights {weights / GIB:.2f} -> {new_weights / GIB:.2f} GiB per GPU, freed to the pool"
        return _row(name, estimate(c.arch, pooled), c.base, note)

    return lever


def _prefix_caching(name: str, c: LeverContext) -> LeverRow:
    req = c.dep.request
    if req is None or req.shared_prefix_tokens == 0:
        return _unchanged(name, c.base, "no shared prefix stated (--shared-prefix-tokens)")
    if c.dep.prefix_caching:
        without = estimate(c.arch, replace(c.pooled, prefix_caching=False))
        note = f"already counted (prefix caching is on); without it: {without.max_concurrency or 0:.2f}"
        return _unchanged(name, c.base, note)
    est = estimate(c.arch, replace(c.pooled, prefix_caching=True))
    return _row(
        name, est, c.base, f"--enable-prefix-caching: the {req.shared_prefix_tokens:,}-token prefix stored once"
    )


def _gpu_memory_utilization(name: str, c: LeverContext) -> LeverRow:
    dep = c.dep
    if dep.gpu_memory_bytes is None:
        return _unknown(name, "needs the GPU memory: pass --gpu-memory-gib")
    if dep.gpu_memory_utilization + 0.05 > 1.0:
        return _unchanged(name, c.base, f"--gpu-memory-utilization is {dep.gpu_memory_utilization}; no room for +0.05")
    extra = int(dep.gpu_memory_bytes * 0.05)
    est = estimate(c.arch, replace(c.pooled, pool_bytes=(c.pooled.pool_bytes or 0) + extra))
    note = f"--gpu-memory-utilization {dep.gpu_memory_utilization + 0.05:.2f}: +{extra / GIB:.2f} GiB"
    return _row(name, est, c.base, note)


def _tensor_parallel_x2(name: str, c: LeverContext) -> LeverRow:
    arch, tp2 = c.arch, c.dep.tp * 2
    if arch.num_attention_heads % tp2:
        return _unknown(name, f"{arch.num_attention_heads} attention heads do not split over TP {tp2}")
    weights = c.base.weights_bytes or 0
    freed = weights - weights // 2
    pooled = replace(c.pooled, tp=tp2, pool_bytes=(c.pooled.pool_bytes or 0) + freed, weights_bytes=weights // 2)
    why = "per GPU; twice the GPUs"
    if c.base.weights_bytes is None:
        why += "; weights unknown, so no freed memory counted"
    if arch.mla:
        why += "; MLA's latent is not split by TP"
    elif arch.kv_heads < tp2:
        why += f"; {arch.kv_heads} KV heads are replicated over TP {tp2}"
    return _row(name, estimate(arch, pooled), c.base, why)


def _fewer_prompt_tokens(name: str, c: LeverContext) -> LeverRow:
    # A quarter off the prompt, never the output: the prompt is what an operator can trim (system
    # prompt, retrieved context); the generated tokens are the answer.
    req = c.dep.request
    if req is None:
        return _unknown(name, "needs a request size: --prompt-tokens and --output-tokens")
    if req.source == "log":
        return _unknown(name, "needs the prompt/output split (vLLM's request token histograms on /metrics)")
    prompt = req.prompt_tokens * 3 // 4
    smaller = replace(req, prompt_tokens=prompt, shared_prefix_tokens=min(req.shared_prefix_tokens, prompt))
    note = f"prompt {req.prompt_tokens:,} -> {prompt:,} tokens (-25 %)"
    return _row(name, estimate(c.arch, replace(c.pooled, request=smaller)), c.base, note)


def _max_model_len_half(name: str, c: LeverContext) -> LeverRow:
    if not c.base.max_model_len:
        return _unchanged(name, c.base, "no change to the pool")
    half = c.base.max_model_len // 2
    shown = estimate(c.arch, replace(c.pooled, max_model_len=half)).max_concurrency_at_max_model_len
    note = (
        f"no change to the pool: a request's KV depends on its own length; only vLLM's startup ratio "
        f"at {half:,} tokens reads {shown or 0:.2f}x"
    )
    return _unchanged(name, c.base, note)


# The levers, in the order every table shows them: (name, how it is applied).
LEVER_TABLE: tuple[tuple[str, Callable[[str, LeverContext], LeverRow]], ...] = (
    ("fp8_kv_cache", _fp8_kv_cache),
    ("int4_weights", _weights(INT4_BYTES_PER_PARAM)),
    ("fp8_weights", _weights(FP8_BYTES_PER_PARAM)),
    ("prefix_caching", _prefix_caching),
    ("gpu_memory_utilization_plus_0_05", _gpu_memory_utilization),
    ("tensor_parallel_x2", _tensor_parallel_x2),
    ("fewer_prompt_tokens", _fewer_prompt_tokens),
    ("max_model_len_half", _max_model_len_half),
)
LEVERS = tuple(name for name, _ in LEVER_TABLE)


def levers(arch: Architecture, dep: Deployment) -> list[LeverRow]:
    """One row per lever of ``LEVER_TABLE``, each applied alone to ``dep``."""
    base = estimate(arch, dep)
    if base.pool_blocks is None:
        needs = "needs a pool: --gpu-memory-gib, --kv-cache-gib, --kv-cache-tokens or --from-log"
        return [_unknown(name, needs) for name in LEVERS]
    pooled = replace(
        dep,
        pool_blocks=None,
        pool_tokens=None,
        pool_bytes=base.pool_bytes,
        gpu_memory_bytes=None,
        weights_bytes=base.weights_bytes,
    )
    context = LeverContext(arch, dep, base, pooled)
    return [apply(name, context) for name, apply in LEVER_TABLE]


def unknown_row(lever: str, note: str) -> LeverRow:
    """A lever kvwatch cannot size, with the reason (e.g. it needs the model)."""
    return _unknown(lever, note)
