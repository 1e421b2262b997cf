"""`kvwatch capacity`: the kvwatch.capacity/1 document, the text table, flags and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.cli import main

FIX = Path(__file__).resolve().parent / "fixtures"
LEVERS = [
    "fp8_kv_cache",
    "int4_weights",
    "fp8_weights",
    "prefix_caching",
    "gpu_memory_utilization_plus_0_05",
    "tensor_parallel_x2",
    "fewer_prompt_tokens",
    "max_model_len_half",
]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    code, out, err = _run(["capacity", *args, "--format", "json"], capsys)
    assert code == 0, err
    doc: dict[str, object] = json.loads(out)
    return doc


def test_capacity_json_has_the_schema_of_issue_3(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(
        [
            "--model",
            "meta-llama/Llama-3.1-8B",
            "--kv-cache-gib",
            "5",
            "--prompt-tokens",
            "7500",
            "--output-tokens",
            "1000",
        ],
        capsys,
    )
    assert doc["schema"] == "kvwatch.capacity/1"
    model = doc["model"]
    assert isinstance(model, dict)
    assert {
        k: model[k] for k in ("name", "layers", "attention_layers", "kv_heads", "head_dim", "attention", "dtype")
    } == {
        "name": "meta-llama/Llama-3.1-8B",
        "layers": 32,
        "attention_layers": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "attention": "gqa",
        "dtype": "bfloat16",
    }
    assert doc["kv_bytes_per_token"] == 131_072
    pool = doc["pool"]
    assert isinstance(pool, dict)
    assert {k: pool[k] for k in ("bytes", "tokens", "blocks", "block_size")} == {
        "bytes": 5 * 2**30,
        "tokens": 40_960,
        "blocks": 2_560,
        "block_size": 16,
    }
    request = doc["request"]
    assert isinstance(request, dict)
    assert {k: request[k] for k in ("prompt_tokens", "output_tokens", "shared_prefix_tokens", "tokens")} == {
        "prompt_tokens": 7500,
        "output_tokens": 1000,
        "shared_prefix_tokens": 0,
        "tokens": 8500,
    }
    assert round(float(doc["max_concurrency"]), 1) == 4.8  # type: ignore[arg-type]
    assert doc["max_concurrency_at_max_model_len"] == pytest.approx(2560 / 8192, abs=1e-4)
    levers = doc["levers"]
    assert isinstance(levers, list)
    assert [row["lever"] for row in levers] == LEVERS
    assert set(levers[0]) >= {"lever", "kv_bytes_per_token", "pool_tokens", "max_concurrency", "multiplier"}


def test_capacity_fp8_with_shared_prefix_is_11_5(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(
        [
            "--model",
            "llama-3.1-8b",
            "--kv-cache-gib",
            "5",
            "--kv-cache-dtype",
            "fp8",
            "--prompt-tokens",
            "7500",
            "--output-tokens",
            "1000",
            "--shared-prefix-tokens",
            "1500",
        ],
        capsys,
    )
    assert (doc["kv_bytes_per_token"], doc["pool"]["tokens"]) == (65_536, 81_920)  # type: ignore[index]
    assert round(float(doc["max_concurrency"]), 1) == 11.5  # type: ignore[arg-type]
    assert doc["request"]["tokens"] == 7_000  # type: ignore[index]


def test_no_request_size_means_null_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(["--model", "llama-3.1-8b", "--kv-cache-tokens", "491520", "--max-model-len", "131072"], capsys)
    assert doc["max_concurrency"] is None
    assert doc["max_concurrency_at_max_model_len"] == 3.75
    assert doc["pool"]["blocks"] == 30_720  # type: ignore[index]


def test_one_32k_request_is_4_gib(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(["--model", "llama-3.1-8b", "--prompt-tokens", "32768", "--output-tokens", "0"], capsys)
    assert doc["request"]["bytes"] == 4 * 2**30  # type: ignore[index]
    assert doc["pool"]["blocks"] is None  # type: ignore[index]


def test_pool_from_gpu_memory(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(
        [
            "--model",
            "llama-3.1-8b",
            "--gpu-memory-gib",
            "80",
            "--gpu-memory-utilization",
            "0.9",
            "--weights-gib",
            "15",
            "--overhead-gib",
            "3",
        ],
        capsys,
    )
    expected = int(80 * 2**30 * 0.9) - 18 * 2**30
    assert doc["pool"]["bytes"] == expected  # type: ignore[index]
    assert doc["pool"]["blocks"] == expected // (2 * 2**20)  # type: ignore[index]
    rows = {r["lever"]: r for r in doc["levers"]}  # type: ignore[attr-defined]
    assert rows["gpu_memory_utilization_plus_0_05"]["pool_tokens"] > doc["pool"]["tokens"]  # type: ignore[index]


def test_tp_and_pp_flags_change_bytes_per_token(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(["--model", "llama-3.1-70b", "--tp", "4", "--pp", "2", "--kv-cache-gib", "40"], capsys)
    assert doc["kv_bytes_per_token"] == 2 * 2 * 128 * 2 * 40


def test_text_output_is_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        [
            "capacity",
            "--model",
            "llama-3.1-8b",
            "--kv-cache-gib",
            "5",
            "--prompt-tokens",
            "7500",
            "--output-tokens",
            "1000",
        ],
        capsys,
    )
    assert code == 0
    assert "131,072 B per GPU" in out
    assert "2,560 blocks of 16 -> 40,960 tokens" in out
    assert "4.82 requests" in out
    for lever in LEVERS:
        assert lever in out


def test_from_log_reads_pool_config_and_checks_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(
        ["--from-log", str(FIX / "vllm-cpu-seed" / "server.log"), "--model", str(FIX / "vllm-cpu-seed" / "seedllama")],
        capsys,
    )
    pool = doc["pool"]
    assert isinstance(pool, dict)
    assert (pool["blocks"], pool["block_size"], pool["tokens"]) == (1280, 32, 40_960)
    assert doc["max_model_len"] == 9_216
    observed = doc["observed"]
    assert isinstance(observed, dict)
    assert observed["max_concurrency"] == 4.44
    assert observed["max_concurrency_matches"] is True


def test_from_log_takes_the_model_from_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    log = next((FIX / "real" / "logs").glob("025-*.log"))
    doc = _json(["--from-log", str(log)], capsys)
    assert doc["model"]["name"] == "meta-llama/Meta-Llama-3-8B"  # type: ignore[index]
    assert doc["pool"]["source"] == "bytes"  # type: ignore[index]


def test_from_log_without_a_model_name_asks_for_model(capsys: pytest.CaptureFixture[str]) -> None:
    log = next((FIX / "real" / "logs").glob("019-*.log"))
    code, _, err = _run(["capacity", "--from-log", str(log)], capsys)
    assert code == 2
    assert "names no model; pass --model" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--model is required"),
        (["--model", "llama-3.1-8b", "--kv-cache-gib", "5", "--kv-cache-tokens", "100"], "give one measured pool"),
        (["--model", "llama-3.1-8b", "--prompt-tokens", "100"], "--prompt-tokens and --output-tokens together"),
        (
            [
                "--model",
                "llama-3.1-8b",
                "--prompt-tokens",
                "100",
                "--output-tokens",
                "5",
                "--shared-prefix-tokens",
                "200",
            ],
            "--shared-prefix-tokens 200 must be within the prompt",
        ),
        (["--model", "llama-3.1-8b", "--kv-cache-dtype", "fp4"], "--kv-cache-dtype 'fp4' is not known"),
        (["--model", "llama-3.1-8b", "--tp", "0"], "--tp must be positive"),
        (
            ["--model", "llama-3.1-70b", "--gpu-memory-gib", "24", "--weights-gib", "131", "--overhead-gib", "3"],
            "no memory left for the KV cache",
        ),
        (
            ["--model", str(FIX / "synthetic-configs" / "head-dim-from-hidden"), "--gpu-memory-gib", "24"],
            "field 'vocab_size' is missing",
        ),
        (["--model", "llama-3.1-8b", "--from-log", "/nonexistent.log"], "no such file"),
    ],
    ids=[
        "no_model",
        "two_pools",
        "prompt_without_output",
        "prefix_longer_than_prompt",
        "unknown_kv_dtype",
        "zero_tp",
        "weights_exceed_gpu",
        "config_without_mlp_width",
        "missing_log",
    ],
)
def test_bad_flags_are_one_line_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["capacity", *args], capsys)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_list_models_prints_the_catalogue_with_sources(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["capacity", "--list-models"], capsys)
    assert code == 0
    assert "deepseek-ai/DeepSeek-V3" in out
    assert "https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json" in out


def test_from_log_text_shows_what_vllm_printed(capsys: pytest.CaptureFixture[str]) -> None:
    log = next((FIX / "real" / "logs").glob("011-*.log"))
    code, out, _ = _run(["capacity", "--from-log", str(log), "--model", "meta-llama/Llama-3.1-8B-Instruct"], capsys)
    assert code == 0
    assert "1,478 blocks of 16 -> 23,648 tokens" in out
    assert "vLLM printed      2.89 GiB, 1,478 blocks" in out
    assert "predicted blocks [1477, 1482], 0.82x" in out
