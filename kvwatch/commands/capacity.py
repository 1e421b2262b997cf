"""`kvwatch capacity` and `kvwatch fleet` (placeholder until the capacity issue lands)."""

from __future__ import annotations

from kvwatch.errors import UsageError


def capacity() -> int:
    """Not built yet."""
    raise UsageError("kvwatch capacity is not built yet")


def fleet() -> int:
    """Not built yet."""
    raise UsageError("kvwatch fleet is not built yet")
