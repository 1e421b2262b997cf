"""Request-borne text never becomes a record: every kind kvwatch reads, in every way vLLM echoes clients.

A model asked to repeat vLLM's words, a prompt, a request id (the client's X-Request-Id), a path:
vLLM writes all of them into the log kvwatch reads (vllm/entrypoints/serve/utils/request_logger.py
in 0.32, vllm/entrypoints/logger.py before; uvicorn's access log). Each genuine vLLM line below is
first shown to give its record on its own, then embedded in each carrier, which must give nothing:
not to ``parse_line``, not to ``LogParser``, not to ``kvwatch analyze`` (the document of a real log
with the carriers added is the real log's), not to the sidecar (the exported series of a real log
replayed with the carriers added are byte for byte the real log's). A genuine line glued after a
real record, header and all, still counts: that is a transport artefact, not an echo.
"""

from __future__ import annotations

import functools
import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.batch import analyze_paths
from kvwatch.export import exposition
from kvwatch.export.collector import StateCollector
from kvwatch.parse import logpatterns as P
from kvwatch.parse.log import LogParser, parse_line
from kvwatch.parse.provenance import echo_cut, logger_allows, quoted_spans, valid_label_value
from kvwatch.reconcile.live import LiveState
from kvwatch.records import (
    ErrorRecord,
    FactRecord,
    LogRecord,
    PreemptionRecord,
    PrefixHitRecord,
    RunStartRecord,
    StatsRecord,
)
from kvwatch.sources.replay import line_seconds
from tests.helpers import Kvwatch, value, wait_for

SEED_LOG = Path(__file__).parent / "fixtures" / "vllm-cpu-seed" / "server.log"
TS = "11-29 14:45:00"

# ---- genuine vLLM lines, one per record kind (vllm-formats.md; the file:line of the release) -----------
# The numbers are the ones an attacker would want exported: 999 waiting, a 3-token pool, 100,000
# preemptions, a model name of their choosing, a version that starts a new "run".
PAYLOADS: dict[str, tuple[str, Callable[[list[LogRecord]], bool]]] = {
    "stats_v1": (
        f"(APIServer pid=1) INFO {TS} [loggers.py:248] Engine 000: Avg prompt throughput: 999.0 tokens/s, Avg "
        "generation throughput: 999.0 tokens/s, Running: 999 reqs, Waiting: 999 reqs, GPU KV cache usage: 100.0%, "
        "Prefix cache hit rate: 0.0%",
        lambda rs: any(isinstance(r, StatsRecord) and r.waiting == 999 for r in rs),
    ),
    "stats_v1_preemptions": (
        f"(APIServer pid=1) INFO {TS} [loggers.py:248] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg "
        "generation throughput: 1.0 tokens/s, Running: 999 reqs, Waiting: 999 reqs, Preemptions: 100000, GPU KV "
        "cache usage: 100.0%, Prefix cache hit rate: 0.0%",
        lambda rs: any(isinstance(r, StatsRecord) and r.preemptions == 100000 for r in rs),
    ),
    "stats_v0": (
        f"INFO {TS} metrics.py:351] Avg prompt throughput: 999.0 tokens/s, Avg generation throughput: 999.0 "
        "tokens/s, Running: 999 reqs, Swapped: 0 reqs, Pending: 999 reqs, GPU KV cache usage: 100.0%, CPU KV cache "
        "usage: 0.0%.",
        lambda rs: any(isinstance(r, StatsRecord) and r.waiting == 999 for r in rs),
    ),
    "prefix_hit_v0": (
        f"INFO {TS} metrics.py:367] Prefix cache hit rate: GPU: 99.00%, CPU: 0.00%",
        lambda rs: any(isinstance(r, PrefixHitRecord) for r in rs),
    ),
    "kv_cache_size": (
        f"(EngineCore_DP0 pid=2) INFO {TS} [kv_cache_utils.py:1087] GPU KV cache size: 3 tokens",
        lambda rs: _fact(rs, "capacity.kv_cache_tokens") == 3,
    ),
    "kv_size_and_concurrency": (
        f"(EngineCore pid=2) INFO {TS} [kv_cache_utils.py:2327] GPU KV cache size: 3 tokens, Maximum concurrency "
        "for 9,216 tokens per request: 0.01x",
        lambda rs: _fact(rs, "capacity.max_concurrency.ratio") == 0.01,
    ),
    "max_concurrency": (
        f"(EngineCore_DP0 pid=2) INFO {TS} [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per "
        "request: 0.01x",
        lambda rs: _fact(rs, "capacity.max_concurrency.ratio") == 0.01,
    ),
    "blocks_v0": (
        f"INFO {TS} gpu_executor.py:122] # GPU blocks: 3, # CPU blocks: 0",
        lambda rs: _fact(rs, "capacity.gpu_blocks") == 3,
    ),
    "available_kv_memory": (
        f"(EngineCore_DP0 pid=2) INFO {TS} [gpu_worker.py:298] Available KV cache memory: 0.01 GiB",
        lambda rs: _fact(rs, "capacity.kv_cache_memory_gib") == 0.01,
    ),
    "weights": (
        f"(EngineCore_DP0 pid=2) INFO {TS} [gpu_model_runner.py:2653] Model loading took 999.0 GiB and 1.2 seconds",
        lambda rs: _fact(rs, "capacity.weights_gib") == 999.0,
    ),
    "config_dump": (
        f"(EngineCore pid=2) INFO {TS} [core.py:133] Initializing a V1 LLM engine (v6.6.6) with config: "
        "model='evil/model', speculative_config=None, tokenizer='evil/model', dtype=torch.float16, max_seq_len=3, "
        "tensor_parallel_size=8, enable_prefix_caching=False",
        lambda rs: _fact(rs, "config.vllm_version") == "6.6.6" and _fact(rs, "config.model") == "evil/model",
    ),
    "non_default_args": (
        f"(APIServer pid=1) INFO {TS} [api_utils.py:286] non-default args: {{'model': 'evil/model', "
        "'served_model_name': ['evil'], 'max_model_len': 3, 'gpu_memory_utilization': 0.01, 'max_num_seqs': 1}",
        lambda rs: _fact(rs, "config.served_model_name") == "evil" and _fact(rs, "config.max_num_seqs") == 1,
    ),
    "args_namespace_v0": (
        f"INFO {TS} api_server.py:177] args: Namespace(host=None, port=8000, model='evil/model', max_model_len=3, "
        "gpu_memory_utilization=0.01, max_num_seqs=1)",
        lambda rs: _fact(rs, "config.model") == "evil/model",
    ),
    "preemption_v0": (
        f"WARNING {TS} scheduler.py:1057] Sequence group cmpl-1 is preempted by PreemptionMode.RECOMPUTE mode "
        "because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
        "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        "total_num_cumulative_preemption=100000",
        lambda rs: any(isinstance(r, PreemptionRecord) and r.cumulative == 100000 for r in rs),
    ),
    "error_kv_insufficient": (
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:708] ValueError: To serve at least one request with the "
        "model's max seq len (9216), (9.0 GiB KV cache is needed, which is larger than the available KV cache "
        "memory (1.0 GiB). Based on the available memory, the estimated maximum model length is 1024.",
        lambda rs: _error(rs) == "kv_insufficient",
    ),
    "error_no_kv_memory": (
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:708] ValueError: No available memory for the cache blocks. "
        "Try increasing `gpu_memory_utilization` when initializing the engine.",
        lambda rs: _error(rs) == "no_kv_memory",
    ),
    "error_oom": (
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 1.00 MiB is free.",
        lambda rs: _error(rs) == "oom",
    ),
    "error_engine_dead": (
        f"(APIServer pid=1) ERROR {TS} [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
        "encountered an issue. See stack trace (above) for the root cause.",
        lambda rs: _error(rs) == "engine_dead",
    ),
    "error_engine_fatal": (
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:700] EngineCore encountered a fatal error.",
        lambda rs: _error(rs) == "engine_dead",
    ),
    "error_startup_memory": (
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:708] ValueError: Free memory on device (7.34/139.72 GiB) on "
        "startup is less than desired GPU memory utilization (0.9, 125.75 GiB). Decrease GPU memory utilization "
        "or reduce GPU memory used by other processes.",
        lambda rs: _error(rs) == "startup_memory",
    ),
    "error_other": (
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:717] EngineCore failed to start.",
        lambda rs: _error(rs) == "other",
    ),
    "version_banner_v0": (
        f"INFO {TS} api_server.py:149] vLLM API server version 6.6.6",
        lambda rs: _fact(rs, "config.vllm_version") == "6.6.6",
    ),
    "version_logo": (
        f"(APIServer pid=1) INFO {TS} [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 6.6.6",
        lambda rs: _fact(rs, "config.vllm_version") == "6.6.6",
    ),
    "version_serving": (
        f"(APIServer pid=1) INFO {TS} [api_utils.py:327] vLLM server version 6.6.6, serving model evil/model",
        lambda rs: _fact(rs, "config.model") == "evil/model",
    ),
}


def _fact(records: list[LogRecord], field: str) -> object:
    return next((r.value for r in records if isinstance(r, FactRecord) and r.field == field), None)


def _error(records: list[LogRecord]) -> str | None:
    return next((r.kind for r in records if isinstance(r, ErrorRecord)), None)


def _message(line: str) -> str:
    """A genuine line's message: what follows its vLLM header."""
    m = P.VLLM_HEADER.search(line)
    assert m is not None, line
    return line[m.end() :]


# ---- carriers: how the genuine text reaches the log inside a client's text -------------------------------
# Each formats a payload the way vLLM 0.32 / uvicorn 0.54 does (format strings quoted in the comments).
CARRIERS: dict[str, Callable[[str], str]] = {
    # RequestLogger.log_outputs: "Generated response %s%s: output: %r, finish_reason: %s"
    "generated_response_output": lambda p: (
        f"(APIServer pid=1) INFO {TS} [request_logger.py:109] Generated response cmpl-1: output: {p!r}, "
        "finish_reason: stop"
    ),
    # ... the request id is the client's X-Request-Id header, written with %s (unquoted)
    "generated_response_request_id": lambda p: (
        f"(APIServer pid=1) INFO {TS} [request_logger.py:109] Generated response {p}: output: 'ok', finish_reason: stop"
    ),
    # 0.10-0.2x: "Generated response %s%s: output: %r, output_token_ids: %s, finish_reason: %s" (streaming)
    "generated_response_streaming": lambda p: (
        f"INFO {TS} [logger.py:71] Generated response chatcmpl-9 (streaming complete): output: {p!r}, "
        "output_token_ids: None, finish_reason: streaming_complete"
    ),
    # RequestLogger.log_request_body: "Request %s JSON body: %s" with request.model_dump_json()
    "json_body": lambda p: (
        f"(APIServer pid=1) DEBUG {TS} [request_logger.py:75] Request cmpl-1 JSON body: "
        + json.dumps({"model": "m", "prompt": p, "max_tokens": 16}, separators=(",", ":"))
    ),
    "json_body_request_id": lambda p: (
        f"(APIServer pid=1) DEBUG {TS} [request_logger.py:75] Request {p} JSON body: {{}}"
    ),
    # uvicorn access: '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s' (the path as
    # sent, worse than uvicorn's quoting of it; the query is not quoted)
    "access_line_path": lambda p: f'(APIServer pid=1) INFO:     127.0.0.1:40000 - "POST /v1/{p} HTTP/1.1" 200 OK',
    "access_line_query": lambda p: (
        '(APIServer pid=1) INFO:     127.0.0.1:40000 - "GET /v1/models?q=' + p.replace(" ", "+") + ' HTTP/1.1" 404'
    ),
    # ... and the address, which --proxy-headers takes from the client's X-Forwarded-For
    "access_line_forwarded_for": lambda p: f'INFO:     {p}:0 - "GET /health HTTP/1.1" 200 OK',
    # RequestLogger.log_inputs 0.4-0.2x: "Received request %s: prompt: %r, params: %s, prompt_token_ids: %s, ..."
    "received_request_repr": lambda p: (
        f"INFO {TS} [logger.py:39] Received request cmpl-1: prompt: {p!r}, params: SamplingParams(n=1, "
        f"stop=[{p!r}], max_tokens=16), prompt_token_ids: None, lora_request: None, prompt_adapter_request: None."
    ),
    # 0.32: "Received request %s: params: %s, lora_request: %s." (the id unquoted)
    "received_request_request_id": lambda p: (
        f"(APIServer pid=1) INFO {TS} [request_logger.py:66] Received request {p}: params: SamplingParams(n=1), "
        "lora_request: None."
    ),
    # 0.32 DEBUG: "Request %s details: prompt: %r, prompt_token_ids: %s, prompt_embeds shape: %s."
    "request_details_prompt": lambda p: (
        f"(APIServer pid=1) DEBUG {TS} [request_logger.py:54] Request cmpl-1 details: prompt: {p!r}, "
        "prompt_token_ids: [1, 2], prompt_embeds shape: None."
    ),
    "request_details_request_id": lambda p: (
        f"(APIServer pid=1) DEBUG {TS} [request_logger.py:54] Request {p} details: prompt: 'x', "
        "prompt_token_ids: None, prompt_embeds shape: None."
    ),
    # 0.32 v1/engine/async_llm.py messages that begin with the request id
    "added_request_id": lambda p: f"(APIServer pid=1) INFO {TS} [async_llm.py:578] Added request {p}.",
    "request_aborted_id": lambda p: f"(APIServer pid=1) INFO {TS} [async_llm.py:783] Request {p} aborted.",
    "request_failed_id": lambda p: (
        f"(APIServer pid=1) INFO {TS} [async_llm.py:795] Request {p} failed (bad request): bad."
    ),
    # V0 async_llm_engine.py 'Finished request %s.'; 0.32 scheduler.py '... KV transfer for request %s'
    "finished_request_id_v0": lambda p: f"INFO {TS} async_llm_engine.py:110] Finished request {p}.",
    "kv_transfer_request_id": lambda p: (
        f"(EngineCore pid=2) DEBUG {TS} [scheduler.py:3223] Finished recving KV transfer for request {p}"
    ),
    # A message that quotes a client's string (not one of the echo forms): quoted text never counts
    "quoted_in_other_message": lambda p: (
        f"(APIServer pid=1) ERROR {TS} [serving_chat.py:200] Error in preprocessing prompt inputs: {p!r}"
    ),
    # ... and the same with no vLLM header at all (a paste, another program's log on the same stream)
    "quoted_in_pasted_text": lambda p: f"Error in preprocessing prompt inputs: {p!r}",
    "json_in_pasted_text": lambda p: "trace " + json.dumps({"input": p}),
    # The genuine message (no header of its own) glued after a real record's message
    "glued_after_api_server_message": lambda p: (
        f"(APIServer pid=1) INFO {TS} [launcher.py:46] Route: /v1/completions, Methods: POST" + _message(p)
    ),
    "glued_after_worker_message": lambda p: (
        f"(EngineCore pid=2) INFO {TS} [gpu_model_runner.py:2600] Starting to load model /models/x... " + _message(p)
    ),
    "glued_after_kv_cache_message": lambda p: (
        f"(EngineCore pid=2) INFO {TS} [kv_cache_utils.py:1000] GPU KV cache size: 40,960 tokens" + _message(p)
    ),
}
# What the carrier line gives with a harmless payload (only the glued carriers' hosts give anything).
NEUTRAL = f"INFO {TS} [x.py:1] hello"


def _carrier_records(carrier: str) -> list[LogRecord]:
    if carrier.startswith("glued_"):
        return parse_line(CARRIERS[carrier](NEUTRAL), 1)
    return []


KINDS = sorted(PAYLOADS)
CASES = [(k, c) for k in KINDS for c in CARRIERS]
IDS = [f"{k}-in-{c}" for k, c in CASES]


@pytest.mark.parametrize("kind", KINDS)
def test_the_genuine_line_alone_gives_its_record(kind: str) -> None:
    line, check = PAYLOADS[kind]
    assert check(parse_line(line, 1)), line


@pytest.mark.parametrize(("kind", "carrier"), CASES, ids=IDS)
def test_request_borne_text_gives_no_record_to_the_line_parser(kind: str, carrier: str) -> None:
    line = CARRIERS[carrier](PAYLOADS[kind][0])
    assert parse_line(line, 1) == _carrier_records(carrier), line
    parser = LogParser()
    got = [*parser.feed_line(line, 1), *parser.feed_line(NEUTRAL, 2), *parser.finish()]
    assert got == _carrier_records(carrier), line


@pytest.mark.parametrize("kind", KINDS)
def test_a_real_record_glued_after_another_still_counts(kind: str) -> None:
    # A transport artefact: two vLLM records on one physical line, each with its header.
    line, check = PAYLOADS[kind]
    for host in (
        f"(APIServer pid=1) INFO {TS} [launcher.py:46] Route: /v1/completions, Methods: POST",
        f"(APIServer pid=1) INFO {TS} [loggers.py:248] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg "
        "generation throughput: 1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, "
        "Prefix cache hit rate: 0.0%",
    ):
        records = parse_line(host + line, 1)
        assert check(records), host + line
        assert len(records) == len(parse_line(host, 1)) + len(parse_line(line, 1))


@pytest.mark.parametrize(
    "line",
    [
        f"ERROR {TS} [model_runner_base.py:116] RuntimeError: Error in model execution (input dumped to "
        "/tmp/err_execute_model_input_20240924-160030.pkl): CUDA out of memory. Tried to allocate 1.00 GiB.",
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:708] torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 2.00 MiB.",
        f"(EngineCore_DP0 pid=2) ERROR {TS} [core.py:708] ray.exceptions.RayTaskError(ValueError): ValueError: No "
        "available memory for the cache blocks.",
    ],
    ids=["v0-model-execution-wrapper", "torch-cuda-module-path", "ray-task-error"],
)
def test_an_error_behind_vllms_own_wrapping_still_counts(line: str) -> None:
    assert _error(parse_line(line, 1)) in ("oom", "no_kv_memory")


def test_a_v0_preemption_warning_counts_vllms_cumulative_not_the_request_ids() -> None:
    fake = PAYLOADS["preemption_v0"][0].split("] ", 1)[1]  # the words, as a request id
    line = (
        f"WARNING {TS} scheduler.py:1057] Sequence group cmpl-{fake} is preempted by PreemptionMode.RECOMPUTE "
        "mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
        "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        "total_num_cumulative_preemption=51"
    )
    records = parse_line(line, 1)
    assert [r.cumulative for r in records if isinstance(r, PreemptionRecord)] == [51]


def test_a_real_record_glued_before_an_echo_still_counts() -> None:
    stats, check = PAYLOADS["stats_v1"]
    echo = CARRIERS["received_request_request_id"](PAYLOADS["kv_cache_size"][0])
    records = parse_line(stats + echo, 1)
    assert check(records)
    assert [type(r) for r in records] == [StatsRecord]


# ---- the analyze document and the sidecar's series ---------------------------------------------------------


def _seed_lines() -> list[str]:
    return SEED_LOG.read_text(encoding="utf-8").splitlines()


def _with_carriers(lines: list[str], carrier_lines: list[str]) -> list[str]:
    """The real log with the carrier lines after its first stats record, mid-run and at its end."""
    first = next(i for i, x in enumerate(lines) if P.STATS_START in x)
    middle = (first + len(lines)) // 2
    out = [*lines[: first + 1], *carrier_lines, *lines[first + 1 : middle], *carrier_lines, *lines[middle:]]
    return [*out, *carrier_lines]


def _document(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(analyze_paths([str(path)])))
    doc.pop("inputs")
    return doc


@pytest.mark.parametrize("carrier", list(CARRIERS))
def test_analyze_document_is_unchanged_by_every_kind_in_every_carrier(carrier: str, tmp_path: Path) -> None:
    # The baseline holds the same carrier lines with a harmless payload, so line numbers match; those
    # give no record (the glued carriers' hosts are real vLLM lines and give their own).
    neutral = [CARRIERS[carrier](NEUTRAL)] * len(KINDS)
    hostile = [CARRIERS[carrier](PAYLOADS[k][0]) for k in KINDS]
    base, path = tmp_path / "neutral.log", tmp_path / "hostile.log"
    base.write_text("\n".join(_with_carriers(_seed_lines(), neutral)) + "\n", encoding="utf-8")
    path.write_text("\n".join(_with_carriers(_seed_lines(), hostile)) + "\n", encoding="utf-8")
    doc = _document(path)
    assert doc["stats"]["count"] > 0  # the real log's records are read around the carriers
    assert doc == _document(base)
    assert "evil" not in json.dumps(doc)


def _exposition(lines: list[str]) -> bytes:
    """The sidecar's path: LogParser -> LiveState -> StateCollector, on the log's own clock."""
    state = LiveState(scrape_interval=10.0)
    parser = LogParser()
    now = 0.0
    for line in lines:
        now = line_seconds(line) or now
        for record in parser.feed_line(line):
            state.on_log_record(record, now)
    for record in parser.finish():
        state.on_log_record(record, now)
    registry = CollectorRegistry()
    registry.register(StateCollector(functools.partial(exposition.samples, state), clock=lambda: now))
    return generate_latest(registry)


@pytest.mark.parametrize("carrier", list(CARRIERS))
def test_sidecar_series_are_unchanged_by_every_kind_in_every_carrier(carrier: str) -> None:
    neutral = [CARRIERS[carrier](NEUTRAL)] * len(KINDS)
    hostile = [CARRIERS[carrier](PAYLOADS[k][0]) for k in KINDS]
    baseline = _exposition(_with_carriers(_seed_lines(), neutral))
    assert b"kvwatch_observed_waiting_requests" in baseline  # the real log's stats are exported
    got = _exposition(_with_carriers(_seed_lines(), hostile))
    assert got == baseline
    assert b"evil" not in got


def test_a_genuine_banner_after_stats_still_starts_a_run_and_an_echoed_one_does_not() -> None:
    lines = _seed_lines()
    banner = PAYLOADS["version_logo"][0]

    def runs(extra: str) -> int:
        parser = LogParser()
        out = [r for line in [*lines, extra] for r in parser.feed_line(line)] + parser.finish()
        return sum(isinstance(r, RunStartRecord) for r in out)

    before = runs(NEUTRAL)
    assert runs(banner) == before + 1
    for name, carrier in CARRIERS.items():
        assert runs(carrier(banner)) == runs(carrier(NEUTRAL)), name


# ---- label values -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", True),
        ("/models/Qwen2.5-7B-Instruct-AWQ", True),
        ("org/model:rev@main", True),
        ("C:\\models\\x", True),
        ("a" * 256, True),
        ("a" * 257, False),
        ("evil model", False),
        ('x"} 1\nkvwatch_memory_bound 1', False),
        ("", False),
        (3, False),
    ],
    ids=[
        "hf-id",
        "path",
        "rev",
        "windows-path",
        "max-length",
        "too-long",
        "space",
        "exposition-escape",
        "empty",
        "int",
    ],
)
def test_label_values_from_the_log_are_checked(value: object, ok: bool) -> None:
    assert valid_label_value(value) is ok


def test_a_model_name_no_model_has_is_not_taken_as_a_fact() -> None:
    line = f"(APIServer pid=1) INFO {TS} [api_utils.py:286] non-default args: {{'model': 'a model', 'max_num_seqs': 4}}"
    records = parse_line(line, 1)
    assert _fact(records, "config.model") is None
    assert _fact(records, "config.max_num_seqs") == 4


# ---- the tables ---------------------------------------------------------------------------------------------

# vLLM 0.32's own format strings (vllm/entrypoints/serve/utils/request_logger.py), a client's text in each.
REAL_032_FORMATS = [
    ("Received request %s: params: %s, lora_request: %s.", ("X", "SamplingParams(n=1)", None)),
    ("Request %s details: prompt: %r, prompt_token_ids: %s, prompt_embeds shape: %s.", ("X", "X", None, None)),
    ("Request %s JSON body: %s", ("X", '{"prompt":"X"}')),
    ("Generated response %s%s details: output_token_ids: %s", ("X", "", [1])),
    ("Generated response %s%s: output: %r, finish_reason: %s", ("X", " (streaming delta)", "X", None)),
]


@pytest.mark.parametrize(("fmt", "args"), REAL_032_FORMATS, ids=[f[0][:24] for f in REAL_032_FORMATS])
def test_every_vllm_request_logger_format_is_an_echo_from_its_first_client_byte(
    fmt: str, args: tuple[Any, ...]
) -> None:
    header = f"(APIServer pid=1) INFO {TS} [request_logger.py:66] "
    line = header + fmt % args
    cut = echo_cut(line)
    assert cut <= line.index("X"), line  # nothing of the client's before the cut
    assert cut >= len(header) - 1  # vLLM's header is not the client's


@pytest.mark.parametrize("form", P.ECHO_FORMS, ids=lambda f: f.name)
def test_every_echo_form_is_documented_and_prefiltered(form: P.EchoForm) -> None:
    assert form.versions
    assert form.why
    assert form.marker in P.REQUEST_MARKERS


@pytest.mark.parametrize("row", [r for r in P.LINE_KINDS if r.error is None], ids=lambda r: r.name)
def test_every_non_error_row_names_the_loggers_that_write_it(row: P.LineKind) -> None:
    family = P.KIND_LOGGERS[row.name]
    assert family == "paste" or family in P.LOGGER_FAMILIES


def test_a_kinds_words_under_a_request_logger_are_no_record() -> None:
    assert not logger_allows("kv_size", "request_logger.py")
    assert not logger_allows("stats", "serving_chat.py")
    assert not logger_allows("engine_dead", "logger.py")
    assert logger_allows("engine_dead", "api_router.py")
    assert logger_allows("stats", None)  # no header: pasted logs keep reading


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("model's max seq len", []),
        ("output: 'a \\' b' rest", [(8, 15)]),
        ('body: {"p":"x \\" y"}', [(7, 9), (11, 18)]),
        ("open: 'never closed", [(6, 19)]),
    ],
    ids=["apostrophe", "repr-escape", "json-escape", "unclosed"],
)
def test_quoted_spans_follow_repr_and_json(text: str, spans: list[tuple[int, int]]) -> None:
    assert quoted_spans(text) == spans


# ---- real echoes: vLLM 0.32.0's RequestLogger and uvicorn's access logger wrote them --------------------------

ECHO_LOG = Path(__file__).parent / "fixtures" / "vllm-cpu-echo" / "echo.log"


def test_the_real_echo_fixture_carries_every_payload() -> None:
    text = ECHO_LOG.read_text(encoding="utf-8")
    payloads = (ECHO_LOG.parent / "payloads.txt").read_text(encoding="utf-8").splitlines()
    assert sorted(payloads) == sorted(line for line, _ in PAYLOADS.values())
    for payload in payloads:
        assert payload in text  # unquoted, as a request id or a forwarded-for address, at least once


def test_real_vllm_echoes_give_no_record() -> None:
    parser = LogParser()
    lines = ECHO_LOG.read_text(encoding="utf-8").splitlines()
    records = [r for n, line in enumerate(lines, 1) for r in parser.feed_line(line, n)] + parser.finish()
    assert records == []
    doc = analyze_paths([str(ECHO_LOG)])
    assert doc["stats"]["count"] == 0
    assert doc["errors"] == []
    assert doc["preemptions"]["warnings"] == 0
    assert all(v is None for v in doc["config"].values())
    assert all(v is None for k, v in doc["capacity"].items() if k != "max_concurrency")


def test_real_vllm_echoes_change_neither_the_document_nor_the_series_of_a_real_log(tmp_path: Path) -> None:
    seed = _seed_lines()
    echoes = ECHO_LOG.read_text(encoding="utf-8").splitlines()
    mixed = [*seed[:120], *echoes, *seed[120:]]  # mid-run, after stats records
    # the baseline: the same number of harmless lines in the same place (line numbers match)
    plain = [*seed[:120], *([NEUTRAL] * len(echoes)), *seed[120:]]
    assert any(P.STATS_START in x for x in seed[:120])
    a, b = tmp_path / "mixed.log", tmp_path / "plain.log"
    a.write_text("\n".join(mixed) + "\n", encoding="utf-8")
    b.write_text("\n".join(plain) + "\n", encoding="utf-8")
    assert _document(a) == _document(b)
    assert _exposition(mixed) == _exposition(plain)


def test_the_sidecar_labels_no_series_with_a_model_name_no_model_has() -> None:
    # Facts can reach LiveState from elsewhere than the line parser; it checks them again.
    stats = parse_line(PAYLOADS["stats_v1"][0], 1)
    for name, label in (('evil model"} 1', 'model_name="unknown"'), ("org/model-7B", 'model_name="org/model-7B"')):
        state = LiveState(scrape_interval=10.0)
        state.on_log_record(FactRecord(1, None, "config.model", name), 1.0)
        for record in stats:
            state.on_log_record(record, 2.0)
        registry = CollectorRegistry()
        registry.register(StateCollector(functools.partial(exposition.samples, state), clock=lambda: 2.0))
        text = generate_latest(registry).decode()
        assert label in text
        assert "evil" not in text


# ---- the sidecar as a process: kvwatch watch --replay ---------------------------------------------------------

# Series whose values depend on the log alone (not on wall-clock time or the process).
STABLE = re.compile(
    r"kvwatch_(log_records_total|kv_pool_tokens|max_concurrency|preemptions_total|observed_\w+|saturation_state"
    r"|memory_bound|kv_bytes_per_token|diagnosis|request_tokens|whatif_\w+|reconcile_ratio)\b"
)


def _scrape(port: int) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    series = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if STABLE.match(s.name)
    }
    return text, series


def test_watch_replay_exports_the_same_series_with_every_kind_in_every_carrier(
    tmp_path: Path, kvwatch: Callable[..., Kvwatch]
) -> None:
    seed = _seed_lines()
    # A genuine record after everything: once it is counted, every line before it has been read.
    sentinel = next(x for x in reversed(seed) if P.STATS_START in x)
    logs = {}
    for name, payload_of in (("neutral", lambda _k: NEUTRAL), ("hostile", lambda k: PAYLOADS[k][0])):
        carriers = [carrier(payload_of(k)) for carrier in CARRIERS.values() for k in KINDS]
        logs[name] = tmp_path / f"{name}.log"
        logs[name].write_text("\n".join([*_with_carriers(seed, carriers), sentinel]) + "\n", encoding="utf-8")
    stats = sum(P.STATS_START in x for x in seed) + 1
    got = {}
    for name, path in logs.items():
        k = kvwatch("--replay", str(path), "--speed", "50")
        wait_for(
            lambda k=k: value(k.port, "kvwatch_log_records_total", kind="stats") == stats,
            timeout=60,
            what=f"{stats} stats records",
        )
        got[name] = _scrape(k.port)
        assert k.stop() == 0
        assert "evil" not in k.stderr
    text, series = got["hostile"]
    assert series == got["neutral"][1]
    pool = [v for (n, labels), v in series.items() if n == "kvwatch_kv_pool_tokens" and ("source", "log") in labels]
    assert pool == [40960]  # the real start's pool, not the 3 tokens the carriers spell
    assert "evil" not in text
    assert "6.6.6" not in text


# Not the glued carriers: text glued after a vLLM message with no header of its own is another vLLM
# process's on the same stream, and stop words are read anywhere in vLLM's words (they are a state, not
# a record); what a client writes reaches the log only through an echo or a quoted string.
@pytest.mark.parametrize("carrier", [c for c in CARRIERS if not c.startswith("glued_")])
def test_a_clients_shutdown_words_do_not_excuse_a_real_engine_death(carrier: str) -> None:
    # A clean stop's EngineDeadError is noise (LogParser drops it when stop words follow), so stop
    # words a client wrote right after a real crash would hide the crash.
    dead = PAYLOADS["error_engine_dead"][0]
    stop = f"INFO {TS} [launcher.py:99] [shutdown] received signal SIGTERM, Shutting down"
    assert _error(_feed([dead, stop])) is None  # vLLM's own stop words excuse it
    assert _error(_feed([dead, CARRIERS[carrier](stop)])) == "engine_dead", CARRIERS[carrier](stop)


def _feed(lines: list[str]) -> list[LogRecord]:
    parser = LogParser()
    return [r for n, line in enumerate(lines, 1) for r in parser.feed_line(line, n)] + parser.finish()


def test_echo_cut_passes_by_only_lines_that_hold_no_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    """echo_cut returns at once for a line holding none of its words; every marker, every start
    literal's marker and the access anchor hold one, so the quick answer is the full one: on every
    real fixture line and every carrier of every payload, as with the words check switched off."""
    from kvwatch.parse import provenance

    words = provenance._ECHO_WORDS
    for marker in (*(a for a, _ in provenance._ANCHORED), *provenance._UNANCHORED, P.ACCESS_ANCHOR):
        assert any(w in marker for w in words), marker
    fixtures = Path(__file__).parent / "fixtures"
    lines = [ln for p in sorted(fixtures.glob("real*/logs/*")) for ln in p.read_text("utf-8", "replace").splitlines()]
    lines += [carry(payload) for carry in CARRIERS.values() for payload, _ in PAYLOADS.values()]
    quick = [echo_cut(ln) for ln in lines]
    monkeypatch.setattr(provenance, "_ECHO_WORDS", ("",))  # "" is in every text: the full reading
    assert [echo_cut(ln) for ln in lines] == quick
    assert sum(c < len(ln) for c, ln in zip(quick, lines, strict=True)) > len(CARRIERS)  # echoes were cut
    assert sum(c == len(ln) for c, ln in zip(quick, lines, strict=True)) > 500  # and most lines passed
