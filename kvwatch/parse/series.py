"""Prometheus HTTP API series -> per-engine :class:`~kvwatch.records.EngineSample` timelines (pure).

The same vocabulary as a scrape: which names to ask a Prometheus for (:func:`query_names`, every
prefix and old name of :data:`kvwatch.parse.metrics.METRIC_ALIASES`) and how an answered series
maps onto an EngineSample field (:func:`kvwatch.parse.metrics.match_series`). The source
(kvwatch.sources.prometheus) fetches; nothing here touches the network.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from kvwatch.parse.metricnames import METRIC_ALIASES, PREFIXES
from kvwatch.parse.metrics import match_series
from kvwatch.records import EngineSample, HistogramSummary


class SeriesLike(Protocol):
    """One answered series: its labels (``__name__`` included) and its (t, value) points."""

    @property
    def labels(self) -> dict[str, str]: ...

    @property
    def points(self) -> list[tuple[float, float]]: ...


def names_of(kinds: Iterable[str], histogram_parts: tuple[str, ...]) -> list[str]:
    """Every exposed name of the table's rows of ``kinds`` (histograms with ``histogram_parts``)."""
    names: list[str] = []
    wanted = set(kinds)
    for alias in METRIC_ALIASES:
        if alias.kind not in wanted:
            continue
        for stem in alias.stems:
            for prefix, _why in PREFIXES:
                base = prefix + stem
                if alias.kind == "counter":
                    names += [base + "_total", base]  # Ray's older exporter drops _total
                elif alias.kind == "histogram":
                    names += [base + part for part in histogram_parts]
                else:
                    names.append(base)
    return sorted(set(names))


@dataclass(frozen=True, slots=True)
class QueryNames:
    """The names to ask for: at the full step (saturation), increase-only, and the interval probe."""

    fine: list[str]
    increase: list[str]
    probe: list[str]


def query_names() -> QueryNames:
    """The gauges and the preemption counter at the full step (the saturation judge needs every
    sample); the other counters and every histogram part for their increase only."""
    gauges = names_of(("gauge",), ())
    preemptions = [n for n in names_of(("counter",), ()) if "num_preemptions" in n]
    increase = [n for n in names_of(("counter",), ()) if n not in preemptions]
    increase += names_of(("histogram",), ("_bucket", "_sum", "_count"))
    return QueryNames(gauges + preemptions, increase, [p + "num_requests_running" for p, _why in PREFIXES])


EngineKey = tuple[str | None, str | None, str | None]  # (instance, model_name, engine)


@dataclass
class _Hist:
    rank: int
    sums: dict[float, float]
    counts: dict[float, float]
    buckets: dict[float, dict[float, float]]  # t -> {le: cumulative}


@dataclass
class _Engine:
    values: dict[str, tuple[int, dict[float, float]]]  # field -> (rank, {t: value})
    hists: dict[str, _Hist]
    kv_metric: str | None = None


def engine_samples(series: Iterable[SeriesLike]) -> dict[EngineKey, list[tuple[float, EngineSample]]]:
    """Per (instance, model_name, engine), the EngineSample at each point in time, in order.

    The same alias table as a scrape (:func:`kvwatch.parse.metrics.match_series`): the newest
    name present wins, ``vllm:`` before ``ray_vllm:``. Buckets appear only at their own (coarse)
    points; values absent at a point stay None, never 0.
    """
    engines: dict[EngineKey, _Engine] = {}
    for s in series:
        name = s.labels.get("__name__", "")
        match = match_series(name, s.labels)
        if match is None:
            continue
        alias, rank, part = match
        key = (s.labels.get("instance"), s.labels.get("model_name"), s.labels.get("engine"))
        eng = engines.setdefault(key, _Engine({}, {}))
        points = dict(s.points)
        if alias.kind == "histogram":
            hist = eng.hists.get(alias.field)
            if hist is None or rank < hist.rank:
                hist = eng.hists[alias.field] = _Hist(rank, {}, {}, {})
            elif rank > hist.rank:
                continue
            if part == "_sum":
                hist.sums = points
            elif part == "_count":
                hist.counts = points
            else:
                try:
                    le = float(s.labels.get("le", ""))
                except ValueError:
                    continue
                for t, v in s.points:
                    hist.buckets.setdefault(t, {})[le] = v
        elif alias.kind in ("gauge", "counter"):
            current = eng.values.get(alias.field)
            if current is None or rank < current[0]:
                eng.values[alias.field] = (rank, points)
                if alias.field == "kv_usage_ratio":
                    eng.kv_metric = name
    out: dict[EngineKey, list[tuple[float, EngineSample]]] = {}
    for key, eng in engines.items():
        rows: list[tuple[float, EngineSample]] = []
        fine = {f: pts for f, (_rank, pts) in eng.values.items() if f in _FINE_FIELDS}
        coarse = {f: pts for f, (_rank, pts) in eng.values.items() if f not in _FINE_FIELDS}
        # The fine points (saturation) and the coarse ones (increases) stay separate samples: a
        # fine sample then carries no histogram and a coarse one no gauge, and each reader of
        # the timeline skips what a sample does not state.
        for values, hists in ((fine, {}), (coarse, eng.hists)):
            times = {t for pts in values.values() for t in pts}
            for h in hists.values():
                times.update(h.buckets)
                times.update(h.counts)
            columns = list(values.items())
            isfinite = math.isfinite
            for t in sorted(times):
                # (runs once per point of every engine: a comprehension, not a loop of ifs)
                fields: dict[str, Any] = {
                    name: x for name, pts in columns if (x := pts.get(t)) is not None and isfinite(x)
                }
                for field_name, h in hists.items():
                    count, total = h.counts.get(t), h.sums.get(t)
                    b = h.buckets.get(t)
                    if b is None and (count is None or total is None):
                        continue
                    if count is None or total is None:
                        count = total = None  # buckets without _sum/_count at this point: read alone
                    fields[field_name] = HistogramSummary(count, total, tuple(sorted(b.items())) if b else ())
                    # (a dozen bounds: sorting each point's few items is cheaper than keeping order)
                if fields:
                    rows.append(
                        (t, EngineSample(model_name=key[1], engine=key[2], kv_usage_metric=eng.kv_metric, **fields))
                    )
        rows.sort(key=lambda row: row[0])  # stable: at one instant the fine sample comes first
        out[key] = rows
    return out


# Fields read at the full step: what the saturation judgement needs at every sample.
_FINE_FIELDS = frozenset({a.field for a in METRIC_ALIASES if a.kind == "gauge"} | {"preemptions_total"})
