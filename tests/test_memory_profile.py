"""vLLM's memory profile predicted from config.json, checked against real vLLM start-ups.

The cases (tests/fixtures/startups/cases.json, provenance in its README) are real start-up logs
with the GPU, the settings and the figures vLLM printed. kvwatch sees only what a user knows
before starting: config.json, the GPU's memory, the utilisation, TP/PP, max_model_len, the
scheduler limits if set and the vLLM version.

Tolerances, per term:
* KV memory: +-5 % for >= 90 % of the cases (the acceptance), and never off by more than 10 %.
* weights: +-3 %. The parameter count is exact; what is not modelled is a few buffers vLLM also
  loads (one rotary cache per attention type in Gemma 3, vision position tables).
* activation: +-0.5 GiB. vLLM measures PyTorch's allocator peak; kvwatch counts the live tensors
  of the dummy forward and sampler, not the caching allocator's rounding or fused kernels' scratch.
* non-torch: +-0.3 GiB. vLLM measures it and config.json cannot give it; kvwatch uses a stated
  default (memory_profile.NON_TORCH_SINGLE_GPU, NCCL_NVLINK_BYTES).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvwatch.cli import main
from kvwatch.errors import UsageError
from kvwatch.reconcile import catalogue
from kvwatch.reconcile.architecture import from_config
from kvwatch.reconcile.capacity import RequestShape, kv_layout, legacy_allocator
from kvwatch.reconcile.memory_profile import (
    CUDA_GRAPH_ESTIMATE,
    GIB,
    MemoryProfile,
    moe_workspace_bytes,
    predict_memory,
    sampler_peak_bytes,
    scheduler_defaults,
)
from kvwatch.reconcile.model_config import raw_config
from kvwatch.reconcile.startup import StartVerdict, explain_failed_start, foretell_start
from kvwatch.reconcile.weights import estimate_weights, model_shape, quant_scheme

STARTUPS = Path(__file__).resolve().parent / "fixtures" / "startups"
CASES: list[dict[str, Any]] = json.loads((STARTUPS / "cases.json").read_text(encoding="utf-8"))["cases"]
SIZED = [c for c in CASES if c["printed"]["kv_memory_gib"] is not None]
FAILING = [c for c in CASES if not c["printed"]["started"]]


def _config(case: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads((STARTUPS / case["config"]).read_text(encoding="utf-8"))
    return raw


def _predict(case: dict[str, Any], **override: Any) -> MemoryProfile:
    i = {**case["inputs"], **override}
    return predict_memory(
        _config(case),
        gpu_total_bytes=int(i["gpu_total_gib"] * GIB),
        utilization=i["utilization"],
        tp=i["tp"],
        pp=i["pp"],
        max_model_len=i["max_model_len"],
        max_num_batched_tokens=i["max_num_batched_tokens"],
        max_num_seqs=i["max_num_seqs"],
        vllm_version=case["vllm_version"],
        enforce_eager=i["enforce_eager"],
        quantization=i["quantization"],
        dtype=i["dtype"],
    )


def _start(case: dict[str, Any], **override: Any) -> StartVerdict:
    i = {**case["inputs"], **override}
    raw = _config(case)
    arch = from_config(raw, name=case["model"], source=case["config"])
    layout = kv_layout(arch, tp=i["tp"], pp=i["pp"], legacy=legacy_allocator(case["vllm_version"]))
    return foretell_start(
        _predict(case, **override), layout, i["max_model_len"], model_max_len=arch.max_position_embeddings
    )


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [c["id"] for c in cases]


# ---------------------------------------------------------------------------------------------
# Against vLLM's printed figures
# ---------------------------------------------------------------------------------------------


def test_kv_memory_within_5_percent_of_vllm_for_90_percent_of_real_startups() -> None:
    misses = []
    for case in SIZED:
        printed = case["printed"]["kv_memory_gib"]
        predicted = _predict(case).kv_memory_bytes / GIB
        if abs(predicted - printed) > 0.05 * printed:
            misses.append(f"{case['id']}: {predicted:.2f} vs {printed:.2f} GiB")
    assert len(SIZED) >= 15
    assert len(misses) <= 0.1 * len(SIZED), misses


@pytest.mark.parametrize("case", SIZED, ids=_ids(SIZED))
def test_kv_memory_is_never_off_by_more_than_10_percent(case: dict[str, Any]) -> None:
    printed = case["printed"]["kv_memory_gib"]
    assert _predict(case).kv_memory_bytes / GIB == pytest.approx(printed, rel=0.10)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_weights_match_what_vllm_loaded(case: dict[str, Any]) -> None:
    assert _predict(case).weights_bytes / GIB == pytest.approx(case["printed"]["weights_gib"], rel=0.03)


@pytest.mark.parametrize("case", SIZED, ids=_ids(SIZED))
def test_activation_peak_matches_vllm_within_half_a_gib(case: dict[str, Any]) -> None:
    assert _predict(case).activation_bytes / GIB == pytest.approx(case["printed"]["activation_gib"], abs=0.5)


@pytest.mark.parametrize("case", SIZED, ids=_ids(SIZED))
def test_non_torch_memory_matches_vllm_within_0_3_gib(case: dict[str, Any]) -> None:
    assert _predict(case).non_torch_bytes / GIB == pytest.approx(case["printed"]["non_torch_gib"], abs=0.3)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_start_is_foretold_as_vllm_did(case: dict[str, Any]) -> None:
    assert _start(case).ok is case["printed"]["started"]


def _template(sentence: str) -> str:
    """vLLM's sentence with its numbers as wildcards (kvwatch's pool differs by a few blocks)."""
    return "^" + re.sub(r"\\\(\d[\d.]*\\\)", r"\\(\\d[\\d.]*\\)", re.escape(sentence)) + "$"


@pytest.mark.parametrize("case", FAILING, ids=_ids(FAILING))
def test_failed_start_gets_vllms_own_sentence_and_what_would_start(case: dict[str, Any]) -> None:
    verdict = _start(case)
    assert verdict.error is not None
    assert re.match(_template(case["printed"]["error"]), verdict.error), verdict.error
    requested = case["inputs"]["max_model_len"]
    assert verdict.max_model_len_that_starts is not None
    assert verdict.max_model_len_that_starts < requested
    assert verdict.gpu_memory_utilization_needed is not None
    assert verdict.gpu_memory_utilization_needed > case["inputs"]["utilization"]
    # Both remedies start it.
    assert _start(case, max_model_len=verdict.max_model_len_that_starts).ok
    if verdict.gpu_memory_utilization_needed <= 1.0:
        assert _start(case, utilization=verdict.gpu_memory_utilization_needed).ok


def test_the_pool_that_held_29000_tokens_was_predicted_below_29000() -> None:
    # vllm-project/vllm#10517: V0 0.6.4 on an RTX 3090 printed 23,648 tokens for max_model_len 29000.
    case = next(c for c in CASES if c["id"] == "llama-3.1-8b-rtx3090-v064-29k-fails")
    verdict = _start(case)
    tokens = int(re.search(r"KV cache \((\d+)\)", verdict.error or "").group(1))  # type: ignore[union-attr]
    assert tokens == pytest.approx(23_648, rel=0.06)


def test_no_kv_memory_at_all_is_vllms_no_available_memory_sentence() -> None:
    # Llama-3.1-70B's 131 GiB of weights on one 24 GB card: the profile leaves nothing.
    raw, _ = raw_config("meta-llama/Llama-3.1-70B")
    for version, ending in (
        ("0.6.3", "initializing the engine."),
        ("0.10.1", "initializing the engine."),
        ("0.32.0", "more details."),
    ):
        profile = predict_memory(raw, gpu_total_bytes=int(23.58 * GIB), max_model_len=8192, vllm_version=version)
        arch = from_config(raw, name="70b", source="catalogue")
        verdict = foretell_start(profile, kv_layout(arch), 8192)
        assert profile.kv_memory_bytes < 0
        assert not verdict.ok
        assert verdict.error is not None
        assert verdict.error.startswith("No available memory for the cache blocks.")
        assert verdict.error.endswith(ending)
        assert verdict.max_model_len_that_starts is None
        assert verdict.gpu_memory_utilization_needed is not None
        assert verdict.gpu_memory_utilization_needed > 1.0
        assert explain_failed_start(verdict, profile)["cause"] == "no_kv_memory_after_weights"


# ---------------------------------------------------------------------------------------------
# Seed 000: Llama-3.1-8B-Instruct bf16 on a 24 GB card at 0.90
# ---------------------------------------------------------------------------------------------


def test_seed_000_scenario_predicts_5_gib_40960_tokens_and_4_8_requests(capsys: pytest.CaptureFixture[str]) -> None:
    # 23.58 GiB is what CUDA reports for a 24 GB RTX 3090 (the real log of vllm-project/vllm#10517).
    with pytest.raises(SystemExit) as info:
        main(
            [
                "capacity",
                "--model",
                str(STARTUPS / "configs" / "llama-3.1-8b.json"),
                "--gpu-memory-gib",
                "23.58",
                "--max-model-len",
                "32768",
                "--prompt-tokens",
                "7500",
                "--output-tokens",
                "1000",
                "--format",
                "json",
            ]
        )
    assert info.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["memory"]["kv_memory_gib"] == pytest.approx(5.0, rel=0.05)
    assert doc["pool"]["tokens"] == pytest.approx(40_960, rel=0.05)
    assert doc["max_concurrency"] == pytest.approx(4.8, rel=0.05)
    # ...and the same model on the same 24 GB card in vLLM's own log is within the KV tolerance.
    real = next(c for c in CASES if c["id"] == "llama-3.1-8b-rtx3090-v064-20k")
    assert _predict(real).kv_memory_bytes / GIB == pytest.approx(real["printed"]["kv_memory_gib"], rel=0.05)


# ---------------------------------------------------------------------------------------------
# Every model and architecture gets a pool from config.json alone
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", catalogue.CATALOGUE, ids=[e.model_id for e in catalogue.CATALOGUE])
def test_every_catalogue_model_gets_a_pool_and_its_published_parameter_count(entry: catalogue.CatalogueEntry) -> None:
    raw, _ = raw_config(entry.model_id)
    published = entry.params * entry.weight_bytes_per_param
    tp = 1
    while published / tp > 60 * GIB:
        tp *= 2
    profile = predict_memory(raw, gpu_total_bytes=int(79.19 * GIB), tp=tp, max_model_len=8192, vllm_version="0.19.0")
    assert profile.kv_memory_bytes > 0
    # The weights come from config.json; the catalogue's model-card parameter count checks them
    # (parameters, not bytes: vLLM pads MXFP4 experts beyond the checkpoint's size).
    assert estimate_weights(raw).params_total == pytest.approx(entry.params, rel=0.03)


SYNTHETIC_MQA = {  # synthetic: a multi-query model (one KV head), complete enough to size
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "multi_query": True,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
SYNTHETIC_MAMBA2_HYBRID = {  # synthetic: granite-4.0-h-shaped attention + Mamba2 layers
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "hidden_size": 1536,
    "intermediate_size": 4096,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "vocab_size": 100352,
    "layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention"],
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_n_groups": 1,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("meta-llama/Llama-2-7b-hf", "mha"),
        ("configs/llama-3.1-8b.json", "gqa"),
        ("synthetic-mqa", "mqa"),
        ("configs/deepseek-v2-lite-chat.json", "mla"),
        ("configs/gemma-2-9b-it.json", "sliding"),
        ("synthetic-mamba2-hybrid", "hybrid"),
        ("ai21labs/Jamba-v0.1", "hybrid"),
        ("configs/qwen3-30b-a3b.json", "gqa"),
        ("configs/gemma-3-12b-it.json", "sliding"),
    ],
    ids=["mha", "gqa", "mqa", "mla", "sliding", "mamba2-hybrid", "jamba-moe-hybrid", "moe", "vlm"],
)
def test_every_architecture_kvwatch_reads_gets_a_pool(source: str, kind: str) -> None:
    if source == "synthetic-mqa":
        raw: dict[str, Any] = SYNTHETIC_MQA
    elif source == "synthetic-mamba2-hybrid":
        raw = SYNTHETIC_MAMBA2_HYBRID
    elif source.startswith("configs/"):
        raw = json.loads((STARTUPS / source).read_text(encoding="utf-8"))
    else:
        raw, _ = raw_config(source)
    arch = from_config(raw, name=source, source=source)
    assert arch.attention == kind
    profile = predict_memory(raw, gpu_total_bytes=int(79.19 * GIB), tp=2, max_model_len=4096, vllm_version="0.19.0")
    assert 0 < profile.weights_bytes < profile.gpu_total_bytes
    assert profile.kv_memory_bytes > 0
    assert foretell_start(profile, kv_layout(arch, tp=2), 4096).ok


def test_mamba_layers_are_sized_as_mixers_not_attention() -> None:
    shape_weights = estimate_weights(SYNTHETIC_MAMBA2_HYBRID)
    as_attention = dict(SYNTHETIC_MAMBA2_HYBRID, layer_types=["attention"] * 8)
    assert shape_weights.bytes_per_gpu != estimate_weights(as_attention).bytes_per_gpu


@pytest.mark.parametrize("field", ["intermediate_size", "vocab_size", "hidden_size", "num_hidden_layers"])
def test_a_config_it_cannot_size_is_a_one_line_error_naming_the_field(
    field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    raw = json.loads((STARTUPS / "configs" / "llama-3.1-8b.json").read_text(encoding="utf-8"))
    del raw[field]
    with pytest.raises(UsageError, match=f"'{field}'"):
        predict_memory(raw, gpu_total_bytes=24 * GIB)
    (tmp_path / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        main(["capacity", "--model", str(tmp_path), "--gpu-memory-gib", "24"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert f"'{field}'" in err
    assert err.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# Bytes per parameter, per quantisation method (synthetic quantization_config blocks)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("qc", "expected"),
    [
        ({"quant_method": "fp8"}, 1.0),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 1 + 4 / 16384),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 0.5 + 2 / 128 + 0.5 / 128),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, 0.5 + 2 / 128 + 0.5 / 128),
        ({"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": True}, 1.0),
        ({"quant_method": "mxfp4"}, 0.5 + 1 / 32),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5 + 4 / 64),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 1.0),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {
                    "group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}
                },
                "ignore": ["lm_head"],
            },
            0.5 + 2 / 128,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
            },
            1.0,
        ),
    ],
    ids=[
        "fp8",
        "fp8-block",
        "awq-g128",
        "gptq-g128",
        "gptq-8bit",
        "mxfp4",
        "bnb-4bit",
        "bnb-8bit",
        "w4a16",
        "fp8-dynamic",
    ],
)
def test_bytes_per_parameter_of_each_quantisation(qc: dict[str, Any], expected: float) -> None:
    scheme = quant_scheme({"quantization_config": qc}, None, 2, "config.json")
    assert scheme is not None
    assert scheme.linear_bytes == pytest.approx(expected)


def test_quantisation_leaves_embeddings_and_the_unquantised_modules_in_the_model_dtype() -> None:
    raw = json.loads((STARTUPS / "configs" / "llama-3.1-8b.json").read_text(encoding="utf-8"))
    bf16 = dict(estimate_weights(raw).rows)
    fp8 = dict(estimate_weights(raw, quantization="fp8").rows)
    assert fp8["embedding"] == bf16["embedding"]
    assert fp8["lm_head"] == bf16["lm_head"]
    assert fp8["mlp"] == pytest.approx(bf16["mlp"] / 2, rel=1e-6)
    # MXFP4 (gpt-oss): only the experts are 4-bit; attention stays bf16.
    moe = json.loads((STARTUPS / "configs" / "qwen3-30b-a3b.json").read_text(encoding="utf-8"))
    mx = dict(estimate_weights(moe, quantization="mxfp4").rows)
    plain = dict(estimate_weights(moe).rows)
    assert mx["attention"] == plain["attention"]
    assert mx["experts"] == pytest.approx(plain["experts"] * (0.5 + 1 / 32) / 2, rel=1e-6)


def test_an_unknown_quantisation_method_is_one_line_naming_the_field() -> None:
    with pytest.raises(UsageError, match=r"quantization_config\.quant_method"):
        quant_scheme({"quantization_config": {"quant_method": "hqq"}}, None, 2, "config.json")


# ---------------------------------------------------------------------------------------------
# The version rows
# ---------------------------------------------------------------------------------------------


def test_cuda_graph_memory_is_subtracted_from_0_21_and_not_with_enforce_eager() -> None:
    case = SIZED[0]
    before = _predict(case)
    after = predict_memory(_config(case), gpu_total_bytes=int(79.19 * GIB), vllm_version="0.21.0", max_model_len=8192)
    eager = predict_memory(
        _config(case), gpu_total_bytes=int(79.19 * GIB), vllm_version="0.21.0", max_model_len=8192, enforce_eager=True
    )
    assert not before.cuda_graph_subtracted
    assert after.cuda_graph_subtracted
    assert after.cuda_graph_bytes == CUDA_GRAPH_ESTIMATE
    assert eager.cuda_graph_bytes == 0
    assert eager.kv_memory_bytes - after.kv_memory_bytes == CUDA_GRAPH_ESTIMATE


@pytest.mark.parametrize(
    ("version", "gpu_gib", "max_model_len", "expected"),
    [
        ("0.8.5", 79.19, 8192, (8192, 1024)),
        ("0.19.0", 23.58, 8192, (2048, 256)),
        ("0.6.3", 79.19, 8192, (8192, 256)),  # no chunked prefill: max(max_model_len, 2048)
        ("0.6.3", 79.19, 131072, (512, 256)),  # chunked prefill above 32K, 0.6's 512
        ("0.8.0", 79.19, 131072, (8192, 1024)),
        ("0.7.0", 79.19, 131072, (2048, 256)),
    ],
)
def test_scheduler_defaults_per_version_and_gpu(
    version: str, gpu_gib: float, max_model_len: int, expected: tuple[int, int]
) -> None:
    from kvwatch.reconcile.memory_profile import parse_version

    got = scheduler_defaults(
        parse_version(version), int(gpu_gib * GIB), max_model_len, multimodal=False, sliding_window=False
    )
    assert got == expected


def test_tensor_parallel_adds_nccl_buffers_on_nvlink_class_gpus_only() -> None:
    case = SIZED[0]
    h100_tp2 = _predict(case, tp=2)
    rtx_tp2 = _predict(case, tp=2, gpu_total_gib=23.58)
    assert h100_tp2.non_torch_bytes > _predict(case).non_torch_bytes
    assert rtx_tp2.non_torch_bytes == _predict(case).non_torch_bytes


def test_the_sampler_grows_with_max_num_seqs_and_the_vocabulary() -> None:
    case = SIZED[0]
    assert _predict(case, max_num_seqs=2048).activation_bytes > _predict(case, max_num_seqs=256).activation_bytes


def test_the_v1_sampler_holds_what_each_release_keeps_alive() -> None:
    """0.11: bf16 + float32 logits + torch.sort values/indices, softmax, masks, scatter (28 B for
    bf16); 0.17+: bf16 + float32 logits, probs, exponentials (14 B) + the Triton per-SM buffer."""
    shape = model_shape(_config(next(c for c in CASES if c["id"] == "gemma-2-2b-it-h100")))
    vocab = 256000
    assert sampler_peak_bytes(shape, 1024, 2, "v1", (0, 11, 0)) == 1024 * vocab * 28
    assert sampler_peak_bytes(shape, 1024, 2, "v1", (0, 19, 0)) == 1024 * vocab * 14 + 132 * vocab * 4
    assert sampler_peak_bytes(shape, 256, 2, "v0", (0, 6, 4)) == 256 * vocab * 2


def test_the_fused_moe_workspace_outlives_the_forward_from_0_15_only() -> None:
    case = next(c for c in CASES if c["id"] == "qwen3-30b-a3b-moe-h100")
    shape = model_shape(_config(case))
    # TritonExperts.workspace_shapes: max(M*topk*max(I, H), M*H) + M*topk*max(2I, H), bf16
    assert moe_workspace_bytes(shape, 8192, 1, 2) == (8192 * 8 * 2048 + 8192 * 8 * 2048) * 2
    new = _predict(case)
    assert any("fused-MoE workspace" in r.source for r in new.rows if r.name == "activation.sampler")
    old = predict_memory(_config(case), gpu_total_bytes=int(79.19 * GIB), utilization=0.95, vllm_version="0.11.0")
    assert not any("fused-MoE workspace" in r.source for r in old.rows)


def test_gpt_oss_120b_on_one_h100_at_1024_tokens_does_not_start_as_vllm_0_11_refused() -> None:
    """vllm#27508: --gpu-memory-utilization 0.95 --max-num-batched-tokens 1024 printed 1.71 GiB
    and refused 131072 tokens; the sampler (1,024 rows x 201,088 logits through torch.sort) is most
    of the activation. kvwatch's pool is ~2 GiB larger (torch.sort's scratch), the verdict the same."""
    raw = _config({"config": "configs/gpt-oss-120b.json"})
    profile = predict_memory(
        raw,
        gpu_total_bytes=int(79.19 * GIB),
        utilization=0.95,
        max_model_len=131072,
        max_num_batched_tokens=1024,
        vllm_version="0.11.0",
    )
    assert profile.activation_bytes > 5 * GIB
    arch = from_config(raw, name="openai/gpt-oss-120b", source="gpt-oss-120b.json")
    layout = kv_layout(arch, tp=1, pp=1, legacy=legacy_allocator("0.11.0"))
    assert not foretell_start(profile, layout, 131072, model_max_len=arch.max_position_embeddings).ok


# ---------------------------------------------------------------------------------------------
# kvwatch capacity: the memory and start blocks, the budget table
# ---------------------------------------------------------------------------------------------


def test_capacity_json_has_the_contract_memory_and_start_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                "capacity",
                "--model",
                "llama-3.1-8b",
                "--gpu-memory-gib",
                "79.19",
                "--vllm-version",
                "0.10.1",
                "--max-num-seqs",
                "512",
                "--enforce-eager",
                "--format",
                "json",
            ]
        )
    doc = json.loads(capsys.readouterr().out)
    memory, start = doc["memory"], doc["start"]
    for key in ("gpu_total_gib", "utilization", "weights_gib", "activation_gib", "non_torch_gib", "cuda_graph_gib"):
        assert isinstance(memory[key], float)
    assert memory["source"] == "predicted"
    assert memory["vllm_version"] == "0.10.1"
    assert memory["cuda_graph_gib"] == 0.0
    assert memory["max_num_seqs"] == 512
    assert set(start) == {"ok", "error", "max_model_len_that_starts", "gpu_memory_utilization_needed"}
    assert start["ok"] is True
    assert doc["pool"]["bytes"] == pytest.approx(memory["kv_memory_gib"] * GIB, rel=0.001)


def test_capacity_text_shows_the_budget_and_the_failed_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["capacity", "--model", "llama-3.1-8b", "--gpu-memory-gib", "23.58"])
    out = capsys.readouterr().out
    assert re.search(r"23\.58 GiB x 0\.90 - 14\.99 weights - [\d.]+ activation - [\d.]+ non-torch", out)
    # Llama-3.1-8B's default max_model_len (131,072) does not fit a 24 GB card.
    assert "FAILS: To serve at least one request with the model's max seq len (131072)" in out
    assert "what starts: --max-model-len" in out


def test_flat_overhead_path_is_unchanged_when_given() -> None:
    # --overhead-gib keeps the issue-3 napkin math (reference numbers elsewhere rely on it).
    from kvwatch.reconcile.capacity import Deployment, estimate
    from kvwatch.reconcile.catalogue import lookup

    dep = Deployment(
        gpu_memory_bytes=24 * GIB, weights_bytes=15 * GIB, overhead_bytes=2 * GIB, request=RequestShape(7_500, 1_000)
    )
    est = estimate(lookup("llama-3.1-8b"), dep)
    assert est.pool_bytes == int(24 * GIB * 0.9) - 17 * GIB


def test_analyze_can_explain_a_logged_refusal_from_the_kv_memory_vllm_printed() -> None:
    from kvwatch.batch import analyze_paths
    from kvwatch.reconcile.startup import foretell_from_log

    # tests/fixtures/real/logs/011: the 29000-token start of vllm-project/vllm#10517 (V0 0.6.4).
    doc = analyze_paths([str(STARTUPS.parent / "real" / "logs" / "011-v064-two-runs-no-prefix-missing-hash.log")])
    arch = from_config(_config(CASES[0]), name="llama-3.1-8b", source="fixture")
    verdict = foretell_from_log(doc, arch)
    assert verdict is not None
    assert not verdict.ok
    assert verdict.error is not None
    logged = doc["errors"][0]["message"]  # vLLM's sentence as the reader kept it
    head = "The model's max seq len (29000) is larger than the maximum number of tokens that can be stored in KV cache"
    assert logged.startswith(head)
    assert verdict.error.startswith(head)
    # vLLM's 23,648 tokens, within the one block the printed 2.89 GiB cannot pin down
    tokens = int(verdict.error[len(head) :].split("(")[1].split(")")[0])
    assert tokens == pytest.approx(23_648, abs=16)
    assert verdict.max_model_len_that_starts == pytest.approx(23_648, abs=32)
    assert verdict.gpu_memory_utilization_needed is None  # the log keeps no GPU total


def test_from_log_reports_the_measured_memory_and_no_pool_flags_leave_it_null(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = STARTUPS.parent / "real" / "logs" / "011-v064-two-runs-no-prefix-missing-hash.log"
    with pytest.raises(SystemExit):
        main(["capacity", "--model", "llama-3.1-8b", "--from-log", str(log), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["memory"]["source"] == "measured"
    assert doc["memory"]["weights_gib"] == 14.9888
    assert doc["memory"]["kv_memory_gib"] == 2.89
    assert doc["start"] is None
    with pytest.raises(SystemExit):
        main(["capacity", "--model", "llama-3.1-8b", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["memory"] is None
    assert doc["start"] is None


def test_the_quantization_flag_wins_over_the_config_unless_it_is_a_kernel_of_the_same_method() -> None:
    awq = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True}}
    same = quant_scheme(awq, "awq_marlin", 2, "config.json")
    other = quant_scheme(awq, "fp8", 2, "config.json")
    assert same is not None
    assert other is not None
    assert same.linear_bytes == pytest.approx(0.5 + 2 / 64 + 0.5 / 64)  # the checkpoint's group size kept
    assert other.method == "fp8"
