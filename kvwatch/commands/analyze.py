"""`kvwatch analyze` (placeholder until its issue lands)."""

from __future__ import annotations

from kvwatch.errors import UsageError


def analyze() -> int:
    """Not built yet."""
    raise UsageError("kvwatch analyze is not built yet")
