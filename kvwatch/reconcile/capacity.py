"""The expected KV-cache capacity, computed the way vLLM computes it (vllm-formats.md §7).

Owns the napkin math of issue 3: KV bytes per token per GPU (full attention, GQA/MQA, MLA,
sliding-window and attention+Mamba hybrids, TP, PP, fp8), the pool (from GPU memory or measured),
blocks, max concurrency for a stated request size (shared prefix stored once) and at
max_model_len exactly as vLLM's startup line prints it, and the levers that move it.

Pure: no files, no clock. ``expected_capacity`` is what the sidecar calls; ``levers`` and
``levers_for_analysis`` feed ``kvwatch capacity`` and ``kvwatch analyze``'s diagnosis.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import UsageError
from kvwatch.reconcile.architecture import Architecture, LayerKind, resolve_model

GIB = 2**30

# --cache-dtype values and their bytes per element (vLLM STR_DTYPE_TO_TORCH_DTYPE; fp8 variants
# are stored as uint8). "auto" means the model dtype. Newer MLA-only formats (fp8_ds_mla, 0.11+)
# are not modelled: they pack 656 bytes per token and layer, not a dtype times a width.
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,  # 0.4+: fp8_e5m2 before 0.5, e4m3 after; 1 byte either way
    "fp8_e4m3": 1,  # 0.5.0+
    "fp8_e5m2": 1,  # 0.4.0+
    "fp8_inc": 1,  # Intel Gaudi, float8_e4m3fn
    "int8": 1,  # 0.20+
}

DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE (CUDA); CPU needs multiples of 32
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
# Non-KV memory besides the weights: PyTorch activation peak + non-torch (NCCL, CUDA context) +
# CUDA graphs (subtracted before sizing from 0.21). A real Llama-3-8B H100 run shows 1.26 GiB
# activations + 1.79 GiB non-torch (tests/fixtures/real/logs/025), and graph capture takes 0.3-0.9
# GiB (logs 019/020), so 3.5 GiB is a stated, round default; --overhead-gib overrides it.
DEFAULT_OVERHEAD_GIB = 3.5
# vLLM's default max_num_batched_tokens for `vllm serve` on a >= 70 GiB GPU (8192; 2048 on smaller
# cards). It only bounds sliding-window layers: a request holds window - 1 + one scheduled chunk.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
# Kernel alignment vLLM uses when it raises the attention block size of a Mamba hybrid so that an
# attention page is at least a Mamba page (HybridAttentionMambaModelConfig, 0.10+).
MAMBA_BLOCK_ALIGNMENT = 16
# Weight bytes per parameter after quantisation: AWQ/GPTQ int4 with group-128 scales and zeros
# (~4.25 bits), fp8 with per-channel scales (~8 bits).
INT4_BYTES_PER_PARAM = 0.53
FP8_BYTES_PER_PARAM = 1.0
# vLLM --quantization values (as the engine config prints them) -> weight bytes per parameter, so
# the weight levers do not shrink weights that are already quantised.
QUANTIZATION_BYTES_PER_PARAM: dict[str, float] = {
    "awq": INT4_BYTES_PER_PARAM,
    "awq_marlin": INT4_BYTES_PER_PARAM,
    "gptq": INT4_BYTES_PER_PARAM,
    "gptq_marlin": INT4_BYTES_PER_PARAM,
    "bitsandbytes": INT4_BYTES_PER_PARAM,
    "gguf": INT4_BYTES_PER_PARAM,
    "mxfp4": INT4_BYTES_PER_PARAM,  # gpt-oss
    "fp8": FP8_BYTES_PER_PARAM,
    "fbgemm_fp8": FP8_BYTES_PER_PARAM,
    "modelopt": FP8_BYTES_PER_PARAM,
}


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as vLLM's ``cdiv``."""
    return -(-a // b)


def kv_dtype_bytes(kv_cache_dtype: str, arch: Architecture) -> int:
    """Bytes per KV element for ``--kv-cache-dtype``; unknown values are a usage error."""
    key = (kv_cache_dtype or "auto").lower()
    if key not in KV_CACHE_DTYPE_BYTES:
        raise UsageError(
            f"--kv-cache-dtype {kv_cache_dtype!r} is not known; use one of {', '.join(KV_CACHE_DTYPE_BYTES)}"
        )
    value = KV_CACHE_DTYPE_BYTES[key]
    return arch.dtype_bytes if value is None else value


def pp_partition(layers: int, pp: int) -> list[tuple[int, int]]:
    """Layer ranges per pipeline stage, as vLLM's ``get_pp_indices`` splits them.

    Each stage gets layers // pp; the remainder goes one each to the stages before the last.
    """
    if pp < 1 or pp > layers:
        raise UsageError(f"--pp {pp} does not fit {layers} layers; use 1..{layers}")
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for size in sizes:
        out.append((start, start + size))
        start += size
    return out


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KvLayout:
    """How one GPU's KV cache is laid out (vLLM V1 KV-cache groups, §7.3).

    Every group's page (one block of one layer) has the same size; ``group_size`` layers share
    one block tensor, so a block of the pool costs ``page_bytes * group_size`` bytes.
    """

    block_size: int
    token_bytes_per_layer: int  # one token, one attention layer, this GPU
    page_bytes: int  # one block of one layer
    group_size: int
    groups: tuple[LayerKind, ...]  # one entry per KV-cache group
    kv_bytes_per_token: int  # one token across this GPU's attention layers
    attention_layers: int  # on this GPU (the largest PP stage)
    sliding_layers: int
    mamba_layers: int
    mamba_state_bytes: int  # one request, one Mamba layer, this GPU (unpadded)
    sliding_window: int | None

    @property
    def block_bytes(self) -> int:
        """What one block of the pool costs in memory."""
        return self.page_bytes * self.group_size

    @property
    def uniform(self) -> bool:
        """One group of full attention: tokens = blocks x block_size exactly."""
        return self.groups == ("full",)


@dataclass(frozen=True, slots=True)
class RequestShape:
    """One request's KV footprint in tokens; the shared prefix is stored once across requests."""

    prompt_tokens: int
    output_tokens: int
    shared_prefix_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        """Tokens one request holds at its end: prompt + output."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Deployment:
    """How vLLM is (or would be) launched, and where the pool comes from.

    Exactly one pool source is used, first of: pool_blocks, pool_tokens, pool_bytes, then GPU
    memory (gpu_memory_bytes x utilization - weights - overhead). ``weights_bytes`` is per GPU, as
    vLLM's "model weights take" line prints it.
    """

    kv_cache_dtype: str = "auto"
    tp: int = 1
    pp: int = 1
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int | None = None
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    prefix_caching: bool = True  # V1 default
    pool_bytes: int | None = None
    pool_tokens: int | None = None
    pool_blocks: int | None = None
    gpu_memory_bytes: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    weights_bytes: int | None = None
    overhead_bytes: int = int(DEFAULT_OVERHEAD_GIB * GIB)
    request: RequestShape | None = None
    vllm_version: str | None = None  # picks the concurrency formula (§7.4); None = current
    quantization: str | None = None  # vLLM --quantization, for the weight levers


@dataclass(frozen=True, slots=True)
class CapacityEstimate:
    """The expectation for one (model, deployment): what ``kvwatch capacity`` prints."""

    layout: KvLayout
    max_model_len: int | None
    pool_bytes: int | None
    pool_blocks: int | None
    pool_tokens: int | None
    pool_source: str  # "gpu_memory" | "bytes" | "tokens" | "blocks" | "none"
    weights_bytes: int | None  # per GPU, used for the GPU-memory pool and the weight levers
    max_concurrency_at_max_model_len: float | None
    request: RequestShape | None
    request_bytes: int | None  # one request's KV footprint (prompt + output), no sharing
    request_tokens: int | None  # what one more request adds: prompt + output - shared prefix
    max_concurrency: float | None

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token on one GPU."""
        return self.layout.kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class LeverRow:
    """One "what if": the new bytes/token, pool, concurrency and its ratio to today."""

    lever: str
    kv_bytes_per_token: int | None
    pool_tokens: int | None
    max_concurrency: float | None
    multiplier: float | None
    basis: str | None  # "request" (stated request size) or "max_model_len"
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The JSON row (kvwatch.capacity/1 levers[])."""
        return {
            "lever": self.lever,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "pool_tokens": self.pool_tokens,
            "max_concurrency": _round(self.max_concurrency),
            "multiplier": _round(self.multiplier),
            "basis": self.basis,
            "note": self.note,
        }


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


# ---------------------------------------------------------------------------------------------
# Layout: bytes per token and the KV-cache groups
# ---------------------------------------------------------------------------------------------


def _group_kinds(counts: Counter[LayerKind]) -> tuple[int, tuple[LayerKind, ...]]:
    """vLLM ``_get_kv_cache_groups_uniform_page_size``: equal-size groups, one kind per group.

    The group size is the smallest layer count among kinds (Gemma 3's 5:1 -> groups of the 1),
    unless the largest is within 1.25x of it (gpt-oss-20b + eagle: 12 vs 13 -> pad to 13).
    """
    order: tuple[LayerKind, ...] = ("full", "sliding", "mamba")
    kinds = [k for k in order if counts.get(k)]
    if len(kinds) == 1:
        return counts[kinds[0]], (kinds[0],)
    smallest = min(counts[k] for k in kinds)
    largest = max(counts[k] for k in kinds)
    size = largest if largest < smallest * 1.25 else smallest
    groups: list[LayerKind] = []
    for k in kinds:
        groups.extend([k] * cdiv(counts[k], size))
    return size, tuple(groups)


def legacy_allocator(vllm_version: str | None) -> bool:
    """True for vLLM before 0.9: no hybrid KV-cache groups (sliding layers allocate like full ones,
    Mamba state lives outside the KV pool). None (unknown) means current vLLM."""
    version = _version(vllm_version)
    return version is not None and version < (0, 9)


def kv_layout(
    arch: Architecture,
    *,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    pp: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    legacy: bool = False,
) -> KvLayout:
    """The KV layout on the GPU that limits the pool (the PP stage with the most bytes per block).

    ``legacy`` (vLLM < 0.9, see ``legacy_allocator``): one group of every attention layer.
    """
    if tp < 1:
        raise UsageError(f"--tp {tp} must be at least 1")
    if block_size < 1:
        raise UsageError(f"--block-size {block_size} must be at least 1")
    elem = kv_dtype_bytes(kv_cache_dtype, arch)
    # MLA: one latent (kv_lora_rank + qk_rope_head_dim) per token and layer, no factor 2, kv heads
    # forced to 1 so not split by TP (vLLM get_num_kv_heads, 0.7.1+). Otherwise K and V per KV head
    # on this GPU: max(1, kv_heads // tp), replicated when kv_heads < tp.
    token_bytes = arch.head_dim * elem if arch.mla else 2 * max(1, arch.kv_heads // tp) * arch.head_dim * elem
    best: KvLayout | None = None
    for start, end in pp_partition(arch.layers, pp):
        counts: Counter[LayerKind] = Counter(arch.layer_kinds[start:end])
        mamba_state = arch.mamba.state_elements(tp) * arch.dtype_bytes if arch.mamba and counts["mamba"] else 0
        bs = block_size
        if legacy:
            counts["full"] += counts.pop("sliding", 0)
        if mamba_state and not legacy:
            # Raise the attention block until one attention page holds a Mamba page (0.10+).
            needed = MAMBA_BLOCK_ALIGNMENT * cdiv(mamba_state, MAMBA_BLOCK_ALIGNMENT * token_bytes)
            bs = max(bs, needed)
        if not counts["full"] and not counts["sliding"]:
            continue  # a stage of only Mamba layers holds no per-token KV
        size, groups = _group_kinds(Counter({k: n for k, n in counts.items() if not (legacy and k == "mamba")}))
        attention = counts["full"] + counts["sliding"]
        layout = KvLayout(
            block_size=bs,
            token_bytes_per_layer=token_bytes,
            page_bytes=bs * token_bytes,
            group_size=size,
            groups=groups,
            kv_bytes_per_token=attention * token_bytes,
            attention_layers=attention,
            sliding_layers=counts["sliding"],
            mamba_layers=counts["mamba"],
            mamba_state_bytes=mamba_state,
            sliding_window=arch.sliding_window if counts["sliding"] else None,
        )
        if best is None or layout.block_bytes > best.block_bytes:
            best = layout
    if best is None:
        raise UsageError(f"{arch.name}: no attention layer holds KV cache; nothing to size")
    return best


def kv_bytes_per_token(arch: Architecture, *, kv_cache_dtype: str = "auto", tp: int = 1, pp: int = 1) -> int:
    """KV bytes of one token on one GPU, over its attention layers (Llama-3.1-8B bf16: 131,072)."""
    return kv_layout(arch, kv_cache_dtype=kv_cache_dtype, tp=tp, pp=pp).kv_bytes_per_token


# ---------------------------------------------------------------------------------------------
# Per-request blocks and concurrency
# ---------------------------------------------------------------------------------------------


def _version(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"v?(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def blocks_per_request_at(layout: KvLayout, max_model_len: int, max_num_batched_tokens: int) -> int:
    """vLLM's per-request block need at max_model_len, summed over groups (§7.4).

    Full: cdiv(L, bs); sliding: cdiv(min(window - 1 + max_num_batched_tokens, L), bs) + 1;
    Mamba: one page.
    """
    bs = layout.block_size
    total = 0
    for kind in layout.groups:
        if kind == "full":
            total += cdiv(max_model_len, bs)
        elif kind == "sliding":
            window = layout.sliding_window or max_model_len
            total += cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), bs) + 1
        else:
            total += 1
    return total


def _request_units(layout: KvLayout, tokens: int, max_num_batched_tokens: int) -> float:
    """Blocks (fractional, as the issue's token formula) one request of ``tokens`` occupies."""
    bs = layout.block_size
    units = 0.0
    for kind in layout.groups:
        if kind == "full":
            units += tokens / bs
        elif kind == "sliding":
            window = layout.sliding_window or tokens
            units += min(tokens, window + max_num_batched_tokens) / bs
        else:
            units += 1.0
    return units


def _prefix_units(layout: KvLayout, prefix: int) -> float:
    # A shared prefix is stored once in full-attention layers; a sliding layer's window has moved
    # past it in a long request, so nothing is counted as shared there.
    return sum(prefix / layout.block_size for kind in layout.groups if kind == "full")


def request_bytes(layout: KvLayout, tokens: int, max_num_batched_tokens: int) -> int:
    """KV bytes one request of ``tokens`` holds on one GPU (a 32,768-token Llama-3.1-8B request: 4 GiB)."""
    total = 0
    per_layer = layout.token_bytes_per_layer
    sliding_layers = layout.sliding_layers
    total += (layout.attention_layers - sliding_layers) * per_layer * tokens
    if sliding_layers:
        window = layout.sliding_window or tokens
        total += sliding_layers * per_layer * min(tokens, window + max_num_batched_tokens)
    total += layout.mamba_layers * layout.mamba_state_bytes
    return total


def max_concurrency_at_max_model_len(
    layout: KvLayout, blocks: int, max_model_len: int, max_num_batched_tokens: int, vllm_version: str | None = None
) -> float:
    """The "Maximum concurrency for L tokens per request: X.XXx" figure vLLM prints.

    V0 and V1 up to 0.8 print blocks x block_size / L; 0.9+ print blocks / (blocks one request of
    L needs, summed over KV-cache groups).
    """
    version = _version(vllm_version)
    if version is not None and version < (0, 9) and layout.uniform:
        return blocks * layout.block_size / max_model_len
    return blocks / blocks_per_request_at(layout, max_model_len, max_num_batched_tokens)


# ---------------------------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------------------------


def pool_bytes_from_gpu(gpu_memory_bytes: int, utilization: float, weights_bytes: int, overhead_bytes: int) -> int:
    """GPU memory x utilization - weights - non-KV overhead (§7.2), in bytes; refuses <= 0."""
    if not 0 < utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization {utilization} must be in (0, 1]")
    available = int(gpu_memory_bytes * utilization) - weights_bytes - overhead_bytes
    if available <= 0:
        raise UsageError(
            f"no memory left for the KV cache: {gpu_memory_bytes / GIB:.2f} GiB x {utilization} - "
            f"{weights_bytes / GIB:.2f} GiB weights - {overhead_bytes / GIB:.2f} GiB overhead <= 0; "
            f"use more --tp, quantised weights or a bigger GPU"
        )
    return available


def default_weights_bytes(arch: Architecture, tp: int, pp: int) -> int | None:
    """The checkpoint's weights per GPU, when the catalogue knows the parameter count."""
    total = arch.weights_bytes
    return None if total is None else total // (tp * pp)


def estimate(arch: Architecture, dep: Deployment) -> CapacityEstimate:
    """Everything ``kvwatch capacity`` reports for one model and deployment."""
    layout = kv_layout(
        arch,
        kv_cache_dtype=dep.kv_cache_dtype,
        tp=dep.tp,
        pp=dep.pp,
        block_size=dep.block_size,
        legacy=legacy_allocator(dep.vllm_version),
    )
    max_len = dep.max_model_len or arch.max_position_embeddings
    mnbt = dep.max_num_batched_tokens
    weights = dep.weights_bytes if dep.weights_bytes is not None else default_weights_bytes(arch, dep.tp, dep.pp)

    blocks: int | None
    pool_bytes: int | None = None
    if dep.pool_blocks is not None:
        source, blocks = "blocks", dep.pool_blocks
    elif dep.pool_tokens is not None:
        source = "tokens"
        if layout.uniform or not max_len:
            blocks = dep.pool_tokens // layout.block_size * len(layout.groups)
        else:  # 0.21+: tokens = int(max_concurrency x max_model_len)
            blocks = math.ceil(dep.pool_tokens * blocks_per_request_at(layout, max_len, mnbt) / max_len)
    elif dep.pool_bytes is not None:
        source, pool_bytes = "bytes", dep.pool_bytes
        blocks = pool_bytes // layout.page_bytes // layout.group_size
    elif dep.gpu_memory_bytes is not None:
        if weights is None:
            raise UsageError(
                f"{arch.name}: the weights size is not known; pass --weights-gib (vLLM's 'model weights take' figure)"
            )
        source = "gpu_memory"
        pool_bytes = pool_bytes_from_gpu(dep.gpu_memory_bytes, dep.gpu_memory_utilization, weights, dep.overhead_bytes)
        blocks = pool_bytes // layout.page_bytes // layout.group_size
    else:
        source, blocks = "none", None
    if blocks is not None and blocks < 0:
        raise UsageError("the KV pool cannot be negative")
    if pool_bytes is None and blocks is not None:
        pool_bytes = blocks * layout.block_bytes

    tokens: int | None = None
    at_len: float | None = None
    if blocks is not None:
        if max_len:
            at_len = max_concurrency_at_max_model_len(layout, blocks, max_len, mnbt, dep.vllm_version)
        if layout.uniform:
            tokens = blocks * layout.block_size
        elif max_len and at_len is not None:
            tokens = int(at_len * max_len)
        else:
            tokens = blocks // len(layout.groups) * layout.block_size

    req = dep.request
    req_bytes = req_tokens = None
    concurrency: float | None = None
    if req is not None:
        shared = req.shared_prefix_tokens if dep.prefix_caching else 0
        req_bytes = request_bytes(layout, req.context_tokens, mnbt)
        req_tokens = req.context_tokens - shared
        if blocks is not None:
            unit = _request_units(layout, req.context_tokens, mnbt)
            prefix = _prefix_units(layout, shared)
            per_request = unit - prefix
            concurrency = max(0.0, (blocks - prefix) / per_request) if per_request > 0 else None

    return CapacityEstimate(
        layout=layout,
        max_model_len=max_len,
        pool_bytes=pool_bytes,
        pool_blocks=blocks,
        pool_tokens=tokens,
        pool_source=source,
        weights_bytes=weights,
        max_concurrency_at_max_model_len=at_len,
        request=req,
        request_bytes=req_bytes,
        request_tokens=req_tokens,
        max_concurrency=concurrency,
    )


def expected_capacity(
    arch: Architecture,
    *,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    pp: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_model_len: int | None = None,
    pool_bytes: int | None = None,
    pool_tokens: int | None = None,
    pool_blocks: int | None = None,
    max_num_batched_tokens: int | None = None,
    request: RequestShape | None = None,
    prefix_caching: bool = True,
    vllm_version: str | None = None,
) -> CapacityEstimate:
    """The sidecar's entry point: the expected capacity for a measured or stated pool."""
    return estimate(
        arch,
        Deployment(
            kv_cache_dtype=kv_cache_dtype,
            tp=tp,
            pp=pp,
            block_size=block_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
            pool_bytes=pool_bytes,
            pool_tokens=pool_tokens,
            pool_blocks=pool_blocks,
            request=request,
            prefix_caching=prefix_caching,
            vllm_version=vllm_version,
        ),
    )


def blocks_range_from_gib(arch_layout: KvLayout, printed_gib: float, decimals: int = 2) -> tuple[int, int]:
    """Blocks a printed, rounded KV-memory figure allows (§7.5): [low, high] over x +- half a unit."""
    half = 0.5 * 10**-decimals
    low = max(0.0, printed_gib - half) * GIB
    high = (printed_gib + half) * GIB
    per_block = arch_layout.block_bytes
    return int(low // per_block), int(high // per_block)


# ---------------------------------------------------------------------------------------------
# Levers
# ---------------------------------------------------------------------------------------------


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
    return LeverRow(lever, est.kv_bytes_per_token, est.pool_tokens, value, multiplier, basis, note)


def _unchanged(lever: str, base: CapacityEstimate, note: str) -> LeverRow:
    return _row(lever, base, base, note)


def _unknown(lever: str, note: str) -> LeverRow:
    return LeverRow(lever, None, None, None, None, None, note)


def _weights_lever(
    lever: str, arch: Architecture, dep: Deployment, base: CapacityEstimate, pooled: Deployment, target: float
) -> LeverRow:
    weights = base.weights_bytes
    if weights is None:
        return _unknown(lever, "needs the weights size: pass --weights-gib or a catalogue model")
    quant = (dep.quantization or "").lower()
    current = QUANTIZATION_BYTES_PER_PARAM.get(quant) or arch.weight_bytes_per_param or float(arch.dtype_bytes)
    new_weights = int(weights * target / current)
    if new_weights >= weights:
        return _unchanged(lever, base, f"weights are already {current:g} bytes/parameter or less")
    freed = weights - new_weights
    est = estimate(arch, replace(pooled, pool_bytes=(pooled.pool_bytes or 0) + freed, weights_bytes=new_weights))
    note = f"weights {weights / GIB:.2f} -> {new_weights / GIB:.2f} GiB per GPU, freed to the pool"
    return _row(lever, est, base, note)


# The levers of issue 3, in the order every table shows them.
LEVERS = (
    "fp8_kv_cache",
    "int4_weights",
    "fp8_weights",
    "prefix_caching",
    "gpu_memory_utilization_plus_0_05",
    "tensor_parallel_x2",
    "fewer_prompt_tokens",
    "max_model_len_half",
)


def levers(arch: Architecture, dep: Deployment) -> list[LeverRow]:
    """One row per lever of issue 3, each applied alone to ``dep``."""
    base = estimate(arch, dep)
    rows: list[LeverRow] = []
    if base.pool_blocks is None:
        return [
            _unknown(n, "needs a pool: --gpu-memory-gib, --kv-cache-gib, --kv-cache-tokens or --from-log")
            for n in LEVERS
        ]
    # Every lever starts from the same pool in bytes, so a measured pool in tokens moves correctly
    # when bytes/token change.
    pooled = replace(
        dep,
        pool_blocks=None,
        pool_tokens=None,
        pool_bytes=base.pool_bytes,
        gpu_memory_bytes=None,
        weights_bytes=base.weights_bytes,
    )

    if kv_dtype_bytes(dep.kv_cache_dtype, arch) == 1:
        rows.append(_unchanged("fp8_kv_cache", base, f"the KV cache is already 1 byte ({dep.kv_cache_dtype})"))
    else:
        rows.append(
            _row(
                "fp8_kv_cache",
                estimate(arch, replace(pooled, kv_cache_dtype="fp8")),
                base,
                "--kv-cache-dtype fp8: 1 byte per element",
            )
        )

    rows.append(_weights_lever("int4_weights", arch, dep, base, pooled, INT4_BYTES_PER_PARAM))
    rows.append(_weights_lever("fp8_weights", arch, dep, base, pooled, FP8_BYTES_PER_PARAM))

    req = dep.request
    if req is None or req.shared_prefix_tokens == 0:
        rows.append(_unchanged("prefix_caching", base, "no shared prefix stated (--shared-prefix-tokens)"))
    elif dep.prefix_caching:
        without = estimate(arch, replace(pooled, prefix_caching=False))
        rows.append(
            _unchanged(
                "prefix_caching",
                base,
                f"already counted (prefix caching is on); without it: {without.max_concurrency or 0:.2f}",
            )
        )
    else:
        rows.append(
            _row(
                "prefix_caching",
                estimate(arch, replace(pooled, prefix_caching=True)),
                base,
                f"--enable-prefix-caching: the {req.shared_prefix_tokens:,}-token prefix stored once",
            )
        )

    if dep.gpu_memory_bytes is None:
        rows.append(_unknown("gpu_memory_utilization_plus_0_05", "needs the GPU memory: pass --gpu-memory-gib"))
    elif dep.gpu_memory_utilization + 0.05 > 1.0:
        rows.append(
            _unchanged(
                "gpu_memory_utilization_plus_0_05",
                base,
                f"--gpu-memory-utilization is {dep.gpu_memory_utilization}; no room for +0.05",
            )
        )
    else:
        extra = int(dep.gpu_memory_bytes * 0.05)
        est = estimate(arch, replace(pooled, pool_bytes=(pooled.pool_bytes or 0) + extra))
        rows.append(
            _row(
                "gpu_memory_utilization_plus_0_05",
                est,
                base,
                f"--gpu-memory-utilization {dep.gpu_memory_utilization + 0.05:.2f}: +{extra / GIB:.2f} GiB",
            )
        )

    tp2 = dep.tp * 2
    if arch.num_attention_heads % tp2:
        heads = arch.num_attention_heads
        rows.append(_unknown("tensor_parallel_x2", f"{heads} attention heads do not split over TP {tp2}"))
    else:
        freed = (base.weights_bytes or 0) - (base.weights_bytes or 0) // 2
        est = estimate(
            arch,
            replace(
                pooled,
                tp=tp2,
                pool_bytes=(pooled.pool_bytes or 0) + freed,
                weights_bytes=(base.weights_bytes or 0) // 2,
            ),
        )
        why = "per GPU; twice the GPUs"
        if base.weights_bytes is None:
            why += "; weights unknown, so no freed memory counted"
        if arch.mla:
            why += "; MLA's latent is not split by TP"
        elif arch.kv_heads < tp2:
            why += f"; {arch.kv_heads} KV heads are replicated over TP {tp2}"
        rows.append(_row("tensor_parallel_x2", est, base, why))

    if req is None:
        rows.append(_unknown("fewer_prompt_tokens", "needs a request size: --prompt-tokens and --output-tokens"))
    else:
        prompt = req.prompt_tokens * 3 // 4
        smaller = RequestShape(prompt, req.output_tokens, min(req.shared_prefix_tokens, prompt))
        rows.append(
            _row(
                "fewer_prompt_tokens",
                estimate(arch, replace(pooled, request=smaller)),
                base,
                f"prompt {req.prompt_tokens:,} -> {prompt:,} tokens (-25 %)",
            )
        )

    if base.max_model_len:
        half = base.max_model_len // 2
        shown = estimate(arch, replace(pooled, max_model_len=half)).max_concurrency_at_max_model_len
        rows.append(
            _unchanged(
                "max_model_len_half",
                base,
                f"no change to the pool: a request's KV depends on its own length; only vLLM's startup ratio "
                f"at {half:,} tokens reads {shown or 0:.2f}x",
            )
        )
    else:
        rows.append(_unchanged("max_model_len_half", base, "no change to the pool"))
    return rows


# ---------------------------------------------------------------------------------------------
# analyze: levers from a kvwatch.analyze/1 document
# ---------------------------------------------------------------------------------------------


def _num(doc: Mapping[str, Any], *path: str) -> Any:
    node: Any = doc
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pos_int(value: Any) -> int | None:
    """A positive integer, or None (a size of 0 or less in a log is not a size)."""
    number = _int_or_none(value)
    return number if number is not None and number > 0 else None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def deployment_from_analysis(doc: Mapping[str, Any], arch: Architecture | None = None) -> Deployment:
    """A Deployment from an analyze document: its config and its measured pool (§7.5)."""
    blocks = _int_or_none(_num(doc, "capacity", "gpu_blocks"))
    tokens = _int_or_none(_num(doc, "capacity", "kv_cache_tokens"))
    gib = _num(doc, "capacity", "kv_cache_memory_gib")
    block_size = _pos_int(_num(doc, "capacity", "block_size")) or _pos_int(_num(doc, "config", "block_size"))
    weights_gib = _num(doc, "capacity", "weights_gib")
    max_len = _pos_int(_num(doc, "config", "max_seq_len")) or _pos_int(
        _num(doc, "capacity", "max_concurrency", "tokens_per_request")
    )
    kv_dtype = _num(doc, "config", "kv_cache_dtype")
    util = _num(doc, "config", "gpu_memory_utilization")
    prefix = _num(doc, "config", "enable_prefix_caching")
    mnbt = _pos_int(_num(doc, "config", "max_num_batched_tokens"))
    version = _num(doc, "config", "vllm_version")
    quant = _num(doc, "config", "quantization")
    request = None
    observed = _pos_int(_num(doc, "requests", "p95_tokens")) or _pos_int(_num(doc, "requests", "tokens_p95"))
    if observed:
        request = RequestShape(observed, 0)
    return Deployment(
        kv_cache_dtype=kv_dtype if isinstance(kv_dtype, str) and kv_dtype.lower() in KV_CACHE_DTYPE_BYTES else "auto",
        tp=_pos_int(_num(doc, "config", "tensor_parallel_size")) or 1,
        pp=_pos_int(_num(doc, "config", "pipeline_parallel_size")) or 1,
        block_size=block_size or DEFAULT_BLOCK_SIZE,
        max_model_len=max_len,
        max_num_batched_tokens=mnbt or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        prefix_caching=prefix if isinstance(prefix, bool) else True,
        pool_blocks=blocks,
        pool_tokens=tokens if blocks is None else None,
        pool_bytes=int(float(gib) * GIB) if blocks is None and tokens is None and _is_num(gib) else None,
        gpu_memory_utilization=float(util) if isinstance(util, (int, float)) and 0 < util <= 1 else 0.9,
        weights_bytes=int(float(weights_gib) * GIB) if isinstance(weights_gib, (int, float)) else None,
        request=request,
        vllm_version=version if isinstance(version, str) else None,
        quantization=quant if isinstance(quant, str) else None,
    )


def _observed_arch(doc: Mapping[str, Any]) -> Architecture | None:
    """Without a model: a one-layer stand-in with the observed bytes/token (KV memory / tokens)."""
    gib = _num(doc, "capacity", "kv_cache_memory_gib")
    tokens = _int_or_none(_num(doc, "capacity", "kv_cache_tokens"))
    blocks = _int_or_none(_num(doc, "capacity", "gpu_blocks"))
    bs = _int_or_none(_num(doc, "capacity", "block_size")) or _int_or_none(_num(doc, "config", "block_size"))
    if tokens is None and blocks is not None and bs:
        tokens = blocks * bs
    computed = _int_or_none(_num(doc, "capacity", "computed_gpu_blocks"))
    if computed is not None and bs:
        tokens = computed * bs  # the KV memory held the computed blocks, not the override
    if not isinstance(gib, (int, float)) or not tokens:
        return None
    per_token = float(gib) * GIB / tokens
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


def levers_for_analysis(
    doc: Mapping[str, Any], arch: Architecture | None, request: RequestShape | None = None
) -> list[dict[str, Any]]:
    """Lever rows (as ``kvwatch capacity``'s JSON) for an analyze document; [] when nothing is known.

    Without ``arch`` the rows use the observed bytes/token (KV memory / pool tokens) and the
    tensor-parallel row says it needs the model. ``request``: a request size read elsewhere (e.g.
    simulate's scrapes), so the ceilings are per request rather than per max_model_len.
    """
    model = arch or _observed_arch(doc)
    if model is None:
        return []
    try:
        dep = deployment_from_analysis(doc, arch)
        rows = levers(model, replace(dep, request=request) if request is not None else dep)
    except (UsageError, ArithmeticError, ValueError):
        # a log's odd numbers (a PP size larger than the model, ...) must not break the postmortem
        return []
    if arch is None:
        needs = "needs the model (--model) to know its KV heads"
        rows = [_unknown(r.lever, needs) if r.lever == "tensor_parallel_x2" else r for r in rows]
    return [r.as_dict() for r in rows]


def nest_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted fact paths (``"capacity.kv_cache_tokens": 40960``) -> the nested analyze-document shape."""
    doc: dict[str, Any] = {}
    for key, value in facts.items():
        node = doc
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return doc


def expected_from_facts(arch: Architecture, facts: Mapping[str, Any], **overrides: Any) -> CapacityEstimate:
    """The config.json expectation under what the log says so far (for the sidecar).

    ``facts`` are analyze-document paths -> values (``"capacity.kv_cache_memory_gib": 54.71``,
    ``"config.tensor_parallel_size": 2``, ...). The pool is *predicted* from vLLM's KV-memory figure
    when the log states one (so observed/expected compares vLLM's block count with kvwatch's),
    else taken from the printed blocks/tokens. ``overrides`` replace Deployment fields (flags).
    """
    doc = nest_facts(facts)
    dep = deployment_from_analysis(doc, arch)
    gib = _num(doc, "capacity", "kv_cache_memory_gib")
    if _is_num(gib):
        dep = replace(dep, pool_blocks=None, pool_tokens=None, pool_bytes=int(float(gib) * GIB))
    return estimate(arch, replace(dep, **overrides) if overrides else dep)


def printed_tokens_for(
    layout: KvLayout, blocks: int, max_model_len: int | None, max_num_batched_tokens: int, vllm_version: str | None
) -> list[int]:
    """What vLLM's "KV cache size: N tokens" line prints for ``blocks`` (§3.5): the candidates.

    Up to 0.20: blocks // groups x block_size; from 0.21: int(max_concurrency x max_model_len).
    An unknown version gives both.
    """
    old = blocks // len(layout.groups) * layout.block_size
    if not max_model_len:
        return [old]
    new = int(max_concurrency_at_max_model_len(layout, blocks, max_model_len, max_num_batched_tokens) * max_model_len)
    version = _version(vllm_version)
    if version is None:
        return [old, new]
    return [new] if version >= (0, 21) else [old]


def check_against_log(doc: Mapping[str, Any], arch: Architecture, dep: Deployment | None = None) -> dict[str, Any]:
    """vLLM's printed pool and concurrency next to kvwatch's prediction (issue 3, §7.5).

    The pool is predicted from vLLM's own "KV cache memory" figure; since the printed GiB is
    rounded to 0.01, the prediction is a block range, and it matches when the printed block count
    lies within one block of that range. The concurrency at max_model_len is predicted from the
    printed block count with vLLM's formula and matches when equal to 2 decimals. A
    --num-gpu-blocks-override replaces the computed pool, so the printed pool is then not vLLM's
    computed one (``capacity.computed_gpu_blocks``, when the reader provides it, is used instead).
    """
    dep = dep or deployment_from_analysis(doc, arch)
    layout = kv_layout(
        arch,
        kv_cache_dtype=dep.kv_cache_dtype,
        tp=dep.tp,
        pp=dep.pp,
        block_size=dep.block_size,
        legacy=legacy_allocator(dep.vllm_version),
    )
    gib = _num(doc, "capacity", "kv_cache_memory_gib")
    printed_blocks = _int_or_none(_num(doc, "capacity", "gpu_blocks"))
    computed_blocks = _int_or_none(_num(doc, "capacity", "computed_gpu_blocks"))
    printed_tokens = _int_or_none(_num(doc, "capacity", "kv_cache_tokens"))
    ratio = _num(doc, "capacity", "max_concurrency", "ratio")
    max_len = _int_or_none(_num(doc, "capacity", "max_concurrency", "tokens_per_request")) or dep.max_model_len
    if printed_blocks is None and printed_tokens is not None and layout.uniform:
        printed_blocks = printed_tokens // layout.block_size
    out: dict[str, Any] = {
        "kv_cache_memory_gib": gib,
        "gpu_blocks": printed_blocks,
        "computed_gpu_blocks": computed_blocks,
        "kv_cache_tokens": printed_tokens,
        "block_size": layout.block_size,
        "max_concurrency": ratio,
        "tokens_per_request": max_len,
        "predicted_blocks_range": None,
        "predicted_tokens_range": None,
        "pool_within_one_block": None,
        "predicted_max_concurrency_range": None,
        "predicted_max_concurrency": None,
        "max_concurrency_matches": None,
    }
    mnbt = dep.max_num_batched_tokens
    if _is_num(gib):
        low, high = blocks_range_from_gib(layout, float(gib))
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
            if _is_num(ratio):
                out["max_concurrency_matches"] = (
                    out["predicted_max_concurrency_range"][0]
                    <= round(float(ratio), 2)
                    <= out["predicted_max_concurrency_range"][1]
                )
    if printed_blocks is not None and max_len:
        predicted = max_concurrency_at_max_model_len(
            layout, printed_blocks, max_len, dep.max_num_batched_tokens, dep.vllm_version
        )
        out["predicted_max_concurrency"] = round(predicted, 2)
        if _is_num(ratio):
            out["max_concurrency_matches"] = round(predicted, 2) == round(float(ratio), 2)
    return out


def analysis_levers(doc: Mapping[str, Any], model: str | None) -> list[dict[str, Any]]:
    """``kvwatch analyze``'s diagnosis levers: the model from ``--model`` or else the log.

    A ``--model`` that cannot be resolved is the user's error (UsageError); a model name from the
    log that kvwatch does not know falls back to the observed bytes/token.
    """
    arch = resolve_model(model) if model else model_from_log(doc)
    return levers_for_analysis(doc, arch)


def model_from_log(doc: Mapping[str, Any]) -> Architecture | None:
    """The model the log names (``config.model``), if kvwatch knows it and the log agrees.

    Only ``config.model`` counts: a served name is the operator's label (the seed run serves a
    4-layer model as "llama-3.1-8b-sim"). When the log states both KV memory and pool tokens and
    their ratio is not within 2x of the model's bytes/token, the name is not trusted.
    """
    name = _num(doc, "config", "model")
    if not isinstance(name, str) or not name:
        return None
    try:
        arch = resolve_model(name)
    except UsageError:
        return None
    gib = _num(doc, "capacity", "kv_cache_memory_gib")
    tokens = _int_or_none(_num(doc, "capacity", "kv_cache_tokens"))
    if _is_num(gib) and tokens:
        dep = deployment_from_analysis(doc, arch)
        try:
            expected = kv_bytes_per_token(arch, kv_cache_dtype=dep.kv_cache_dtype, tp=dep.tp, pp=dep.pp)
        except UsageError:
            return None
        observed = float(gib) * GIB / tokens
        if not 0.5 <= observed / expected <= 2.0:
            return None
    return arch


__all__ = [
    "GIB",
    "CapacityEstimate",
    "Deployment",
    "KvLayout",
    "LeverRow",
    "RequestShape",
    "analysis_levers",
    "blocks_range_from_gib",
    "check_against_log",
    "estimate",
    "expected_capacity",
    "expected_from_facts",
    "kv_bytes_per_token",
    "kv_layout",
    "levers",
    "levers_for_analysis",
    "model_from_log",
    "printed_tokens_for",
    "resolve_model",
]
