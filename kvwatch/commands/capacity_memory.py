"""``kvwatch capacity``'s memory profile: the pool from config.json and the GPU, and the start.

Wires ``reconcile.model_config`` (the config.json), ``reconcile.memory_profile`` (vLLM's budget
per version) and ``reconcile.startup`` (would it start) into the ``memory`` and ``start`` blocks
of kvwatch.capacity/1 (CONTRACTS.md "kvwatch.capacity/1 additions") and the text budget table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.reconcile.capacity import GIB, CapacityEstimate
from kvwatch.reconcile.memory_profile import MemoryProfile, predict_memory
from kvwatch.reconcile.model_config import raw_config
from kvwatch.reconcile.startup import StartVerdict, foretell_start


@dataclass(frozen=True, slots=True)
class MemoryInputs:
    """What the user said about the launch, beyond the Deployment (flags; None = vLLM's default)."""

    gpu_memory_bytes: int
    utilization: float
    tp: int
    pp: int
    max_model_len: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    vllm_version: str | None
    enforce_eager: bool
    quantization: str | None
    dtype: str | None
    weights_bytes: int | None


def predict(model: str, inputs: MemoryInputs) -> MemoryProfile:
    """vLLM's predicted profile for ``--model`` under these inputs (one GPU of TP x PP)."""
    raw, source = raw_config(model)
    return predict_memory(
        raw,
        gpu_total_bytes=inputs.gpu_memory_bytes,
        utilization=inputs.utilization,
        tp=inputs.tp,
        pp=inputs.pp,
        max_model_len=inputs.max_model_len,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
        max_num_seqs=inputs.max_num_seqs,
        vllm_version=inputs.vllm_version,
        enforce_eager=inputs.enforce_eager,
        quantization=inputs.quantization,
        dtype=inputs.dtype,
        weights_bytes=inputs.weights_bytes,
        source=source,
    )


def start_of(profile: MemoryProfile, est: CapacityEstimate, model_max_len: int | None) -> StartVerdict | None:
    """The start verdict at the estimate's max_model_len (None without one)."""
    if not est.max_model_len:
        return None
    return foretell_start(profile, est.layout, est.max_model_len, model_max_len=model_max_len)


def measured_memory(log_doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``memory`` block from what a log printed (source "measured"); None if it printed nothing."""
    cap = log_doc.get("capacity") or {}
    conf = log_doc.get("config") or {}
    weights = cap.get("weights_gib")
    kv = cap.get("kv_cache_memory_gib")
    if weights is None and kv is None:
        return None
    # The analyze reader keeps the weights and KV figures; the other terms stay null.
    return {
        "gpu_total_gib": None,
        "utilization": conf.get("gpu_memory_utilization"),
        "weights_gib": weights,
        "activation_gib": None,
        "non_torch_gib": None,
        "cuda_graph_gib": None,
        "kv_memory_gib": kv,
        "source": "measured",
        "vllm_version": conf.get("vllm_version"),
    }


def render_memory(doc: Mapping[str, Any]) -> list[str]:
    """The budget table and the start line for the text output."""
    memory = doc.get("memory")
    lines: list[str] = []
    if isinstance(memory, Mapping) and memory.get("source") == "predicted":
        lines.append(f"  memory budget     {memory['budget']}  (vLLM {memory['vllm_version']}, {memory['engine']})")
        for row in memory.get("rows", []):
            mark = "-" if row["subtracted"] else " "
            lines.append(f"    {mark} {row['name']:<20}{row['gib']:>8.2f} GiB  {row['source']}  [{row['versions']}]")
    start = doc.get("start")
    if isinstance(start, Mapping):
        if start["ok"]:
            lines.append(f"  start             ok at max_model_len {doc.get('max_model_len') or '-':,}")
        else:
            lines.append(f"  start             FAILS: {start['error']}")
            fits = start["max_model_len_that_starts"]
            util = start["gpu_memory_utilization_needed"]
            by_len = f"--max-model-len {fits:,}" if fits else "no --max-model-len (no KV memory at all)"
            by_util = f"--gpu-memory-utilization {util:.2f}" + (" (above 1.0: not on this GPU)" if util > 1 else "")
            lines.append(f"                    what starts: {by_len}, or {by_util}")
    return lines


def memory_block(profile: MemoryProfile) -> dict[str, Any]:
    """The contract's ``memory`` block plus the named rows and the one-line budget."""
    block = profile.as_dict()
    block["budget"] = profile.budget_line()
    return block


__all__ = ["GIB", "MemoryInputs", "measured_memory", "memory_block", "predict", "render_memory", "start_of"]
