"""vLLM ``/metrics`` exposition text -> :class:`~kvwatch.records.MetricsSnapshot` (pure).

This module owns the one table of vLLM metric names kvwatch reads (:data:`METRIC_ALIASES`, old
and new names side by side), the names it deliberately ignores (:data:`IGNORED_METRICS`), the
repair of expositions damaged by pasting, and the typing of ``vllm:cache_config_info`` labels.

The text is read with ``prometheus_client.parser.text_string_to_metric_families``. That parser
gives up on the first bad line, so damage a paste leaves behind is repaired first (see
:func:`repair_exposition`) and, when the parser still fails, the text is checked line by line so
one bad line costs that line only. Lines that cannot be read unambiguously are counted and
described (line number and reason, never the line's content) in ``skipped_lines`` /
``skipped_examples``.

No files, network or clock here: sources hand in text, commands and the sidecar render results.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from kvwatch.records import EngineSample, HistogramSummary, MetricsSnapshot

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
    versions: str  # which vLLM versions expose each stem (docs: shared/reference/vllm-formats.md, 6.2)
    why: str


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
        "only capacity waiting counts toward memory_bound (CONTRACTS.md, Saturation)",
    ),
    MetricAlias(
        "waiting_deferred",
        ("num_requests_waiting_by_reason",),
        "gauge",
        'V1 0.20+, series with reason="deferred"',
        "requests held back by LoRA budget / KV transfer: waiting, but not for KV memory",
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


# --------------------------------------------------------------------------------------------
# Repairing pasted expositions
# --------------------------------------------------------------------------------------------

_METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_BLOCKQUOTE = re.compile(r"^(?:>\s?)+")  # GitHub/Markdown quote markers, possibly nested
# "# HELP"/"# TYPE" rendered as a Markdown heading and copied back loses its "#" (or gains more):
_BARE_META = re.compile(rf"^#*\s*(HELP|TYPE)\s+({_METRIC_NAME})(\s.*)?$")
_TYPE_WORDS = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "info", "stateset", "gaugehistogram", "unknown"}
)
_FENCE = re.compile(r"^(```|~~~)")
# A Prometheus query result copied from its web UI's table into Markdown: 'series | value' rows,
# optionally '| series | value |', and a '-- | --' separator row (vLLM PR 24049, 0.10.2, eight
# data-parallel engines). The series part must end the label set (or be a bare name) right
# before the bar, so a '|' inside a label value never matches.
_TABLE_ROW = re.compile(rf"^\|?\s*({_METRIC_NAME}(?:\{{.*\}})?)\s*\|\s*([-+]?[0-9.eE+-]+|NaN|[-+]?Inf)\s*\|?$")
_TABLE_RULE = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?$")
# A Markdown list item ('- vllm:num_requests_running{...} 3', '* # HELP ...'): no exposition
# line starts with a list marker, so it is dropped when a metric name or '#' follows it.
_LIST_MARKER = re.compile(rf"^[-*+]\s+(?=#|{_METRIC_NAME}(?:\{{|\s))")
_NAME_START = re.compile(rf"^({_METRIC_NAME})")
_MAX_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class RepairedLine:
    """One line after repair: its 1-based number in the input, and the text to parse (or a skip)."""

    number: int
    text: str
    skip_reason: str | None = None


def repair_exposition(text: str) -> list[RepairedLine]:
    """Undo damage that pasting does, where the intent is unambiguous.

    - ``> `` blockquote markers (nested too) are removed: no exposition line starts with ``>``.
    - ``HELP name ...`` / ``TYPE name kind`` without ``#`` (a Markdown heading copied back), or
      with ``##``, become comments again: a sample line can never read ``HELP name text``.
    - Code fences and inline-code backticks around a whole line are removed.
    - Markdown table rows ``series | value`` (a Prometheus UI table copied into an issue) become
      ``series value``; the table's ``-- | --`` rule is dropped.
    - A Markdown list marker (``- ``, ``* ``, ``+ ``) before a sample or comment is dropped.
    - CR/CRLF endings and surrounding whitespace are dropped.

    Everything else is left for the parser; nothing is guessed. (Later, only for lines the parser
    rejects: lines a terminal hard-wrapped are glued back and curly quotes / non-breaking spaces
    from a rich-text copy straightened, each only where the result then reads.)
    """
    out: list[RepairedLine] = []
    for number, raw in enumerate(text.replace("\r\n", "\n").replace("\r", "\n").split("\n"), start=1):
        line = raw.strip().lstrip("\ufeff")
        line = _BLOCKQUOTE.sub("", line).strip()
        if _FENCE.match(line) or _TABLE_RULE.match(line):
            continue
        if len(line) > 1 and line.startswith("`") and line.endswith("`"):
            line = _BLOCKQUOTE.sub("", line.strip("`").strip()).strip()
        line = _LIST_MARKER.sub("", line)
        row = _TABLE_ROW.match(line)
        if row:
            line = f"{row.group(1)} {row.group(2)}"
        meta = _BARE_META.match(line)
        # a bare "HELP word ..." is prose unless the word looks like a metric name (has _ or :)
        if meta and not line.startswith("# ") and re.search(r"[_:]", meta.group(2)):
            keyword, name, rest = meta.group(1), meta.group(2), (meta.group(3) or "").strip()
            if keyword == "TYPE" and rest not in _TYPE_WORDS:
                out.append(RepairedLine(number, "", "TYPE line without a known metric type"))
                continue
            line = f"# {keyword} {name} {rest}".rstrip()
        out.append(RepairedLine(number, line))
    return out


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """One parsed sample: exposed name, labels, value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class ExpositionReading:
    """Everything one read of an exposition yields; :func:`parse_exposition` returns ``snapshot``.

    ``vllm_names`` lists every vLLM family or sample name seen (also HELP/TYPE-only families), so
    a caller can tell "a vLLM exposition with no samples yet" from "not vLLM at all".
    ``uncatalogued`` are vLLM names in neither :data:`METRIC_ALIASES` nor :data:`IGNORED_METRICS`.
    """

    snapshot: MetricsSnapshot
    vllm_names: frozenset[str] = frozenset()
    uncatalogued: tuple[str, ...] = ()
    lines: int = 0


def parse_exposition(text: str) -> MetricsSnapshot:
    """Read one vLLM ``/metrics`` exposition (any version, V0/V1, ``vllm:``/``ray_vllm:``).

    One EngineSample per (model_name, engine) pair, sorted by engine; absent metrics are None.
    Damaged lines are skipped and counted, never fatal.
    """
    return read_exposition(text).snapshot


def read_exposition(text: str) -> ExpositionReading:
    """:func:`parse_exposition` plus what a command needs to judge and report the input."""
    samples, declared, skipped = _read_samples(text)
    names = set(declared)
    names.update(s.name for s in samples)
    vllm_names = frozenset(n for n in names if split_prefix(n) is not None)
    uncatalogued = tuple(sorted(n for n in vllm_names if catalogue_status(n) is None))
    vllm_samples = [s for s in samples if split_prefix(s.name) is not None]
    by_engine, by_engine_config, duplicates = _collect(vllm_samples)
    reasons = [reason for _n, reason in skipped] + duplicates
    snapshot = MetricsSnapshot(
        engines=by_engine,
        cache_config=_top_level_config(by_engine_config),
        cache_config_by_engine=by_engine_config,
        skipped_lines=len(skipped),
        skipped_examples=tuple(reasons[:_MAX_EXAMPLES]),
    )
    return ExpositionReading(snapshot, vllm_names, uncatalogued, len(text.splitlines()))


def _read_samples(text: str) -> tuple[list[Sample], set[str], list[tuple[int, str]]]:
    """Samples, declared family names and skipped (line, reason) pairs of the repaired text."""
    repaired = repair_exposition(text)
    skipped = [(ln.number, f"line {ln.number}: {ln.skip_reason}") for ln in repaired if ln.skip_reason]
    good = [ln for ln in repaired if not ln.skip_reason]
    try:
        samples, declared = _parse_block("\n".join(ln.text for ln in good))
    except Exception:  # the parser raises ValueError, IndexError, TypeError ... on bad lines
        kept: list[RepairedLine] = []
        in_help = False  # the previous line was a HELP line or a piece of its wrapped text
        i = 0
        while i < len(good):
            ln = good[i]
            reason = _line_problem(ln.text)
            if reason is None:
                kept.append(ln)
                in_help = ln.text.startswith("# HELP ")
                i += 1
                continue
            fixed = _repaired_line(ln.text)
            if fixed is not None:
                kept.append(RepairedLine(ln.number, fixed))
                in_help = fixed.startswith("# HELP ")
                i += 1
                continue
            rejoined = _rejoin_wrapped(good, i)
            if rejoined is not None:
                kept.append(rejoined[0])
                in_help = False
                i += rejoined[1]
                continue
            previous = kept[-1] if kept else None
            if previous is not None and not previous.text.startswith("#") and not in_help:
                glued = previous.text + ln.text
                if _line_problem(glued) is None:
                    # a sample wrapped inside its value ("... 1.79596" / "23446205237e+09"): the
                    # first piece read on its own, the second cannot, together they read as one
                    kept[-1] = RepairedLine(previous.number, glued)
                    i += 1
                    continue
            if not in_help:
                skipped.append((ln.number, f"line {ln.number}: {reason}"))
            # else: the rest of a wrapped HELP text (documentation, not data), dropped unreported
            i += 1
        try:
            samples, declared = _parse_block("\n".join(ln.text for ln in kept))
        except Exception:  # lines fine alone but not together: read each alone
            samples, declared = [], set()
            for ln in kept:
                more, names = _parse_block(ln.text)
                samples += more
                declared |= names
    skipped.sort()
    return samples, declared, skipped


def _parse_block(text: str) -> tuple[list[Sample], set[str]]:
    samples: list[Sample] = []
    declared: set[str] = set()
    for family in text_string_to_metric_families(text + "\n"):
        declared.add(family.name)
        for s in family.samples:
            samples.append(Sample(s.name, dict(s.labels), float(s.value)))
    # HELP/TYPE names as written (the parser strips "_total" off counter family names)
    for line in text.split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3:
                declared.add(parts[2])
    return samples, declared


_TYPOGRAPHY = str.maketrans(
    {
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u2033": '"',
        "\u00a0": " ",
        "\u2009": " ",
        "\u202f": " ",
        "\u200b": None,
        "\u2060": None,
    }
)
_SAMPLE_START = re.compile(rf"^{_METRIC_NAME}(\{{|\s|$)")
_SAMPLE_NAME = re.compile(rf"^({_METRIC_NAME})(?:\{{|\s)")
# Label sets a user shortened with "..." (or "…") in place of labels: '{...,reason="capacity"}',
# '{block_size="16", ...}' (vllm-metal issue 479, vLLM issue 42966). Not exposition syntax, but
# what the remaining labels state is unambiguous.
_ELIDED_SAMPLE = re.compile(rf"^({_METRIC_NAME})\{{(.*)\}}(\s+\S+.*)?$")
_ELISION = re.compile(r"(?:^|,)\s*(?:\.\.\.|\u2026)\s*(?=,|$)")
# ... or cut short with a trailing "..." where the line grew too long to show whole, which for
# the 1-2 KB cache_config_info is common: 'vllm:cache_config_info{block_size="16",...'.
_ELIDED_TAIL = re.compile(rf"^({_METRIC_NAME}_info)\{{(.*?)\s*,?\s*(?:\.\.\.|\u2026)\s*\}}?\s*$")
ELIDED_LABEL = "kvwatch_elided"  # marks a sample whose label set was shortened; see _collect
_MAX_WRAP_PIECES = 40  # a 1,500-character cache_config_info line wrapped at 40 columns


def _rejoin_wrapped(lines: list[RepairedLine], start: int) -> tuple[RepairedLine, int] | None:
    """A sample or TYPE line hard-wrapped by a terminal, glued back: (line, pieces used) or None.

    Long lines (``vllm:cache_config_info`` is 1-2 KB) arrive cut into pieces with newlines where
    the terminal wrapped them. The pieces are joined only when the first piece is an unreadable
    sample start, no later piece is a readable line or comment of its own, and the joined text
    reads as one sample; otherwise nothing is guessed and the pieces are skipped.
    """
    first = lines[start].text
    if not (_SAMPLE_START.match(first) or first.startswith("# TYPE ")):
        return None
    text = first
    for j in range(start + 1, min(start + _MAX_WRAP_PIECES, len(lines))):
        piece = lines[j].text
        if not piece:
            # a blank line inside a cut sample: users split a long cache_config_info around the
            # label they report (vLLM issue 16560, 0.8.x, 'num_gpu_blocks="None"' set apart by
            # blank lines), and Markdown renderers add blank lines between wrapped pieces. It
            # joins nothing; the joined text must still read as one sample.
            continue
        if piece.startswith("#") or _line_problem(piece) is None or _starts_vllm_sample(piece):
            return None
        text += piece
        readable = _readable_form(text)
        if readable is not None:
            return RepairedLine(lines[start].number, readable), j - start + 1
    return None


def _plain_forms(line: str) -> list[str]:
    """``line`` with paste typography undone, then also JSON (``\\"``) or HTML (``&quot;``)
    escaping, each a candidate only when it differs from the line."""
    straight = line.translate(_TYPOGRAPHY)
    forms = [straight, straight.replace('\\"', '"'), html.unescape(straight)]
    return [f for i, f in enumerate(forms) if f != line and f not in forms[:i]]


def _starts_vllm_sample(piece: str) -> bool:
    """Whether a piece begins a sample of its own (a vLLM name, then labels or a value)."""
    match = _SAMPLE_NAME.match(piece)
    return match is not None and split_prefix(match.group(1)) is not None


def _readable_form(text: str) -> str | None:
    """``text`` as it reads: itself, or as a table row or elided label set would; else None.

    The name must be a whole metric name: prometheus_client's parser also takes names with dots
    in them, which a stray piece glued in front ('ime_to...vllm:...') would otherwise make.
    """
    if not _SAMPLE_NAME.match(text) and not text.startswith("# TYPE "):
        return None
    if _line_problem(text) is None:
        return text
    return _repaired_line(text)


def _repaired_line(line: str) -> str | None:
    """``line`` as it reads once what a paste did to it alone is undone, else None.

    In order: curly quotes and no-break spaces of a rich-text copy, or JSON (``\\"``) or HTML
    (``&quot;``) escaping; then, on the line or those forms, a Markdown table row or a label set
    elided with ``...``. Each is used only when the result then reads.
    """
    for plain in _plain_forms(line):
        if _line_problem(plain) is None:
            return plain
    for form in (line, *_plain_forms(line)):
        row = _TABLE_ROW.match(form)
        if row and _line_problem(f"{row.group(1)} {row.group(2)}") is None:
            return f"{row.group(1)} {row.group(2)}"
        unelided = _unelide(form)
        if unelided is not None and _line_problem(unelided) is None:
            return unelided
    return None


def _unelide(line: str) -> str | None:
    """A sample line with its ``...`` label placeholders removed and :data:`ELIDED_LABEL` added.

    None when the line has no placeholder. Only lines the parser rejects get here, and the result
    is used only when it then reads. Which engine the sample belonged to is settled in
    :func:`_collect`, from the other samples.
    """
    match = _ELIDED_SAMPLE.match(line)
    if match is None:
        tail = _ELIDED_TAIL.match(line)
        if tail is None:
            return None
        name, labels = tail.groups()
        labels = labels.strip().rstrip(",")
        kept = f'{labels},{ELIDED_LABEL}="1"' if labels else f'{ELIDED_LABEL}="1"'
        return f"{name}{{{kept}}} 1"
    name, labels, rest = match.groups()
    kept = _ELISION.sub("", labels).strip().lstrip(",").strip()
    if kept == labels.strip():
        return None
    if rest is None:
        if not name.endswith("_info"):
            return None
        rest = " 1"  # an *_info series is 1 by definition; the shortened paste dropped it
    kept = f'{kept},{ELIDED_LABEL}="1"' if kept else f'{ELIDED_LABEL}="1"'
    return f"{name}{{{kept}}}{rest}"


def _line_problem(line: str) -> str | None:
    """Why one line cannot be read on its own, or None when it can."""
    try:
        list(text_string_to_metric_families(line + "\n"))
    except Exception:  # see _read_samples
        name = _NAME_START.match(line)
        if line.startswith("#"):
            return "malformed HELP/TYPE line"
        if name and split_prefix(name.group(1)) is not None:
            return f"unreadable sample of {name.group(1)} (damaged labels or value)"
        return "not an exposition line"
    return None


_IDENTITY_LABELS = ("model_name", "engine")
_SERIES_LABELS = ("le", "reason")  # labels that tell the series of one alias row apart


@dataclass(slots=True)
class _Histogram:
    """Mutable parts of one histogram while samples arrive."""

    rank: int
    buckets: dict[float, float] = field(default_factory=dict)
    sum: float | None = None
    count: float | None = None


@dataclass(slots=True)
class _EngineBuilder:
    """Mutable accumulator for one (model_name, engine); frozen into an EngineSample at the end."""

    values: dict[str, tuple[int, float]] = field(default_factory=dict)  # field -> (rank, value)
    kv_metric: str | None = None
    histograms: dict[str, _Histogram] = field(default_factory=dict)


ConfigValues = dict[str, str | int | float | bool | None]


def _collect(samples: list[Sample]) -> tuple[tuple[EngineSample, ...], dict[str, ConfigValues], list[str]]:
    """Group vLLM samples by (model_name, engine) into EngineSamples, and cache_config_info by engine."""
    builders: dict[tuple[str | None, str | None], _EngineBuilder] = {}
    configs: dict[str, ConfigValues] = {}
    duplicates: list[str] = []
    seen: set[tuple[str | None, ...]] = set()
    prefix_order = [p for p, _why in PREFIXES]
    only_engine = _only_engine(samples)

    for s in samples:
        prefix, stem = split_prefix(s.name) or ("", s.name)
        model, engine = s.labels.get("model_name"), s.labels.get("engine")
        if ELIDED_LABEL in s.labels:
            # a label set shortened with "...": the identity labels it lost are those of the one
            # engine the other samples name; with several engines it is not guessed
            if only_engine is not None:
                model = model if model is not None else only_engine[0]
                engine = engine if engine is not None else only_engine[1]
            elif stem != "cache_config_info" and (model is None or engine is None):
                duplicates.append(f"{s.name}: labels elided with '...' and several engines: which one is unknown")
                continue
        if stem == "cache_config_info":
            key = engine if engine is not None else ""
            if key not in configs:  # several replicas (Ray) under one engine label: keep the first
                configs[key] = type_cache_config(s.labels)
            continue
        if stem.endswith("_info"):  # metadata gauges at 1 (lora_requests_info ...) name no engine
            continue
        builder = builders.setdefault((model, engine), _EngineBuilder())
        match = _match(stem, s.labels)
        if match is None:
            continue
        alias, stem_rank, part = match
        series = (s.name, model, engine, *(s.labels.get(k) for k in _SERIES_LABELS))
        if series in seen:
            extra = sorted(
                k for k in s.labels if k not in _IDENTITY_LABELS and k not in _SERIES_LABELS and k != ELIDED_LABEL
            )
            duplicates.append(
                f"{s.name}: several series for model_name={model!r} engine={engine!r} "
                f"(other labels: {', '.join(extra) or 'none'}); kept the first, nothing summed"
            )
            continue
        seen.add(series)
        # newer stem first, then vllm: before ray_vllm: when both describe the same engine
        rank = stem_rank * len(prefix_order) + prefix_order.index(prefix)
        if alias.kind == "histogram":
            _add_histogram(builder, alias.field, rank, part, s)
        else:
            _add_value(builder, alias.field, rank, s.value, s.name)

    return _finish(builders), configs, duplicates


def _only_engine(samples: list[Sample]) -> tuple[str | None, str | None] | None:
    """The (model_name, engine) of the one engine the complete samples name, or None if not one.

    Complete: not elided, not a metadata ``*_info`` gauge. API-server series without an engine
    (or model) label do not count when others carry one, as in :func:`_finish`.
    """
    pairs = {
        (s.labels.get("model_name"), s.labels.get("engine"))
        for s in samples
        if ELIDED_LABEL not in s.labels and not (split_prefix(s.name) or ("", s.name))[1].endswith("_info")
    }
    if any(engine is not None for _model, engine in pairs):
        pairs = {p for p in pairs if p[1] is not None}
    if any(model is not None for model, _engine in pairs):
        pairs = {p for p in pairs if p[0] is not None}
    return next(iter(pairs)) if len(pairs) == 1 else None


def match_series(name: str, labels: dict[str, str]) -> tuple[MetricAlias, int, str] | None:
    """(alias row, rank, histogram part) for one exposed series name and its labels, or None.

    The rank orders names that fill the same field (newer stem first, then ``vllm:`` before
    ``ray_vllm:``), as :func:`parse_exposition` does; used by readers of Prometheus' HTTP API,
    which see series, not expositions.
    """
    split = split_prefix(name)
    if split is None:
        return None
    match = _match(split[1], labels)
    if match is None:
        return None
    alias, stem_rank, part = match
    prefixes = [p for p, _why in PREFIXES]
    return alias, stem_rank * len(prefixes) + prefixes.index(split[0]), part


def _match(stem: str, labels: dict[str, str]) -> tuple[MetricAlias, int, str] | None:
    """(alias row, rank of the stem within the row, histogram part) for a sample stem, or None."""
    candidates = [(stem, "")]
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if stem.endswith(suffix):
            candidates.append((stem[: -len(suffix)], suffix))
    allowed = {"gauge": ("",), "info": ("",), "counter": ("", "_total"), "histogram": ("_bucket", "_sum", "_count")}
    for base, part in candidates:
        for alias in _ALIAS_BY_STEM.get(base, ()):
            if part not in allowed[alias.kind]:
                continue
            if alias.field == "waiting_capacity" and labels.get("reason") != "capacity":
                continue
            if alias.field == "waiting_deferred" and labels.get("reason") != "deferred":
                continue
            return alias, alias.stems.index(base), part
    return None


def _add_value(builder: _EngineBuilder, name: str, rank: int, value: float, exposed: str) -> None:
    if not math.isfinite(value):  # a NaN/Inf gauge says nothing usable: absent, never a number
        return
    current = builder.values.get(name)
    if current is None or rank < current[0]:
        builder.values[name] = (rank, value)
        if name == "kv_usage_ratio":
            builder.kv_metric = exposed


def _add_histogram(builder: _EngineBuilder, name: str, rank: int, part: str, s: Sample) -> None:
    hist = builder.histograms.get(name)
    if hist is None or rank < hist.rank:
        hist = builder.histograms[name] = _Histogram(rank)
    elif rank > hist.rank:
        return
    if part == "_bucket":
        try:
            hist.buckets[float(s.labels.get("le", ""))] = s.value
        except ValueError:
            return
    elif part == "_sum":
        hist.sum = s.value
    else:
        hist.count = s.value


def _finish(builders: dict[tuple[str | None, str | None], _EngineBuilder]) -> tuple[EngineSample, ...]:
    """EngineSamples sorted by engine.

    Every (model_name, engine) pair of a vLLM series names an engine, except API-server-level
    series: those carry no engine label while other series do (V1 ``admission_rejections``), or
    no model_name while others do. A pair with values kvwatch reads is always kept.
    """
    pairs = list(builders)
    if any(engine is not None for _model, engine in pairs):
        pairs = [p for p in pairs if p[1] is not None]
    if any(model is not None for model, _engine in pairs):
        pairs = [p for p in pairs if p[0] is not None]
    pairs += [p for p, b in builders.items() if (b.values or b.histograms) and p not in pairs]
    engines = []
    for model, engine in sorted(pairs, key=_engine_order):
        b = builders[(model, engine)]
        fields: dict[str, Any] = {name: value for name, (_rank, value) in b.values.items()}
        fields.update({name: _summary(h) for name, h in b.histograms.items()})
        engines.append(EngineSample(model_name=model, engine=engine, kv_usage_metric=b.kv_metric, **fields))
    return tuple(engines)


def _summary(hist: _Histogram) -> HistogramSummary:
    buckets = tuple(sorted(hist.buckets.items()))
    count = hist.count
    if count is None and buckets and math.isinf(buckets[-1][0]):
        count = buckets[-1][1]  # the +Inf bucket is the count when _count was cut off
    return HistogramSummary(count=count, sum=hist.sum, buckets=buckets)


def _engine_order(key: tuple[str | None, str | None]) -> tuple[int, float, str, str]:
    model, engine = key
    if engine is None:
        return (0, 0.0, "", model or "")
    return (1, float(engine) if engine.isdigit() else math.inf, engine, model or "")


# --------------------------------------------------------------------------------------------
# cache_config_info labels
# --------------------------------------------------------------------------------------------

_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")
_NOT_CONFIG = frozenset({"engine", "model_name", ELIDED_LABEL})


def type_label_value(value: str) -> str | int | float | bool | None:
    """A cache_config_info label as the Python value vLLM stringified: ``"None"`` -> None,
    ``"True"``/``"False"`` -> bool, integers and decimals -> numbers, anything else unchanged."""
    if value == "None":
        return None
    if value in ("True", "False"):
        return value == "True"
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    return value


def type_cache_config(labels: dict[str, str]) -> ConfigValues:
    """Typed labels of one ``vllm:cache_config_info`` series (without ``engine``/``model_name``)."""
    return {k: type_label_value(v) for k, v in sorted(labels.items()) if k not in _NOT_CONFIG}


def _top_level_config(by_engine: dict[str, ConfigValues]) -> ConfigValues:
    """Engine "0" (or the unlabelled V0 series, or the first engine): CONTRACTS.md cache_config."""
    for key in ("0", ""):
        if key in by_engine:
            return dict(by_engine[key])
    for key in sorted(by_engine, key=lambda e: (not e.isdigit(), int(e) if e.isdigit() else 0, e)):
        return dict(by_engine[key])
    return {}
