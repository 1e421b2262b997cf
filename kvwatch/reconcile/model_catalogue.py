"""Built-in architecture numbers of common models, so ``--model NAME`` works offline.

Each entry holds the config.json fields that size the KV cache, copied from the model's published
config.json (the ``source`` URL; ``fields`` says which were used), and goes through the same reader
as a real config.json (``architecture.from_config``), so a catalogue model and its config.json
cannot disagree. ``params`` (parameter count) and ``weight_bytes_per_param`` only feed the weights
estimate of the GPU-memory pool; ``--weights-gib`` overrides it.

Unknown names raise a one-line UsageError listing the closest names (difflib).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from kvwatch.errors import UsageError
from kvwatch.reconcile.architecture import Architecture, from_config

HF = "https://huggingface.co/{}/blob/main/config.json"
MLA_FIELDS = "num_hidden_layers, kv_lora_rank, qk_rope_head_dim, torch_dtype (weights fp8: quantization_config)"
LLAMA_FIELDS = "num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, torch_dtype"


@dataclass(frozen=True, slots=True)
class CatalogueEntry:
    """One model: its Hugging Face id, other names it goes by, the config.json subset, the source."""

    model_id: str
    config: dict[str, Any]
    params: float  # parameter count (model card), for the weights estimate only
    fields: str  # which config.json fields were copied
    weight_bytes_per_param: float = 2.0  # bf16/fp16 checkpoints; fp8 = 1; MXFP4 measured from size
    aliases: tuple[str, ...] = ()
    note: str = ""
    source: str = field(default="")

    @property
    def citation(self) -> str:
        """Where the numbers come from."""
        return self.source or HF.format(self.model_id)


def _llama(layers: int, heads: int, kv: int, hidden: int, dtype: str, max_pos: int, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_size": hidden,
        "torch_dtype": dtype,
        "max_position_embeddings": max_pos,
    }
    cfg.update(extra)
    return cfg


CATALOGUE: tuple[CatalogueEntry, ...] = (
    # --- Llama 2: MHA in 7B/13B (kv heads = heads), GQA from 70B; fp16 checkpoints, 4k context.
    CatalogueEntry(
        "meta-llama/Llama-2-7b-hf",
        _llama(32, 32, 32, 4096, "float16", 4096),
        6.74e9,
        LLAMA_FIELDS,
        aliases=("llama-2-7b", "llama-2-7b-chat-hf", "llama2-7b"),
    ),
    CatalogueEntry(
        "meta-llama/Llama-2-13b-hf",
        _llama(40, 40, 40, 5120, "float16", 4096),
        13.0e9,
        LLAMA_FIELDS,
        aliases=("llama-2-13b", "llama-2-13b-chat-hf", "llama2-13b"),
    ),
    CatalogueEntry(
        "meta-llama/Llama-2-70b-hf",
        _llama(80, 64, 8, 8192, "float16", 4096),
        69.0e9,
        LLAMA_FIELDS,
        aliases=("llama-2-70b", "llama-2-70b-chat-hf", "llama2-70b"),
    ),
    # --- Llama 3 / 3.1 / 3.2: GQA with 8 KV heads, bf16. Llama 3 8B = 3.1 8B minus the long rope.
    CatalogueEntry(
        "meta-llama/Meta-Llama-3-8B",
        _llama(32, 32, 8, 4096, "bfloat16", 8192),
        8.03e9,
        LLAMA_FIELDS,
        aliases=("llama-3-8b", "meta-llama-3-8b-instruct", "llama3-8b"),
        note="named by a real log (tests/fixtures/real/logs/025)",
    ),
    CatalogueEntry(
        "meta-llama/Llama-3.1-8B",
        _llama(32, 32, 8, 4096, "bfloat16", 131072),
        8.03e9,
        LLAMA_FIELDS,
        aliases=(
            "llama-3.1-8b",
            "llama-3.1-8b-instruct",
            "meta-llama-3.1-8b",
            "meta-llama-3.1-8b-instruct",
            "hermes-3-llama-3.1-8b",
            "llama3.1-8b",
        ),
    ),
    CatalogueEntry(
        "meta-llama/Llama-3.1-70B",
        _llama(80, 64, 8, 8192, "bfloat16", 131072),
        70.6e9,
        LLAMA_FIELDS,
        aliases=(
            "llama-3.1-70b",
            "llama-3.1-70b-instruct",
            "meta-llama-3.1-70b-instruct",
            "llama-3.3-70b-instruct",
            "llama3.1-70b",
        ),
    ),
    CatalogueEntry(
        "meta-llama/Llama-3.1-405B",
        _llama(126, 128, 8, 16384, "bfloat16", 131072),
        405.9e9,
        LLAMA_FIELDS,
        aliases=("llama-3.1-405b", "llama-3.1-405b-instruct", "meta-llama-3.1-405b-instruct"),
    ),
    CatalogueEntry(
        "meta-llama/Llama-3.2-1B",
        _llama(16, 32, 8, 2048, "bfloat16", 131072, head_dim=64),
        1.24e9,
        LLAMA_FIELDS + ", head_dim",
        aliases=("llama-3.2-1b", "llama-3.2-1b-instruct"),
    ),
    CatalogueEntry(
        "meta-llama/Llama-3.2-3B",
        _llama(28, 24, 8, 3072, "bfloat16", 131072, head_dim=128),
        3.21e9,
        LLAMA_FIELDS + ", head_dim",
        aliases=("llama-3.2-3b", "llama-3.2-3b-instruct"),
    ),
    # --- Mistral / Mixtral: GQA; v0.3 and Mixtral set sliding_window null (full attention).
    CatalogueEntry(
        "mistralai/Mistral-7B-Instruct-v0.3",
        {
            **_llama(32, 32, 8, 4096, "bfloat16", 32768, head_dim=128, sliding_window=None),
            "architectures": ["MistralForCausalLM"],
        },
        7.25e9,
        LLAMA_FIELDS + ", head_dim, sliding_window",
        aliases=("mistral-7b", "mistral-7b-v0.3", "mistral-7b-instruct", "mistral-7b-instruct-v0.2"),
    ),
    CatalogueEntry(
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
        {**_llama(32, 32, 8, 4096, "bfloat16", 32768, sliding_window=None), "architectures": ["MixtralForCausalLM"]},
        46.7e9,
        LLAMA_FIELDS + ", sliding_window",
        aliases=("mixtral-8x7b", "mixtral-8x7b-v0.1", "mixtral-8x7b-instruct"),
    ),
    # --- Qwen2.5: GQA; use_sliding_window false in every release, so full attention.
    CatalogueEntry(
        "Qwen/Qwen2.5-7B-Instruct",
        {
            **_llama(28, 28, 4, 3584, "bfloat16", 32768, sliding_window=131072, use_sliding_window=False),
            "architectures": ["Qwen2ForCausalLM"],
        },
        7.62e9,
        LLAMA_FIELDS + ", use_sliding_window",
        aliases=("qwen2.5-7b", "qwen2.5-7b-instruct"),
    ),
    CatalogueEntry(
        "Qwen/Qwen2.5-32B-Instruct",
        {
            **_llama(64, 40, 8, 5120, "bfloat16", 32768, sliding_window=131072, use_sliding_window=False),
            "architectures": ["Qwen2ForCausalLM"],
        },
        32.8e9,
        LLAMA_FIELDS + ", use_sliding_window",
        aliases=("qwen2.5-32b", "qwen2.5-32b-instruct"),
    ),
    CatalogueEntry(
        "Qwen/Qwen2.5-72B-Instruct",
        {
            **_llama(80, 64, 8, 8192, "bfloat16", 32768, sliding_window=131072, use_sliding_window=False),
            "architectures": ["Qwen2ForCausalLM"],
        },
        72.7e9,
        LLAMA_FIELDS + ", use_sliding_window",
        aliases=("qwen2.5-72b", "qwen2.5-72b-instruct"),
    ),
    # --- Qwen3: GQA, explicit head_dim 128 (not hidden/heads).
    CatalogueEntry(
        "Qwen/Qwen3-8B",
        {**_llama(36, 32, 8, 4096, "bfloat16", 40960, head_dim=128), "architectures": ["Qwen3ForCausalLM"]},
        8.19e9,
        LLAMA_FIELDS + ", head_dim",
        aliases=("qwen3-8b",),
    ),
    CatalogueEntry(
        "Qwen/Qwen3-32B",
        {**_llama(64, 64, 8, 5120, "bfloat16", 40960, head_dim=128), "architectures": ["Qwen3ForCausalLM"]},
        32.8e9,
        LLAMA_FIELDS + ", head_dim",
        aliases=("qwen3-32b",),
    ),
    CatalogueEntry(
        "Qwen/Qwen3-30B-A3B",
        {**_llama(48, 32, 4, 2048, "bfloat16", 40960, head_dim=128), "architectures": ["Qwen3MoeForCausalLM"]},
        30.5e9,
        LLAMA_FIELDS + ", head_dim",
        aliases=("qwen3-30b-a3b", "qwen3-30b"),
    ),
    CatalogueEntry(
        "Qwen/Qwen3-235B-A22B",
        {**_llama(94, 64, 4, 4096, "bfloat16", 40960, head_dim=128), "architectures": ["Qwen3MoeForCausalLM"]},
        235e9,
        LLAMA_FIELDS + ", head_dim",
        aliases=("qwen3-235b-a22b", "qwen3-235b"),
    ),
    # --- DeepSeek V3 / R1: MLA, 576-wide latent (512 + 64), fp8 checkpoint weights.
    CatalogueEntry(
        "deepseek-ai/DeepSeek-V3",
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "torch_dtype": "bfloat16",
            "max_position_embeddings": 163840,
        },
        671e9,
        MLA_FIELDS,
        weight_bytes_per_param=1.0,
        aliases=("deepseek-v3", "deepseek-v3-0324"),
    ),
    CatalogueEntry(
        "deepseek-ai/DeepSeek-R1",
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "torch_dtype": "bfloat16",
            "max_position_embeddings": 163840,
        },
        671e9,
        MLA_FIELDS,
        weight_bytes_per_param=1.0,
        aliases=("deepseek-r1", "deepseek-r1-0528"),
    ),
    # --- Gemma 2: every other layer slides over 4,096 tokens (vLLM gemma2.py: even layers).
    CatalogueEntry(
        "google/gemma-2-9b-it",
        {
            **_llama(42, 16, 8, 3584, "bfloat16", 8192, head_dim=256, sliding_window=4096),
            "architectures": ["Gemma2ForCausalLM"],
        },
        9.24e9,
        LLAMA_FIELDS + ", head_dim, sliding_window",
        aliases=("gemma-2-9b", "gemma2-9b"),
    ),
    CatalogueEntry(
        "google/gemma-2-27b-it",
        {
            **_llama(46, 32, 16, 4608, "bfloat16", 8192, head_dim=128, sliding_window=4096),
            "architectures": ["Gemma2ForCausalLM"],
        },
        27.2e9,
        LLAMA_FIELDS + ", head_dim, sliding_window",
        aliases=("gemma-2-27b", "gemma2-27b"),
    ),
    # --- Gemma 3 27B: multimodal; text numbers in text_config; 5 of every 6 layers slide over 1,024.
    CatalogueEntry(
        "google/gemma-3-27b-it",
        {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "torch_dtype": "bfloat16",
            "text_config": {
                "num_hidden_layers": 62,
                "num_attention_heads": 32,
                "num_key_value_heads": 16,
                "head_dim": 128,
                "hidden_size": 5376,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "max_position_embeddings": 131072,
            },
        },
        27.4e9,
        "text_config: " + LLAMA_FIELDS + ", head_dim, sliding_window, sliding_window_pattern",
        aliases=("gemma-3-27b", "gemma3-27b"),
    ),
    # --- gpt-oss: alternating 128-token sliding and full layers (layer_types), 64-wide heads, MXFP4
    # experts (weight bytes per parameter from the checkpoint size: 13.8 GB / 20.9e9, 65.3 GB / 116.8e9).
    CatalogueEntry(
        "openai/gpt-oss-20b",
        {
            **_llama(
                24,
                64,
                8,
                2880,
                "bfloat16",
                131072,
                head_dim=64,
                sliding_window=128,
                layer_types=["sliding_attention", "full_attention"] * 12,
            ),
            "architectures": ["GptOssForCausalLM"],
        },
        20.9e9,
        LLAMA_FIELDS + ", head_dim, sliding_window, layer_types",
        weight_bytes_per_param=0.66,
        aliases=("gpt-oss-20b",),
    ),
    CatalogueEntry(
        "openai/gpt-oss-120b",
        {
            **_llama(
                36,
                64,
                8,
                2880,
                "bfloat16",
                131072,
                head_dim=64,
                sliding_window=128,
                layer_types=["sliding_attention", "full_attention"] * 18,
            ),
            "architectures": ["GptOssForCausalLM"],
        },
        116.8e9,
        LLAMA_FIELDS + ", head_dim, sliding_window, layer_types",
        weight_bytes_per_param=0.56,
        aliases=("gpt-oss-120b",),
    ),
    # --- Phi-3-mini: MHA, head_dim 96. Its sliding_window (2047) is read as full attention: at its
    # 4,096 context the window + one 2,048-token batch already covers the whole request.
    CatalogueEntry(
        "microsoft/Phi-3-mini-4k-instruct",
        {**_llama(32, 32, 32, 3072, "bfloat16", 4096), "architectures": ["Phi3ForCausalLM"]},
        3.82e9,
        LLAMA_FIELDS,
        aliases=("phi-3-mini", "phi-3-mini-4k", "phi3-mini"),
    ),
    # --- Jamba: attention + Mamba hybrid. 4 of 32 layers attend (period 8, offset 4); the other 28
    # keep a Mamba state per request (d_inner = 2 x 4096, d_state 16, d_conv 4).
    CatalogueEntry(
        "ai21labs/Jamba-v0.1",
        {
            **_llama(
                32,
                32,
                8,
                4096,
                "bfloat16",
                262144,
                attn_layer_period=8,
                attn_layer_offset=4,
                mamba_d_state=16,
                mamba_d_conv=4,
                mamba_expand=2,
            ),
            "architectures": ["JambaForCausalLM"],
        },
        51.6e9,
        LLAMA_FIELDS + ", attn_layer_period, attn_layer_offset, mamba_d_state, mamba_d_conv, mamba_expand",
        aliases=("jamba", "jamba-v0.1"),
    ),
    # --- Pixtral 12B: multimodal (Llava wrapper); a Mistral-Nemo text model in text_config.
    CatalogueEntry(
        "mistral-community/pixtral-12b",
        {
            "architectures": ["LlavaForConditionalGeneration"],
            "torch_dtype": "bfloat16",
            "text_config": {
                "num_hidden_layers": 40,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "hidden_size": 5120,
                "sliding_window": None,
                "max_position_embeddings": 1024000,
            },
        },
        12.4e9,
        "text_config: " + LLAMA_FIELDS + ", head_dim",
        aliases=("pixtral-12b", "pixtral-12b-2409", "mistralai-pixtral-12b-2409"),
        note="named by a real log (tests/fixtures/real/logs/017)",
    ),
)


def normalise(name: str) -> str:
    """Lower-case, last path part, no org: '/models/Meta-Llama-3.1-8B-Instruct' -> 'meta-llama-3.1-8b-instruct'."""
    base = name.strip().rstrip("/").replace("\\", "/")
    base = re.sub(r"^models--[^/]+?--", "", base.split("/")[-1])
    return base.lower()


@cache
def _index() -> dict[str, CatalogueEntry]:
    index: dict[str, CatalogueEntry] = {}
    for entry in CATALOGUE:
        for key in (entry.model_id.lower(), normalise(entry.model_id), *entry.aliases):
            index[key.lower()] = entry
    return index


def names() -> list[str]:
    """Every catalogue model id."""
    return [e.model_id for e in CATALOGUE]


def find(name: str) -> CatalogueEntry | None:
    """The entry for an id, a name, an alias or a path ending in one; None if none matches."""
    index = _index()
    for key in (name.strip().lower(), normalise(name)):
        if key in index:
            return index[key]
    # A local folder name often carries a suffix ('-Instruct', '-hf', '-AWQ', '-FP8'): try the
    # name with trailing parts dropped, longest first.
    parts = normalise(name).split("-")
    for cut in range(len(parts) - 1, 1, -1):
        key = "-".join(parts[:cut])
        if key in index:
            return index[key]
    return None


def architecture(entry: CatalogueEntry) -> Architecture:
    """The entry read through the same path as a config.json."""
    return from_config(
        entry.config,
        name=entry.model_id,
        source=entry.citation,
        params=entry.params,
        weight_bytes_per_param=entry.weight_bytes_per_param,
    )


def known(name: str) -> Architecture:
    """``lookup`` for a caller that only asks whether kvwatch knows ``name`` (a model the log
    names): an unknown name raises UsageError without the closest names, which no one reads."""
    entry = find(name)
    if entry is None:
        raise UsageError(f"unknown model {name!r}")
    return architecture(entry)


def closest(name: str, n: int = 3) -> list[str]:
    """Catalogue ids closest to ``name`` (difflib), best first."""
    import difflib  # local: only an unknown --model's message needs it

    keys = _index()
    hits = difflib.get_close_matches(normalise(name), list(keys), n=n * 3, cutoff=0.3)
    out: list[str] = []
    for key in hits:
        model_id = keys[key].model_id
        if model_id not in out:
            out.append(model_id)
    return out[:n]


def lookup(name: str) -> Architecture:
    """The catalogue architecture for ``name``; unknown -> UsageError listing the closest names."""
    entry = find(name)
    if entry is not None:
        return architecture(entry)
    near = closest(name)  # (difflib over every name: ~10 ms, for the message alone)
    hint = f"closest catalogue names: {', '.join(near)}" if near else "see `kvwatch capacity --list-models`"
    raise UsageError(
        f"unknown model {name!r}: not a config.json, a model folder, a cached Hugging Face model or a catalogue "
        f"name; {hint}"
    )
