"""The log reader, line kind by line kind and vLLM version by version.

Lines here are CONSTRUCTED from the format strings quoted in docs/vllm-formats.md
(each id names the vLLM version whose format it fills); real captures are checked by
test_contract.py and the golden files of test_analyze.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvwatch.parse import logpatterns
from kvwatch.parse.log import MAX_WRAP_LINES, LogParser, parse_line
from kvwatch.records import ErrorRecord, FactRecord, PreemptionRecord, PrefixHitRecord, RunStartRecord, StatsRecord


def _facts(text: str) -> dict[str, Any]:
    return {r.field: r.value for r in parse_line(text, 1) if isinstance(r, FactRecord)}


def _stats(text: str) -> list[StatsRecord]:
    return [r for r in parse_line(text, 1) if isinstance(r, StatsRecord)]


# ---- periodic stats records (docs/vllm-formats.md §4) ------------------------------------------------

V0_041 = (
    "INFO 11-29 14:05:10 metrics.py:218] Avg prompt throughput: 1532.4 tokens/s, Avg generation throughput: "
    "842.7 tokens/s, Running: 48 reqs, Swapped: 2 reqs, Pending: 3 reqs, GPU KV cache usage: 87.3%, "
    "CPU KV cache usage: 1.5%"
)
V0_063 = V0_041.replace("metrics.py:218]", "metrics.py:351]") + "."
V1_073 = (
    "INFO 11-29 14:05:10 [loggers.py:80] Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: "
    "20.0 tokens/s, Running: 4 reqs, Waiting: 1 reqs, GPU KV cache usage: 50.0%, Prefix cache hit rate: 12.5%"
)
V1_083 = V1_073.replace("[loggers.py:80] ", "[loggers.py:116] Engine 000: ")
V1_0111 = (
    "(APIServer pid=2871) INFO 11-29 14:05:10 [loggers.py:236] Engine 001: Avg prompt throughput: 1532.4 tokens/s, "
    "Avg generation throughput: 842.7 tokens/s, Running: 48 reqs, Waiting: 3 reqs, Preemptions: 2, "
    "GPU KV cache usage: 97.9%, Prefix cache hit rate: 42.2%, External prefix cache hit rate: 10.5%, "
    "MM cache hit rate: 3.0%"
)
V1_030 = (
    "(APIServer pid=2871) INFO 11-29 14:05:10 [loggers.py:336] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: 911.0 tokens/s, Running: 64 reqs, Waiting: 12 reqs, Deferred: 2 reqs, "
    "Preemptions: 5, XPU KV cache usage: 99.1%, Prefix cache hit rate: 38.0%"
)
V1_032_KV_FETCH = (
    "(APIServer pid=9) INFO 11-29 14:05:10 [loggers.py:340] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
    "Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 4 reqs, KV fetch: 1 waiting to start, "
    "2 in progress, 0 completed waiting, GPU KV cache usage: 40.0%, Corrupted: 1 reqs"
)
V1_AGGREGATED = (
    "(APIServer pid=1) INFO 11-29 14:05:10 [loggers.py:236] 2 Engines Aggregated: Avg prompt throughput: 5.0 "
    "tokens/s, Avg generation throughput: 6.0 tokens/s, Running: 7 reqs, Waiting: 0 reqs, GPU KV cache usage: "
    "30.0%, Prefix cache hit rate: 0.0%"
)

STATS_CASES = [
    pytest.param(
        V0_041,
        {"running": 48, "swapped": 2, "waiting": 3, "kv_usage_pct": 87.3, "cpu_kv_usage_pct": 1.5, "engine": None},
        id="v0.4.1-stats-no-period",
    ),
    pytest.param(
        V0_063, {"running": 48, "waiting": 3, "cpu_kv_usage_pct": 1.5, "prompt_tps": 1532.4}, id="v0.6.3-stats"
    ),
    pytest.param(
        V1_073,
        {"running": 4, "waiting": 1, "prefix_hit_pct": 12.5, "engine": None, "swapped": None},
        id="v0.7.3-v1-stats",
    ),
    pytest.param(V1_083, {"engine": 0, "kv_usage_pct": 50.0, "cpu_kv_usage_pct": None}, id="v0.8.3-engine-prefix"),
    pytest.param(
        V1_0111,
        {"engine": 1, "preemptions": 2, "external_prefix_hit_pct": 10.5, "mm_cache_hit_pct": 3.0, "kv_usage_pct": 97.9},
        id="v0.11.1-parts-preemptions-external-mm",
    ),
    pytest.param(
        V1_030,
        {"deferred": 2, "preemptions": 5, "kv_usage_pct": 99.1, "device": "xpu", "cpu_kv_usage_pct": None},
        id="v0.30-device-word-deferred",
    ),
    pytest.param(
        V1_032_KV_FETCH, {"running": 3, "waiting": 4, "kv_usage_pct": 40.0, "prefix_hit_pct": None}, id="v0.32-kv-fetch"
    ),
    pytest.param(
        V1_AGGREGATED, {"engine": None, "engines_aggregated": 2, "running": 7}, id="v0.11.1-engines-aggregated"
    ),
    pytest.param(
        V1_083.replace("GPU KV", "CPU KV"),
        {"kv_usage_pct": 50.0, "cpu_kv_usage_pct": None, "device": "cpu"},
        id="v0.30-cpu-backend-usage-is-the-pool",
    ),
    pytest.param(
        V1_083 + ", MFU: 11.3 TF/s/GPU 772.8 GB/s/GPU", {"running": 4, "prefix_hit_pct": 12.5}, id="v1-mfu-suffix"
    ),
]


@pytest.mark.parametrize(("line", "expected"), STATS_CASES)
def test_stats_record_fields(line: str, expected: dict[str, Any]) -> None:
    (rec,) = _stats(line)
    for key, value in expected.items():
        assert getattr(rec, key) == value, key


PREFIXES = [
    pytest.param("", id="bare-v0.8-header"),
    pytest.param("(APIServer pid=2871) ", id="v0.10.1-apiserver-prefix"),
    pytest.param("\x1b[1;36m(EngineCore_DP0 pid=3012)\x1b[0;0m ", id="v0.10.2-ansi-cyan-prefix"),
    pytest.param("[0;36m(APIServer pid=1)[0;0m ", id="ansi-remnants-without-esc"),
    pytest.param("(MapWorker(MapBatches(vLLMEngineStageUDF)) pid=20874) ", id="ray-data-nested-prefix"),
    pytest.param("(EngineCore pid=925) (RayWorkerProc pid=8272) ", id="stacked-prefixes"),
    pytest.param("2025-10-15T00:02:38.756689123Z (APIServer pid=1) ", id="docker-rfc3339"),
    pytest.param("myprefix ", id="vllm-logging-prefix"),
    pytest.param("Running generate_until requests:   0%|   | 0/14345 [00:00<?, ?it/s", id="tqdm-junk-glued"),
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_prefix_layout_reads_the_same_record(prefix: str) -> None:
    (rec,) = _stats(prefix + V1_083 + "\r\n")
    assert (rec.engine, rec.running, rec.waiting, rec.kv_usage_pct) == (0, 4, 1, 50.0)


def test_docker_stamp_gives_a_complete_timestamp() -> None:
    (rec,) = _stats("2025-10-15T00:02:38.75Z " + V1_083)
    assert rec.ts is not None
    assert rec.ts.iso() == "2025-10-15T00:02:38.75Z"


def test_vllm_header_gives_a_yearless_timestamp() -> None:
    (rec,) = _stats(V1_083)
    assert rec.ts is not None
    assert rec.ts.iso() == "--11-29T14:05:10"


def test_custom_logging_format_and_bare_message() -> None:
    custom = "2024-12-20 15:18:19 - vllm.engine.metrics - INFO - " + V0_063.split("] ", 1)[1]
    bare = "`" + V0_041.split("] ", 1)[1] + "`"
    (a,) = _stats(custom)
    (b,) = _stats(bare)
    assert a.ts is not None
    assert a.ts.iso() == "2024-12-20T15:18:19"
    assert (a.running, b.running, b.ts) == (48, 48, None)


def test_records_glued_on_one_physical_line_each_count() -> None:
    glued = V1_083 + V1_083.replace("14:05:10", "14:05:20").replace("Running: 4", "Running: 5")
    recs = _stats(glued)
    assert [r.running for r in recs] == [4, 5]
    assert [r.ts.second if r.ts else None for r in recs] == [10.0, 20.0]


def test_hard_wrapped_stats_record_is_joined_with_its_continuation() -> None:
    first, second = V1_083[:120], V1_083[120:]
    parser = LogParser()
    out = parser.feed_line(first + "\n", 1) + parser.feed_line(second + "\n", 2) + parser.finish()
    (rec,) = [r for r in out if isinstance(r, StatsRecord)]
    assert (rec.line, rec.running, rec.kv_usage_pct, rec.prefix_hit_pct) == (1, 4, 50.0, 12.5)


@pytest.mark.parametrize("cut", [80, 150, len(V1_083) - 6], ids=["before-running", "mid-kv-usage", "mid-prefix-hit"])
def test_hard_wrap_anywhere_in_the_record_is_joined(cut: int) -> None:
    parser = LogParser()
    out = parser.feed_line(V1_083[:cut], 1) + parser.feed_line(V1_083[cut:], 2) + parser.finish()
    (rec,) = out
    assert isinstance(rec, StatsRecord)
    assert (rec.running, rec.kv_usage_pct, rec.prefix_hit_pct) == (4, 50.0, 12.5)


def _hard_wrapped(line: str, width: int) -> list[str]:
    """``line`` as a terminal of ``width`` columns cuts it (no word wrap: at the column)."""
    return [line[i : i + width] for i in range(0, len(line), width)]


@pytest.mark.parametrize(
    ("record", "width"),
    [(V1_0111, 80), (V1_0111, 100), (V1_0111, 120), (V1_083, 60), (V1_083, 80), (V0_063, 80)],
    ids=[
        "v0.11.1-80-columns",
        "v0.11.1-100-columns",
        "v0.11.1-120-columns",
        "v0.8.3-60-columns",
        "v0.8.3-80-columns",
        "v0.6.3-80-columns",
    ],
)
def test_record_cut_into_several_lines_by_a_narrow_terminal_is_joined(record: str, width: int) -> None:
    (whole,) = _stats(record)
    pieces = _hard_wrapped(record, width)
    assert 2 < len(pieces) <= MAX_WRAP_LINES or width >= 100
    parser = LogParser()
    out = [r for i, piece in enumerate(pieces, 1) for r in parser.feed_line(piece, i)] + parser.finish()
    (rec,) = out
    assert isinstance(rec, StatsRecord)
    assert rec._replace(line=1) == whole._replace(line=1)


def test_a_whole_record_glued_before_one_cut_in_its_first_words_is_kept() -> None:
    # Two records on one physical line (no newline between them), the second cut by the console
    # inside "Avg prompt throughput:": the first is whole and must survive the join of the second.
    second = V1_083.replace("14:05:10", "14:05:20").replace("Running: 4", "Running: 5")
    cut = second.index("Avg prompt") + 6
    parser = LogParser()
    out = parser.feed_line(V1_083 + second[:cut], 1) + parser.feed_line(second[cut:], 2) + parser.finish()
    assert [r.running for r in out if isinstance(r, StatsRecord)] == [4, 5]


def test_a_cut_record_takes_no_line_after_its_last_short_piece() -> None:
    # A record with a fork's suffix never ends in "%", so it always looks cut. Its last piece is
    # shorter than the terminal: the bare line after it (an OOM, no prefix) is a line of its own.
    record = V1_0111 + ", MFU: 11.3 TF/s/GPU 772.8 GB/s/GPU"
    pieces = _hard_wrapped(record, 80)
    assert len(pieces[-1]) < 80
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    parser = LogParser()
    out = [r for i, line in enumerate([*pieces, oom], 1) for r in parser.feed_line(line, i)] + parser.finish()
    stats = [r for r in out if isinstance(r, StatsRecord)]
    assert [r.running for r in stats] == [48]
    assert [(r.kind, r.line) for r in out if isinstance(r, ErrorRecord)] == [("oom", len(pieces) + 1)]


def test_next_record_with_its_own_prefix_is_not_taken_as_a_continuation() -> None:
    parser = LogParser()
    mfu = "(APIServer pid=1) " + V1_083 + ", MFU: 11.3 TF/s/GPU 772.8 GB/s/GPU"
    out = parser.feed_line(mfu, 1) + parser.feed_line(mfu, 2) + parser.finish()
    assert [r.line for r in out] == [1, 2]


def test_record_copied_from_a_web_page_with_no_break_spaces_reads_the_same() -> None:
    (rec,) = _stats(V0_063.replace(" ", "\xa0"))
    (plain,) = _stats(V0_063)
    assert (rec.running, rec.waiting, rec.kv_usage_pct, rec.ts) == (
        plain.running,
        plain.waiting,
        plain.kv_usage_pct,
        plain.ts,
    )


def test_records_in_markdown_table_rows_are_not_joined_as_a_hard_wrap() -> None:
    # V0 records pasted as cells of a markdown table (a real vllm-ascend report): each row ends in
    # "%.  |", which looks cut, but the next row holds a record of its own.
    rows = [f"| model-{i} | 19% | {V0_063[V0_063.index('Avg prompt') :]}  |" for i in (1, 2)]
    rows[1] = rows[1].replace("Running: 48 reqs", "Running: 7 reqs")
    parser = LogParser()
    out = [r for i, row in enumerate(rows, 1) for r in parser.feed_line(row, i)] + parser.finish()
    assert [r.running for r in out if isinstance(r, StatsRecord)] == [48, 7]


def test_cut_stats_record_at_end_of_log_still_counts() -> None:
    parser = LogParser()
    out = parser.feed_line(V1_083[:120], 1) + parser.finish()
    assert [type(r) for r in out] == [StatsRecord]


def test_v0_prefix_hit_rate_is_a_separate_record() -> None:
    (rec,) = parse_line("INFO 11-29 14:05:10 metrics.py:367] Prefix cache hit rate: GPU: 42.17%, CPU: 0.00%", 3)
    assert isinstance(rec, PrefixHitRecord)
    assert (rec.gpu_pct, rec.cpu_pct) == (42.17, 0.0)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(
            "INFO 04-10 03:44:48 [metrics.py:101] SpecDecoding metrics: Draft acceptance rate: 40.0%, Mean acceptance "
            "length: 2.20, Accepted: 78 tokens, Drafted: 195 tokens, Per-position acceptance rate: 0.615, 0.415",
            id="v0.8.5-v1-spec-decode",
        ),
        pytest.param(
            "INFO 08-20 02:39:37 metrics.py:451] Speculative metrics: Draft acceptance rate: 0.611, System efficiency: "
            "0.522, Number of speculative tokens: 4, Number of accepted tokens: 99, Number of draft tokens: 162, "
            "Number of emitted tokens: 141.",
            id="v0.5-v0-speculative-metrics",
        ),
        pytest.param(
            "INFO 06-22 02:55:02 [loggers.py:137] Engine 000: vllm cache_config_info with initialization after "
            "num_gpu_blocks is: 15745",
            id="v0.9.2-cache-config-info-is-not-stats",
        ),
    ],
)
def test_lines_that_are_not_stats_records(line: str) -> None:
    assert _stats(line) == []


# ---- startup lines (docs/vllm-formats.md §3) --------------------------------------------------------------

STARTUP_CASES = [
    pytest.param(
        "INFO 11-29 14:00:01 api_server.py:528] vLLM API server version 0.6.3",
        {"config.vllm_version": "0.6.3"},
        id="v0.4.3-api-server-version",
    ),
    pytest.param(
        "(APIServer pid=2871) INFO 11-29 14:00:01 [startup.py:38] vLLM server version 0.33.0, serving model "
        "meta-llama/Llama-3.1-8B-Instruct",
        {"config.vllm_version": "0.33.0", "config.model": "meta-llama/Llama-3.1-8B-Instruct"},
        id="v0.16-server-version-serving-model",
    ),
    pytest.param(
        "(APIServer pid=2424) INFO 11-29 14:24:58 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0",
        {"config.vllm_version": "0.32.0"},
        id="v0.16-ascii-logo-version",
    ),
    pytest.param(
        "(APIServer pid=2424) INFO 11-29 14:24:58 [api_utils.py:347]   █▄█▀ █     █     █     █  "
        "model   /tmp/tinyllama",
        {"config.model": "/tmp/tinyllama"},
        id="v0.16-ascii-logo-model",
    ),
    pytest.param(
        "(APIServer pid=6539) INFO 04-18 20:22:57 [utils.py:299] █▄█▀ █ █ █ █ model openai/gpt-oss-20b",
        {"config.model": "openai/gpt-oss-20b"},
        id="v0.19-ascii-logo-model-with-spaces-collapsed-by-a-web-page",
    ),
    pytest.param(
        "INFO 08-07 21:32:22 [serve.py:119] Defaulting api_server_count to data_parallel_size (8).",
        {"config.data_parallel_size": 8},
        id="v0.25-api-server-count-defaults-to-the-dp-size",
    ),
    pytest.param(
        "ValueError: max_num_seqs (256) exceeds available Mamba cache blocks (161).",
        {"config.max_num_seqs": 256},
        id="v0.23-mamba-cache-error-states-max-num-seqs",
    ),
    pytest.param(
        "INFO 11-29 14:00:01 api_server.py:529] args: Namespace(host=None, port=8000, model='meta-llama/Llama-2-7b', "
        "dtype='auto', kv_cache_dtype='auto', max_model_len=None, block_size=16, enable_prefix_caching=False, "
        "gpu_memory_utilization=0.9, tensor_parallel_size=2, max_num_batched_tokens=None, max_num_seqs=256, "
        "quantization=None, served_model_name=None)",
        {
            "config.model": "meta-llama/Llama-2-7b",
            "config.block_size": 16,
            "capacity.block_size": 16,
            "config.gpu_memory_utilization": 0.9,
            "config.tensor_parallel_size": 2,
            "config.max_num_seqs": 256,
            "config.enable_prefix_caching": False,
            "config.kv_cache_dtype": "auto",
        },
        id="v0.4.3-args-namespace",
    ),
    pytest.param(
        "(APIServer pid=2871) INFO 11-29 14:00:01 [utils.py:328] non-default args: {'model_tag': 'm', "
        "'max_model_len': 32768, 'gpu_memory_utilization': 0.85, 'tensor_parallel_size': 2, "
        "'served_model_name': ['tiny-llama'], 'max_num_seqs': 8}",
        {
            "config.max_seq_len": 32768,
            "config.gpu_memory_utilization": 0.85,
            "config.served_model_name": "tiny-llama",
            "config.max_num_seqs": 8,
        },
        id="v0.9-non-default-args",
    ),
    pytest.param(
        "INFO 11-29 14:00:05 llm_engine.py:238] Initializing an LLM engine (v0.6.3) with config: model='m/x', "
        "speculative_config=None, tokenizer='m/x', dtype=torch.bfloat16, max_seq_len=8192, tensor_parallel_size=1, "
        "pipeline_parallel_size=1, quantization=fp8, kv_cache_dtype=fp8_e4m3, device_config=cuda, "
        "served_model_name=m/x, chunked_prefill_enabled=False multi_step_stream_outputs=True, "
        "enable_prefix_caching=False, use_async_output_proc=True, use_cached_outputs=True, mm_processor_kwargs=None)",
        {
            "config.vllm_version": "0.6.3",
            "config.model": "m/x",
            "config.max_seq_len": 8192,
            "config.quantization": "fp8",
            "config.kv_cache_dtype": "fp8_e4m3",
            "config.enable_prefix_caching": False,
            "capacity.device": "gpu",
        },
        id="v0.6.3-v0-config-dump-commaless",
    ),
    pytest.param(
        "INFO 11-29 14:00:05 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='m', "
        "speculative_config=None, dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=2, "
        "pipeline_parallel_size=1, data_parallel_size=2, quantization=None, kv_cache_dtype=auto,  device_config=cuda, "
        'decoding_config=DecodingConfig(backend=\'auto\'), compilation_config={"level":3,"max_num_seqs": 9}, '
        "served_model_name=m, enable_prefix_caching=True",
        {
            "config.data_parallel_size": 2,
            "config.tensor_parallel_size": 2,
            "config.enable_prefix_caching": True,
            "config.max_seq_len": 32768,
        },
        id="v0.11-v1-config-dump-nested-reprs",
    ),
    pytest.param(
        "INFO 11-29 14:00:40 model_runner.py:1067] Loading model weights took 14.9888 GB",
        {"capacity.weights_gib": 14.9888},
        id="v0.4.3-loading-model-weights-gb-is-gib",
    ),
    pytest.param(
        "INFO 11-29 14:00:40 [gpu_model_runner.py:2653] Model loading took 14.9889 GiB and 6.123456 seconds",
        {"capacity.weights_gib": 14.9889},
        id="v0.8.5-model-loading-took",
    ),
    pytest.param(
        "(EngineCore pid=3012) INFO 11-29 14:00:40 [gpu_model_runner.py:5089] Model loading took 14.99 GiB memory "
        "and 6.123456 seconds",
        {"capacity.weights_gib": 14.99},
        id="v0.14-model-loading-format-gib",
    ),
    pytest.param(
        "(VllmWorkerProcess pid=880) INFO 02-07 14:50:41 hpu_model_runner.py:712] Pre-loading model weights on "
        "hpu:0 took 79.41 GiB of device memory (79.41 GiB/94.62 GiB used) and 4.706 GiB of host memory "
        "(98.92 GiB/1007 GiB used)",
        {"capacity.weights_gib": 79.41},
        id="gaudi-vllm-fork-0.6-pre-loading-weights-on-hpu",
    ),
    pytest.param(
        "INFO 08-02 17:37:52 hpu_model_runner.py:442] Loading model weights took in total 14.97 GiB of device "
        "memory (14.97 GiB/94.62 GiB used) and 2.95 GiB of host memory (475.2 GiB/1007 GiB used)",
        {"capacity.weights_gib": 14.97},
        id="gaudi-vllm-fork-0.5-weights-took-in-total",
    ),
    pytest.param(
        "INFO 09-24 17:31:40 habana_worker.py:177] Free device memory: 79.22 GiB, 71.3 GiB usable "
        "(gpu_memory_utilization=0.9), 7.13 GiB reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=0.1), 64.17 GiB "
        "reserved for KV cache",
        {"capacity.kv_cache_memory_gib": 64.17, "config.gpu_memory_utilization": 0.9},
        id="gaudi-vllm-fork-0.5-free-device-memory-reserved-for-kv-cache",
    ),
    pytest.param(
        "INFO 11-29 14:00:52 worker.py:232] Memory profiling results: total_gpu_memory=79.19GiB "
        "initial_memory_usage=15.34GiB peak_torch_memory=17.06GiB memory_usage_post_profile=15.35Gib "
        "non_torch_memory=0.35GiB kv_cache_size=54.71GiB gpu_memory_utilization=0.90",
        {"capacity.kv_cache_memory_gib": 54.71, "config.gpu_memory_utilization": 0.9},
        id="v0.6.4-memory-profiling-one-line",
    ),
    pytest.param(
        "INFO 11-29 14:00:52 [worker.py:274] the current vLLM instance can use total_gpu_memory (79.19GiB) x "
        "gpu_memory_utilization (0.90) = 71.27GiB",
        {"config.gpu_memory_utilization": 0.9},
        id="v0.6.5-memory-profiling-line-2",
    ),
    pytest.param(
        "INFO 11-29 14:00:52 [worker.py:274] model weights take 14.99GiB; non_torch_memory takes 0.38GiB; PyTorch "
        "activation peak memory takes 1.19GiB; the rest of the memory reserved for KV Cache is 54.71GiB.",
        {"capacity.weights_gib": 14.99, "capacity.kv_cache_memory_gib": 54.71},
        id="v0.6.5-memory-profiling-line-3",
    ),
    pytest.param(
        "INFO 12-13 19:54:18 worker.py:243] available_kv_cache_memory\t53.29GiB",
        {"capacity.kv_cache_memory_gib": 53.29},
        id="v0.6.5dev-tab-aligned-profile",
    ),
    pytest.param(
        "(EngineCore_DP0 pid=3012) INFO 11-29 14:01:02 [gpu_worker.py:298] Available KV cache memory: 54.71 GiB",
        {"capacity.kv_cache_memory_gib": 54.71},
        id="v0.9.1-available-kv-cache-memory",
    ),
    pytest.param(
        "INFO 11-29 14:01:02 [gpu_worker.py:290] Initial free memory 31.16 GiB, reserved 4.25GiB memory for KV "
        "Cache as specified by kv_cache_memory_bytes config and skipped memory profiling. This does does not respect "
        "the gpu_memory_utilization config.",
        {"capacity.kv_cache_memory_gib": 4.25},
        id="v0.10.2-kv-cache-memory-bytes",
    ),
    pytest.param(
        "INFO 11-29 14:01:03 gpu_executor.py:122] # GPU blocks: 27514, # CPU blocks: 2048",
        {"capacity.gpu_blocks": 27514, "capacity.cpu_blocks": 2048, "capacity.device": "gpu"},
        id="v0.4.3-gpu-blocks",
    ),
    pytest.param(
        "INFO 11-29 14:01:03 executor_base.py:113] # CUDA blocks: 30720, # CPU blocks: 2048",
        {"capacity.gpu_blocks": 30720, "capacity.cpu_blocks": 2048},
        id="v0.7.0-cuda-blocks",
    ),
    pytest.param(
        "INFO 11-29 14:01:03 [executor_base.py:113] # cuda blocks: 30720, # CPU blocks: 2048",
        {"capacity.gpu_blocks": 30720, "capacity.device": "gpu"},
        id="v0.7.3-lowercase-cuda-blocks",
    ),
    pytest.param(
        "INFO 11-29 14:01:03 [kv_cache_utils.py:537] # GPU blocks: 2048",
        {"capacity.gpu_blocks": 2048, "capacity.cpu_blocks": None},
        id="v0.7.0-v1-gpu-blocks-alone",
    ),
    pytest.param("GPU blocks: 1952, # CPU blocks: 2048", {"capacity.gpu_blocks": 1952}, id="v0.6-hash-lost-in-paste"),
    pytest.param(
        "INFO 11-29 14:01:03 [kv_cache_utils.py:716] GPU KV cache size: 491,520 tokens",
        {"capacity.kv_cache_tokens": 491520, "capacity.device": "gpu"},
        id="v0.8.0-gpu-kv-cache-size-separators",
    ),
    pytest.param(
        "INFO 11-29 14:01:03 [kv_cache_utils.py:720] Maximum concurrency for 131,072 tokens per request: 3.75x",
        {"capacity.max_concurrency.tokens_per_request": 131072, "capacity.max_concurrency.ratio": 3.75},
        id="v0.8.0-max-concurrency-separators",
    ),
    pytest.param(
        "INFO 11-29 14:01:03 [executor_base.py:118] Maximum concurrency for 32768 tokens per request: 24.53x",
        {"capacity.max_concurrency.tokens_per_request": 32768, "config.max_seq_len": 32768},
        id="v0.6.3-v0-max-concurrency-raw",
    ),
    pytest.param(
        "(EngineCore pid=3012) INFO 11-29 14:01:03 [kv_cache_utils.py:1146] GPU KV cache size: 491,520 tokens, "
        "Maximum concurrency for 131,072 tokens per request: 3.75x",
        {"capacity.kv_cache_tokens": 491520, "capacity.max_concurrency.ratio": 3.75},
        id="v0.28-merged-size-and-concurrency",
    ),
    pytest.param(
        "(EngineCore pid=3012) INFO 11-29 14:01:03 [kv_cache_utils.py:2327] XPU KV cache size: 98304 tokens, "
        "Maximum concurrency for 8,192 tokens per request: 12.00x",
        {"capacity.kv_cache_tokens": 98304, "capacity.device": "xpu"},
        id="v0.30-xpu-kv-cache-size-no-separators",
    ),
    pytest.param(
        "INFO 11-29 14:01:03 [kv_cache_utils.py:2619] Overriding num_gpu_blocks=32768 with num_gpu_blocks_override=32",
        {"capacity.gpu_blocks": 32},
        id="v0.7-overriding-num-gpu-blocks",
    ),
    pytest.param(
        "INFO 06-22 02:55:02 [loggers.py:137] Engine 000: vllm cache_config_info with initialization after "
        "num_gpu_blocks is: 15745",
        {"capacity.gpu_blocks": 15745},
        id="v0.9.2-cache-config-info-line",
    ),
    pytest.param(
        "$ vllm serve meta-llama/Meta-Llama-3-8B -tp 2 --max-model-len 8192 --enable-prefix-caching",
        {
            "config.model": "meta-llama/Meta-Llama-3-8B",
            "config.tensor_parallel_size": 2,
            "config.max_seq_len": 8192,
            "config.enable_prefix_caching": True,
        },
        id="pasted-vllm-serve-command",
    ),
    pytest.param(
        "(RayWorkerProc pid=29271) (Worker pid=29271) INFO 08-19 18:00:26 [gpu_worker.py:857] Free memory on device "
        "(78.66/79.18 GiB) on startup. Desired GPU memory utilization is (0.9, 71.26 GiB). Actual usage is 15.31 GiB "
        "for weight, 1.29 GiB for peak activation, 0.22 GiB for non-torch memory, and 1.0 GiB for CUDAGraph memory. "
        "Replace gpu_memory_utilization config with `--kv-cache-memory=57229567898` (53.3 GiB) to fit into requested "
        "memory, or `--kv-cache-memory=65178914304` (60.7 GiB) to fully utilize gpu memory. Current kv cache memory "
        "in use is 54.45 GiB.",
        {"config.gpu_memory_utilization": 0.9, "capacity.kv_cache_memory_gib": 54.45},
        id="v0.2x-free-memory-summary-after-graph-capture",
    ),
    pytest.param(
        "(EngineCore pid=3012) INFO 11-29 14:01:03 [kv_cache_utils.py:1146] GPU + host KV cache size: 491,520 tokens, "
        "Maximum concurrency for 131,072 tokens per request: 3.75x",
        {"capacity.device": "gpu", "capacity.kv_cache_tokens": 491520, "capacity.max_concurrency.ratio": 3.75},
        id="v0.33-hisparse-gpu-plus-host-kv-cache-size",
    ),
    pytest.param(
        "INFO 03-05 10:00:00 [executor_base.py:113] # rocm blocks: 95442, # CPU blocks: 4096",
        {"capacity.device": "gpu", "capacity.gpu_blocks": 95442, "capacity.cpu_blocks": 4096},
        id="v0.8-v0-rocm-blocks-named-by-device-name",
    ),
    pytest.param(
        "INFO 11-30 09:49:17 llm_engine.py:72] Initializing an LLM engine with config: model='/m/vicuna-7b/', "
        "tokenizer='/m/vicuna-7b/', tokenizer_mode=auto, revision=None, tokenizer_revision=None, "
        "trust_remote_code=False, dtype=torch.float16, max_seq_len=4096, download_dir=None, load_format=auto, "
        "tensor_parallel_size=2, quantization=None, seed=0)",
        {
            "config.model": "/m/vicuna-7b/",
            "config.dtype": "torch.float16",
            "config.max_seq_len": 4096,
            "config.tensor_parallel_size": 2,
        },
        id="v0.2-config-dump-without-version",
    ),
    pytest.param(
        "INFO 02-10 17:12:31 llm_engine.py:234] Initializing a V0 LLM engine (v0.6.4.post2.dev395+g02222a02) with "
        "config: model='m', max_seq_len=2048, kv_cache_dtype=auto,  device_config=cuda:1, seed=0",
        {"config.vllm_version": "0.6.4.post2.dev395+g02222a02", "capacity.device": "gpu"},
        id="v0.6.4-config-dump-device-with-index",
    ),
    pytest.param(
        "vllm serve Qwen3.5-9B --served-model-name default_model --max-num-batched-tokens=64K --max-num-seqs 128 "
        "--max-model-len 32k --no-enable-prefix-caching --host ::",
        {
            "config.model": "Qwen3.5-9B",
            "config.served_model_name": "default_model",
            "config.max_num_batched_tokens": 65536,
            "config.max_num_seqs": 128,
            "config.max_seq_len": 32000,
            "config.enable_prefix_caching": False,
        },
        id="v0.18-vllm-serve-human-readable-token-counts",
    ),
    pytest.param(
        "VLLM_USE_V1=1 vllm serve neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8 --max-model-len 2048 "
        "--gpu-memory-utilization 0.98",
        {
            "config.model": "neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8",
            "config.max_seq_len": 2048,
            "config.gpu_memory_utilization": 0.98,
        },
        id="v0.7-vllm-serve-behind-an-environment-assignment",
    ),
    pytest.param(
        "2026-11-29T14:00:00.000456789Z CUDA_VISIBLE_DEVICES=0 vllm serve m --max-num-seqs 64",
        {"config.model": "m", "config.max_num_seqs": 64},
        id="vllm-serve-behind-env-assignment-and-a-shipper-stamp",
    ),
    pytest.param(
        'CUDA_VISIBLE_DEVICES=0,1 python -m vllm.entrypoints.api_server --model="/cm/deepseek-coder-6.7b-instruct/" '
        '--tensor-parallel-size=2 --trust-remote-code --dtype="float16"',
        {
            "config.model": "/cm/deepseek-coder-6.7b-instruct/",
            "config.tensor_parallel_size": 2,
            "config.dtype": "float16",
        },
        id="v0.4-demo-api-server-command",
    ),
    pytest.param(
        json.dumps(
            {
                "log": "(APIServer pid=1) INFO 04-15 07:22:41 [utils.py:299]  \u2584\u2584 \u2584\u2588 \u2588     "
                "\u2588     \u2588 \u2580\u2584\u2580 \u2588  version 0.19.1\n",
                "stream": "stdout",
                "time": "2026-04-15T07:22:41.123456789Z",
            }
        ),
        {"config.vllm_version": "0.19.1"},
        id="v0.19-logo-row-in-docker-json-file-with-escaped-blocks",
    ),
    pytest.param(
        json.dumps(
            {
                "log": "INFO 11-29 14:00:01 [utils.py:328] non-default args: {'model': 'm', "
                "'compilation_config': {\"level\": 3}, 'max_num_seqs': 8}\n",
                "stream": "stdout",
                "time": "2026-11-29T14:00:01Z",
            }
        ),
        {"config.model": "m", "config.max_num_seqs": 8},
        id="v0.9-non-default-args-in-docker-json-file",
    ),
]


@pytest.mark.parametrize(("line", "expected"), STARTUP_CASES)
def test_startup_line_facts(line: str, expected: dict[str, Any]) -> None:
    facts = _facts(line)
    for key, value in expected.items():
        assert facts.get(key) == value, key


# ---- preemption and errors (docs/vllm-formats.md §5) ---------------------------------------------------------

PREEMPT = (
    "WARNING 11-29 14:06:44 scheduler.py:1481] Sequence group cmpl-5f3c-0 is preempted by PreemptionMode.{mode} "
    "mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
    "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
    "total_num_cumulative_preemption={n}"
)


@pytest.mark.parametrize(
    ("mode", "n"), [pytest.param("RECOMPUTE", 51, id="v0.4.3-recompute"), pytest.param("SWAP", 1, id="v0.4.3-swap")]
)
def test_v0_preemption_warning(mode: str, n: int) -> None:
    (rec,) = parse_line(PREEMPT.format(mode=mode, n=n), 9)
    assert isinstance(rec, PreemptionRecord)
    assert (rec.mode, rec.cumulative, rec.line) == (mode.lower(), n, 9)


ERROR_CASES = [
    pytest.param(
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (9.73 GiB). Based on the available memory, the "
        "estimated maximum model length is 79696. Try increasing `gpu_memory_utilization`",
        "kv_insufficient",
        id="v0.9.1-kv-insufficient-models-s",
    ),
    pytest.param(
        "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (9.73 GiB). Based on the available memory",
        "kv_insufficient",
        id="v0.22-kv-insufficient-model-s",
    ),
    pytest.param(
        "To serve at least one request with the models's max seq len (32768), (4.00 GB KV cache is needed, which is "
        "larger than the available KV cache memory (2.10 GB). Try increasing `gpu_memory_utilization`",
        "kv_insufficient",
        id="v0.7.3-kv-insufficient-gb",
    ),
    pytest.param(
        "ValueError: The model's max seq len (29000) is larger than the maximum number of tokens that can be stored "
        "in KV cache (23648). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`",
        "kv_insufficient",
        id="v0.4.1-v0-kv-insufficient",
    ),
    pytest.param(
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        "no_kv_memory",
        id="v0.4.1-no-kv-memory",
    ),
    pytest.param(
        "ValueError: Free memory on device cuda:0 (30.12/79.19 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        "startup_memory",
        id="v0.9.1-startup-free-memory",
    ),
    pytest.param(
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try "
        "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.",
        "oom",
        id="v0.8.5-warmup-oom",
    ),
    pytest.param(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19",
        "oom",
        id="torch-runtime-oom",
    ),
    pytest.param(
        "(APIServer pid=1) ERROR 11-29 14:48:34 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "engine_dead",
        id="v0.8-engine-dead",
    ),
]


ERROR_CASES += [
    pytest.param(
        "(VllmWorker rank=3 pid=1090) ERROR 06-05 06:18:13 [multiproc_executor.py:470] RuntimeError: CUDA error: "
        "out of memory",
        "oom",
        id="v0.9-cuda-graph-capture-cuda-error-out-of-memory",
    ),
    pytest.param(
        "(EngineCore_0 pid=1) ERROR 09-03 11:03:37 [core.py:712] ValueError: Free memory on device (7.34/139.72 GiB) "
        "on startup is less than desired GPU memory utilization (0.9, 125.75 GiB). Decrease GPU memory utilization "
        "or reduce GPU memory used by other processes.",
        "startup_memory",
        id="v0.10-free-memory-on-startup-without-device-name",
    ),
    pytest.param(
        "(EngineCore_DP0 pid=9817) torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.08 GiB. GPU 0 has a "
        "total capacity of 62.47 GiB of which 769.28 MiB is free.",
        "oom",
        id="rocm-torch-runtime-oom-says-hip",
    ),
    pytest.param(
        "(EngineCore_DP0 pid=559) ERROR 10-20 03:20:50 [core.py:720] EngineCore encountered a fatal error.",
        "engine_dead",
        id="v0.8-enginecore-fatal-error",
    ),
    pytest.param(
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {}",
        "other",
        id="v0.8-engine-core-initialization-failed",
    ),
    pytest.param(
        "(EngineCore pid=316) ERROR 08-21 18:37:44 [core.py:1344] EngineCore failed to start.",
        "other",
        id="v0.10-enginecore-failed-to-start",
    ),
    pytest.param(
        "  | [2025-03-10T15:07:20Z] ERROR 03-10 08:07:20 [core.py:302] EngineCore hit an exception: Traceback (most "
        "recent call last):",
        "engine_dead",
        id="v0.7-enginecore-hit-an-exception-in-buildkite-paste",
    ),
    pytest.param(
        "(EngineCore pid=74) ERROR 05-07 00:37:03 [core.py:1136] RuntimeError: CUDA driver error: out of memory",
        "oom",
        id="v0.20-cuda-driver-error-out-of-memory-from-a-custom-op",
    ),
    pytest.param(
        "ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (614).",
        "kv_insufficient",
        id="v0.25-hybrid-model-max-num-seqs-exceeds-mamba-cache-blocks",
    ),
    pytest.param(
        "ERROR 03-17 08:02:04 serving_chat.py:596] vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not "
        "running. Inspect the stacktrace to find the original error: AssertionError('Error in model execution (input "
        "dumped to /tmp/err_execute_model_input_20250317-080027.pkl): ').",
        "engine_dead",
        id="v0.7-v0-mq-engine-dead-error",
    ),
    pytest.param(
        "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop is not running. If it was running, "
        "inspect the output to find the stacktrace of the error that caused the background loop to stop "
        "(AsyncEngineDeadError).",
        "engine_dead",
        id="v0.6-v0-async-engine-dead-error-background-loop-not-running",
    ),
    pytest.param(
        "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.",
        "engine_dead",
        id="v0.4-v0-async-engine-dead-error-background-loop-errored",
    ),
    pytest.param(
        "CRITICAL 01-24 07:01:39 launcher.py:88] AsyncLLMEngine is already dead, terminating server process",
        "engine_dead",
        id="v0.6-v0-launcher-engine-already-dead",
    ),
]


@pytest.mark.parametrize(("line", "kind"), ERROR_CASES)
def test_error_kinds(line: str, kind: str) -> None:
    errors = [r for r in parse_line(line, 4) if isinstance(r, ErrorRecord)]
    assert [e.kind for e in errors] == [kind]
    assert errors[0].message in line  # vLLM's own text, nothing added


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(
            "(VllmWorkerProcess pid=13109) INFO 08-19 07:51:12 model_runner.py:1028] CUDA graphs can take additional "
            "1~3 GiB memory per GPU. If you are running out of memory, consider decreasing `gpu_memory_utilization` "
            "or enforcing eager mode.",
            id="v0.5-cuda-graph-advice",
        ),
        pytest.param(
            "INFO 04-12 08:22:05 [model_runner.py:1456] Capturing cudagraphs for decoding. If out-of-memory error "
            "occurs during cudagraph capture, consider decreasing `gpu_memory_utilization` or switching to eager mode.",
            id="v0.8-cudagraph-capture-advice",
        ),
    ],
)
def test_advice_about_memory_is_no_error(line: str) -> None:
    assert [r for r in parse_line(line, 4) if isinstance(r, ErrorRecord)] == []


ENGINE_DEAD = (
    "(APIServer pid=1) ERROR 11-29 14:48:34 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause."
)


@pytest.mark.parametrize(
    "dead",
    [
        ENGINE_DEAD,
        "ERROR 03-17 08:02:04 serving_chat.py:596] vllm.engine.multiprocessing.MQEngineDeadError: Engine loop is not "
        "running. Inspect the stacktrace to find the original error: RuntimeError('cancelled')",
    ],
    ids=["v1-engine-dead-error", "v0-mq-engine-dead-error"],
)
def test_engine_dead_after_clean_sigint_is_not_a_crash(dead: str) -> None:
    parser = LogParser()
    shutdown = "(APIServer pid=1) INFO 11-29 14:48:34 [launcher.py:254] [shutdown] API server: shutdown triggered"
    out = parser.feed_line(shutdown, 1) + parser.feed_line(dead, 2)
    assert not [r for r in out if isinstance(r, ErrorRecord)]


def test_engine_dead_followed_by_shutdown_lines_is_not_a_crash() -> None:
    parser = LogParser()
    dead = ENGINE_DEAD
    stopped = "(APIServer pid=1) INFO 11-29 14:48:34 [launcher.py:279] [shutdown] API server: engine client stopped"
    out = parser.feed_line(V1_083, 1) + parser.feed_line(dead, 2) + parser.feed_line(stopped, 3) + parser.finish()
    assert not [r for r in out if isinstance(r, ErrorRecord)]


def test_engine_dead_followed_by_uvicorn_shutting_down_is_a_crash() -> None:
    # 0.20.2 (a real report): the API server stops uvicorn because its engine died; the stop follows the
    # death, so it says nothing about a clean shutdown.
    parser = LogParser()
    lines = [V1_083, ENGINE_DEAD, "(APIServer pid=1) INFO:     Shutting down"]
    out = [r for i, line in enumerate(lines, 1) for r in parser.feed_line(line, i)] + parser.finish()
    assert [r.kind for r in out if isinstance(r, ErrorRecord)] == ["engine_dead"]


def test_enginecore_fatal_error_is_a_crash_even_with_shutdown_lines_around() -> None:
    fatal = "(EngineCore_DP0 pid=5) ERROR 10-20 03:20:50 [core.py:720] EngineCore encountered a fatal error."
    stopped = "(APIServer pid=1) INFO 11-29 14:48:34 [launcher.py:279] [shutdown] API server: engine client stopped"
    parser = LogParser()
    lines = [V1_083, fatal, stopped]
    out = [r for i, line in enumerate(lines, 1) for r in parser.feed_line(line, i)] + parser.finish()
    assert [r.kind for r in out if isinstance(r, ErrorRecord)] == ["engine_dead"]


def test_header_with_markdown_escaped_bracket_still_gives_the_time() -> None:
    # v0.10-0.11 lines pasted on GitHub: "[loggers.py:118[] " (the renderer escaped the "]").
    (rec,) = _stats(V1_083.replace("[loggers.py:116] ", "[loggers.py:116[] "))
    assert rec.ts is not None
    assert (rec.ts.hour, rec.ts.minute, rec.engine) == (14, 5, 0)


def test_engine_dead_while_serving_is_a_crash() -> None:
    parser = LogParser()
    out = parser.feed_line(V1_083, 1) + parser.feed_line(ENGINE_DEAD, 2) + parser.finish()
    assert [r.kind for r in out if isinstance(r, ErrorRecord)] == ["engine_dead"]


# ---- runs ------------------------------------------------------------------------------------------

BANNER = "INFO 11-29 14:00:01 api_server.py:528] vLLM API server version 0.6.3"


def _runs(lines: list[str]) -> int:
    parser = LogParser()
    out = [r for i, line in enumerate(lines, 1) for r in parser.feed_line(line, i)] + parser.finish()
    return 1 + sum(isinstance(r, RunStartRecord) for r in out)


def test_a_second_startup_after_stats_is_a_second_run() -> None:
    assert _runs([BANNER, V0_063, BANNER, V0_063]) == 2


def test_one_startup_block_is_one_run_even_with_per_worker_lines() -> None:
    kv_size = "(Worker pid={p}) INFO 11-29 14:01:03 [kv_cache_utils.py:716] GPU KV cache size: 491,520 tokens"
    available = "(Worker pid={p}) INFO 11-29 14:01:02 [gpu_worker.py:298] Available KV cache memory: 54.71 GiB"
    lines = [BANNER, available.format(p=1), available.format(p=2), kv_size.format(p=1), kv_size.format(p=2), V1_083]
    assert _runs(lines) == 1


def test_data_parallel_engine_cores_starting_side_by_side_are_one_run() -> None:
    dump = (
        "(EngineCore_DP{n} pid=3{n}) INFO 11-29 14:00:05 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with "
        "config: model='m', max_seq_len=32768, kv_cache_dtype=auto, enable_prefix_caching=True"
    )
    size = "(EngineCore_DP{n} pid=3{n}) INFO 11-29 14:01:03 [kv_cache_utils.py:716] GPU KV cache size: 491,520 tokens"
    lines = [BANNER, dump.format(n=0), size.format(n=0), dump.format(n=1), size.format(n=1), V1_083]
    assert _runs(lines) == 1


def test_a_restart_that_crashed_before_serving_is_a_second_run() -> None:
    args = "(APIServer pid={p}) INFO 11-29 14:00:01 [utils.py:328] non-default args: {{'max_model_len': 32768}}"
    assert _runs([args.format(p=1), args.format(p=2), V1_083]) == 2


def test_ray_workers_on_other_nodes_are_separate_processes_of_one_run() -> None:
    # V0 0.6 multi-node TP under Ray: "(RayWorkerWrapper pid=N, ip=ADDR)"; each worker prints its weights.
    weights = (
        "(RayWorkerWrapper pid={p}, ip=10.0.0.{p}) INFO 12-15 07:41:22 model_runner.py:1077] "
        "Loading model weights took 3.8761 GB"
    )
    blocks = (
        "(LLMRayActor pid=9, ip=10.0.0.9) INFO 12-15 07:41:29 distributed_gpu_executor.py:57] "
        "# GPU blocks: 5, # CPU blocks: 1"
    )
    assert _runs([weights.format(p=1), weights.format(p=2), weights.format(p=3), blocks]) == 1


def test_gaudi_pre_load_then_total_weights_lines_are_one_start() -> None:
    # HabanaAI vllm-fork 0.5-0.9: each worker prints its pre-load footprint, then the total after the HPU-graph
    # wrap, then the KV budget and the block count: one start, not two.
    lines = [
        "INFO 08-02 17:37:52 hpu_model_runner.py:430] Pre-loading model weights on hpu:0 took 14.97 GiB of device "
        "memory (14.97 GiB/94.62 GiB used) and 2.95 GiB of host memory (475.2 GiB/1007 GiB used)",
        "INFO 08-02 17:37:52 hpu_model_runner.py:442] Loading model weights took in total 14.97 GiB of device "
        "memory (14.97 GiB/94.62 GiB used) and 2.95 GiB of host memory (475.2 GiB/1007 GiB used)",
        "INFO 08-02 17:37:54 hpu_worker.py:158] Free device memory: 79.16 GiB, 39.58 GiB usable "
        "(gpu_memory_utilization=0.5), 15.83 GiB reserved for HPUGraphs (VLLM_GRAPH_RESERVED_MEM=0.4), 23.75 GiB "
        "reserved for KV cache",
        "INFO 08-02 17:37:54 hpu_executor.py:85] # HPU blocks: 1519, # CPU blocks: 0",
    ]
    assert _runs(lines) == 1


def test_startup_lines_going_back_in_phase_start_a_run() -> None:
    weights = "Loading model weights took 14.9888 GB"
    blocks = "# GPU blocks: 1478, # CPU blocks: 2048"
    assert _runs([weights, blocks, weights, blocks]) == 2


# ---- privacy ----------------------------------------------------------------------------------------

CANARY = "CANARY-7f3a-do-not-copy"


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(
            f"INFO 04-10 03:44:50 [logger.py:39] Received request chatcmpl-1: prompt: '{CANARY} GPU KV cache size: "
            "5 tokens, # GPU blocks: 7', params: SamplingParams(n=1, max_tokens=10), prompt_token_ids: None.",
            id="v0.8-received-request-with-vllm-like-text",
        ),
        pytest.param(
            f"INFO 04-10 03:44:50 async_llm_engine.py:529] Received request cmpl-1: prompt: '{CANARY} version 9.9',"
            " sampling_params: SamplingParams(n=1), prompt_token_ids: [1, 2, 3].",
            id="v0.4-received-request",
        ),
    ],
)
def test_request_content_is_never_parsed(line: str) -> None:
    assert parse_line(line, 1) == []


def test_stats_record_glued_after_a_request_line_is_not_read() -> None:
    # The request id before "prompt:" is the client's X-Request-Id, written unquoted: a header and
    # a stats record after a request echo on the same physical line may be the client's, so the
    # whole rest of the line is request-borne (tests/test_injection.py covers every kind).
    request = f"INFO 04-10 03:44:50 [logger.py:39] Received request c-1: prompt: '{CANARY}', params: None."
    assert [type(r) for r in parse_line(V1_083, 1)] == [StatsRecord]
    assert parse_line(request + V1_083, 1) == []
    # A record glued BEFORE the echo is vLLM's and still counts.
    recs = parse_line(V1_083 + request, 1)
    assert [type(r) for r in recs] == [StatsRecord]
    assert CANARY not in repr(recs)


# ---- the table itself --------------------------------------------------------------------------------


@pytest.mark.parametrize("row", logpatterns.LINE_KINDS, ids=lambda r: r.name)
def test_every_row_is_documented_and_reachable_by_the_prefilter(row: logpatterns.LineKind) -> None:
    assert row.versions
    assert row.why
    anchors = [a.decode() for a in logpatterns.PREFILTER_ANCHORS]
    assert any(a in row.anchor for a in anchors), row.anchor


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("line", "expected"), STATS_CASES)
def test_fast_path_for_plain_stats_lines_equals_the_general_path(
    line: str, expected: dict[str, Any], prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvwatch.parse import log

    for ending in ("", "\n", "\r\n"):
        monkeypatch.undo()
        fast = log.scan_line(prefix + line + ending, 7)
        monkeypatch.setattr(log, "_plain_stats_line", lambda text, lineno: None)
        general = log.scan_line(prefix + line + ending, 7)
        assert fast.records == general.records
        assert fast.ts == general.ts
    assert expected.items() <= {k: getattr(fast.records[0], k) for k in expected}.items()


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("INFO 11-29 14:02:03 metrics.py:351] Avg prompt throughput: ...", id="doc-placeholder-numbers"),
        pytest.param("Avg prompt throughput: 1.2.3 tokens/s, Running: 1..2 reqs, GPU KV cache usage: .%", id="dots"),
        pytest.param("GPU KV cache size: ,,, tokens, Maximum concurrency for , tokens per request: .x", id="commas"),
        pytest.param("args: Namespace(max_num_seqs=abc, block_size=[, gpu_memory_utilization=)", id="broken-args"),
        pytest.param("\x00\x01\x1b[" * 50 + "Engine 000: Avg prompt throughput: 1.0", id="control-bytes"),
    ],
)
def test_malformed_numbers_never_raise(line: str) -> None:
    parser = LogParser()
    parser.feed_line(line, 1)
    parser.finish()


# ---- a header's time and logger, kept per text -----------------------------------------------------


def test_header_time_and_logger_kept_per_text_read_as_the_whole_header_does() -> None:
    """split_records takes a header's time from its stamp's fixed offsets and its logger from the
    "[file:line] " part alone, both kept per text: on every header of the real fixture logs (and
    comma decimals, 0.4's headers without "[", paths) they equal the groups' reading of the whole
    header, twice over (the second time from what was kept)."""
    from pathlib import Path

    from kvwatch.parse.log import clean, split_records
    from kvwatch.parse.provenance import header_logger
    from kvwatch.records import LogTime

    fixtures = Path(__file__).parent / "fixtures"
    lines = [
        "WARNING 01-02 03:04:05,678 [v1/engine/core.py:12] x",
        "INFO 12-31 23:59:59 metrics.py:351] y",
        "DEBUG 07-08 09:10:11.5 [a/b/c/loggers.py:7[] z INFO 07-08 09:10:12 [llm_engine.py:1] w",
    ]
    for path in sorted(fixtures.glob("real*/logs/*")):
        lines += [ln for ln in path.read_text("utf-8", "replace").splitlines() if logpatterns.VLLM_HEADER.search(ln)]
    checked = 0
    for _ in range(2):
        for line in lines:
            text = clean(line)
            if text.startswith(("{", "20")) or logpatterns.ASCTIME.match(text):
                continue  # an outer stamp gives the time: not this path
            headers = list(logpatterns.VLLM_HEADER.finditer(text))
            segments = [s for s in split_records(text) if s.logger is not None]  # a header's own
            if len(segments) != len(headers):
                continue  # a header inside a quoted string: no segment of its own
            for h, seg in zip(headers, segments, strict=True):
                mo, d, hh, mi, s = h.groups()
                assert seg.ts == LogTime(int(mo), int(d), int(hh), int(mi), float(s.replace(",", "."))), line
                assert seg.logger == header_logger(h.group(0)), line
                checked += 1
    assert checked > 2 * 400, checked
