"""vLLM's start-up memory profile predicted from config.json and the GPU, per vLLM version.

What vLLM does (the same shape in every release read: 0.6.3, 0.8.5, 0.10.1, 0.11.0, 0.15.0-0.19.0, 0.32.0):

    KV memory = total GPU memory x gpu_memory_utilization
                - weights - PyTorch activation peak of a profile run - non-torch memory
                [- CUDA-graph memory estimate, from 0.21 unless --enforce-eager]

* V0 ``vllm/worker/worker.py`` ``Worker.determine_num_available_blocks`` (0.4-0.7; 0.6.5+ through
  ``vllm/utils.py`` ``memory_profiling``) and V1 ``vllm/v1/worker/gpu_worker.py``
  ``Worker.determine_available_memory`` (0.8+: ``requested_memory - non_kv_cache_memory``).
* The profile run is one dummy forward of ``max_num_batched_tokens`` tokens, then the sampler on
  one logits row per dummy request: V0 ``model_runner.py`` ``profile_run`` (``max_num_seqs``
  sequences sharing the token budget, ``SamplingParams(top_p=0.99, top_k=vocab-1)``), V1
  ``gpu_model_runner.py`` ``profile_run`` -> ``_dummy_run(max_num_tokens)`` and
  ``_dummy_sampler_run`` (``min(max_num_seqs, max_num_tokens)`` rows, top_p=0.9, top_k=vocab-1,
  so the top-k/top-p path sorts the whole vocabulary: ``v1/sample/ops/topk_topp_sampler.py``).
* The peak is the larger of the forward's live tensors and the sampler's (the forward's
  intermediates are freed before the logits are computed; the hidden states survive, and from 0.15
  so does the fused-MoE workspace the WorkspaceManager keeps: MOE_WORKSPACE_VERSION).
* CUDA graphs: V0 and V1 up to 0.20 capture them *after* the KV cache is allocated (the memory
  comes out of the 1 - utilisation headroom); from 0.21 ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
  defaults to 1 and the estimate is subtracted (0.32.0 ``gpu_worker.py``: "CUDA graph memory
  profiling is enabled (default since v0.21.0)").

Each term is a named ``ProfileRow`` with the versions and source it follows. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import UsageError
from kvwatch.reconcile.weights import DTYPE_BYTES, FLOAT32_FLAG, ModelShape, estimate_weights, model_shape

GIB = 2**30
CURRENT_VERSION = "0.32.0"  # the newest release read; an unstated --vllm-version means this
LARGE_GPU_BYTES = 70 * GIB  # arg_utils.py: ">= 70 GiB" picks the H100-class scheduler defaults

# V1 default scheduler limits for `vllm serve` (UsageContext.OPENAI_API_SERVER), from
# vllm/engine/arg_utils.py _set_default_args_v1 (0.8.5) / _set_default_max_num_seqs_and_batched_
# tokens_args (0.32.0): (max_num_batched_tokens, max_num_seqs) by GPU size.
V1_DEFAULTS_LARGE = (8192, 1024)
V1_DEFAULTS_SMALL = (2048, 256)
# V0 (vllm/config.py SchedulerConfig, 0.5-0.7): 256 sequences; without chunked prefill the token
# budget is max(max_model_len, 2048); chunked prefill (on by default above 32K context for text
# models, arg_utils.py create_engine_config) uses 512 for the API server.
V0_MAX_NUM_SEQS = 256
V0_MIN_BATCHED_TOKENS = 2048
# Chunked prefill's token budget: 512 in 0.6.3 (SchedulerConfig: "the best balance between ITL
# and TTFT on A100"), _DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048 in 0.8.5. The releases between were
# not read; the change is placed at 0.7.0.
V0_CHUNKED_BATCHED_TOKENS_OLD = 512
V0_CHUNKED_BATCHED_TOKENS = 2048
V0_LONG_CONTEXT = 32768
# vllm/envs.py VLLM_FUSED_MOE_CHUNK_SIZE (default 32768 in 0.6-0.11, 16K*4 later): fused_moe
# processes at most this many tokens at once, so its caches stop growing past it.
FUSED_MOE_CHUNK = 32768
# V1's dummy sampler (``_dummy_sampler_run`` -> ``Sampler.forward`` -> ``TopKTopPSampler``), bytes
# per logits element (dummy rows x padded vocabulary) alive at its peak, read in the releases named.
# Always alive: the model-dtype logits ``compute_logits`` returned (``_dummy_sampler_run`` keeps
# its reference while the sampler runs) and the float32 copy ``Sampler.forward`` makes
# (``logits.to(torch.float32)``; the callers' frames keep it while top-k/top-p runs).
# * 0.8.5-0.16 (pip installs: FlashInfer is an optional extra in 0.11.0 and opt-in from 0.15), the
#   PyTorch path ``apply_top_k_top_p``: at its final ``logits_sort.scatter(...)`` the sorted float32
#   values (4), int64 indices (8), the top-p softmax/cumsum (4), the two bool masks (1 + 1) and the
#   scattered result (4) are alive: 22 B on top of the two logits tensors. torch.sort's own scratch
#   is not counted. Where FlashInfer is installed (vLLM's Docker images) 0.8-0.14 take it by default
#   instead: flashinfer.sampling.top_k_top_p_sampling_from_logits keeps a masked float32 copy and
#   its softmax (8 B on top), 14 B/element less; flashinfer#1180 shows that A/B on one start (4.00
#   vs 2.49 GiB of KV). kvwatch follows the pip install (no FlashInfer before it became a dependency).
# * 0.17+ (0.17.0, 0.19.0, 0.32.0 ``apply_top_k_top_p``: ``apply_top_k_top_p_triton`` for >= 8 rows)
#   the mask is applied in place in the float32 logits; then ``forward_native``'s float32 softmax
#   ``probs`` (4) and ``random_sample``'s ``q = torch.empty_like(probs)`` (4): 8 B on top, plus the
#   kernel's cached per-program float32 buffer of min(SMs, rows) x vocab.
SAMPLER_TORCH_SORT_BYTES = 4 + 8 + 4 + 1 + 1 + 4
SAMPLER_TRITON_BYTES = 4 + 4
SAMPLER_LOGITS_F32 = 4
TRITON_TOPK_VERSION = (0, 17, 0)
# topk_topp_triton.py: NUM_PROGRAMS = min(num_compute_units, rows). The SM count is not in the
# memory size; kvwatch states an H100's 132 (smaller GPUs have fewer SMs: a smaller buffer).
TRITON_TOPK_PROGRAMS = 132
# Fused-MoE workspace (0.15.0, 0.16.0, 0.17.0, 0.19.0 ``fused_moe/modular_kernel.py``
# ``_allocate_buffers`` -> ``v1/worker/workspace.py`` ``WorkspaceManager.get_simultaneous``): the
# Triton experts' intermediate caches are views of one buffer the manager keeps for the process, so
# after the dummy forward they are still allocated while the sampler runs. Its size
# (``TritonExperts.workspace_shapes``): workspace13 = max(M x topk x max(I, H), M x H) and
# workspace2 = M x topk x max(2I, H) in the activation dtype, I the experts' intermediate per TP
# rank. 0.11.0 allocates the caches per call (``fused_experts_impl``), so they are freed there;
# 0.12-0.14 were not read, so the change is placed at 0.15. MXFP4 checkpoints take other expert
# kernels, whose buffers kvwatch does not count.
MOE_WORKSPACE_VERSION = (0, 15, 0)
# Non-torch memory: what the CUDA runtime and libraries (cuBLAS/cuBLASLt workspaces, lazily
# loaded kernel images) allocate outside PyTorch during the profile run. vLLM *measures* it
# (memory_profiling's non_torch_increase); nothing in config.json gives it. kvwatch uses a stated
# 0.2 GiB for one GPU: the public single-GPU logs printed 0.04-0.38 GiB (tests/fixtures/startups).
NON_TORCH_SINGLE_GPU = 0.2 * GIB
# With TP > 1 NCCL allocates its channel buffers (and NVLS buffers on NVSwitch systems) outside
# PyTorch. Not computable from the config either; vLLM's own PR #10511 (0.6.5, H100 80 GB)
# printed 1.79 GiB more per GPU at TP 2 than at TP 1, and PCIe cards (3090s at TP 4) show none.
# kvwatch adds that measured figure on >= 70 GiB (SXM/NVLink class) GPUs only, and says so.
NCCL_NVLINK_BYTES = int(1.79 * GIB)
# CUDA-graph memory is measured by capturing graphs (0.21+ ``profile_cudagraph_memory``); the
# public logs' "Graph capturing finished ... took X GiB" range 0.13-0.84 GiB. A stated 0.5 GiB
# estimate is used where a version subtracts it.
CUDA_GRAPH_ESTIMATE = int(0.5 * GIB)


def parse_version(text: str | None) -> tuple[int, int, int]:
    """``"0.8.5"`` -> (0, 8, 5); None -> the current release; junk is a usage error."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", (text or CURRENT_VERSION).strip())
    if not m:
        raise UsageError(f"--vllm-version {text!r} is not a version; give one like 0.10.1")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def engine_of(version: tuple[int, int, int]) -> str:
    """V1 is the default engine from 0.8.0 (VLLM_USE_V1 defaults to 1); V0 before."""
    return "v1" if version >= (0, 8, 0) else "v0"


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One term of the budget: bytes per GPU, the vLLM versions it applies to and why."""

    name: str
    bytes: int
    versions: str
    source: str
    subtracted: bool = True

    def as_dict(self) -> dict[str, Any]:
        """JSON row."""
        return {
            "name": self.name,
            "gib": round(self.bytes / GIB, 4),
            "subtracted": self.subtracted,
            "versions": self.versions,
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    """The predicted profile of one GPU: the budget vLLM computes before sizing the KV cache."""

    gpu_total_bytes: int
    utilization: float
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    cuda_graph_subtracted: bool
    kv_memory_bytes: int
    vllm_version: str
    engine: str
    max_num_batched_tokens: int
    max_num_seqs: int
    rows: tuple[ProfileRow, ...]
    source: str = "predicted"

    @property
    def non_kv_bytes(self) -> int:
        """Everything vLLM subtracts before the KV cache."""
        graph = self.cuda_graph_bytes if self.cuda_graph_subtracted else 0
        return self.weights_bytes + self.activation_bytes + self.non_torch_bytes + graph

    def with_utilization(self, utilization: float) -> MemoryProfile:
        """The same profile at another --gpu-memory-utilization (only the budget moves)."""
        kv = int(self.gpu_total_bytes * utilization) - self.non_kv_bytes
        return MemoryProfile(
            self.gpu_total_bytes,
            utilization,
            self.weights_bytes,
            self.activation_bytes,
            self.non_torch_bytes,
            self.cuda_graph_bytes,
            self.cuda_graph_subtracted,
            kv,
            self.vllm_version,
            self.engine,
            self.max_num_batched_tokens,
            self.max_num_seqs,
            self.rows,
            self.source,
        )

    def as_dict(self) -> dict[str, Any]:
        """The ``memory`` block of kvwatch.capacity/1 (CONTRACTS.md), plus the named rows."""
        return {
            "gpu_total_gib": round(self.gpu_total_bytes / GIB, 2),
            "utilization": self.utilization,
            "weights_gib": round(self.weights_bytes / GIB, 2),
            "activation_gib": round(self.activation_bytes / GIB, 2),
            "non_torch_gib": round(self.non_torch_bytes / GIB, 2),
            "cuda_graph_gib": round(self.cuda_graph_bytes / GIB, 2),
            "kv_memory_gib": round(self.kv_memory_bytes / GIB, 2),
            "source": self.source,
            "vllm_version": self.vllm_version,
            "engine": self.engine,
            "cuda_graph_subtracted": self.cuda_graph_subtracted,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "rows": [r.as_dict() for r in self.rows],
        }

    def budget_line(self) -> str:
        """``24 GiB x 0.90 - 14.99 weights - 1.19 activation - 0.13 non-torch = 5.0 GiB``."""
        total = self.gpu_total_bytes / GIB
        parts = [f"{total:.2f} GiB x {self.utilization:.2f}"]
        parts.append(f"{self.weights_bytes / GIB:.2f} weights")
        parts.append(f"{self.activation_bytes / GIB:.2f} activation")
        parts.append(f"{self.non_torch_bytes / GIB:.2f} non-torch")
        if self.cuda_graph_subtracted:
            parts.append(f"{self.cuda_graph_bytes / GIB:.2f} CUDA graphs")
        return " - ".join(parts) + f" = {self.kv_memory_bytes / GIB:.2f} GiB"


def scheduler_defaults(
    version: tuple[int, int, int],
    gpu_total_bytes: int,
    max_model_len: int,
    *,
    multimodal: bool,
    sliding_window: bool,
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM picks for ``vllm serve`` when not given.

    From 0.10 the >= 70 GiB defaults also require a device name without "a100" (arg_utils.py,
    0.10.1 / 0.11.0 / 0.32.0), which the memory size cannot tell: an A100 80GB gets 2048 / 256
    there, so pass those with --max-num-batched-tokens / --max-num-seqs for one.
    """
    if engine_of(version) == "v1":
        return V1_DEFAULTS_LARGE if gpu_total_bytes >= LARGE_GPU_BYTES else V1_DEFAULTS_SMALL
    chunked = max_model_len > V0_LONG_CONTEXT and not multimodal and not sliding_window
    if chunked:
        budget = V0_CHUNKED_BATCHED_TOKENS if version >= (0, 7, 0) else V0_CHUNKED_BATCHED_TOKENS_OLD
        return budget, V0_MAX_NUM_SEQS
    return max(max_model_len, V0_MIN_BATCHED_TOKENS), V0_MAX_NUM_SEQS


def forward_peak_bytes(s: ModelShape, tokens: int, tp: int, elem: int) -> int:
    """Live tensors of the dummy forward's worst layer, on one GPU.

    Dense MLP (``LlamaMLP.forward``): the residual, the normed input and the output (3 x hidden)
    plus gate_up (2 x I/TP) and SiluAndMul's output (I/TP), all alive at down_proj. MoE
    (``fused_moe.fused_experts_impl``): intermediate_cache1/2/3 = topk x (2I + I + hidden) per
    token, up to FUSED_MOE_CHUNK tokens, plus the router logits. Attention: q, k, v and the output.
    """
    h = s.hidden
    base = 3 * h * tokens
    attn_heads = s.heads / tp
    if s.mla:
        attn = attn_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim + s.qk_nope_head_dim + 2 * s.v_head_dim)
    else:
        kv = max(1.0, s.kv_heads / tp)
        attn = (2 * attn_heads + 2 * kv) * s.head_dim
    stages = [attn * tokens]
    if s.intermediate and s.layers > s.moe_layers:
        stages.append(3 * s.intermediate / tp * tokens)
    if s.moe_layers:
        chunk = min(tokens, FUSED_MOE_CHUNK)
        moe = s.experts_per_token * (3 * s.moe_intermediate / tp + h) * chunk + s.experts * tokens
        shared = 3 * s.shared_intermediate / tp * tokens
        stages.append(moe + shared)
    return int((base + max(stages)) * elem)


def sampler_peak_bytes(
    s: ModelShape, rows: int, elem: int, engine: str = "v1", version: tuple[int, int, int] = (0, 32, 0)
) -> int:
    """The dummy sampler's peak over one logits row per request and the padded vocabulary.

    V1 (every TP rank all-gathers the logits): the model-dtype logits and their float32 copy, plus
    the top-k/top-p path's tensors of that release (SAMPLER_TORCH_SORT_BYTES before 0.17,
    SAMPLER_TRITON_BYTES and the Triton kernel's buffer from 0.17). V0: the gathered logits in the
    model dtype. V0's printed peaks show no float32 sampler copies (a 3090 on 0.6.4 printed 0.06
    GiB for 512 tokens of Llama-3.1-8B, which is 256 rows x 128,256 x 2 bytes), so kvwatch counts
    the logits only there.
    """
    vocab = -(-s.vocab // 64) * 64
    if engine != "v1":
        return rows * vocab * elem
    held = elem + SAMPLER_LOGITS_F32
    if version >= TRITON_TOPK_VERSION:
        buffer = min(rows, TRITON_TOPK_PROGRAMS) * vocab * 4 if rows >= 8 else 0
        return rows * vocab * (held + SAMPLER_TRITON_BYTES) + buffer
    return rows * vocab * (held + SAMPLER_TORCH_SORT_BYTES)


def moe_workspace_bytes(s: ModelShape, tokens: int, tp: int, elem: int) -> int:
    """The fused-MoE workspace the WorkspaceManager keeps after the dummy forward (0.15+)."""
    if not s.moe_layers or not s.experts_per_token:
        return 0
    m = min(tokens, FUSED_MOE_CHUNK)
    inter = s.moe_intermediate / tp
    ws13 = max(m * s.experts_per_token * max(inter, s.hidden), tokens * s.hidden)
    ws2 = m * s.experts_per_token * max(2 * inter, s.hidden)
    return int((ws13 + ws2) * elem)


def encoder_peak_bytes(s: ModelShape, tokens_budget: int, elem: int) -> int:
    """Vision-tower profile (V1 ``profile_run``: "Encoder cache will be initialized with a budget
    of N tokens, and profiled with K image items of the maximum feature size"): K = budget //
    embedding tokens per image, all K images through the ViT at once: 3 x hidden + 3 x
    intermediate per patch. An estimate of the ViT's live tensors; towers differ, and kvwatch
    reports the row so it can be compared with vLLM's printed peak.
    """
    if not s.vision_params or not s.image_tokens:
        return 0
    per_image = s.mm_tokens_per_image or s.image_tokens
    items = max(1, tokens_budget // per_image)
    per_patch = 3 * s.vision_hidden + 3 * s.vision_intermediate
    return int(items * s.image_tokens * per_patch * elem)


def predict_memory(
    raw: Mapping[str, Any],
    *,
    gpu_total_bytes: int,
    utilization: float = 0.9,
    tp: int = 1,
    pp: int = 1,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    vllm_version: str | None = None,
    enforce_eager: bool = False,
    quantization: str | None = None,
    dtype: str | None = None,
    weights_bytes: int | None = None,
    sliding_window: bool = False,
    source: str = "config.json",
) -> MemoryProfile:
    """The profile vLLM would print for this config on this GPU (one GPU of TP x PP)."""
    if not 0 < utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization {utilization} must be in (0, 1]")
    if gpu_total_bytes <= 0:
        raise UsageError("--gpu-memory-gib must be positive")
    version = parse_version(vllm_version)
    vtext = ".".join(str(x) for x in version)
    engine = engine_of(version)
    shape = model_shape(raw, source=source)
    max_len = max_model_len or shape.max_position or 0
    if not max_len:
        raise UsageError(f"{source}: field 'max_position_embeddings' is missing; pass --max-model-len")
    multimodal = shape.vision_params > 0
    d_mnbt, d_mns = scheduler_defaults(
        version, gpu_total_bytes, max_len, multimodal=multimodal, sliding_window=sliding_window
    )
    mnbt = max_num_batched_tokens or d_mnbt
    mns = max_num_seqs or d_mns
    cfg_dtype = str(raw.get("torch_dtype") or (raw.get("text_config") or {}).get("torch_dtype") or "bfloat16")
    elem = FLOAT32_FLAG.get(dtype or "", DTYPE_BYTES.get((dtype or cfg_dtype).removeprefix("torch."), 2))

    rows: list[ProfileRow] = []
    if weights_bytes is None:
        w = estimate_weights(raw, tp=tp, pp=pp, dtype=dtype, quantization=quantization, source=source, shape=shape)
        weights_bytes = w.bytes_per_gpu
        why = "parameters from config.json x bytes per parameter" + (f" ({w.quantization})" if w.quantization else "")
    else:
        why = "given (--weights-gib)"
    rows.append(
        ProfileRow(
            "weights",
            weights_bytes,
            "0.4+",
            f"{why}; as loaded (V1 gpu_model_runner.load_model 'Model loading took X GiB', V0 model_runner "
            f"'Loading model weights took X GB')",
        )
    )

    forward = forward_peak_bytes(shape, mnbt, tp, elem)
    sample_rows = min(mns, mnbt) if engine == "v1" else mns
    method = str(quantization or (raw.get("quantization_config") or {}).get("quant_method") or "").lower()
    workspace = (
        moe_workspace_bytes(shape, mnbt, tp, elem)
        if engine == "v1" and version >= MOE_WORKSPACE_VERSION and "mxfp4" not in method
        else 0
    )
    sampler = sampler_peak_bytes(shape, sample_rows, elem, engine, version) + mnbt * shape.hidden * elem + workspace
    encoder = encoder_peak_bytes(shape, mnbt, elem)
    activation = max(forward, sampler, encoder)
    rows.append(
        ProfileRow(
            "activation.forward",
            forward,
            "V0 0.4-0.7 worker/model_runner.py profile_run; V1 0.8+ v1/worker/gpu_model_runner.py _dummy_run",
            f"dummy forward of max_num_batched_tokens={mnbt} tokens",
            subtracted=forward == activation,
        )
    )
    rows.append(
        ProfileRow(
            "activation.sampler",
            sampler,
            "V1 0.8.5-0.32.0 _dummy_sampler_run + v1/sample/ops/topk_topp_sampler.py (Triton top-k/top-p from "
            "0.17); V0 profile_run logits",
            f"logits of {sample_rows} dummy requests x vocab {shape.vocab}"
            + (
                f", after the fused-MoE workspace ({workspace / GIB:.2f} GiB kept from the forward)"
                if workspace
                else ""
            )
            + (
                (
                    ": model-dtype and float32 logits, float32 probs and exponentials, Triton buffer"
                    if version >= TRITON_TOPK_VERSION
                    else ": model-dtype and float32 logits, torch.sort values and int64 indices, softmax, masks"
                )
                if engine == "v1"
                else ", model dtype"
            ),
            subtracted=sampler == activation and forward != activation,
        )
    )
    if encoder:
        rows.append(
            ProfileRow(
                "activation.encoder",
                encoder,
                "V1 0.8+ v1/worker/gpu_model_runner.py profile_run ('Profile with multimodal encoder')",
                "dummy images of the encoder budget through the vision tower (an estimate of the ViT's tensors)",
                subtracted=encoder == activation,
            )
        )

    non_torch = int(NON_TORCH_SINGLE_GPU)
    rows.append(
        ProfileRow(
            "non_torch.runtime",
            non_torch,
            "0.6.5+ utils memory_profiling non_torch_increase; V1 gpu_worker.determine_available_memory",
            "CUDA libraries outside PyTorch during the profile run; vLLM measures it, kvwatch states 0.2 GiB",
        )
    )
    if tp > 1 and gpu_total_bytes >= LARGE_GPU_BYTES:
        non_torch += NCCL_NVLINK_BYTES
        rows.append(
            ProfileRow(
                "non_torch.nccl",
                NCCL_NVLINK_BYTES,
                "0.6.5+ (the same measurement, with a TP group)",
                "NCCL all-reduce buffers with TP > 1 on NVLink-class GPUs (vLLM PR #10511 measured 1.79 GiB)",
            )
        )

    graph_subtracted = version >= (0, 21, 0) and not enforce_eager
    graph = 0 if enforce_eager else CUDA_GRAPH_ESTIMATE
    rows.append(
        ProfileRow(
            "cuda_graphs",
            graph,
            "subtracted from 0.21 (gpu_worker.determine_available_memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"
            "=1); before, graphs are captured after the KV cache is sized",
            "stated 0.5 GiB estimate (vLLM captures them to measure); --enforce-eager captures none",
            subtracted=graph_subtracted,
        )
    )
    total = int(gpu_total_bytes * utilization)
    kv = total - weights_bytes - activation - non_torch - (graph if graph_subtracted else 0)
    return MemoryProfile(
        gpu_total_bytes=gpu_total_bytes,
        utilization=utilization,
        weights_bytes=weights_bytes,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graph,
        cuda_graph_subtracted=graph_subtracted,
        kv_memory_bytes=kv,
        vllm_version=vtext,
        engine=engine,
        max_num_batched_tokens=mnbt,
        max_num_seqs=mns,
        rows=tuple(rows),
    )


__all__ = [
    "CURRENT_VERSION",
    "MemoryProfile",
    "ProfileRow",
    "encoder_peak_bytes",
    "engine_of",
    "forward_peak_bytes",
    "moe_workspace_bytes",
    "parse_version",
    "predict_memory",
    "sampler_peak_bytes",
    "scheduler_defaults",
]
