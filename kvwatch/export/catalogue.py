"""The one catalogue of ``kvwatch_*`` metrics: name, type, unit, help, labels.

The exporter emits exactly these (checked by a test both ways), and every dashboard query and
alert expression may use only these names or vLLM's own (checked by tests over deploy/ and
dashboards/). docs/contracts.md fixes the minimum set; rows marked ``contract=True`` are in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvwatch.reconcile.saturation import STATES as SATURATION_STATES

ENGINE_LABELS = ("model_name", "engine")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric family."""

    name: str
    type: Literal["gauge", "counter", "summary"]
    help: str
    labels: tuple[str, ...] = ()
    per_engine: bool = True  # carries model_name and engine
    contract: bool = False

    @property
    def all_labels(self) -> tuple[str, ...]:
        """Label names in exposition order."""
        return (ENGINE_LABELS if self.per_engine else ()) + self.labels


# The saturation states are defined once, in kvwatch.reconcile.saturation; re-exported here.
STATES = SATURATION_STATES

CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec(
        "kvwatch_kv_bytes_per_token",
        "gauge",
        "KV-cache bytes one token costs on one GPU; source=config (from config.json) or observed "
        "(KV memory / pool tokens from the log).",
        ("source",),
        contract=True,
    ),
    MetricSpec(
        "kvwatch_kv_pool_tokens",
        "gauge",
        "Tokens the KV-cache pool holds; source=log, metrics (cache_config_info) or config (expected).",
        ("source",),
        contract=True,
    ),
    MetricSpec(
        "kvwatch_kv_pool_bytes", "gauge", "KV-cache memory of the pool in bytes; source=log or config.", ("source",)
    ),
    # docs/contracts.md lists this as a gauge with a quantile label; promtool check metrics rejects a
    # quantile label on a non-summary, so it is typed summary (quantile samples only): same name,
    # same labels, same queries.
    MetricSpec(
        "kvwatch_request_tokens",
        "summary",
        "Observed KV footprint of one request (prompt + generation tokens) at quantile 0.5 and 0.95.",
        ("quantile",),
        contract=True,
    ),
    MetricSpec(
        "kvwatch_max_concurrency",
        "gauge",
        "Requests the pool holds at once: pool tokens / per-request tokens; basis=max_model_len or observed_p95.",
        ("basis",),
        contract=True,
    ),
    MetricSpec("kvwatch_max_num_seqs", "gauge", "vLLM's max_num_seqs (scheduler cap on running requests)."),
    MetricSpec(
        "kvwatch_observed_running_requests",
        "gauge",
        "Requests running, from /metrics when fresh, else from the log.",
        contract=True,
    ),
    MetricSpec(
        "kvwatch_observed_waiting_requests",
        "gauge",
        "Requests waiting, from /metrics when fresh, else from the log.",
        contract=True,
    ),
    MetricSpec("kvwatch_observed_kv_usage_ratio", "gauge", "KV-cache usage 0..1, latest.", contract=True),
    MetricSpec("kvwatch_kv_usage_peak_ratio", "gauge", "Highest KV-cache usage 0..1 within the saturation window."),
    MetricSpec(
        "kvwatch_memory_bound",
        "gauge",
        "1 while requests wait because the KV cache is full (state memory_bound), else 0.",
        contract=True,
    ),
    MetricSpec(
        "kvwatch_saturation_state",
        "gauge",
        "1 for the current saturation state, 0 for the others.",
        ("state",),
        contract=True,
    ),
    MetricSpec(
        "kvwatch_diagnosis",
        "gauge",
        "1 for the cause of the current state (the cause table of kvwatch analyze), 0 for the others.",
        ("cause",),
    ),
    MetricSpec(
        "kvwatch_preemptions_total",
        "counter",
        "Preemptions seen; source=log or metrics. Monotonic across vLLM restarts.",
        ("source",),
        contract=True,
    ),
    MetricSpec(
        "kvwatch_whatif_max_concurrency",
        "gauge",
        "Projected max concurrency (observed_p95 basis) if one lever were pulled.",
        ("lever",),
        contract=True,
    ),
    MetricSpec(
        "kvwatch_whatif_waiting_requests",
        "gauge",
        "Simulated mean requests waiting (vLLM's scheduler replayed on the last window's workload) if one "
        "lever were pulled; lever=observed is the window as it is. Recomputed at most once a minute; absent "
        "when the window cannot calibrate the simulation.",
        ("lever",),
    ),
    MetricSpec(
        "kvwatch_whatif_preemptions_per_100_requests",
        "gauge",
        "Simulated preemptions per 100 finished requests if one lever were pulled, on the last window's "
        "workload (as kvwatch_whatif_waiting_requests).",
        ("lever",),
    ),
    MetricSpec(
        "kvwatch_reconcile_ratio",
        "gauge",
        "Observed / expected; check=pool_tokens, bytes_per_token or max_concurrency.",
        ("check",),
        contract=True,
    ),
    MetricSpec(
        "kvwatch_source_up",
        "gauge",
        "1 when the last read of the source (log, metrics) succeeded.",
        ("source",),
        per_engine=False,
        contract=True,
    ),
    MetricSpec(
        "kvwatch_source_duration_seconds",
        "gauge",
        "How long the last read of the source took.",
        ("source",),
        per_engine=False,
    ),
    MetricSpec(
        "kvwatch_source_last_success_timestamp_seconds",
        "gauge",
        "Unix time of the last successful read of the source.",
        ("source",),
        per_engine=False,
    ),
    MetricSpec("kvwatch_source_errors_total", "counter", "Failed reads of the source.", ("source",), per_engine=False),
    MetricSpec(
        "kvwatch_last_stats_timestamp_seconds",
        "gauge",
        "Unix time when the newest stats record was seen.",
        contract=True,
    ),
    MetricSpec(
        "kvwatch_log_records_total",
        "counter",
        "Parsed log records by kind (stats, startup, preemption, error, ...).",
        ("kind",),
        per_engine=False,
        contract=True,
    ),
    MetricSpec(
        "kvwatch_http_connections_dropped_total",
        "counter",
        "Connections kvwatch's own HTTP server closed without an answer: reason=aborted (client went "
        "away), timeout (idle or slow request), over_limit (too many open), tls_error (failed handshake), "
        "bad_request (a request head over 16 KiB).",
        ("reason",),
        per_engine=False,
    ),
    MetricSpec(
        "kvwatch_whatif_errors_total",
        "counter",
        "What-if recomputes that failed with an unexpected error (logged once each); bad or missing "
        "evidence is not an error, the what-if gauges are then absent.",
        per_engine=False,
    ),
    MetricSpec(
        "kvwatch_build_info", "gauge", "kvwatch build; always 1.", ("version",), per_engine=False, contract=True
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOGUE}


def exposed_names() -> set[str]:
    """Every series name the exporter may emit (counters expose ``_total`` as named)."""
    return set(BY_NAME)
