"""Quantiles from cumulative Prometheus histogram buckets, as ``histogram_quantile`` computes them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile(q, ...)`` for one series of ``(le, cumulative_count)``.

    Linear interpolation inside the bucket that holds the rank; the lowest bucket starts at 0
    (token counts are never negative); a rank in the +Inf bucket returns the highest finite
    bound, as Prometheus does. None when there are no observations.
    """
    if not buckets:
        return None
    ordered = sorted(buckets)
    total = ordered[-1][1]
    if total <= 0:
        return None
    return _interpolate(q, ordered, total)


def _interpolate(q: float, ordered: Sequence[tuple[float, float]], total: float) -> float | None:
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower_bound
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return ordered[-1][0] if not math.isinf(ordered[-1][0]) else lower_bound


def bucket_delta(
    new: Sequence[tuple[float, float]], old: Sequence[tuple[float, float]]
) -> tuple[tuple[float, float], ...]:
    """Buckets observed between two scrapes (new - old); ``new`` alone after a counter reset."""
    old_map = dict(old)
    if any(count < old_map.get(le, 0.0) for le, count in new):
        return tuple(sorted(new))
    return tuple(sorted((le, count - old_map.get(le, 0.0)) for le, count in new))
