"""vLLM ``/metrics`` exposition text -> :class:`~kvwatch.records.MetricsSnapshot` (pure).

This module owns the parser: samples grouped into engines by the name table of
``kvwatch.parse.metricnames`` (old and new names side by side, names deliberately ignored), the
repair of expositions damaged by pasting, and the typing of ``vllm:cache_config_info`` labels.

The text is read with ``prometheus_client.parser.text_string_to_metric_families`` (the plain text
a server writes by kvwatch.parse.textformat, to the same result, without importing it). That parser
gives up on the first bad line, so damage a paste leaves behind is repaired first (see
:func:`repair_exposition`) and, when the parser still fails, the text is checked line by line so
one bad line costs that line only. Lines that cannot be read unambiguously are counted and
described (line number and reason, never the line's content) in ``skipped_lines`` /
``skipped_examples``.

No files, network or clock here: sources hand in text, commands and the sidecar render results.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

# The vocabulary (which vLLM series kvwatch reads, under which names, since when and why) is
# kvwatch.parse.metricnames; its names are re-exported here for older imports.
from kvwatch.parse.metricnames import (  # noqa: F401
    _ALIAS_BY_STEM,
    IGNORED_METRICS,
    METRIC_ALIASES,
    PREFIXES,
    MetricAlias,
    MetricKind,
    catalogue_status,
    split_prefix,
)
from kvwatch.parse.paste import (
    ELIDED_LABEL,
    MAX_EXAMPLES,
    RepairedLine,
    line_problem,
    rejoin_wrapped,
    repair_exposition,
    repaired_line,
)
from kvwatch.parse.textformat import read_families, refuses
from kvwatch.records import EngineSample, HistogramSummary, MetricsSnapshot

# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """One parsed sample: exposed name, labels, value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class ExpositionReading:
    """Everything one read of an exposition yields; :func:`parse_exposition` returns ``snapshot``.

    ``vllm_names`` lists every vLLM family or sample name seen (also HELP/TYPE-only families), so
    a caller can tell "a vLLM exposition with no samples yet" from "not vLLM at all".
    ``uncatalogued`` are vLLM names in neither :data:`METRIC_ALIASES` nor :data:`IGNORED_METRICS`.
    """

    snapshot: MetricsSnapshot
    vllm_names: frozenset[str] = frozenset()
    uncatalogued: tuple[str, ...] = ()
    lines: int = 0


def parse_exposition(text: str) -> MetricsSnapshot:
    """Read one vLLM ``/metrics`` exposition (any version, V0/V1, ``vllm:``/``ray_vllm:``).

    One EngineSample per (model_name, engine) pair, sorted by engine; absent metrics are None.
    Damaged lines are skipped and counted, never fatal.
    """
    return read_exposition(text).snapshot


def read_exposition(text: str) -> ExpositionReading:
    """:func:`parse_exposition` plus what a command needs to judge and report the input."""
    samples, declared, skipped = _read_samples(text)
    names = set(declared)
    names.update(s.name for s in samples)
    vllm_names = frozenset(n for n in names if split_prefix(n) is not None)
    uncatalogued = tuple(sorted(n for n in vllm_names if catalogue_status(n) is None))
    vllm_samples = [s for s in samples if split_prefix(s.name) is not None]
    by_engine, by_engine_config, duplicates = _collect(vllm_samples)
    reasons = [reason for _n, reason in skipped] + duplicates
    snapshot = MetricsSnapshot(
        engines=by_engine,
        cache_config=_top_level_config(by_engine_config),
        cache_config_by_engine=by_engine_config,
        skipped_lines=len(skipped),
        skipped_examples=tuple(reasons[:MAX_EXAMPLES]),
    )
    return ExpositionReading(snapshot, vllm_names, uncatalogued, len(text.splitlines()))


def _read_samples(text: str) -> tuple[list[Sample], set[str], list[tuple[int, str]]]:
    """Samples, declared family names and skipped (line, reason) pairs of the repaired text."""
    repaired = repair_exposition(text)
    skipped = [(ln.number, f"line {ln.number}: {ln.skip_reason}") for ln in repaired if ln.skip_reason]
    good = [ln for ln in repaired if not ln.skip_reason]
    try:
        samples, declared = _parse_block("\n".join(ln.text for ln in good))
    except Exception:  # the parser raises ValueError, IndexError, TypeError ... on bad lines
        kept: list[RepairedLine] = []
        in_help = False  # the previous line was a HELP line or a piece of its wrapped text
        i = 0
        while i < len(good):
            ln = good[i]
            reason = line_problem(ln.text)
            if reason is None:
                kept.append(ln)
                in_help = ln.text.startswith("# HELP ")
                i += 1
                continue
            fixed = repaired_line(ln.text)
            if fixed is not None:
                kept.append(RepairedLine(ln.number, fixed))
                in_help = fixed.startswith("# HELP ")
                i += 1
                continue
            rejoined = rejoin_wrapped(good, i)
            if rejoined is not None:
                kept.append(rejoined[0])
                in_help = False
                i += rejoined[1]
                continue
            previous = kept[-1] if kept else None
            if previous is not None and not previous.text.startswith("#") and not in_help:
                glued = previous.text + ln.text
                if line_problem(glued) is None:
                    # a sample wrapped inside its value ("... 1.79596" / "23446205237e+09"): the
                    # first piece read on its own, the second cannot, together they read as one
                    kept[-1] = RepairedLine(previous.number, glued)
                    i += 1
                    continue
            if not in_help:
                skipped.append((ln.number, f"line {ln.number}: {reason}"))
            # else: the rest of a wrapped HELP text (documentation, not data), dropped unreported
            i += 1
        try:
            samples, declared = _parse_block("\n".join(ln.text for ln in kept))
        except Exception:  # lines fine alone but not together: read each alone
            samples, declared = [], set()
            for ln in kept:
                more, names = _parse_block(ln.text)
                samples += more
                declared |= names
    skipped.sort()
    return samples, declared, skipped


def _parse_block(text: str) -> tuple[list[Sample], set[str]]:
    samples: list[Sample] = []
    declared: set[str] = set()
    families = read_families(text)
    if families is None and refuses(text):  # what prometheus_client's parser would raise on
        raise ValueError("a line no exposition holds")
    if families is None:  # not the plain text servers write: prometheus_client's parser decides
        from prometheus_client.parser import text_string_to_metric_families

        families = [
            (f.name, [(s.name, dict(s.labels), float(s.value)) for s in f.samples])
            for f in text_string_to_metric_families(text + "\n")
        ]
    for family_name, family_samples in families:
        declared.add(family_name)
        samples.extend(Sample(name, labels, value) for name, labels, value in family_samples)
    # HELP/TYPE names as written (the parser strips "_total" off counter family names)
    for line in text.split("\n"):
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(maxsplit=3)
            if len(parts) >= 3:
                declared.add(parts[2])
    return samples, declared


_IDENTITY_LABELS = ("model_name", "engine")
_SERIES_LABELS = ("le", "reason")  # labels that tell the series of one alias row apart


@dataclass(slots=True)
class _Histogram:
    """Mutable parts of one histogram while samples arrive."""

    rank: int
    buckets: dict[float, float] = field(default_factory=dict)
    sum: float | None = None
    count: float | None = None


@dataclass(slots=True)
class _EngineBuilder:
    """Mutable accumulator for one (model_name, engine); frozen into an EngineSample at the end."""

    values: dict[str, tuple[int, float]] = field(default_factory=dict)  # field -> (rank, value)
    kv_metric: str | None = None
    histograms: dict[str, _Histogram] = field(default_factory=dict)


ConfigValues = dict[str, str | int | float | bool | None]


def _collect(samples: list[Sample]) -> tuple[tuple[EngineSample, ...], dict[str, ConfigValues], list[str]]:
    """Group vLLM samples by (model_name, engine) into EngineSamples, and cache_config_info by engine."""
    builders: dict[tuple[str | None, str | None], _EngineBuilder] = {}
    configs: dict[str, ConfigValues] = {}
    duplicates: list[str] = []
    seen: set[tuple[str | None, ...]] = set()
    prefix_order = [p for p, _why in PREFIXES]
    only_engine = _only_engine(samples)

    for s in samples:
        prefix, stem = split_prefix(s.name) or ("", s.name)
        model, engine = s.labels.get("model_name"), s.labels.get("engine")
        if ELIDED_LABEL in s.labels:
            # a label set shortened with "...": the identity labels it lost are those of the one
            # engine the other samples name; with several engines it is not guessed
            if only_engine is not None:
                model = model if model is not None else only_engine[0]
                engine = engine if engine is not None else only_engine[1]
            elif stem != "cache_config_info" and (model is None or engine is None):
                duplicates.append(f"{s.name}: labels elided with '...' and several engines: which one is unknown")
                continue
        if stem == "cache_config_info":
            key = engine if engine is not None else ""
            if key not in configs:  # several replicas (Ray) under one engine label: keep the first
                configs[key] = type_cache_config(s.labels)
            continue
        if stem.endswith("_info"):  # metadata gauges at 1 (lora_requests_info ...) name no engine
            continue
        builder = builders.setdefault((model, engine), _EngineBuilder())
        match = _match(stem, s.labels)
        if match is None:
            continue
        alias, stem_rank, part = match
        series = (s.name, model, engine, *(s.labels.get(k) for k in _SERIES_LABELS))
        if series in seen:
            extra = sorted(
                k for k in s.labels if k not in _IDENTITY_LABELS and k not in _SERIES_LABELS and k != ELIDED_LABEL
            )
            duplicates.append(
                f"{s.name}: several series for model_name={model!r} engine={engine!r} "
                f"(other labels: {', '.join(extra) or 'none'}); kept the first, nothing summed"
            )
            continue
        seen.add(series)
        # newer stem first, then vllm: before ray_vllm: when both describe the same engine
        rank = stem_rank * len(prefix_order) + prefix_order.index(prefix)
        if alias.kind == "histogram":
            _add_histogram(builder, alias.field, rank, part, s)
        else:
            _add_value(builder, alias.field, rank, s.value, s.name)

    return _finish(builders), configs, duplicates


def _only_engine(samples: list[Sample]) -> tuple[str | None, str | None] | None:
    """The (model_name, engine) of the one engine the complete samples name, or None if not one.

    Complete: not elided, not a metadata ``*_info`` gauge. API-server series without an engine
    (or model) label do not count when others carry one, as in :func:`_finish`.
    """
    pairs = {
        (s.labels.get("model_name"), s.labels.get("engine"))
        for s in samples
        if ELIDED_LABEL not in s.labels and not (split_prefix(s.name) or ("", s.name))[1].endswith("_info")
    }
    if any(engine is not None for _model, engine in pairs):
        pairs = {p for p in pairs if p[1] is not None}
    if any(model is not None for model, _engine in pairs):
        pairs = {p for p in pairs if p[0] is not None}
    return next(iter(pairs)) if len(pairs) == 1 else None


def match_series(name: str, labels: dict[str, str]) -> tuple[MetricAlias, int, str] | None:
    """(alias row, rank, histogram part) for one exposed series name and its labels, or None.

    The rank orders names that fill the same field (newer stem first, then ``vllm:`` before
    ``ray_vllm:``), as :func:`parse_exposition` does; used by readers of Prometheus' HTTP API,
    which see series, not expositions.
    """
    split = split_prefix(name)
    if split is None:
        return None
    match = _match(split[1], labels)
    if match is None:
        return None
    alias, stem_rank, part = match
    prefixes = [p for p, _why in PREFIXES]
    return alias, stem_rank * len(prefixes) + prefixes.index(split[0]), part


def _match(stem: str, labels: dict[str, str]) -> tuple[MetricAlias, int, str] | None:
    """(alias row, rank of the stem within the row, histogram part) for a sample stem, or None."""
    candidates = [(stem, "")]
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if stem.endswith(suffix):
            candidates.append((stem[: -len(suffix)], suffix))
    allowed = {"gauge": ("",), "info": ("",), "counter": ("", "_total"), "histogram": ("_bucket", "_sum", "_count")}
    for base, part in candidates:
        for alias in _ALIAS_BY_STEM.get(base, ()):
            if part not in allowed[alias.kind]:
                continue
            if alias.field == "waiting_capacity" and labels.get("reason") != "capacity":
                continue
            if alias.field == "waiting_deferred" and labels.get("reason") != "deferred":
                continue
            return alias, alias.stems.index(base), part
    return None


def _add_value(builder: _EngineBuilder, name: str, rank: int, value: float, exposed: str) -> None:
    if not math.isfinite(value):  # a NaN/Inf gauge says nothing usable: absent, never a number
        return
    current = builder.values.get(name)
    if current is None or rank < current[0]:
        builder.values[name] = (rank, value)
        if name == "kv_usage_ratio":
            builder.kv_metric = exposed


def _add_histogram(builder: _EngineBuilder, name: str, rank: int, part: str, s: Sample) -> None:
    hist = builder.histograms.get(name)
    if hist is None or rank < hist.rank:
        hist = builder.histograms[name] = _Histogram(rank)
    elif rank > hist.rank:
        return
    if part == "_bucket":
        try:
            hist.buckets[float(s.labels.get("le", ""))] = s.value
        except ValueError:
            return
    elif part == "_sum":
        hist.sum = s.value
    else:
        hist.count = s.value


def _finish(builders: dict[tuple[str | None, str | None], _EngineBuilder]) -> tuple[EngineSample, ...]:
    """EngineSamples sorted by engine.

    Every (model_name, engine) pair of a vLLM series names an engine, except API-server-level
    series: those carry no engine label while other series do (V1 ``admission_rejections``), or
    no model_name while others do. A pair with values kvwatch reads is always kept.
    """
    pairs = list(builders)
    if any(engine is not None for _model, engine in pairs):
        pairs = [p for p in pairs if p[1] is not None]
    if any(model is not None for model, _engine in pairs):
        pairs = [p for p in pairs if p[0] is not None]
    pairs += [p for p, b in builders.items() if (b.values or b.histograms) and p not in pairs]
    engines = []
    for model, engine in sorted(pairs, key=_engine_order):
        b = builders[(model, engine)]
        fields: dict[str, Any] = {name: value for name, (_rank, value) in b.values.items()}
        fields.update({name: _summary(h) for name, h in b.histograms.items()})
        engines.append(EngineSample(model_name=model, engine=engine, kv_usage_metric=b.kv_metric, **fields))
    return tuple(engines)


def _summary(hist: _Histogram) -> HistogramSummary:
    buckets = tuple(sorted(hist.buckets.items()))
    count = hist.count
    if count is None and buckets and math.isinf(buckets[-1][0]):
        count = buckets[-1][1]  # the +Inf bucket is the count when _count was cut off
    return HistogramSummary(count=count, sum=hist.sum, buckets=buckets)


def _engine_order(key: tuple[str | None, str | None]) -> tuple[int, float, str, str]:
    model, engine = key
    if engine is None:
        return (0, 0.0, "", model or "")
    return (1, float(engine) if engine.isdigit() else math.inf, engine, model or "")


# --------------------------------------------------------------------------------------------
# cache_config_info labels
# --------------------------------------------------------------------------------------------

_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")
_NOT_CONFIG = frozenset({"engine", "model_name", ELIDED_LABEL})


def type_label_value(value: str) -> str | int | float | bool | None:
    """A cache_config_info label as the Python value vLLM stringified: ``"None"`` -> None,
    ``"True"``/``"False"`` -> bool, integers and decimals -> numbers, anything else unchanged."""
    if value == "None":
        return None
    if value in ("True", "False"):
        return value == "True"
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    return value


def type_cache_config(labels: dict[str, str]) -> ConfigValues:
    """Typed labels of one ``vllm:cache_config_info`` series (without ``engine``/``model_name``)."""
    return {k: type_label_value(v) for k, v in sorted(labels.items()) if k not in _NOT_CONFIG}


def _top_level_config(by_engine: dict[str, ConfigValues]) -> ConfigValues:
    """Engine "0" (or the unlabelled V0 series, or the first engine): docs/contracts.md cache_config."""
    for key in ("0", ""):
        if key in by_engine:
            return dict(by_engine[key])
    for key in sorted(by_engine, key=lambda e: (not e.isdigit(), int(e) if e.isdigit() else 0, e)):
        return dict(by_engine[key])
    return {}
