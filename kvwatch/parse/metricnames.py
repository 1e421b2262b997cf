"""THE table of vLLM metric names kvwatch knows: the twin of ``kvwatch.parse.logpatterns``.

Every vLLM series kvwatch reads (``METRIC_ALIASES``: old and new names side by side, the vLLM
versions that expose each, its labels, why it is read), every one it deliberately ignores
(``IGNORED_METRICS``, with why) and the prefixes they appear under (``PREFIXES``). The metrics
reader (``kvwatch.parse.metrics``) reads through it; ``deploy/generate.py`` names the vLLM series
its dashboards and rules query through ``vllm_series`` here, which refuses a name the table
lacks; tests check every dashboard and rule against it.

Pure data and lookups: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# --------------------------------------------------------------------------------------------
# The vocabulary: which vLLM series kvwatch reads, under which names, since when and why
# --------------------------------------------------------------------------------------------

PREFIXES: tuple[tuple[str, str], ...] = (
    # (prefix, why it exists). Every stem below is looked up under each prefix.
    ("vllm:", "vLLM's own /metrics (API server), every version"),
    (
        "ray_vllm:",
        "vLLM run as a library under Ray Serve / Ray Data: vLLM's RayPrometheusStatLogger "
        "(vllm/v1/metrics/ray_wrappers.py, 0.8+) records into ray.util.metrics and Ray's "
        "exporter adds its 'ray_' prefix; older Ray exporters drop '_total' from counters",
    ),
    (
        "ray_vllm_",
        "the same Ray stat logger from vLLM 0.10.2 on (Ray's OpenTelemetry metrics backend): "
        "RayPrometheusMetric._get_sanitized_opentelemetry_name replaces ':' with '_', so Ray's "
        "port serves ray_vllm_num_requests_running ... (seen with Ray 2.52, vLLM PR 24267)",
    ),
)

MetricKind = Literal["gauge", "counter", "histogram", "info"]


@dataclass(frozen=True, slots=True)
class MetricAlias:
    """One vLLM series kvwatch reads: the EngineSample field it fills and every name it had.

    ``stems`` are the names without prefix, newest first; the first stem present for an engine
    wins. Counters are looked up with and without ``_total`` (prometheus_client always exposes
    ``_total``; Ray's older exporter and hand-edited pastes do not).
    """

    field: str  # EngineSample field (or "cache_config" for the info series)
    stems: tuple[str, ...]
    kind: MetricKind
    versions: str  # which vLLM versions expose each stem (docs/vllm-formats.md, "Metric names")
    why: str
    # Labels besides model_name and engine (which V1 puts on every series; V0 has model_name only)
    # that the row depends on; histograms also carry le.
    labels: tuple[str, ...] = ()


METRIC_ALIASES: tuple[MetricAlias, ...] = (
    MetricAlias(
        "running",
        ("num_requests_running",),
        "gauge",
        "V0 0.4.1-0.10.2; V1 0.7.1+",
        "requests in the running batch: the numerator of the seq_bound test",
    ),
    MetricAlias(
        "waiting",
        ("num_requests_waiting",),
        "gauge",
        "V0 0.4.1-0.10.2; V1 0.7.1+ (includes deferred requests from 0.20)",
        "the queue: every saturation state starts from waiting > 0",
    ),
    MetricAlias(
        "waiting_capacity",
        ("num_requests_waiting_by_reason",),
        "gauge",
        'V1 0.20+, series with reason="capacity"',
        "only capacity waiting counts toward memory_bound (docs/contracts.md, Saturation)",
        ("reason",),
    ),
    MetricAlias(
        "waiting_deferred",
        ("num_requests_waiting_by_reason",),
        "gauge",
        'V1 0.20+, series with reason="deferred"',
        "requests held back by LoRA budget / KV transfer: waiting, but not for KV memory",
        ("reason",),
    ),
    MetricAlias(
        "swapped",
        ("num_requests_swapped",),
        "gauge",
        "V0 0.4.1-0.8.0 (hidden 0.8.2-0.9.0, removed 0.9.1); never in V1",
        "V0 swap preemption parks requests on the CPU: they hold no GPU KV",
    ),
    MetricAlias(
        "kv_usage_ratio",
        ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
        "gauge",
        "kv_cache_usage_perc: V1 0.9.2+. gpu_cache_usage_perc: V0 0.4.1-0.10.2, V1 0.7.1-0.10.2 "
        "(hidden 0.11, removed 0.12)",
        "the KV pool fill 0..1; 0.9.2-0.11 expose both (same value), the new name wins",
    ),
    MetricAlias(
        "preemptions_total",
        ("num_preemptions",),
        "counter",
        "V0 0.4.3-0.10.2; V1 0.8.0+ (declared without _total from 0.9.0, exposed the same)",
        "V1 logs no line per preemption: this counter is the only complete count",
    ),
    MetricAlias(
        "prefix_cache_queries_total",
        ("prefix_cache_queries", "gpu_prefix_cache_queries"),
        "counter",
        "prefix_cache_queries: V1 0.9.2+. gpu_prefix_cache_queries: V1 0.7.3-0.10.2 (hidden 0.11, "
        "removed 0.12); its 0.7.x help text counts blocks, later tokens",
        "with hits, the prefix-cache hit ratio (a ratio of the same unit either way)",
    ),
    MetricAlias(
        "prefix_cache_hits_total",
        ("prefix_cache_hits", "gpu_prefix_cache_hits"),
        "counter",
        "as prefix_cache_queries_total",
        "see prefix_cache_queries_total",
    ),
    MetricAlias(
        "prompt_tokens_total", ("prompt_tokens",), "counter", "V0 0.4.1-0.10.2; V1 0.7.1+", "prefill token throughput"
    ),
    MetricAlias(
        "generation_tokens_total",
        ("generation_tokens",),
        "counter",
        "V0 0.4.1-0.10.2; V1 0.7.1+",
        "decode token throughput",
    ),
    MetricAlias(
        "request_prompt_tokens",
        ("request_prompt_tokens",),
        "histogram",
        "V0 0.4.3-0.10.2; V1 0.7.1+",
        "per-request prompt length: half of the observed KV footprint of one request",
    ),
    MetricAlias(
        "request_generation_tokens",
        ("request_generation_tokens",),
        "histogram",
        "V0 0.4.3-0.10.2; V1 0.7.1+",
        "per-request output length: the other half of the footprint",
    ),
    MetricAlias(
        "request_num_preemptions",
        ("request_num_preemptions",),
        "histogram",
        "V1 0.30+",
        "how often one request was preempted (recompute cost per request)",
    ),
    MetricAlias(
        "ttft_seconds",
        ("time_to_first_token_seconds",),
        "histogram",
        "V0 0.4.1-0.10.2; V1 0.7.1+",
        "time to first token: analyze's latency.ttft_s (queueing and preemption show here first)",
    ),
    MetricAlias(
        "e2e_latency_seconds",
        ("e2e_request_latency_seconds",),
        "histogram",
        "V0 0.4.1-0.10.2; V1 0.7.1+ (observed once per finished request, vllm/v1/metrics/loggers.py "
        "PrometheusStatLogger.record)",
        "end-to-end latency: analyze's latency.e2e_s, where preemption's recompute cost lands",
    ),
    MetricAlias(
        "queue_time_seconds",
        ("request_queue_time_seconds",),
        "histogram",
        "V0 0.6.x-0.10.2; V1 0.8.0+ (FinishedRequestStats.queued_time)",
        "time spent waiting: analyze's latency.queue_s, the cost of a memory-bound queue",
    ),
    MetricAlias(
        "cache_config",
        ("cache_config_info",),
        "info",
        "V0 0.4.1+ (an Info 'vllm:cache_config' until 0.5.5, same exposed name); V1 0.7.3+ with "
        "an engine label, filled in after start-up from 0.9.0",
        "block_size, num_gpu_blocks, kv_cache_size_tokens ...: the pool as vLLM sized it",
    ),
)

IGNORED_METRICS: tuple[tuple[tuple[str, ...], str], ...] = (
    # (stems, why kvwatch does not read them). A name in neither table is reported as uncatalogued.
    (("cpu_cache_usage_perc",), "V0 swap-space usage (0.4.1-0.9.0): not the KV pool; analyze reads it from logs"),
    (
        ("gpu_prefix_cache_hit_rate", "cpu_prefix_cache_hit_rate"),
        "V0 0.5.5-0.9.0 rate gauges; hit ratios are derived from the query/hit counters instead",
    ),
    (
        ("external_prefix_cache_queries", "external_prefix_cache_hits", "mm_cache_queries", "mm_cache_hits"),
        "V1 0.11.1+ connector / multimodal caches: not the GPU KV pool",
    ),
    (
        (
            "prompt_tokens_by_source",
            "prompt_tokens_cached",
            "prompt_tokens_cached_by_source",
            "prompt_tokens_recomputed",
        ),
        "V1 0.16+ breakdowns of prompt_tokens; the total is read",
    ),
    (
        (
            "iteration_tokens_total",
            "request_max_num_generation_tokens",
            "request_params_n",
            "request_params_max_tokens",
            "request_params_best_of",
            "request_prefill_kv_computed_tokens",
        ),
        "batch and sampling-parameter histograms: not needed for KV capacity",
    ),
    (
        (
            "time_per_output_token_seconds",
            "inter_token_latency_seconds",
            "request_time_per_output_token_seconds",
            "request_prefill_time_seconds",
            "request_decode_time_seconds",
            "request_inference_time_seconds",
        ),
        "per-token and phase latency histograms: vLLM's own dashboards plot them; analyze reads TTFT, "
        "end-to-end and queue time (the rows above)",
    ),
    (("request_success",), "finished requests by reason: throughput, not capacity"),
    (
        ("kv_block_lifetime_seconds", "kv_block_idle_before_evict_seconds", "kv_block_reuse_gap_seconds"),
        "V1 0.12+ opt-in (--kv-cache-metrics) sampled block residency: not needed for fill or preemption",
    ),
    (("num_requests_kv_fetch_by_stage",), "V1 0.32+ KV-consumer (disaggregated) fetch stages"),
    (("engine_sleep_state",), "V1 0.11.1+ sleep mode: not a capacity signal"),
    (("admission_rejections",), "API-server queue limits (no engine label): not a KV capacity signal"),
    (("corrupted_requests",), "V1 0.11.1+ NaN-logit requests (VLLM_COMPUTE_NANS_IN_LOGITS)"),
    (("lora_requests_info",), "LoRA adapter bookkeeping"),
    (
        (
            "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens",
            "spec_decode_num_accepted_tokens_per_pos",
            "spec_decode_draft_acceptance_rate",
            "spec_decode_efficiency",
            "spec_decode_num_emitted_tokens",
        ),
        "speculative decoding acceptance",
    ),
    (
        ("estimated_flops_per_gpu", "estimated_read_bytes_per_gpu", "estimated_write_bytes_per_gpu"),
        "V1 MFU estimates: compute, not KV capacity",
    ),
    (
        (
            "avg_prompt_throughput_toks_per_s",
            "avg_generation_throughput_toks_per_s",
            "model_forward_time_milliseconds",
            "model_execute_time_milliseconds",
            "time_in_queue_requests",
            "tokens",
        ),
        "V0-only throughput/timing series (0.4.1-0.9.0); the token counters are read instead",
    ),
)

_SERIES_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")

_ALIAS_BY_STEM: dict[str, list[MetricAlias]] = {}
for _alias in METRIC_ALIASES:
    for _stem in _alias.stems:
        _ALIAS_BY_STEM.setdefault(_stem, []).append(_alias)
_IGNORED_STEMS = frozenset(stem for stems, _why in IGNORED_METRICS for stem in stems)


def split_prefix(name: str) -> tuple[str, str] | None:
    """``("vllm:", "num_requests_running")`` for a vLLM series name; None for anything else."""
    for prefix, _why in PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix) :]
    return None


def catalogue_status(name: str) -> Literal["read", "ignored"] | None:
    """Whether a vLLM series or family name is read, deliberately ignored, or unknown (None).

    Accepts exposed sample names (``vllm:iteration_tokens_total_bucket``, ``..._created``) and
    family names from HELP/TYPE lines. Non-vLLM names (``process_*``, ``python_*``) return None.
    """
    split = split_prefix(name)
    if split is None:
        return None
    stem = split[1]
    for _ in range(3):  # e.g. iteration_tokens_total_bucket -> iteration_tokens_total -> iteration_tokens
        if stem in _ALIAS_BY_STEM:
            return "read"
        if stem in _IGNORED_STEMS:
            return "ignored"
        for suffix in _SERIES_SUFFIXES:
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        else:
            return None
    return None


def exposed_names(alias: MetricAlias, prefix: str = "vllm:") -> tuple[str, ...]:
    """The family names a row is exposed under (counters with ``_total``, as prometheus_client does)."""
    suffix = "_total" if alias.kind == "counter" else ""
    return tuple(f"{prefix}{stem}{suffix}" for stem in alias.stems)


def vllm_series(uses: dict[str, str]) -> dict[str, str]:
    """Name -> "why it is used" for vLLM series a dashboard or rule reads, checked against the table.

    Raises ValueError naming the series when the table has no row for it: a dashboard must not
    query a vLLM name kvwatch has not catalogued (with its versions and why).
    """
    unknown = sorted(name for name in uses if catalogue_status(name) is None)
    if unknown:
        raise ValueError(
            f"vLLM series {', '.join(unknown)} not in kvwatch/parse/metricnames.py; add a row (versions, why) first"
        )
    return dict(uses)
