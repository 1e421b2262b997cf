"""The raw config.json behind ``--model``, for the memory profile (weights, activations).

``architecture.resolve_model`` reads only the fields that size the KV cache; the memory profile
needs the whole language-model shape (MLP width, vocabulary, experts). This module returns the
parsed config.json from the same places, in the same order: a file or model folder, the local
Hugging Face cache (never downloaded), else a catalogue entry. Catalogue entries carry only the KV
fields, so ``CATALOGUE_SHAPES`` adds the remaining fields of each model's published config.json
(the entry's citation URL): the catalogue stays a convenience for names, and a config.json alone
is always enough.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvwatch.errors import UsageError
from kvwatch.reconcile.architecture import hf_cache_config

_LLAMA3 = {"intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
_QWEN25 = {"vocab_size": 152064, "tie_word_embeddings": False}
_QWEN3 = {"vocab_size": 151936, "tie_word_embeddings": False}
_GPT_OSS = {
    "intermediate_size": 2880,
    "vocab_size": 201088,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "head_dim": 64,
    "tie_word_embeddings": False,
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
}
_DEEPSEEK_V3 = {
    "intermediate_size": 18432,
    "vocab_size": 129280,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "num_attention_heads": 128,
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
}
_SIGLIP_896 = {
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_hidden_layers": 27,
    "image_size": 896,
    "patch_size": 14,
}

# model id -> the published config.json fields the catalogue entry lacks (added only where absent;
# nested "text_config" / "vision_config" merge into the entry's own).
CATALOGUE_SHAPES: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-2-7b-hf": {"intermediate_size": 11008, "vocab_size": 32000, "tie_word_embeddings": False},
    "meta-llama/Llama-2-13b-hf": {"intermediate_size": 13824, "vocab_size": 32000, "tie_word_embeddings": False},
    "meta-llama/Llama-2-70b-hf": {"intermediate_size": 28672, "vocab_size": 32000, "tie_word_embeddings": False},
    "meta-llama/Meta-Llama-3-8B": _LLAMA3,
    "meta-llama/Llama-3.1-8B": _LLAMA3,
    "meta-llama/Llama-3.1-70B": {**_LLAMA3, "intermediate_size": 28672},
    "meta-llama/Llama-3.1-405B": {**_LLAMA3, "intermediate_size": 53248},
    "meta-llama/Llama-3.2-1B": {"intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True},
    "meta-llama/Llama-3.2-3B": {"intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True},
    "mistralai/Mistral-7B-Instruct-v0.3": {
        "intermediate_size": 14336,
        "vocab_size": 32768,
        "tie_word_embeddings": False,
    },
    "mistralai/Mixtral-8x7B-Instruct-v0.1": {
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen2.5-7B-Instruct": {**_QWEN25, "intermediate_size": 18944},
    "Qwen/Qwen2.5-32B-Instruct": {**_QWEN25, "intermediate_size": 27648},
    "Qwen/Qwen2.5-72B-Instruct": {**_QWEN25, "intermediate_size": 29568},
    "Qwen/Qwen3-8B": {**_QWEN3, "intermediate_size": 12288},
    "Qwen/Qwen3-32B": {**_QWEN3, "intermediate_size": 25600},
    "Qwen/Qwen3-30B-A3B": {
        **_QWEN3,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
    },
    "Qwen/Qwen3-235B-A22B": {
        **_QWEN3,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_experts": 128,
        "num_experts_per_tok": 8,
    },
    "deepseek-ai/DeepSeek-V3": _DEEPSEEK_V3,
    "deepseek-ai/DeepSeek-R1": _DEEPSEEK_V3,
    "google/gemma-2-9b-it": {"intermediate_size": 14336, "vocab_size": 256000},
    "google/gemma-2-27b-it": {"intermediate_size": 36864, "vocab_size": 256000},
    "google/gemma-3-27b-it": {
        "mm_tokens_per_image": 256,
        "text_config": {"intermediate_size": 21504, "vocab_size": 262208},
        "vision_config": _SIGLIP_896,
    },
    "openai/gpt-oss-20b": {**_GPT_OSS, "num_local_experts": 32},
    "openai/gpt-oss-120b": {**_GPT_OSS, "num_local_experts": 128},
    "microsoft/Phi-3-mini-4k-instruct": {"intermediate_size": 8192, "vocab_size": 32064, "tie_word_embeddings": False},
    "ai21labs/Jamba-v0.1": {
        "intermediate_size": 14336,
        "vocab_size": 65536,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "tie_word_embeddings": False,
    },
    "mistral-community/pixtral-12b": {
        "text_config": {"intermediate_size": 14336, "vocab_size": 131072, "tie_word_embeddings": False},
        "vision_config": {
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_hidden_layers": 24,
            "image_size": 1024,
            "patch_size": 16,
        },
    },
}


def _merge_missing(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge_missing(base[key], value)
        elif key not in base:
            base[key] = copy.deepcopy(value)


def _read(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc.__class__.__name__}); give a readable config.json") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}); fix config.json") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: config.json must be a JSON object")
    return raw


def raw_config(name_or_path: str, env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """(parsed config.json, where it came from) for ``--model``, resolved as ``resolve_model`` does."""
    path = Path(name_or_path).expanduser()
    if path.is_file() or (path.is_dir() and (path / "config.json").is_file()):
        return _read(path), str(path)
    cached = hf_cache_config(name_or_path, env)
    if cached is not None:
        return _read(cached), str(cached)
    from kvwatch.reconcile import catalogue  # local: the catalogue imports architecture

    entry = catalogue.find(name_or_path)
    if entry is None:
        catalogue.lookup(name_or_path)  # raises the catalogue's one-line "unknown model" error
        raise UsageError(f"--model {name_or_path!r} is not known")
    raw = copy.deepcopy(entry.config)
    _merge_missing(raw, CATALOGUE_SHAPES.get(entry.model_id, {}))
    return raw, entry.citation


__all__ = ["CATALOGUE_SHAPES", "raw_config"]
