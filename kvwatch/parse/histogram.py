"""Older home of ``kvwatch.histogram`` (bucket quantiles), kept so its imports keep working.

The math moved next to ``kvwatch.records``: the records every stage shares use it, and a record
must not depend on a stage.
"""

from __future__ import annotations

from kvwatch.histogram import bucket_delta, bucket_quantile

__all__ = ["bucket_delta", "bucket_quantile"]
