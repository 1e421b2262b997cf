"""`kvwatch watch` and `kvwatch run` (placeholder until the sidecar issue lands)."""

from __future__ import annotations

from kvwatch.errors import UsageError


def watch() -> int:
    """Not built yet."""
    raise UsageError("kvwatch watch is not built yet")


def run() -> int:
    """Not built yet."""
    raise UsageError("kvwatch run is not built yet")
