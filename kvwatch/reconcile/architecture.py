"""The architecture numbers behind the KV cache, read from a Hugging Face config.json.

Owns: the frozen ``Architecture`` record; reading it from a config.json file, a model folder, a
model id in the local Hugging Face cache (never downloaded), or the built-in catalogue
(``kvwatch.reconcile.model_catalogue``); and validating config.json with one-line errors that name the
field. ``resolve_model`` is the one entry point behind ``--model`` / ``--model-config``.

Which layer holds what (per vLLM, see docs/vllm-formats.md §7):
``full``    full attention: per-token KV for the whole context;
``sliding`` sliding-window attention: per-token KV bounded by the window;
``mamba``   a state-space layer: a fixed state per request, no per-token KV.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvwatch.errors import UsageError

LayerKind = Literal["full", "sliding", "mamba"]
AttentionKind = Literal["mha", "gqa", "mqa", "mla", "sliding", "hybrid"]

# Bytes per element of the model dtype (config.json "torch_dtype", or "dtype" in transformers
# >= 4.56). vLLM's kv_cache_dtype "auto" stores the KV cache in this dtype; a float32 checkpoint
# is served in float16/bfloat16 by default (ModelConfig._get_and_verify_dtype), so it counts 2.
DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 2,  # vLLM serves float32 checkpoints in 16 bits unless --dtype float32
    "float": 2,
}


@dataclass(frozen=True, slots=True)
class MambaShape:
    """What one Mamba layer keeps per request (vLLM ``MambaStateShapeCalculator``).

    version 1 (Jamba, Mamba): conv state (d_inner, d_conv - 1) + SSM state (d_inner, d_state).
    version 2 (granite-4.0-h, Bamba, Nemotron-H): conv state (d_inner + 2 n_groups d_state,
    d_conv - 1) + SSM state (n_heads, head_dim, d_state). Both split by TP.
    """

    version: int
    d_inner: int
    d_state: int
    d_conv: int
    n_groups: int = 1
    n_heads: int = 0
    head_dim: int = 0

    def state_elements(self, tp: int) -> int:
        """Elements of conv + SSM state for one layer, one request, on one GPU."""
        if self.version == 1:
            d_inner = self.d_inner // tp
            return d_inner * (self.d_conv - 1) + d_inner * self.d_state
        # Mamba2: groups are replicated when n_groups < tp (vLLM extra_groups_for_head_shards).
        groups = max(self.n_groups, tp) if self.n_groups % tp else self.n_groups
        conv_dim = self.d_inner // tp + 2 * (groups // tp) * self.d_state
        return conv_dim * (self.d_conv - 1) + (self.n_heads // tp) * self.head_dim * self.d_state


@dataclass(frozen=True, slots=True)
class Architecture:
    """The numbers of one model that size its KV cache. Frozen; build with ``from_config``.

    ``layer_kinds`` has one entry per decoder layer. ``kv_heads`` is the total number of KV
    heads (before TP); ``head_dim`` is per head, or the MLA latent width
    (kv_lora_rank + qk_rope_head_dim) when ``mla``.
    """

    name: str
    architecture_class: str
    layer_kinds: tuple[LayerKind, ...]
    num_attention_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    mla: bool = False
    sliding_window: int | None = None
    mamba: MambaShape | None = None
    max_position_embeddings: int | None = None
    params: float | None = None  # parameter count, for the weights estimate
    weight_bytes_per_param: float | None = None  # as the checkpoint ships (2 = bf16, 1 = fp8)
    source: str = ""  # the file read, or the catalogue citation

    @property
    def layers(self) -> int:
        """Decoder layers (num_hidden_layers)."""
        return len(self.layer_kinds)

    @property
    def attention_layers(self) -> int:
        """Layers that hold per-token KV (full + sliding)."""
        return sum(1 for k in self.layer_kinds if k != "mamba")

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the model dtype (what kv_cache_dtype auto stores)."""
        return DTYPE_BYTES.get(self.dtype, 2)

    @property
    def attention(self) -> AttentionKind:
        """How the JSON document names the attention: mha|gqa|mqa|mla|sliding|hybrid."""
        if self.mamba is not None or "mamba" in self.layer_kinds:
            return "hybrid"
        if self.mla:
            return "mla"
        if "sliding" in self.layer_kinds:
            return "sliding"
        if self.kv_heads == 1:
            return "mqa"
        if self.kv_heads == self.num_attention_heads:
            return "mha"
        return "gqa"

    @property
    def weights_bytes(self) -> int | None:
        """Checkpoint weights in bytes (whole model), when the parameter count is known."""
        if self.params is None or self.weight_bytes_per_param is None:
            return None
        return int(self.params * self.weight_bytes_per_param)


# ---------------------------------------------------------------------------------------------
# Architecture classes kvwatch knows how to read. An unknown class is refused (field
# "architectures") rather than guessed: a wrong guess would be a confidently wrong capacity.
# Each row: the class -> how its layers are laid out (the rule's name), and why.
# ---------------------------------------------------------------------------------------------
LAYOUT_RULES: dict[str, str] = {
    # Plain decoders: every layer full attention (GQA/MHA by kv heads).
    "LlamaForCausalLM": "full",
    "Qwen2ForCausalLM": "qwen2",  # sliding only if use_sliding_window (off in every Qwen2.5 release)
    "Qwen2MoeForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "full",
    "Qwen3MoeForCausalLM": "full",
    "GraniteForCausalLM": "full",
    "GemmaForCausalLM": "full",
    "Phi3ForCausalLM": "full",  # Phi-3-mini-4k's sliding_window 2047 >= its context minus a batch: see catalogue
    # Mistral 7B v0.1 applies sliding_window to every layer; later releases set it to null.
    "MistralForCausalLM": "all_sliding_if_set",
    "MixtralForCausalLM": "all_sliding_if_set",
    # MLA (vLLM 0.7.1+): one latent per token per layer, no K/V split, not split by TP.
    "DeepseekV2ForCausalLM": "mla",
    "DeepseekV3ForCausalLM": "mla",
    # Interleaved sliding window.
    "Gemma2ForCausalLM": "gemma2",  # vLLM gemma2.py: even layers slide
    "Gemma3ForCausalLM": "gemma3",  # vLLM gemma3.py: (i + 1) % sliding_window_pattern != 0 slides
    "Gemma3ForConditionalGeneration": "gemma3",
    "GptOssForCausalLM": "layer_types",  # config lists sliding_attention / full_attention per layer
    # Attention + Mamba hybrids: attention at i % attn_layer_period == attn_layer_offset.
    "JambaForCausalLM": "jamba",
    "GraniteMoeHybridForCausalLM": "layer_types",  # granite-4.0-h: layer_types attention / mamba
    # Multimodal wrappers: the language model's numbers sit in text_config.
    "LlavaForConditionalGeneration": "all_sliding_if_set",
    "Mistral3ForConditionalGeneration": "all_sliding_if_set",
    "Qwen2VLForConditionalGeneration": "qwen2",
    "Qwen2_5_VLForConditionalGeneration": "qwen2",
}


def _where(source: str, field: str) -> str:
    return f"{source}: field '{field}'"


def _get_int(cfg: Mapping[str, Any], field: str, source: str, *, required: bool = True) -> int | None:
    value = cfg.get(field)
    if value is None:
        if required:
            raise UsageError(
                f"{_where(source, field)} is missing; it is needed to size the KV cache "
                f"(fix config.json or pass a catalogue model name)"
            )
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{_where(source, field)} must be an integer, got {json.dumps(value)[:40]}")
    if value < 0 or (value == 0 and required):
        raise UsageError(f"{_where(source, field)} must be positive, got {value}")
    return value


def _text_config(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The language model's fields: top level, overlaid with text_config / llm_config if present."""
    merged = dict(raw)
    for key in ("text_config", "llm_config", "language_config"):
        sub = raw.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise UsageError(f"{_where(source, key)} must be an object, got {json.dumps(sub)[:40]}")
        merged.update(sub)
        break
    return merged


def _layer_kinds(rule: str, cfg: Mapping[str, Any], layers: int, source: str) -> tuple[LayerKind, ...]:
    window = cfg.get("sliding_window")
    if rule == "layer_types" or (cfg.get("layer_types") is not None and rule not in ("jamba",)):
        types = cfg.get("layer_types")
        if not isinstance(types, list) or len(types) != layers:
            raise UsageError(f"{_where(source, 'layer_types')} must list one type per layer ({layers} layers)")
        kinds: list[LayerKind] = []
        for t in types:
            if t in ("sliding_attention", "chunked_attention"):
                kinds.append("sliding")
            elif t in ("full_attention", "attention"):
                kinds.append("full")
            elif t == "mamba":
                kinds.append("mamba")
            else:
                raise UsageError(f"{_where(source, 'layer_types')} has an unknown type {t!r}")
        return tuple(kinds)
    full: tuple[LayerKind, ...] = tuple("full" for _ in range(layers))
    if rule in {"full", "mla"}:
        return full
    if rule == "qwen2":
        # Qwen2: layers from max_window_layers on slide, and only with use_sliding_window true.
        if cfg.get("use_sliding_window") and isinstance(window, int):
            first = cfg.get("max_window_layers", 0)
            first = first if isinstance(first, int) else 0
            return tuple("sliding" if i >= first else "full" for i in range(layers))
        return full
    if rule == "all_sliding_if_set":
        if isinstance(window, int) and window > 0:
            return tuple("sliding" for _ in range(layers))
        return full
    if rule == "gemma2":
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(layers))
    if rule == "gemma3":
        pattern = _get_int(cfg, "sliding_window_pattern", source, required=False) or 6
        return tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers))
    if rule == "jamba":
        period = _get_int(cfg, "attn_layer_period", source)
        offset = _get_int(cfg, "attn_layer_offset", source, required=False) or 0
        assert period is not None
        return tuple("full" if i % period == offset else "mamba" for i in range(layers))
    raise AssertionError(f"no layout rule {rule}")


def _mamba_shape(cfg: Mapping[str, Any], hidden: int, source: str) -> MambaShape:
    d_state = _get_int(cfg, "mamba_d_state", source)
    d_conv = _get_int(cfg, "mamba_d_conv", source)
    assert d_state is not None
    assert d_conv is not None
    n_heads = _get_int(cfg, "mamba_n_heads", source, required=False)
    if n_heads:  # Mamba2
        head_dim = _get_int(cfg, "mamba_d_head", source)
        assert head_dim is not None
        groups = _get_int(cfg, "mamba_n_groups", source, required=False) or 1
        return MambaShape(2, n_heads * head_dim, d_state, d_conv, groups, n_heads, head_dim)
    expand = _get_int(cfg, "mamba_expand", source)
    assert expand is not None
    return MambaShape(1, expand * hidden, d_state, d_conv)


def from_config(
    raw: Mapping[str, Any],
    *,
    name: str,
    source: str,
    params: float | None = None,
    weight_bytes_per_param: float | None = None,
) -> Architecture:
    """Read a parsed config.json into an ``Architecture``; bad fields raise a one-line UsageError."""
    if not isinstance(raw, Mapping):
        raise UsageError(f"{source}: config.json must be a JSON object")
    classes = raw.get("architectures")
    if classes is None:
        raise UsageError(f"{_where(source, 'architectures')} is missing; it names the model class")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise UsageError(f"{_where(source, 'architectures')} must be a list of class names")
    arch_class = classes[0]
    rule = LAYOUT_RULES.get(arch_class)
    if rule is None:
        raise UsageError(
            f"{_where(source, 'architectures')}: unknown architecture {arch_class!r}; kvwatch knows "
            f"{', '.join(sorted(LAYOUT_RULES)[:6])}, ... (pass a catalogue model or the numbers with "
            f"--kv-bytes-per-token)"
        )
    cfg = _text_config(raw, source)
    layers = _get_int(cfg, "num_hidden_layers", source)
    heads = _get_int(cfg, "num_attention_heads", source)
    assert layers is not None
    assert heads is not None
    dtype = cfg.get("torch_dtype", cfg.get("dtype", raw.get("torch_dtype", raw.get("dtype", "bfloat16"))))
    if dtype is None:
        dtype = "bfloat16"
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPE_BYTES:
        raise UsageError(f"{_where(source, 'torch_dtype')} must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    dtype = dtype.removeprefix("torch.")
    max_pos = _get_int(cfg, "max_position_embeddings", source, required=False)

    mla = rule == "mla"
    if mla:
        rank = _get_int(cfg, "kv_lora_rank", source)
        rope = _get_int(cfg, "qk_rope_head_dim", source)
        assert rank is not None
        assert rope is not None
        kv_heads, head_dim = 1, rank + rope  # vLLM get_num_kv_heads -> 1 when use_mla
    else:
        # vLLM ModelConfig.get_total_num_kv_heads: the first of these that is set, else heads.
        kv_heads = heads
        for field in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"):
            value = _get_int(cfg, field, source, required=False)
            if value:
                kv_heads = value
                break
        if cfg.get("multi_query") is True:
            kv_heads = 1
        head_dim_cfg = _get_int(cfg, "head_dim", source, required=False)
        if head_dim_cfg:
            head_dim = head_dim_cfg
        else:
            hidden = _get_int(cfg, "hidden_size", source)
            assert hidden is not None
            head_dim = hidden // heads

    kinds = _layer_kinds(rule, cfg, layers, source)
    window: int | None = None
    if "sliding" in kinds:
        window = _get_int(cfg, "sliding_window", source)
    mamba = None
    if "mamba" in kinds:
        hidden = _get_int(cfg, "hidden_size", source)
        assert hidden is not None
        mamba = _mamba_shape(cfg, hidden, source)
    return Architecture(
        name=name,
        architecture_class=arch_class,
        layer_kinds=kinds,
        num_attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        mla=mla,
        sliding_window=window,
        mamba=mamba,
        max_position_embeddings=max_pos,
        params=params,
        weight_bytes_per_param=weight_bytes_per_param,
        source=source,
    )


def load_config_file(path: Path, *, name: str | None = None) -> Architecture:
    """Read a config.json file (or a model folder holding one)."""
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; give a config.json, a model folder or a model name") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc.__class__.__name__}); give a readable config.json") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); fix config.json") from None
    model_name = name or (path.parent.name if path.name == "config.json" else path.stem)
    return from_config(raw, name=model_name, source=str(path))


def hf_cache_config(model_id: str, env: Mapping[str, str] | None = None) -> Path | None:
    """config.json of ``org/name`` in the local Hugging Face cache, or None. Never downloads.

    Looks in ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``; prefers
    the snapshot that ``refs/main`` names, else the newest snapshot with a config.json.
    """
    env = os.environ if env is None else env
    if "/" not in model_id or model_id.count("/") != 1:
        return None
    hub = env.get("HF_HUB_CACHE")
    if hub:
        root = Path(hub)
    else:
        home = env.get("HF_HOME")
        root = (Path(home) if home else Path.home() / ".cache" / "huggingface") / "hub"
    repo = root / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text(encoding="utf-8").strip() / "config.json"
        if candidate.is_file():
            return candidate
    found = [p for p in snapshots.glob("*/config.json") if p.is_file()]
    if not found:
        return None
    return max(found, key=lambda p: p.stat().st_mtime)


def resolve_model(
    name_or_path: str,
    *,
    env: Mapping[str, str] | None = None,
    catalogue_lookup: Callable[[str], Architecture] | None = None,
) -> Architecture:
    """The Architecture behind ``--model`` / ``--model-config``.

    In order: an existing config.json file or model folder; a model id in the local Hugging Face
    cache; the built-in catalogue (by id, name or alias, case-insensitive; a path's last part is
    tried too). An unknown name raises UsageError listing the closest catalogue names.
    """
    if not name_or_path or not name_or_path.strip():
        raise UsageError("--model is empty; give a catalogue name, a config.json or a model folder")
    path = Path(name_or_path).expanduser()
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        return load_config_file(path)
    if path.is_dir():
        raise UsageError(f"{path}: folder has no config.json; give the model folder or its config.json")
    cached = hf_cache_config(name_or_path, env)
    if cached is not None:
        return load_config_file(cached, name=name_or_path)
    if catalogue_lookup is not None:
        return catalogue_lookup(name_or_path)
    from kvwatch.reconcile.model_catalogue import lookup  # local: the catalogue imports this module

    return lookup(name_or_path)
