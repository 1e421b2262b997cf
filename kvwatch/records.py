"""The records passed between stages, defined once.

Parsers produce them from text; the analyzer, the sidecar's reconciler and the exporter consume
them. They are frozen and small. Add fields at the end with a default; never rename one (the JSON
documents in docs/contracts.md are built from them).

Privacy: no record carries request content. A parser that sees a "Received request ... prompt:"
line produces nothing from it (at most a count of request lines).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

# --------------------------------------------------------------------------------------------
# Log records (kvwatch.parse.log)
# --------------------------------------------------------------------------------------------


# LogTime and StatsRecord are NamedTuples, not frozen dataclasses like the records below: a big log
# has one of each per stats record (tens of thousands per GB). A NamedTuple is built from a plain
# tuple at C speed (tuple.__new__; worker processes send plain tuples, kvwatch.parse.log.StatsRow)
# and its fields read at C speed; a frozen slots dataclass sets every field through
# object.__setattr__. Both are immutable and keep their field names, defaults and methods;
# compare them only with records of their own type (a NamedTuple equals a plain tuple).

_DAYS_BEFORE_MONTH = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)  # a non-leap year


class LogTime(NamedTuple):
    """A timestamp as a vLLM log states it.

    vLLM's own stamp is ``MM-DD HH:MM:SS`` with no year and no zone; an outer docker/kubectl
    RFC3339 stamp, when present, is complete. ``iso`` renders what is known and nothing more.
    """

    month: int
    day: int
    hour: int
    minute: int
    second: float
    year: int | None = None
    tz: str | None = None  # e.g. "Z" or "+08:00", only from an outer RFC3339 stamp

    def iso(self) -> str:
        """ISO-8601; ``--MM-DDTHH:MM:SS`` (the year-less ISO form) when the log gives no year."""
        whole = int(self.second)
        frac = f"{self.second - whole:.6f}"[1:].rstrip("0").rstrip(".")
        sec = f"{whole:02d}{frac}"
        date = f"{self.year:04d}-{self.month:02d}-{self.day:02d}" if self.year else f"--{self.month:02d}-{self.day:02d}"
        return f"{date}T{self.hour:02d}:{self.minute:02d}:{sec}{self.tz or ''}"

    def seconds(self) -> float:
        """Seconds since the start of a nominal year: for differences between nearby records."""
        # Month lengths of a non-leap year; differences across a month end are exact, across a
        # year end (no year in the log) they are not, which only matters to a 31-Dec log.
        # Unpacked, and the month clamped without calls: analyze computes this for every stats
        # record, and it was a tenth of the main process's fold of a big log.
        month, day, hour, minute, second = self[:5]
        doy = _DAYS_BEFORE_MONTH[(month if 1 <= month <= 12 else 1 if month < 1 else 12) - 1] + day - 1
        return ((doy * 24 + hour) * 60 + minute) * 60 + second


class StatsRecord(NamedTuple):
    """One periodic stats record ("Avg prompt throughput: ..."), V0 or V1.

    Percentages are as printed (0..100). None means the record did not state the value.
    """

    line: int  # 1-based physical line number where the record starts
    ts: LogTime | None
    engine: int | None  # the int after "Engine", None for V0 / no engine prefix
    engines_aggregated: int | None  # "N Engines Aggregated:"
    running: int | None
    waiting: int | None
    swapped: int | None = None
    deferred: int | None = None
    preemptions: int | None = None  # V1 "Preemptions: N" (count within the interval)
    kv_usage_pct: float | None = None  # GPU KV cache usage, or "<DEVICE> KV cache usage"
    cpu_kv_usage_pct: float | None = None  # only V0's second "CPU KV cache usage" (swap space)
    prefix_hit_pct: float | None = None
    external_prefix_hit_pct: float | None = None
    mm_cache_hit_pct: float | None = None
    prompt_tps: float | None = None
    gen_tps: float | None = None
    device: str | None = None  # "gpu", "cpu", "xpu" ... from "<DEVICE> KV cache usage"
    source: str | None = None  # the log file this came from (analyze over many inputs)
    # Logged at DEBUG. vLLM's stats logger drops to DEBUG only when this interval AND the one before
    # had no prompt and no generation tokens (V1 v1/metrics/loggers.py LoggingStatLogger.log, read in
    # 0.11.0; engine_is_idle in later versions; V0 engine/metrics.py LoggingStatLogger.log likewise:
    # "Avoid log noise on an idle production system"), so such a record stands for two tokenless
    # intervals, the first of which an INFO-level log never shows.
    debug_level: bool = False


@dataclass(frozen=True, slots=True)
class PrefixHitRecord:
    """V0's separate "Prefix cache hit rate: GPU: X%, CPU: Y%" record (0.5.5-0.10.2)."""

    line: int
    ts: LogTime | None
    gpu_pct: float
    cpu_pct: float | None


@dataclass(frozen=True, slots=True)
class FactRecord:
    """One startup/config fact: ``field`` is a dotted path of the analyze document.

    e.g. ``FactRecord(12, ts, "capacity.gpu_blocks", 1478)`` or ``("config.max_seq_len", 29000)``.
    The analyze document keeps the last value seen of each field; ``engine`` is the data-parallel
    rank whose own process printed it (None: the API server, a single engine, or not named), so
    that facts are kept per (server run, engine) (kvwatch.reconcile.facts.FactsBuilder).
    """

    line: int
    ts: LogTime | None
    field: str
    value: str | int | float | bool | None
    engine: int | None = None


@dataclass(frozen=True, slots=True)
class RunStartRecord:
    """A new server start (a startup block after stats or after another startup block)."""

    line: int
    ts: LogTime | None
    reason: str  # which line kind marked it, e.g. "version_banner"


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """V0 "Sequence group ... is preempted by PreemptionMode.X mode ..." warning."""

    line: int
    ts: LogTime | None
    mode: Literal["recompute", "swap"] | None
    cumulative: int | None  # total_num_cumulative_preemption


ErrorKind = Literal["kv_insufficient", "no_kv_memory", "oom", "engine_dead", "startup_memory", "other"]


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """A capacity error, OOM or engine death. ``message`` is vLLM's own text, never request content."""

    line: int
    ts: LogTime | None
    kind: ErrorKind
    message: str


LogRecord = StatsRecord | PrefixHitRecord | FactRecord | RunStartRecord | PreemptionRecord | ErrorRecord


# --------------------------------------------------------------------------------------------
# /metrics records (kvwatch.parse.metrics)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistogramSummary:
    """A cumulative histogram as scraped: bucket upper bounds with cumulative counts."""

    count: float | None
    sum: float | None
    buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), sorted, +Inf last

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile over these buckets (linear within a bucket)."""
        from kvwatch.histogram import bucket_quantile  # local: keep records import-light

        return bucket_quantile(q, self.buckets)


@dataclass(frozen=True, slots=True)
class EngineSample:
    """What one scrape says about one (model_name, engine). Absent metrics are None, never 0."""

    model_name: str | None
    engine: str | None
    running: float | None = None
    waiting: float | None = None
    waiting_capacity: float | None = None
    waiting_deferred: float | None = None
    swapped: float | None = None
    kv_usage_ratio: float | None = None
    kv_usage_metric: str | None = None  # which vLLM name supplied kv_usage_ratio
    preemptions_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_prompt_tokens: HistogramSummary | None = None
    request_generation_tokens: HistogramSummary | None = None
    request_num_preemptions: HistogramSummary | None = None
    ttft_seconds: HistogramSummary | None = None  # vllm:time_to_first_token_seconds
    e2e_latency_seconds: HistogramSummary | None = None  # vllm:e2e_request_latency_seconds
    queue_time_seconds: HistogramSummary | None = None  # vllm:request_queue_time_seconds


@dataclass(frozen=True, slots=True)
class TimingSeries:
    """The counters that time a run (kvwatch.parse.scrapeseries.TIMING_SERIES), summed over one
    exposition's label sets; None where the series is absent."""

    steps: float | None = None
    step_tokens: float | None = None
    generation_tokens: float | None = None
    finished: float | None = None
    e2e_count: float | None = None
    e2e_sum: float | None = None
    ttft_count: float | None = None
    ttft_sum: float | None = None


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One /metrics exposition, normalised across vLLM versions."""

    engines: tuple[EngineSample, ...]
    cache_config: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    # cache_config_info per engine label ("0", "1", ...; "" when unlabelled), for DP servers
    cache_config_by_engine: dict[str, dict[str, str | int | float | bool | None]] = field(default_factory=dict)
    skipped_lines: int = 0  # lines that could not be read unambiguously (reported, not fatal)
    skipped_examples: tuple[str, ...] = ()  # first few reasons, for the report (no sample values)
    # Set by a reader that also times the run (the sidecar's, for its what-if simulation).
    timing: TimingSeries | None = None
