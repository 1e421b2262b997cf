"""The KV pool, computed the way vLLM computes it (docs/vllm-formats.md, "KV-cache sizing").

Owns the pool and memory math: KV bytes per token per GPU (full attention, GQA/MQA, MLA,
sliding-window and attention+Mamba hybrids, TP, PP, fp8), vLLM's KV-cache groups, the pool (from
GPU memory, KV memory, tokens or blocks), blocks, what vLLM prints for them (tokens and the
concurrency at max_model_len, per vLLM version) and the concurrency for a stated request size
(a shared prefix stored once). ``estimate`` is the one entry point; the levers
(``kvwatch.reconcile.levers``) and the expectation from a server's stated facts
(``kvwatch.reconcile.expectation``) are built on it.

Pure: no files, no clock.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from kvwatch.errors import UsageError
from kvwatch.reconcile.architecture import Architecture, LayerKind

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
    mamba_pages: int = 1  # pages one request's Mamba state holds per Mamba group (see mamba_pages)

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
    # Where the size came from, said beside every what-if computed for it: "flags" (the operator's
    # --prompt-tokens/--output-tokens), "metrics" (p95 of vLLM's request token histograms),
    # "log" (pool x KV usage / running of the last stats record). None: not said.
    source: str | None = None

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


def mamba_pages(arch: Architecture, vllm_version: str | None, prefix_caching: bool) -> int:
    """Pages one request's Mamba state holds in each Mamba KV-cache group.

    With prefix caching on, vLLM 0.32 keeps Mamba state in "align" mode
    (vllm/model_executor/models/config.py ``MambaModelConfig``): 2 pages plus one prefill
    checkpoint for Mamba2 mixers (vllm/v1/kv_cache_interface.py ``MambaSpec.max_memory_usage_bytes``,
    vllm/model_executor/layers/mamba/mamba_mixer2.py ``get_kv_cache_spec``), without speculative
    decoding. Otherwise, and for versions before 0.32 (not read), one page.
    """
    version = _version(vllm_version)
    if arch.mamba is None or not prefix_caching or (version is not None and version < (0, 32)):
        return 1
    return 3 if arch.mamba.version == 2 else 2


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
    mamba_pages: int = 1,
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
            # The alignment is the larger of the kernel's smallest block and the configured block
            # size (vllm/platforms/interface.py ``update_block_size_for_backend``, 0.32.0).
            align = max(MAMBA_BLOCK_ALIGNMENT, block_size)
            needed = align * cdiv(mamba_state, align * token_bytes)
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
            mamba_pages=mamba_pages if counts["mamba"] and not legacy else 1,
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
            total += layout.mamba_pages
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
            units += layout.mamba_pages
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


def deployment_layout(arch: Architecture, dep: Deployment) -> KvLayout:
    """The KV layout of ``arch`` as ``dep`` launches it (its vLLM version picks the allocator)."""
    return kv_layout(
        arch,
        kv_cache_dtype=dep.kv_cache_dtype,
        tp=dep.tp,
        pp=dep.pp,
        block_size=dep.block_size,
        legacy=legacy_allocator(dep.vllm_version),
        mamba_pages=mamba_pages(arch, dep.vllm_version, dep.prefix_caching),
    )


def estimate(arch: Architecture, dep: Deployment) -> CapacityEstimate:
    """Everything ``kvwatch capacity`` reports for one model and deployment."""
    layout = deployment_layout(arch, dep)
    max_len = dep.max_model_len or arch.max_position_embeddings
    mnbt = dep.max_num_batched_tokens
    weights = dep.weights_bytes if dep.weights_bytes is not None else default_weights_bytes(arch, dep.tp, dep.pp)

    blocks: int | None
    pool_bytes: int | None = None
    if dep.pool_blocks is not None:
        source, blocks = "blocks", dep.pool_blocks
    elif dep.pool_tokens is not None:
        source = "tokens"
        if layout.uniform or not max_len or not tokens_follow_concurrency(dep.vllm_version):
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
        elif max_len and at_len is not None and tokens_follow_concurrency(dep.vllm_version):
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
    if _version(vllm_version) is None:
        return [old, new]
    return [new] if tokens_follow_concurrency(vllm_version) else [old]


def tokens_follow_concurrency(vllm_version: str | None) -> bool:
    """True when "KV cache size: N tokens" is int(max concurrency x max_model_len), as in vLLM 0.21+
    (vllm/v1/core/kv_cache_utils.py ``get_kv_cache_capacity`` in 0.32.0); before, it was blocks //
    groups x block_size. None (unknown) means current vLLM."""
    version = _version(vllm_version)
    return version is None or version >= (0, 21)
