"""`kvwatch snapshot` (placeholder until its issue lands)."""

from __future__ import annotations

from kvwatch.errors import UsageError


def snapshot() -> int:
    """Not built yet."""
    raise UsageError("kvwatch snapshot is not built yet")
