"""Fleet sizing: GPUs needed to hold the KV cache of a peak of concurrent conversations.

cache needed = peak concurrent x average context x KV bytes per token; GPUs = that / usable KV
cache per card, rounded up; and the same over a few context lengths (the sensitivity table),
because the context length is the number operators know least. Integer arithmetic throughout, so
10,000 x 8,000 x 50,000 B over 61 GB is exactly 66, not 65.99999.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvwatch.errors import UsageError

SCHEMA = "kvwatch.fleet/1"
DEFAULT_SENSITIVITY = (4000, 8000, 32000)


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """GPUs for a peak, and how that count moves with the average context."""

    peak_concurrent: int
    avg_context: int
    kv_bytes_per_token: int
    usable_cache_bytes: int
    per_request_bytes: int
    cache_needed_bytes: int
    gpus: int
    sensitivity: tuple[tuple[int, int], ...]  # (avg_context, gpus)

    def as_dict(self) -> dict[str, Any]:
        """The ``kvwatch.fleet/1`` document."""
        return {
            "schema": SCHEMA,
            "gpus": self.gpus,
            "cache_needed_bytes": self.cache_needed_bytes,
            "per_request_bytes": self.per_request_bytes,
            "sensitivity": [{"avg_context": c, "gpus": g} for c, g in self.sensitivity],
            "peak_concurrent": self.peak_concurrent,
            "avg_context": self.avg_context,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "usable_cache_bytes": self.usable_cache_bytes,
        }


def gpus_needed(peak_concurrent: int, avg_context: int, kv_bytes_per_token: int, usable_cache_bytes: int) -> int:
    """ceil(peak x context x bytes/token / usable bytes per GPU)."""
    need = peak_concurrent * avg_context * kv_bytes_per_token
    return -(-need // usable_cache_bytes)


def plan_fleet(
    *,
    peak_concurrent: int,
    avg_context: int,
    kv_bytes_per_token: int,
    usable_cache_bytes: int,
    sensitivity: tuple[int, ...] = DEFAULT_SENSITIVITY,
) -> FleetPlan:
    """The fleet for a peak; every input must be positive (UsageError naming the flag otherwise)."""
    for flag, value in (
        ("--peak-concurrent", peak_concurrent),
        ("--avg-context", avg_context),
        ("--kv-bytes-per-token", kv_bytes_per_token),
        ("--usable-cache-gib/--usable-cache-gb", usable_cache_bytes),
    ):
        if value <= 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    if any(c <= 0 for c in sensitivity):
        raise UsageError(f"--sensitivity must list positive context lengths, got {','.join(map(str, sensitivity))}")
    per_request = avg_context * kv_bytes_per_token
    return FleetPlan(
        peak_concurrent=peak_concurrent,
        avg_context=avg_context,
        kv_bytes_per_token=kv_bytes_per_token,
        usable_cache_bytes=usable_cache_bytes,
        per_request_bytes=per_request,
        cache_needed_bytes=per_request * peak_concurrent,
        gpus=gpus_needed(peak_concurrent, avg_context, kv_bytes_per_token, usable_cache_bytes),
        sensitivity=tuple(
            (c, gpus_needed(peak_concurrent, c, kv_bytes_per_token, usable_cache_bytes)) for c in sensitivity
        ),
    )
