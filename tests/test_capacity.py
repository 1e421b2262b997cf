"""The capacity model: reference numbers per architecture (docs/vllm-formats.md, "KV-cache sizing")."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.errors import UsageError
from kvwatch.reconcile.architecture import Architecture, resolve_model
from kvwatch.reconcile.capacity import (
    GIB,
    Deployment,
    RequestShape,
    blocks_range_from_gib,
    estimate,
    expected_capacity,
    kv_bytes_per_token,
    kv_layout,
    levers,
    levers_for_analysis,
    pp_partition,
)

ROOT = Path(__file__).resolve().parent
LLAMA31_8B = "meta-llama/Llama-3.1-8B"


def _seventy_b_class() -> Architecture:
    """80 layers, 8 KV heads, head_dim 128, fp16 (the issue's "70B-class model")."""
    return Architecture(
        name="70b-class",
        architecture_class="LlamaForCausalLM",
        layer_kinds=("full",) * 80,
        num_attention_heads=64,
        kv_heads=8,
        head_dim=128,
        dtype="float16",
    )


# --- bytes per token, per architecture ----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "kv_cache_dtype", "expected"),
    [
        (LLAMA31_8B, "auto", 131_072),
        (LLAMA31_8B, "fp8", 65_536),
        (LLAMA31_8B, "fp8_e4m3", 65_536),
        (LLAMA31_8B, "fp8_e5m2", 65_536),
        ("meta-llama/Llama-2-7b-hf", "auto", 524_288),
    ],
    ids=["llama31_8b_bf16", "llama31_8b_fp8", "fp8_e4m3_is_one_byte", "fp8_e5m2_is_one_byte", "llama2_7b_no_gqa"],
)
def test_kv_bytes_per_token_reference_numbers(model: str, kv_cache_dtype: str, expected: int) -> None:
    assert kv_bytes_per_token(resolve_model(model), kv_cache_dtype=kv_cache_dtype) == expected


def test_seventy_b_class_fp16_is_327680_bytes_per_token() -> None:
    assert kv_bytes_per_token(_seventy_b_class()) == 327_680


def test_one_32k_request_of_llama31_8b_holds_4_gib() -> None:
    est = expected_capacity(resolve_model(LLAMA31_8B), request=RequestShape(32_768, 0))
    assert est.request_bytes == 4 * GIB


# --- the 5 GiB pool ---------------------------------------------------------------------------------


def test_five_gib_pool_is_40960_tokens_in_2560_blocks_of_16() -> None:
    est = expected_capacity(resolve_model(LLAMA31_8B), pool_bytes=5 * GIB)
    assert (est.pool_tokens, est.pool_blocks, est.layout.block_size) == (40_960, 2_560, 16)


def test_five_gib_fits_4_8_requests_of_7500_plus_1000() -> None:
    est = expected_capacity(resolve_model(LLAMA31_8B), pool_bytes=5 * GIB, request=RequestShape(7_500, 1_000))
    assert est.max_concurrency is not None
    assert round(est.max_concurrency, 1) == 4.8
    assert est.max_concurrency == pytest.approx(40_960 / 8_500)


def test_fp8_doubles_the_five_gib_pool_to_81920_tokens() -> None:
    est = expected_capacity(resolve_model(LLAMA31_8B), pool_bytes=5 * GIB, kv_cache_dtype="fp8")
    assert (est.kv_bytes_per_token, est.pool_tokens) == (65_536, 81_920)


def test_fp8_with_a_1500_token_shared_prefix_fits_11_5() -> None:
    est = expected_capacity(
        resolve_model(LLAMA31_8B), pool_bytes=5 * GIB, kv_cache_dtype="fp8", request=RequestShape(7_500, 1_000, 1_500)
    )
    assert est.max_concurrency is not None
    assert round(est.max_concurrency, 1) == 11.5
    assert est.max_concurrency == pytest.approx((81_920 - 1_500) / (7_500 + 1_000 - 1_500))
    assert est.request_tokens == 7_000


def test_shared_prefix_counts_nothing_without_prefix_caching() -> None:
    est = estimate(
        resolve_model(LLAMA31_8B),
        Deployment(
            pool_bytes=5 * GIB, kv_cache_dtype="fp8", request=RequestShape(7_500, 1_000, 1_500), prefix_caching=False
        ),
    )
    assert est.max_concurrency == pytest.approx(81_920 / 8_500)


# --- docs/vllm-formats.md §7 worked example ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kv_cache_dtype", "tp", "blocks", "tokens"),
    [("auto", 1, 30_720, 491_520), ("fp8", 1, 61_440, 983_040), ("auto", 2, 61_440, 983_040)],
    ids=["bf16", "fp8", "tp2_per_gpu"],
)
def test_worked_example_sixty_gib(kv_cache_dtype: str, tp: int, blocks: int, tokens: int) -> None:
    est = expected_capacity(
        resolve_model(LLAMA31_8B), pool_bytes=60 * GIB, kv_cache_dtype=kv_cache_dtype, tp=tp, max_model_len=131_072
    )
    assert (est.pool_blocks, est.pool_tokens) == (blocks, tokens)


def test_worked_example_concurrency_at_max_model_len_is_3_75() -> None:
    est = expected_capacity(resolve_model(LLAMA31_8B), pool_bytes=60 * GIB, max_model_len=131_072)
    assert est.max_concurrency_at_max_model_len == 3.75


# --- the real vLLM CPU runs (numbers vLLM printed) -----------------------------------------------


def test_tiny_llama_one_gib_is_32768_blocks_of_32_as_vllm_computed() -> None:
    arch = resolve_model(str(ROOT / "fixtures" / "vllm-cpu" / "tiny-llama"))
    est = expected_capacity(arch, pool_bytes=1 * GIB, block_size=32, max_model_len=512)
    assert est.kv_bytes_per_token == 1_024
    assert est.pool_blocks == 32_768  # "Overriding num_gpu_blocks=32768 ..."


def test_tiny_llama_override_to_32_blocks_is_1024_tokens_and_2x_at_512() -> None:
    arch = resolve_model(str(ROOT / "fixtures" / "vllm-cpu" / "tiny-llama"))
    est = expected_capacity(arch, pool_blocks=32, block_size=32, max_model_len=512)
    assert est.pool_tokens == 1_024
    assert est.max_concurrency_at_max_model_len is not None
    assert round(est.max_concurrency_at_max_model_len, 2) == 2.00


def test_seedllama_1280_blocks_is_40960_tokens_and_4_44_at_9216() -> None:
    arch = resolve_model(str(ROOT / "fixtures" / "vllm-cpu-seed" / "seedllama"))
    est = expected_capacity(arch, pool_blocks=1_280, block_size=32, max_model_len=9_216)
    assert est.pool_tokens == 40_960
    assert est.max_concurrency_at_max_model_len is not None
    assert round(est.max_concurrency_at_max_model_len, 2) == 4.44


# --- architectures ------------------------------------------------------------------------------


def test_mla_is_one_latent_per_layer_with_no_factor_two_and_no_tp_split() -> None:
    arch = resolve_model("deepseek-ai/DeepSeek-V3")
    assert kv_bytes_per_token(arch) == 61 * 576 * 2
    assert kv_bytes_per_token(arch, tp=8) == 61 * 576 * 2
    assert kv_bytes_per_token(arch, kv_cache_dtype="fp8") == 61 * 576


@pytest.mark.parametrize(
    ("tp", "expected"),
    [(1, 2 * 8 * 128 * 2 * 80), (2, 2 * 4 * 128 * 2 * 80), (8, 2 * 1 * 128 * 2 * 80), (16, 2 * 1 * 128 * 2 * 80)],
    ids=["tp1", "tp2_halves", "tp8_one_head_each", "tp16_replicates_heads"],
)
def test_tp_splits_kv_heads_until_one_per_gpu(tp: int, expected: int) -> None:
    assert kv_bytes_per_token(resolve_model("meta-llama/Llama-3.1-70B"), tp=tp) == expected


def test_pp_splits_layers_as_vllm_get_pp_indices() -> None:
    assert pp_partition(126, 4) == [(0, 31), (31, 63), (63, 95), (95, 126)]
    # the stage with the most layers limits the pool
    assert kv_bytes_per_token(resolve_model("meta-llama/Llama-3.1-405B"), pp=4) == 32 * 4096


def test_pp_larger_than_layers_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--pp 17"):
        kv_bytes_per_token(resolve_model("meta-llama/Llama-3.2-1B"), pp=17)


def test_unknown_kv_cache_dtype_is_a_usage_error_listing_choices() -> None:
    with pytest.raises(UsageError, match="fp8_e4m3"):
        kv_bytes_per_token(resolve_model(LLAMA31_8B), kv_cache_dtype="fp4")


def test_sliding_window_groups_follow_vllm_and_bound_per_request_blocks() -> None:
    arch = resolve_model("google/gemma-3-27b-it")
    layout = kv_layout(arch)
    # 10 full + 52 sliding -> groups of 10 layers: 1 full group, 6 sliding groups (8 padded layers)
    assert layout.group_size == 10
    assert layout.groups.count("full") == 1
    assert layout.groups.count("sliding") == 6
    est = expected_capacity(arch, pool_blocks=10_000, max_model_len=131_072, max_num_batched_tokens=8_192)
    # full: cdiv(131072, 16) = 8192; sliding: 6 x (cdiv(min(1023 + 8192, 131072), 16) + 1) = 6 x 577
    assert est.max_concurrency_at_max_model_len == pytest.approx(10_000 / (8_192 + 6 * 577))


def test_sliding_layers_cost_only_their_window_in_a_long_request() -> None:
    arch = resolve_model("openai/gpt-oss-20b")
    est = expected_capacity(arch, request=RequestShape(100_000, 0), max_num_batched_tokens=2_048)
    per_layer = 2 * 8 * 64 * 2
    assert est.request_bytes == 12 * per_layer * 100_000 + 12 * per_layer * (128 + 2_048)


def test_gpt_oss_equal_layer_counts_form_two_groups_of_twelve() -> None:
    layout = kv_layout(resolve_model("openai/gpt-oss-20b"))
    assert (layout.group_size, layout.groups) == (12, ("full", "sliding"))


def test_hybrid_mamba_holds_per_token_kv_only_in_attention_layers() -> None:
    arch = resolve_model("ai21labs/Jamba-v0.1")
    layout = kv_layout(arch)
    assert layout.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2
    # Mamba1 state: d_inner 8192 x (d_conv - 1 + d_state) = 8192 x 19 elements x 2 bytes
    assert layout.mamba_state_bytes == 8192 * 19 * 2
    # attention block raised so a page holds a Mamba state: 16 x cdiv(311296, 16 x 4096) = 80
    assert layout.block_size == 80
    est = expected_capacity(arch, request=RequestShape(1_000, 0))
    assert est.request_bytes == 4 * 4096 * 1_000 + 28 * 8192 * 19 * 2


def test_mamba2_state_from_layer_types_config() -> None:
    arch = resolve_model(str(ROOT / "fixtures" / "synthetic-configs" / "hybrid-mamba2-layer-types"))
    layout = kv_layout(arch)
    conv = (48 * 64 + 2 * 1 * 128) * 3
    ssm = 48 * 64 * 128
    assert layout.mamba_state_bytes == (conv + ssm) * 2
    assert layout.kv_bytes_per_token == 2 * 2 * 4 * 128 * 2


def test_multimodal_text_config_sizes_like_its_text_model() -> None:
    arch = resolve_model(str(ROOT / "fixtures" / "synthetic-configs" / "multimodal-text-config"))
    assert kv_bytes_per_token(arch) == 40 * 2 * 8 * 128 * 2


def test_gpu_memory_pool_subtracts_weights_and_overhead() -> None:
    arch = resolve_model(LLAMA31_8B)
    dep = Deployment(
        gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.9, weights_bytes=15 * GIB, overhead_bytes=3 * GIB
    )
    est = estimate(arch, dep)
    assert est.pool_bytes == int(80 * GIB * 0.9) - 18 * GIB
    assert est.pool_blocks == est.pool_bytes // (65_536 * 32)


def test_gpu_memory_smaller_than_weights_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no memory left for the KV cache"):
        estimate(resolve_model("meta-llama/Llama-3.1-70B"), Deployment(gpu_memory_bytes=24 * GIB))


def test_printed_gib_pins_blocks_to_a_range() -> None:
    layout = kv_layout(resolve_model(LLAMA31_8B))
    low, high = blocks_range_from_gib(layout, 3.81)
    assert (low, high) == (1948, 1953)


def test_v0_concurrency_formula_for_old_versions() -> None:
    arch = resolve_model(LLAMA31_8B)
    old = expected_capacity(arch, pool_blocks=1478, max_model_len=29_000, vllm_version="0.6.4")
    new = expected_capacity(arch, pool_blocks=1478, max_model_len=29_000)
    assert old.max_concurrency_at_max_model_len == pytest.approx(1478 * 16 / 29_000)
    assert new.max_concurrency_at_max_model_len == pytest.approx(1478 / 1813)


# --- levers -------------------------------------------------------------------------------------


def _rows(dep: Deployment, model: str = LLAMA31_8B) -> dict[str, dict[str, object]]:
    return {r.lever: r.as_dict() for r in levers(resolve_model(model), dep)}


def test_every_lever_has_a_row_in_order() -> None:
    rows = levers(resolve_model(LLAMA31_8B), Deployment(pool_bytes=5 * GIB, request=RequestShape(7_500, 1_000)))
    assert [r.lever for r in rows] == [
        "fp8_kv_cache",
        "int4_weights",
        "fp8_weights",
        "prefix_caching",
        "gpu_memory_utilization_plus_0_05",
        "tensor_parallel_x2",
        "fewer_prompt_tokens",
        "max_model_len_half",
    ]


def test_fp8_lever_doubles_pool_tokens_and_halves_bytes() -> None:
    rows = _rows(Deployment(pool_bytes=5 * GIB, request=RequestShape(7_500, 1_000)))
    assert rows["fp8_kv_cache"]["kv_bytes_per_token"] == 65_536
    assert rows["fp8_kv_cache"]["pool_tokens"] == 81_920
    assert rows["fp8_kv_cache"]["multiplier"] == pytest.approx(2.0)


def test_prefix_caching_lever_moves_the_concurrency_when_off() -> None:
    rows = _rows(
        Deployment(
            pool_bytes=5 * GIB, kv_cache_dtype="fp8", prefix_caching=False, request=RequestShape(7_500, 1_000, 1_500)
        )
    )
    assert rows["prefix_caching"]["max_concurrency"] == pytest.approx(11.4886, abs=1e-4)


def test_utilization_lever_adds_five_percent_of_the_gpu() -> None:
    dep = Deployment(
        gpu_memory_bytes=80 * GIB, weights_bytes=15 * GIB, overhead_bytes=3 * GIB, request=RequestShape(7_500, 1_000)
    )
    base = estimate(resolve_model(LLAMA31_8B), dep)
    rows = _rows(dep)
    extra_blocks = int(80 * GIB * 0.05) // (65_536 * 32)
    assert base.pool_blocks is not None
    pool_tokens = rows["gpu_memory_utilization_plus_0_05"]["pool_tokens"]
    assert isinstance(pool_tokens, int)
    assert abs(pool_tokens - (base.pool_blocks + extra_blocks) * 16) <= 16


def test_weight_levers_free_memory_into_the_pool() -> None:
    dep = Deployment(gpu_memory_bytes=24 * GIB, weights_bytes=15 * GIB, overhead_bytes=2 * GIB)
    rows = _rows(dep)
    base = estimate(resolve_model(LLAMA31_8B), dep)
    assert base.pool_tokens is not None
    int4, fp8 = rows["int4_weights"]["pool_tokens"], rows["fp8_weights"]["pool_tokens"]
    assert isinstance(int4, int)
    assert isinstance(fp8, int)
    assert int4 > fp8 > base.pool_tokens


def test_tensor_parallel_lever_halves_bytes_per_token_per_gpu() -> None:
    rows = _rows(Deployment(pool_bytes=60 * GIB, weights_bytes=0))
    assert rows["tensor_parallel_x2"]["kv_bytes_per_token"] == 65_536
    assert rows["tensor_parallel_x2"]["pool_tokens"] == 983_040


def test_fewer_prompt_tokens_lever_cuts_the_prompt_by_a_quarter() -> None:
    rows = _rows(Deployment(pool_bytes=5 * GIB, request=RequestShape(8_000, 1_000)))
    assert rows["fewer_prompt_tokens"]["max_concurrency"] == pytest.approx(40_960 / 7_000, abs=1e-4)


def test_halving_max_model_len_does_not_change_the_pool() -> None:
    rows = _rows(Deployment(pool_bytes=5 * GIB, max_model_len=32_768, request=RequestShape(7_500, 1_000)))
    row = rows["max_model_len_half"]
    assert row["pool_tokens"] == 40_960
    assert row["multiplier"] == 1.0
    assert "no change to the pool" in str(row["note"])


def test_levers_need_a_pool() -> None:
    rows = _rows(Deployment())
    assert all(r["pool_tokens"] is None and "needs a pool" in str(r["note"]) for r in rows.values())


def test_levers_for_analysis_use_the_logs_pool_and_config() -> None:
    doc = {
        "capacity": {
            "gpu_blocks": 1478,
            "block_size": None,
            "kv_cache_tokens": None,
            "kv_cache_memory_gib": 2.89,
            "weights_gib": 14.9888,
            "max_concurrency": {"tokens_per_request": 29000, "ratio": 0.82},
        },
        "config": {
            "kv_cache_dtype": None,
            "max_seq_len": 29000,
            "tensor_parallel_size": None,
            "enable_prefix_caching": None,
            "vllm_version": None,
        },
    }
    rows = {r["lever"]: r for r in levers_for_analysis(doc, resolve_model(LLAMA31_8B))}
    assert rows["fp8_kv_cache"]["pool_tokens"] == 2 * 1478 * 16
    assert rows["fp8_kv_cache"]["basis"] == "max_model_len"
    assert rows["max_model_len_half"]["pool_tokens"] == 1478 * 16


def test_levers_for_analysis_without_a_model_use_observed_bytes_per_token() -> None:
    doc = {"capacity": {"kv_cache_memory_gib": 5.0, "kv_cache_tokens": 40_960}, "config": {}}
    rows = {r["lever"]: r for r in levers_for_analysis(doc, None)}
    assert rows["fp8_kv_cache"]["kv_bytes_per_token"] == 65_536
    assert rows["tensor_parallel_x2"]["pool_tokens"] is None


def test_levers_for_analysis_with_nothing_known_is_empty() -> None:
    assert levers_for_analysis({"capacity": {}, "config": {}}, None) == []


# --- analyze's diagnosis levers ----------------------------------------------------------------


def test_analyze_diagnosis_gains_levers_with_a_model() -> None:
    from kvwatch.batch import analyze_paths

    log = next((ROOT / "fixtures" / "real" / "logs").glob("011-*.log"))
    doc = analyze_paths([str(log)], model="meta-llama/Llama-3.1-8B-Instruct")
    rows = {r["lever"]: r for r in doc["diagnosis"]["levers"]}
    assert rows["fp8_kv_cache"]["pool_tokens"] == 2 * 1478 * 16
    assert rows["tensor_parallel_x2"]["kv_bytes_per_token"] == 65_536


def test_analyze_takes_the_model_from_the_log_when_known() -> None:
    from kvwatch.batch import analyze_paths
    from kvwatch.reconcile.analysis import levers_hook

    log = next((ROOT / "fixtures" / "real" / "logs").glob("025-*.log"))
    doc = analyze_paths([str(log)])
    # Two starts and no stats: no KV-pool cause, so the diagnosis carries no levers (the cause
    # table); the model the log names still sizes them through the capacity model's hook.
    assert doc["diagnosis"]["levers"] == []
    rows = {r["lever"]: r for r in levers_hook(doc, None)}
    assert rows["tensor_parallel_x2"]["kv_bytes_per_token"] == 32_768  # Meta-Llama-3-8B at TP 4


def test_a_served_name_that_looks_like_a_catalogue_model_is_not_trusted() -> None:
    from kvwatch.batch import analyze_paths

    doc = analyze_paths([str(ROOT / "fixtures" / "vllm-cpu-seed" / "server.log")])
    assert doc["config"]["served_model_name"] == "llama-3.1-8b-sim"
    rows = {r["lever"]: r for r in doc["diagnosis"]["levers"]}
    assert rows["tensor_parallel_x2"]["pool_tokens"] is None  # no model: observed bytes/token only
    assert rows["fp8_kv_cache"]["multiplier"] == pytest.approx(2.0)


def test_a_model_name_the_log_contradicts_is_not_trusted() -> None:
    from kvwatch.reconcile.capacity import model_from_log

    doc = {
        "config": {"model": "meta-llama/Llama-3.1-8B"},
        "capacity": {"kv_cache_memory_gib": 1.0, "kv_cache_tokens": 40_960},
    }
    assert model_from_log(doc) is None
    doc["capacity"] = {"kv_cache_memory_gib": 5.0, "kv_cache_tokens": 40_960}
    arch = model_from_log(doc)
    assert arch is not None
    assert arch.name == "meta-llama/Llama-3.1-8B"


def test_a_model_the_log_names_that_kvwatch_does_not_know_costs_no_search_for_close_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The closest catalogue names serve --model's error message alone: for the log's own model
    # name they were searched (difflib over every name, ~10 ms of each analyze) and thrown away.
    from kvwatch.reconcile import model_catalogue
    from kvwatch.reconcile.capacity import model_from_log

    def no_search(*_args: object, **_kw: object) -> list[str]:
        raise AssertionError("closest() searched for a message no one reads")

    monkeypatch.setattr(model_catalogue, "closest", no_search)
    doc = {"config": {"model": "/mnt/tenant-home/Model/Some/Unknown-Model-7B"}}
    assert model_from_log(doc) is None
    assert model_from_log({"config": {"model": "meta-llama/Llama-3.1-8B"}}) is not None  # a known one still is


def test_analyze_with_an_unknown_model_flag_is_a_usage_error() -> None:
    from kvwatch.batch import analyze_paths

    with pytest.raises(UsageError, match="closest catalogue names"):
        analyze_paths([str(ROOT / "fixtures" / "vllm-cpu" / "server.log")], model="llama-3.1-7b")


@pytest.mark.parametrize(
    ("quantization", "int4_changes", "fp8_changes"),
    [(None, True, True), ("awq", False, False), ("gptq_marlin", False, False), ("fp8", True, False)],
    ids=["bf16_weights_shrink", "awq_already_int4", "gptq_already_int4", "fp8_weights_still_shrink"],
)
def test_weight_levers_respect_existing_quantization(
    quantization: str | None, int4_changes: bool, fp8_changes: bool
) -> None:
    dep = Deployment(pool_bytes=5 * GIB, weights_bytes=5 * GIB, quantization=quantization)
    rows = {r.lever: r for r in levers(resolve_model(LLAMA31_8B), dep)}
    assert (rows["int4_weights"].pool_tokens != 40_960) is int4_changes
    assert (rows["fp8_weights"].pool_tokens != 40_960) is fp8_changes


def test_hybrid_pool_in_tokens_round_trips_to_blocks() -> None:
    arch = resolve_model("google/gemma-3-27b-it")
    from_blocks = expected_capacity(arch, pool_blocks=12_345, max_model_len=131_072)
    assert from_blocks.pool_tokens is not None
    from_tokens = expected_capacity(arch, pool_tokens=from_blocks.pool_tokens, max_model_len=131_072)
    assert from_tokens.pool_blocks is not None
    assert abs(from_tokens.pool_blocks - 12_345) <= 1


@pytest.mark.parametrize(
    ("config", "rows_expected"),
    [
        ({"max_seq_len": 0}, 8),
        ({"max_seq_len": -5, "block_size": 0}, 8),
        ({"pipeline_parallel_size": 999}, 0),
        ({"tensor_parallel_size": "two", "kv_cache_dtype": "fp4"}, 8),
    ],
    ids=["zero_max_len_ignored", "negative_sizes_ignored", "pp_beyond_layers_gives_no_rows", "garbage_ignored"],
)
def test_levers_for_analysis_survive_odd_log_values(config: dict[str, object], rows_expected: int) -> None:
    doc = {"capacity": {"gpu_blocks": 100, "kv_cache_memory_gib": 0.2}, "config": config}
    rows = levers_for_analysis(doc, resolve_model(LLAMA31_8B))
    assert len(rows) == rows_expected
    if rows:
        assert rows[0]["pool_tokens"] == 2 * 100 * 16  # fp8 on the log's 100 blocks of 16
