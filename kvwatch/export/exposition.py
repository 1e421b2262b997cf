"""The live state as kvwatch_* samples: every exported name and label is chosen here.

``kvwatch.reconcile.live.LiveState.view`` says what is known, by meaning (a pool by source, a
concurrency by basis, a what-if by lever); ``render`` turns that into samples named by the
catalogue (``kvwatch.export.catalogue``), which ``StateCollector`` groups into families at
scrape time. A value that is not known, or not finite, is not exported (absent, never 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvwatch.reconcile.causes import CAUSE_IDS
from kvwatch.reconcile.live import Labels, LiveState, LiveView
from kvwatch.reconcile.saturation import STATES, SaturationState


@dataclass(frozen=True, slots=True)
class Sample:
    """One exported value: metric name (from the catalogue), labels, value."""

    name: str
    labels: Labels
    value: float


def render(view: LiveView) -> list[Sample]:
    """The samples for one view, in a stable order (sources, record kinds, engines, each sorted)."""
    out: list[Sample] = [Sample("kvwatch_build_info", (("version", view.version),), 1.0)]
    for src in view.sources:
        lab = (("source", src.source),)
        out.append(Sample("kvwatch_source_up", lab, src.up))
        out.append(Sample("kvwatch_source_errors_total", lab, src.errors))
        if src.duration is not None:
            out.append(Sample("kvwatch_source_duration_seconds", lab, src.duration))
        if src.last_success is not None:
            out.append(Sample("kvwatch_source_last_success_timestamp_seconds", lab, src.last_success))
    for kind, count in view.record_counts:
        out.append(Sample("kvwatch_log_records_total", (("kind", kind),), count))
    for reason, count in view.http_drops:
        out.append(Sample("kvwatch_http_connections_dropped_total", (("reason", reason),), count))
    if view.whatif_errors is not None:
        out.append(Sample("kvwatch_whatif_errors_total", (), view.whatif_errors))

    for eng in view.engines:
        base: Labels = (("model_name", eng.model_name), ("engine", eng.engine))

        def put(name: str, value: float | None, extra: Labels = (), base: Labels = base) -> None:
            if value is not None and math.isfinite(value):
                out.append(Sample(name, base + extra, float(value)))

        def each(name: str, label: str, pairs: tuple[tuple[str, float | None], ...]) -> None:
            for key, value in pairs:
                put(name, value, ((label, key),))

        each("kvwatch_kv_pool_tokens", "source", eng.pool_tokens)
        each("kvwatch_kv_bytes_per_token", "source", eng.bytes_per_token)
        each("kvwatch_kv_pool_bytes", "source", eng.pool_bytes)
        put("kvwatch_max_num_seqs", eng.max_num_seqs)
        each("kvwatch_request_tokens", "quantile", eng.request_tokens)
        each("kvwatch_max_concurrency", "basis", eng.max_concurrency)
        each("kvwatch_whatif_max_concurrency", "lever", eng.whatif)
        each("kvwatch_whatif_waiting_requests", "lever", eng.whatif_waiting)
        each("kvwatch_whatif_preemptions_per_100_requests", "lever", eng.whatif_preemptions_per_100)
        each("kvwatch_reconcile_ratio", "check", eng.reconcile)
        put("kvwatch_observed_running_requests", eng.running)
        put("kvwatch_observed_waiting_requests", eng.waiting)
        put("kvwatch_observed_kv_usage_ratio", eng.kv_usage)
        put("kvwatch_kv_usage_peak_ratio", eng.kv_usage_peak)
        if eng.state is not None:
            put("kvwatch_memory_bound", 1.0 if eng.state == SaturationState.MEMORY_BOUND else 0.0)
            for state in STATES:
                put("kvwatch_saturation_state", 1.0 if state == eng.state else 0.0, (("state", state),))
        if eng.cause is not None:
            for cause in CAUSE_IDS:
                put("kvwatch_diagnosis", 1.0 if cause == eng.cause else 0.0, (("cause", cause),))
        each("kvwatch_preemptions_total", "source", eng.preemptions)
        put("kvwatch_last_stats_timestamp_seconds", eng.last_stats_at)
    return out


def samples(state: LiveState, now: float) -> list[Sample]:
    """``render(state.view(now))``: what /metrics shows for ``state`` at ``now``."""
    return render(state.view(now))
