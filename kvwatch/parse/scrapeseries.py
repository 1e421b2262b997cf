"""The few counters and histogram sums of a vLLM ``/metrics`` exposition that time a run (pure).

``parse_exposition`` (metrics.py) reads the gauges, the token histograms and the cache counters
into an ``EngineSample``; a simulator's calibration also needs how many engine steps ran and how
long requests took, which no EngineSample field holds. One table names those series (V1 names,
0.8 onwards, as written by vllm/v1/metrics/loggers.py ``PrometheusStatLogger``); every value is the
sum over the label sets of one server (engines, finish reasons), ``_created`` samples ignored.
"""

from __future__ import annotations

import math
import re

from kvwatch.records import TimingSeries

__all__ = ["TIMING_SERIES", "TimingSeries", "read_timing", "scraped_at"]

# field -> exposed V1 sample name (loggers.py PrometheusStatLogger.__init__, vLLM 0.32.0)
TIMING_SERIES: dict[str, str] = {
    # one observation per engine iteration with outputs: count = steps, sum = scheduled tokens
    "steps": "vllm:iteration_tokens_total_count",
    "step_tokens": "vllm:iteration_tokens_total_sum",
    "generation_tokens": "vllm:generation_tokens_total",
    "finished": "vllm:request_success_total",
    "e2e_count": "vllm:e2e_request_latency_seconds_count",
    "e2e_sum": "vllm:e2e_request_latency_seconds_sum",
    "ttft_count": "vllm:time_to_first_token_seconds_count",
    "ttft_sum": "vllm:time_to_first_token_seconds_sum",
}

_SAMPLE = re.compile(r"^(?:ray_)?(vllm:[A-Za-z0-9_:]+)(?:\{[^}]*\})?\s+([-+0-9.eEinfINFNa]+)")
# "# scraped at t=+12.3s ..." (first line a saving script adds) -> seconds since the load started
_SCRAPED_AT = re.compile(r"^#\s*scraped at t=\+?([0-9.]+)s")


def read_timing(text: str) -> TimingSeries:
    """The timing counters of one exposition (sums over label sets)."""
    names = {v: k for k, v in TIMING_SERIES.items()}
    if "ray_vllm:" in text:
        names.update({"ray_" + v: k for k, v in TIMING_SERIES.items()})
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(("vllm:", "ray_vllm:")):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        field = names.get(m.group(1))
        if field is None:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        if not math.isnan(value):  # NaN carries nothing
            totals[field] = totals.get(field, 0.0) + value
    return TimingSeries(**totals)


def scraped_at(text: str) -> float | None:
    """Seconds since the load started, from a saving script's first-line comment, if it wrote one."""
    first = text.split("\n", 1)[0]
    m = _SCRAPED_AT.match(first)
    return float(m.group(1)) if m else None
