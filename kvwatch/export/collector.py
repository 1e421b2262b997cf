"""A prometheus_client Collector that renders the sidecar's latest state at scrape time.

No module-global gauges: ``collect()`` asks the state for its samples under the sidecar's lock
and groups them into families by the catalogue, so what is exported is exactly what the state
knows now, and only catalogued names can appear.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvwatch.export.catalogue import BY_NAME, CATALOGUE
from kvwatch.export.exposition import Sample


class StateCollector(Collector):
    """Collects ``samples_fn(now)`` into metric families, catalogue order."""

    def __init__(
        self,
        samples_fn: Callable[[float], list[Sample]],
        lock: threading.Lock | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._samples_fn = samples_fn
        self._lock = lock or threading.Lock()
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        """Render every catalogued family that has samples now."""
        with self._lock:
            samples = self._samples_fn(self._clock())
        by_name: dict[str, list[Sample]] = {}
        for sample in samples:
            if sample.name not in BY_NAME:
                raise ValueError(f"{sample.name} is not in kvwatch.export.catalogue")
            by_name.setdefault(sample.name, []).append(sample)
        for spec in CATALOGUE:
            rows = by_name.get(spec.name)
            if not rows:
                continue
            labels = [k for k, _ in rows[0].labels]
            family: Metric
            if spec.type == "summary":  # quantile samples only (see the catalogue row)
                family = Metric(spec.name, spec.help, "summary")
                for row in rows:
                    family.add_sample(spec.name, dict(row.labels), row.value)
                yield family
                continue
            if spec.type == "counter":
                family = CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=labels)
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=labels)
            for row in rows:
                family.add_metric([v for _, v in row.labels], row.value)
            yield family
