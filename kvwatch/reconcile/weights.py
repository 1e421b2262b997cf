"""The weights vLLM loads, from config.json alone: parameters per GPU and bytes per parameter.

Owns the ``ModelShape`` record (the config.json fields that size weights and activations) and the
weights estimate that vLLM's "Model loading took X GiB" / "model weights take X GiB" line prints.

How vLLM lays the weights out (read in vLLM 0.6.3, 0.8.5, 0.10.1, 0.11.0 and 0.32.0):

* ``model_executor/layers/vocab_parallel_embedding.py`` ``VocabParallelEmbedding``/``ParallelLMHead``:
  the vocabulary is padded to a multiple of ``DEFAULT_VOCAB_PADDING_SIZE`` (64) and split by TP;
  a tied lm_head is the embedding itself (``tie_word_embeddings``), so it costs nothing more.
* ``model_executor/layers/linear.py``: QKV, gate/up and expert weights are split by TP; KV heads
  are replicated when there are fewer than TP (``QKVParallelLinear``: ``num_kv_head_replicas``).
* ``model_executor/layers/rotary_embedding.py`` ``RotaryEmbedding``: a ``cos_sin_cache`` buffer
  of (max_position_embeddings, rotary_dim) in the model dtype lives on the GPU and is counted in
  the loaded memory (Llama-3.1-8B: 14.96 GiB of parameters + 0.03 GiB of cache = the 14.99 printed).
* ``model_executor/models/utils.py`` ``make_layers`` / ``distributed/utils.py`` ``get_pp_indices``:
  each PP stage loads only its layers; the embedding sits on the first stage, lm_head on the last.

Quantisation (``model_executor/layers/quantization/*``): each method's ``get_quant_method``
returns an unquantised method for embeddings, lm_head (unless the config quantises it), norms and
whatever the config's ignore/skip list names; the quantised linear layers store packed weights
plus scales (and zero points) per group.

Pure: dict in, record out; errors are one-line ``UsageError`` naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import UsageError

GIB = 2**30
VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE

# Bytes per element of the dtype vLLM computes in. A float32 checkpoint is served in bfloat16
# (or float16) unless --dtype float32 (vllm/config ModelConfig._get_and_verify_dtype, 0.6-0.32).
DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 2,
    "float": 2,
    "auto": 2,
}
FLOAT32_FLAG = {"float32": 4}  # only an explicit --dtype float32 keeps 4 bytes
# Classes whose logits always come from the input embedding (vLLM gemma.py / gemma2.py /
# gemma3.py compute_logits(self.model.embed_tokens, ...)); their configs often omit
# tie_word_embeddings. Every other family kvwatch reads defaults it to False in its
# transformers config class, so an absent field means an untied lm_head there.
ALWAYS_TIED_PREFIXES = ("GemmaFor", "Gemma2For", "Gemma3For")


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The config.json numbers behind weights and activations (the language model's, per layer).

    ``moe_layers`` of ``layers`` use experts; the rest a dense MLP of ``intermediate``.
    MLA fields are 0 when the model has no MLA. ``vision_params`` is the vision tower's
    parameter count (0 for a text model).
    """

    architecture: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_position: int
    rotary_dim: int
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0  # all shared experts together
    moe_layers: int = 0
    moe_layer_ids: frozenset[int] = frozenset()
    mamba_layer_ids: frozenset[int] = frozenset()
    mamba_params: int = 0  # one Mamba mixer layer (in/out projections, conv, SSM parameters)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    vision_params: int = 0
    vision_hidden: int = 0
    vision_intermediate: int = 0
    vision_layers: int = 0
    image_tokens: int = 0  # patches of one image at the vision tower's resolution
    mm_tokens_per_image: int = 0  # embedding tokens one image becomes (config mm_tokens_per_image)

    @property
    def mla(self) -> bool:
        """True for DeepSeek-style multi-head latent attention."""
        return self.kv_lora_rank > 0


@dataclass(frozen=True, slots=True)
class WeightsEstimate:
    """Weights of the GPU that holds the most (bytes), and how they were counted."""

    params_total: int
    params_per_gpu: int
    bytes_per_gpu: int
    quantization: str | None  # the method read from quantization_config or --quantization
    rows: tuple[tuple[str, int], ...]  # (part, bytes on that GPU)

    @property
    def gib(self) -> float:
        """Bytes per GPU in GiB, as vLLM prints them."""
        return self.bytes_per_gpu / GIB


def _field(cfg: Mapping[str, Any], name: str, source: str, default: int | None = None) -> int:
    value = cfg.get(name)
    if value is None:
        if default is not None:
            return default
        raise UsageError(
            f"{source}: field '{name}' is missing; it is needed to size the weights and activations "
            f"(or give --weights-gib and --overhead-gib)"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"{source}: field '{name}' must be a non-negative integer, got {json.dumps(value)[:40]}")
    return value


def _text(raw: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(raw)
    for key in ("text_config", "llm_config", "language_config"):
        sub = raw.get(key)
        if isinstance(sub, dict):
            merged.update(sub)
            break
    return merged


def _vision(raw: Mapping[str, Any], source: str) -> tuple[int, int, int, int, int]:
    """Vision tower params (ViT: per layer 4h^2 attention + 2hI MLP), hidden, I, layers, patches."""
    vc = raw.get("vision_config")
    if not isinstance(vc, dict):
        return 0, 0, 0, 0, 0
    h = vc.get("hidden_size") or vc.get("embed_dim") or vc.get("width")
    layers = vc.get("num_hidden_layers") or vc.get("depth") or vc.get("layers")
    if not isinstance(h, int) or not isinstance(layers, int):
        raise UsageError(f"{source}: field 'vision_config.hidden_size' or 'num_hidden_layers' is missing")
    inter = vc.get("intermediate_size")
    if not isinstance(inter, int):
        ratio = vc.get("mlp_ratio", 4)
        inter = int(h * (ratio if isinstance(ratio, (int, float)) else 4))
    patch = vc.get("patch_size", 14)
    image = vc.get("image_size", 336)
    patches = (image // patch) ** 2 if isinstance(image, int) and isinstance(patch, int) and patch else 0
    # attention (q, k, v, o with biases) + MLP (two or three matrices; two for CLIP/SigLIP) + norms
    per_layer = 4 * h * h + 2 * h * inter + 4 * h
    proj = (
        h * (raw.get("text_config", {}) or {}).get("hidden_size", h) if isinstance(raw.get("text_config"), dict) else 0
    )
    return layers * per_layer + proj, h, inter, layers, patches


def _moe_layer_ids(cfg: Mapping[str, Any], layers: int, source: str) -> frozenset[int]:
    """Which decoder layers hold experts, as each family's vLLM model decides.

    DeepSeek (deepseek_v2.py): from first_k_dense_replace on, every moe_layer_freq-th layer;
    Qwen2/3-MoE (qwen3_moe.py): every decoder_sparse_step-th layer ((i + 1) % step == 0) minus
    mlp_only_layers; Jamba (jamba.py): i % expert_layer_period == expert_layer_offset;
    everything else (Mixtral, gpt-oss, granite-moe): every layer.
    """
    if cfg.get("expert_layer_period"):
        period = _field(cfg, "expert_layer_period", source)
        offset = _field(cfg, "expert_layer_offset", source, default=0)
        return frozenset(i for i in range(layers) if i % period == offset)
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        first = _field(cfg, "first_k_dense_replace", source, default=0)
        freq = _field(cfg, "moe_layer_freq", source, default=1) or 1
        return frozenset(i for i in range(first, layers) if i % freq == 0)
    step = _field(cfg, "decoder_sparse_step", source, default=1) or 1
    only = cfg.get("mlp_only_layers") or []
    skip = {i for i in only if isinstance(i, int)}
    return frozenset(i for i in range(layers) if (i + 1) % step == 0 and i not in skip)


def _mamba(raw: Mapping[str, Any], hidden: int, layers: int, source: str) -> tuple[frozenset[int], int]:
    """Mamba layers (as architecture.py lays them out) and one mixer's parameters.

    Mamba1 (jamba.py MambaMixer): in_proj h x 2 d_inner, conv d_inner x d_conv, x_proj
    d_inner x (dt_rank + 2 d_state), dt_proj dt_rank x d_inner, A d_inner x d_state, D, out_proj.
    Mamba2 (mamba_mixer2.py): in_proj h x (2 d_inner + 2 groups d_state + heads), conv over
    d_inner + 2 groups d_state, out_proj, A/D/dt_bias per head, a gated norm over d_inner.
    """
    from kvwatch.reconcile.architecture import from_config  # same stage; the layer layout rule

    try:
        arch = from_config(raw, name="weights", source=source)
    except UsageError:
        return frozenset(), 0  # a class architecture.py does not lay out has no Mamba layers here
    if arch.mamba is None:
        return frozenset(), 0
    m = arch.mamba
    ids = frozenset(i for i, kind in enumerate(arch.layer_kinds) if kind == "mamba")
    if m.version == 1:
        dt_rank = -(-hidden // 16)
        params = (
            hidden * 2 * m.d_inner
            + m.d_inner * m.d_conv
            + m.d_inner * (dt_rank + 2 * m.d_state)
            + dt_rank * m.d_inner
            + m.d_inner * m.d_state
            + 2 * m.d_inner
            + m.d_inner * hidden
        )
    else:
        conv_dim = m.d_inner + 2 * m.n_groups * m.d_state
        params = (
            hidden * (2 * m.d_inner + 2 * m.n_groups * m.d_state + m.n_heads)
            + conv_dim * m.d_conv
            + m.d_inner * hidden
            + 3 * m.n_heads
            + m.d_inner
        )
    return ids, params


def model_shape(raw: Mapping[str, Any], *, source: str = "config.json") -> ModelShape:
    """Read the fields that size weights and activations; a missing one is a one-line error."""
    if not isinstance(raw, Mapping):
        raise UsageError(f"{source}: config.json must be a JSON object")
    classes = raw.get("architectures") or ["?"]
    arch = str(classes[0]) if isinstance(classes, list) and classes else "?"
    cfg = _text(raw)
    hidden = _field(cfg, "hidden_size", source)
    layers = _field(cfg, "num_hidden_layers", source)
    heads = _field(cfg, "num_attention_heads", source)
    kv_heads = heads
    for name in ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"):
        if cfg.get(name):
            kv_heads = _field(cfg, name, source)
            break
    head_dim = _field(cfg, "head_dim", source, default=hidden // max(heads, 1)) or hidden // max(heads, 1)
    vocab = _field(cfg, "vocab_size", source)
    max_pos = _field(cfg, "max_position_embeddings", source, default=0)
    tied_field = cfg.get("tie_word_embeddings", raw.get("tie_word_embeddings"))
    tied = bool(tied_field) if tied_field is not None else arch.startswith(ALWAYS_TIED_PREFIXES)
    factor = cfg.get("partial_rotary_factor", 1.0)
    rotary = int(head_dim * (factor if isinstance(factor, (int, float)) else 1.0))

    experts = 0
    for name in ("n_routed_experts", "num_local_experts", "num_experts"):
        if cfg.get(name):
            experts = _field(cfg, name, source)
            break
    topk = 0
    moe_inter = shared = moe_layers = 0
    moe_ids: frozenset[int] = frozenset()
    if experts:
        for name in ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "moe_topk"):
            if cfg.get(name):
                topk = _field(cfg, name, source)
                break
        if not topk:
            raise UsageError(f"{source}: field 'num_experts_per_tok' is missing; it is needed for a MoE model")
        moe_inter = _field(cfg, "moe_intermediate_size", source, default=0) or _field(cfg, "intermediate_size", source)
        n_shared = _field(cfg, "n_shared_experts", source, default=0)
        shared = n_shared * moe_inter + _field(cfg, "shared_expert_intermediate_size", source, default=0)
        moe_ids = _moe_layer_ids(cfg, layers, source)
        moe_layers = len(moe_ids)
    dense_layers = layers - moe_layers
    intermediate = _field(cfg, "intermediate_size", source) if dense_layers or not experts else 0

    q_lora = kv_lora = nope = rope = v_head = 0
    if cfg.get("kv_lora_rank"):
        kv_lora = _field(cfg, "kv_lora_rank", source)
        q_lora = _field(cfg, "q_lora_rank", source, default=0)
        nope = _field(cfg, "qk_nope_head_dim", source)
        rope = _field(cfg, "qk_rope_head_dim", source)
        v_head = _field(cfg, "v_head_dim", source)
        rotary = rope
    vision, vh, vi, vl, patches = _vision(raw, source)
    mamba_ids, mamba_params = _mamba(raw, hidden, layers, source)
    return ModelShape(
        architecture=arch,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=vocab,
        tied=tied,
        max_position=max_pos,
        rotary_dim=rotary,
        experts=experts,
        experts_per_token=topk,
        moe_intermediate=moe_inter,
        shared_intermediate=shared,
        moe_layers=moe_layers,
        moe_layer_ids=moe_ids,
        mamba_layer_ids=mamba_ids,
        mamba_params=mamba_params,
        q_lora_rank=q_lora,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=v_head,
        vision_params=vision,
        vision_hidden=vh,
        vision_intermediate=vi,
        vision_layers=vl,
        image_tokens=patches,
        mm_tokens_per_image=_field(raw, "mm_tokens_per_image", source, default=0),
    )


# ---------------------------------------------------------------------------------------------
# Quantisation: bytes per parameter of the quantised linear layers, and what stays unquantised
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuantScheme:
    """How one quantisation method stores a linear layer's weight."""

    method: str
    linear_bytes: float  # bytes per parameter of a quantised linear layer (scales included)
    experts_only: bool = False  # MXFP4 on gpt-oss: only the MoE experts are quantised
    # The experts' (intermediate per partition, hidden) rounded up to these multiples.
    expert_pad: tuple[int, int] = (1, 1)
    lm_head: bool = False  # the config quantises lm_head too
    ignore: tuple[str, ...] = ()  # module names/patterns left in the model dtype


def _group_bytes(bits: int, group: int, dtype_bytes: int, zeros: bool) -> float:
    """Packed weight + one scale (model dtype) and, if asymmetric, one packed zero per group."""
    per = bits / 8
    if group and group > 0:
        per += dtype_bytes / group + ((bits / 8) / group if zeros else 0.0)
    return per


def quant_scheme(raw: Mapping[str, Any], override: str | None, dtype_bytes: int, source: str) -> QuantScheme | None:
    """The scheme from ``quantization_config`` (or ``--quantization`` when the config has none)."""
    qc = raw.get("quantization_config")
    if not isinstance(qc, dict):
        qc = (
            (raw.get("text_config") or {}).get("quantization_config")
            if isinstance(raw.get("text_config"), dict)
            else None
        )
    from_flag = False
    if isinstance(qc, dict) and override not in (None, "", "none"):
        # --quantization wins (CONTRACTS.md); a kernel variant of the checkpoint's own method
        # (awq_marlin for awq, gptq_marlin for gptq) keeps the checkpoint's bits and group size.
        family = str(override).lower().split("_")[0]
        if not str(qc.get("quant_method", "")).lower().startswith(family):
            qc = None
    if not isinstance(qc, dict):
        if override in (None, "", "none"):
            return None
        method = str(override).lower()
        qc = {"quant_method": method}
        from_flag = True
    method = str(qc.get("quant_method") or override or "").lower()
    ignore = tuple(
        str(x) for x in (qc.get("ignore") or qc.get("modules_to_not_convert") or qc.get("ignored_layers") or [])
    )
    lm_head = bool(qc.get("lm_head", False))
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
        # Fp8LinearMethod: 1-byte weight + a float32 scale per tensor, channel or 128x128 block.
        block = qc.get("weight_block_size")
        scale = 4 / (block[0] * block[1]) if isinstance(block, list) and len(block) == 2 else 0.0
        return QuantScheme(method, 1.0 + scale, ignore=ignore)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin", "auto-round", "autoround"):
        bits = qc.get("bits", qc.get("w_bit", 4))
        group = qc.get("group_size", qc.get("q_group_size", 128))
        sym = bool(qc.get("sym", method.startswith("gptq") is False and not qc.get("zero_point", True)))
        zeros = not sym or method.startswith("gptq")  # GPTQ checkpoints keep qzeros even when symmetric
        if not isinstance(bits, int) or not isinstance(group, int):
            raise UsageError(f"{source}: field 'quantization_config.bits'/'group_size' must be integers")
        return QuantScheme(method, _group_bytes(bits, group, dtype_bytes, zeros), lm_head=lm_head, ignore=ignore)
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        weights = None
        for group in groups.values() if isinstance(groups, dict) else []:
            if isinstance(group, dict) and isinstance(group.get("weights"), dict):
                weights = group["weights"]
                break
        if weights is None:
            raise UsageError(f"{source}: field 'quantization_config.config_groups' has no weights scheme")
        bits = weights.get("num_bits", 8)
        gsize = weights.get("group_size") if weights.get("strategy") == "group" else 0
        sym = bool(weights.get("symmetric", True))
        fmt = str(qc.get("format", ""))
        if weights.get("type") == "float" and bits == 4:  # nvfp4: fp8 scale per 16 + a global scale
            return QuantScheme(method, 0.5 + 1 / 16, ignore=ignore)
        return QuantScheme(
            method,
            _group_bytes(int(bits), int(gsize or 0), dtype_bytes, zeros=not sym and "pack" in fmt),
            ignore=ignore,
        )
    if method == "mxfp4":
        # Mxfp4Config (gpt-oss): MoE experts in 4 bits with one e8m0 scale per 32; attention,
        # router, embeddings and lm_head stay bf16.
        # Mxfp4MoEMethod.create_weights pads the experts for its kernel: Marlin (GPUs before
        # Hopper, or Hopper without triton_kernels / FlashInfer; the path 0.10.1 took on H100)
        # needs intermediate_size_per_partition % 128 and hidden % 256. The backend depends on
        # the installed packages, so kvwatch predicts the Marlin layout (0.10.1, 0.11.0 mxfp4.py).
        return QuantScheme(method, 0.5 + 1 / 32, experts_only=True, expert_pad=(128, 256))
    if method in ("modelopt", "modelopt_fp4", "nvfp4"):
        algo = str(qc.get("quant_algo", (qc.get("quantization") or {}).get("quant_algo", "FP8"))).upper()
        return QuantScheme(method, 0.5 + 1 / 16 if "FP4" in algo else 1.0, ignore=ignore)
    if method == "bitsandbytes":
        # bitsandbytes 4-bit: packed nf4/fp4 + a float32 absmax per 64 (8-bit + shared scale when
        # double-quantised); 8-bit: int8 + a float32 scale per row. Skip list stays in dtype.
        skip = tuple(str(x) for x in (qc.get("llm_int8_skip_modules") or ()))
        if qc.get("load_in_8bit"):
            return QuantScheme(method, 1.0, ignore=skip)
        double = bool(qc.get("bnb_4bit_use_double_quant"))
        return QuantScheme(method, 0.5 + (1 / 64 + 4 / (64 * 256) if double else 4 / 64), ignore=skip)
    if method in ("gguf",):
        return QuantScheme(method, 0.5625)
    where = "--quantization" if from_flag else f"{source}: field 'quantization_config.quant_method'"
    raise UsageError(
        f"{where} {method!r} is not known; kvwatch reads fp8, awq, gptq, compressed-tensors, mxfp4, modelopt "
        f"and bitsandbytes (or pass --weights-gib)"
    )


def _ignored(scheme: QuantScheme, module: str) -> bool:
    for pattern in scheme.ignore:
        if pattern.startswith("re:"):
            if re.search(pattern[3:], module):
                return True
        elif pattern == module or module.endswith(pattern) or pattern in module:
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Parameters per GPU
# ---------------------------------------------------------------------------------------------


def _round_up(x: float, multiple: int) -> float:
    return -(-x // multiple) * multiple if multiple > 1 else x


def _layer_parts(
    s: ModelShape, tp: int, moe: bool, mamba: bool = False, expert_pad: tuple[int, int] = (1, 1)
) -> dict[str, float]:
    """Parameters of one decoder layer on one GPU, by part (linear layers split by TP)."""
    h = s.hidden
    if mamba:
        attn = s.mamba_params / tp
    elif s.mla:
        qk_head = s.qk_nope_head_dim + s.qk_rope_head_dim
        q = (h * s.q_lora_rank + s.q_lora_rank * s.heads * qk_head) if s.q_lora_rank else h * s.heads * qk_head
        attn = (
            q / tp
            + h * (s.kv_lora_rank + s.qk_rope_head_dim)  # replicated: ReplicatedLinear kv_a_proj_with_mqa
            + s.kv_lora_rank * s.heads * (s.qk_nope_head_dim + s.v_head_dim) / tp
            + s.heads * s.v_head_dim * h / tp
        )
    else:
        kv = max(1, s.kv_heads // tp) if s.kv_heads < tp else s.kv_heads / tp
        attn = h * s.head_dim * (s.heads / tp + 2 * kv) + s.heads / tp * s.head_dim * h
    parts: dict[str, float] = {"attention": attn, "norms": 2 * h}
    if moe:
        inter = _round_up(s.moe_intermediate / tp, expert_pad[0])
        parts["experts"] = s.experts * 3 * _round_up(h, expert_pad[1]) * inter
        parts["router"] = h * s.experts
        if s.shared_intermediate:
            parts["shared_experts"] = 3 * h * s.shared_intermediate / tp
    else:
        parts["mlp"] = 3 * h * s.intermediate / tp
    return parts


def estimate_weights(
    raw: Mapping[str, Any],
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: str | None = None,
    quantization: str | None = None,
    source: str = "config.json",
    shape: ModelShape | None = None,
) -> WeightsEstimate:
    """Weights on the busiest GPU (the first PP stage holds the embedding, the last the lm_head)."""
    s = shape or model_shape(raw, source=source)
    cfg = _text(raw)
    dt = (dtype or str(cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or "bfloat16")).lower()
    dt = dt.removeprefix("torch.")
    elem = FLOAT32_FLAG.get(dtype or "", DTYPE_BYTES.get(dt, 2))
    scheme = quant_scheme(raw, quantization, elem, source)

    def linear_bytes(part: str, params: float) -> float:
        if scheme is None or part in ("norms", "router") or _ignored(scheme, part):
            return params * elem
        if scheme.experts_only and part != "experts":
            return params * elem
        return params * scheme.linear_bytes

    padded_vocab = -(-s.vocab // VOCAB_PADDING) * VOCAB_PADDING
    embed = padded_vocab * s.hidden / tp
    from kvwatch.reconcile.capacity import pp_partition  # the same split vLLM's get_pp_indices makes

    best: tuple[float, float, dict[str, float]] = (-1.0, 0.0, {})
    total_params = 0.0
    for stage, (start, end) in enumerate(pp_partition(s.layers, pp)):
        rows: dict[str, float] = {}
        params = 0.0
        for i in range(start, end):
            moe, mamba = i in s.moe_layer_ids, i in s.mamba_layer_ids
            pad = scheme.expert_pad if scheme else (1, 1)
            for part, n in _layer_parts(s, tp, moe, mamba, pad).items():
                rows[part] = rows.get(part, 0.0) + linear_bytes(part, n)
            # the checkpoint's parameters (the padding is the kernel's, not the model's)
            params += sum(_layer_parts(s, tp, moe, mamba).values())
        if stage == 0:
            rows["embedding"] = embed * elem
            params += embed
            if s.vision_params:
                rows["vision_tower"] = s.vision_params * elem  # replicated on every TP rank in most VLMs
                params += s.vision_params
        if stage == pp - 1:
            rows["final_norm"] = s.hidden * elem
            params += s.hidden
            if not s.tied or pp > 1:
                head_quant = scheme is not None and scheme.lm_head and not scheme.experts_only
                rows["lm_head"] = embed * (scheme.linear_bytes if head_quant and scheme else elem)
                params += embed
            # RotaryEmbedding.cos_sin_cache: (max_position, rotary_dim) in the model dtype.
            rows["rotary_cache"] = s.max_position * s.rotary_dim * elem
        total_params += params
        size = sum(rows.values())
        if size > best[0]:
            best = (size, params, rows)
    size, params, rows = best
    return WeightsEstimate(
        params_total=int(total_params * tp),
        params_per_gpu=int(params),
        bytes_per_gpu=int(size),
        quantization=scheme.method if scheme else None,
        rows=tuple((k, int(v)) for k, v in rows.items()),
    )


__all__ = ["GIB", "ModelShape", "QuantScheme", "WeightsEstimate", "estimate_weights", "model_shape", "quant_scheme"]
