"""The start foretold: would vLLM start with this KV memory, and if not, what makes it start.

vLLM refuses to start in two ways once it has sized the KV memory (the ``MemoryProfile``):

* KV memory <= 0 (V0: 0 GPU blocks): "No available memory for the cache blocks. ..."
* the pool cannot hold one request of max_model_len:
  V0 (``vllm/worker/worker.py`` ``raise_if_cache_size_invalid``, 0.4-0.10): max_model_len >
  block_size x num_gpu_blocks; V1 (``vllm/v1/core/kv_cache_utils.py``
  ``check_enough_kv_cache_memory``): the bytes one max_model_len request needs, summed over the
  layers' ``max_memory_usage_bytes``, exceed the KV memory; vLLM then binary-searches the longest
  length that fits (``estimate_max_model_len``) and names it in the sentence.

The sentences are vLLM's own, per the releases read (0.6.3, 0.8.5, 0.10.1, 0.11.0, 0.32.0); a
release between two read ones takes the wording of the nearest earlier read release.
``foretell_from_log`` and ``explain_failed_start`` are what ``analyze`` can call to say why a
logged start failed and what would have started it. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.reconcile.architecture import Architecture
from kvwatch.reconcile.capacity import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    KV_CACHE_DTYPE_BYTES,
    KvLayout,
    cdiv,
    kv_layout,
    legacy_allocator,
)
from kvwatch.reconcile.memory_profile import GIB, MemoryProfile, engine_of, parse_version

# V0 vllm/worker/worker.py raise_if_cache_size_invalid (0.6.3; the same text through 0.10's V0).
V0_NO_MEMORY = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
)
V0_TOO_LONG = (
    "The model's max seq len ({max_model_len}) is larger than the maximum number of tokens that can be "
    "stored in KV cache ({tokens}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
    "when initializing the engine."
)
V1_NO_MEMORY_OLD = V0_NO_MEMORY  # v1/core/kv_cache_utils.py 0.8.5-0.11.0
# 0.32.0 _check_enough_kv_cache_memory
V1_NO_MEMORY_NEW = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
    "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)


def _v1_too_long(version: tuple[int, int, int], max_model_len: int, need: int, avail: int, estimated: int) -> str:
    """vLLM's V1 sentence for a pool that cannot hold one max_model_len request, per release."""
    if version < (0, 10, 0):
        # 0.8.5: the estimate's f-string is a separate statement there, so only its first half
        # (" Based on the available memory,") reaches the message.
        est = " Based on the available memory," if estimated > 0 else ""
        return (
            f"To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({need / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({avail / GIB:.2f} GiB).{est}  Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine."
        )
    est = f"Based on the available memory, the estimated maximum model length is {estimated}." if estimated > 0 else ""
    if version < (0, 12, 0):  # 0.10.1.1, 0.11.0
        return (
            f"To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({need / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({avail / GIB:.2f} GiB). {est} Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine."
        )
    est = est + " " if est else ""
    return (  # 0.32.0: format_gib rounds to 2 decimals and drops trailing zeros
        f"To serve at least one request with the model's max seq len ({max_model_len}), "
        f"({round(need / GIB, 2)} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({round(avail / GIB, 2)} GiB). {est}Try increasing `gpu_memory_utilization` (which also controls "
        f"CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. "
        f"See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )


@dataclass(frozen=True, slots=True)
class StartVerdict:
    """``start`` of kvwatch.capacity/1: does it start, vLLM's sentence if not, and what would."""

    ok: bool
    error: str | None
    max_model_len_that_starts: int | None
    gpu_memory_utilization_needed: float | None
    needed_bytes: int  # KV memory one max_model_len request needs (vLLM's accounting)

    def as_dict(self) -> dict[str, Any]:
        """The contract's ``start`` block."""
        return {
            "ok": self.ok,
            "error": self.error,
            "max_model_len_that_starts": self.max_model_len_that_starts,
            "gpu_memory_utilization_needed": self.gpu_memory_utilization_needed,
        }


def request_need_bytes(layout: KvLayout, max_model_len: int, max_num_batched_tokens: int, engine: str) -> int:
    """KV bytes vLLM requires for one request of ``max_model_len`` on this GPU.

    V0: whole blocks of every layer (``CacheEngine.get_cache_block_size``). V1: per layer
    ``FullAttentionSpec.max_memory_usage_bytes`` = cdiv(L, block) pages, sliding-window
    ``SlidingWindowSpec`` = cdiv(min(window - 1 + max_num_batched_tokens, L), block) + 1 pages,
    Mamba one page.
    """
    bs = layout.block_size
    page = layout.page_bytes
    if engine == "v0":
        return cdiv(max_model_len, bs) * bs * layout.kv_bytes_per_token
    full = layout.attention_layers - layout.sliding_layers
    need = full * cdiv(max_model_len, bs) * page
    if layout.sliding_layers:
        window = layout.sliding_window or max_model_len
        need += layout.sliding_layers * (cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), bs) + 1) * page
    need += layout.mamba_layers * page
    return need


def _v0_tokens(layout: KvLayout, kv_bytes: int) -> int:
    per_block = layout.block_size * layout.kv_bytes_per_token
    return max(0, kv_bytes // per_block) * layout.block_size if per_block else 0


def longest_that_fits(layout: KvLayout, kv_bytes: int, upper: int, max_num_batched_tokens: int, engine: str) -> int:
    """The longest max_model_len (1..upper) whose one request fits ``kv_bytes``; 0 if none does.

    The binary search of V1's ``estimate_max_model_len``; V0 is block_size x num_gpu_blocks.
    """
    if kv_bytes <= 0:
        return 0
    if engine == "v0":
        return min(upper, _v0_tokens(layout, kv_bytes))
    lo, hi, best = 1, upper, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if request_need_bytes(layout, mid, max_num_batched_tokens, engine) <= kv_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def utilization_needed(profile: MemoryProfile, need_bytes: int) -> float | None:
    """The smallest --gpu-memory-utilization (to 0.01, rounded up) whose KV memory holds ``need_bytes``.

    May exceed 1.0: then no utilisation starts it on this GPU. None when the GPU's size is unknown.
    """
    if profile.gpu_total_bytes <= 0:
        return None
    required = (profile.non_kv_bytes + need_bytes) / profile.gpu_total_bytes
    return math.ceil(required * 100 - 1e-9) / 100


def foretell_start(
    profile: MemoryProfile,
    layout: KvLayout,
    max_model_len: int,
    *,
    model_max_len: int | None = None,
) -> StartVerdict:
    """Would vLLM start? With vLLM's own sentence when not, and the length/utilisation that would."""
    version = parse_version(profile.vllm_version)
    engine = profile.engine
    mnbt = profile.max_num_batched_tokens
    kv = profile.kv_memory_bytes
    need = request_need_bytes(layout, max_model_len, mnbt, engine)
    upper = max(max_model_len, model_max_len or 0)
    fits = longest_that_fits(layout, kv, upper, mnbt, engine)
    util = utilization_needed(profile, need)
    error: str | None = None
    if engine == "v0":
        tokens = _v0_tokens(layout, kv)
        if tokens <= 0:
            error = V0_NO_MEMORY
        elif max_model_len > tokens:
            error = V0_TOO_LONG.format(max_model_len=max_model_len, tokens=tokens)
    elif kv <= 0:
        error = V1_NO_MEMORY_OLD if version < (0, 12, 0) else V1_NO_MEMORY_NEW
    elif need > kv:
        estimated = longest_that_fits(layout, kv, max_model_len, mnbt, engine)
        error = _v1_too_long(version, max_model_len, need, kv, estimated)
    return StartVerdict(
        ok=error is None,
        error=error,
        max_model_len_that_starts=fits or None,
        gpu_memory_utilization_needed=util,
        needed_bytes=need,
    )


def foretell_from_log(doc: Mapping[str, Any], arch: Architecture) -> StartVerdict | None:
    """The start verdict for a logged start, from the KV memory vLLM printed (for ``analyze``).

    ``doc`` is a kvwatch.analyze/1 document. The engine is the log's version, else V0 when the log
    printed CPU blocks (V1 has none). The utilisation needed is unknown (the reader keeps no GPU
    total) and stays None. None when the log states no KV memory or no max_model_len.
    """
    cap = doc.get("capacity") or {}
    conf = doc.get("config") or {}
    kv_gib, max_len = cap.get("kv_cache_memory_gib"), conf.get("max_seq_len")
    if not isinstance(kv_gib, (int, float)) or not isinstance(max_len, int) or max_len <= 0:
        return None
    version_text = conf.get("vllm_version")
    if not isinstance(version_text, str):
        version_text = "0.6.3" if cap.get("cpu_blocks") is not None else None
    version = parse_version(version_text)
    tp = conf.get("tensor_parallel_size") or 1
    pp = conf.get("pipeline_parallel_size") or 1
    block = cap.get("block_size") or conf.get("block_size") or DEFAULT_BLOCK_SIZE
    kv_dtype = conf.get("kv_cache_dtype")
    layout = kv_layout(
        arch,
        kv_cache_dtype=kv_dtype if isinstance(kv_dtype, str) and kv_dtype.lower() in KV_CACHE_DTYPE_BYTES else "auto",
        tp=tp,
        pp=pp,
        block_size=block,
        legacy=legacy_allocator(version_text),
    )
    mnbt = conf.get("max_num_batched_tokens") or DEFAULT_MAX_NUM_BATCHED_TOKENS
    profile = MemoryProfile(
        gpu_total_bytes=0,
        utilization=float(conf.get("gpu_memory_utilization") or 0.9),
        weights_bytes=int(float(cap.get("weights_gib") or 0) * GIB),
        activation_bytes=0,
        non_torch_bytes=0,
        cuda_graph_bytes=0,
        cuda_graph_subtracted=False,
        kv_memory_bytes=int(float(kv_gib) * GIB),
        vllm_version=".".join(str(x) for x in version),
        engine=engine_of(version),
        max_num_batched_tokens=int(mnbt),
        max_num_seqs=int(conf.get("max_num_seqs") or 256),
        rows=(),
        source="measured",
    )
    return foretell_start(profile, layout, max_len, model_max_len=arch.max_position_embeddings)


def explain_failed_start(verdict: StartVerdict, profile: MemoryProfile) -> dict[str, Any]:
    """Facts for analyze's cause table: which refusal, the budget behind it, and what would start.

    ``cause`` uses the analyze cause ids (CONTRACTS.md): no_kv_memory_after_weights or
    max_model_len_exceeds_pool; None when the start is predicted to succeed.
    """
    cause = None
    if not verdict.ok:
        cause = "no_kv_memory_after_weights" if profile.kv_memory_bytes <= 0 else "max_model_len_exceeds_pool"
    return {
        "cause": cause,
        "error": verdict.error,
        "budget": profile.budget_line(),
        "max_model_len_that_starts": verdict.max_model_len_that_starts,
        "gpu_memory_utilization_needed": verdict.gpu_memory_utilization_needed,
    }


__all__ = [
    "StartVerdict",
    "explain_failed_start",
    "foretell_from_log",
    "foretell_start",
    "longest_that_fits",
    "request_need_bytes",
    "utilization_needed",
]
