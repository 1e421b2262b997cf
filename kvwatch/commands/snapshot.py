"""`kvwatch snapshot PATH_OR_URL`: one vLLM /metrics exposition read into a normalised snapshot.

PATH_OR_URL is a saved scrape (plain or gzip), ``-`` for stdin, or an http(s) URL scraped once.
``--format json`` prints the ``kvwatch.snapshot/1`` document of docs/contracts.md (plus additive
fields: ``cache_config_by_engine``, ``skipped``, ``uncatalogued_metrics``, ``source``, and the
``request_num_preemptions`` histogram); ``--format text`` a compact table per engine.

Exit codes (docs/contracts.md): 2 when the input cannot be read (missing file, directory, bad URL,
endpoint down or answering an error); 1 when it was read but holds no vLLM metrics (empty,
binary, another exporter's page); 0 otherwise. Each failure is one line on stderr.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
import zlib
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvwatch.errors import UnusableInput, UsageError
from kvwatch.parse.metrics import ExpositionReading, read_exposition
from kvwatch.records import EngineSample, HistogramSummary, MetricsSnapshot

SCHEMA = "kvwatch.snapshot/1"


class OutputFormat(StrEnum):
    """Output formats of ``kvwatch snapshot``."""

    text = "text"
    json = "json"


def snapshot(
    path_or_url: Annotated[
        str,
        typer.Argument(
            metavar="PATH_OR_URL", help="A saved /metrics scrape (plain or .gz), - for stdin, or an http(s) URL."
        ),
    ],
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="text (a table per engine) or json (kvwatch.snapshot/1).")
    ] = OutputFormat.text,
    bearer_token: Annotated[
        str | None,
        typer.Option(
            "--bearer-token",
            envvar="KVWATCH_BEARER_TOKEN",
            show_default=False,
            help="For URLs: send 'Authorization: Bearer TOKEN' (or set KVWATCH_BEARER_TOKEN).",
        ),
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="For https URLs: do not verify the server's TLS certificate.")
    ] = False,
    ca_file: Annotated[
        Path | None,
        typer.Option("--ca-file", show_default=False, help="For https URLs: verify against this CA bundle."),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="For URLs: seconds to wait for the whole answer.")
    ] = 5.0,
) -> None:
    """Read one vLLM /metrics exposition (a saved file or a live URL) into a normalised snapshot."""
    verify: bool | str = not insecure
    if ca_file is not None and not insecure:
        if not ca_file.is_file():
            raise UsageError(f"--ca-file {ca_file}: no such file; give a PEM CA bundle, or --insecure")
        verify = str(ca_file)
    reading, source = load(path_or_url, bearer_token=bearer_token, verify=verify, timeout=timeout)
    if not reading.vllm_names:
        raise UnusableInput(
            f"{source['input']}: no vLLM metrics in {reading.lines} lines (expected vllm:* series, e.g. "
            "vllm:num_requests_running); save vLLM's own /metrics: curl http://HOST:8000/metrics > scrape.prom"
        )
    if output_format is OutputFormat.json:
        print(json.dumps(snapshot_document(reading, source), indent=2))
    else:
        print(render_text(reading))


# --------------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------------


def load(
    path_or_url: str, *, bearer_token: str | None = None, verify: bool | str = True, timeout: float = 5.0
) -> tuple[ExpositionReading, dict[str, Any]]:
    """Read and parse one exposition; returns it with a ``source`` description.

    Raises UsageError (cannot read) or UnusableInput (read, but empty or binary).
    """
    if path_or_url.startswith(("http://", "https://")):
        return _load_url(path_or_url, bearer_token=bearer_token, verify=verify, timeout=timeout)
    if path_or_url == "-":
        data, name, kind = sys.stdin.buffer.read(), "<stdin>", "stdin"
    else:
        data, name, kind = _read_file(path_or_url), path_or_url, "file"
    reading = read_exposition(_decode(data, name))
    return reading, {"input": name, "kind": kind, "bytes": len(data), "lines": reading.lines}


def _load_url(
    url: str, *, bearer_token: str | None, verify: bool | str, timeout: float
) -> tuple[ExpositionReading, dict[str, Any]]:
    # local: requests and urllib3 load only for a URL, not for a saved file (start-up time)
    from kvwatch.sources.scrape import MetricsScraper, redact

    readings: list[ExpositionReading] = []

    def reader(text: str) -> ExpositionReading:
        readings.append(read_exposition(text))
        return readings[-1]

    scraper = MetricsScraper(url, timeout=timeout, bearer_token=bearer_token, verify=verify, reader=reader)
    try:
        result = scraper.scrape()
    finally:
        scraper.close()
    if not result.ok or not readings:
        error = result.error or f"GET {redact(url)}: failed"
        raise UnusableInput(error) if result.complete else UsageError(error)
    return readings[-1], {
        "input": redact(url),
        "kind": "url",
        "bytes": result.body_bytes,
        "lines": readings[-1].lines,
        "status": result.status_code,
        "duration_seconds": round(result.duration_seconds, 4),
    }


def _read_file(name: str) -> bytes:
    path = Path(name)
    hint = "give a saved /metrics file, - for stdin, or an http(s) URL"
    try:
        if path.is_dir():
            raise UsageError(f"{name}: is a directory; {hint}")
        data = path.read_bytes()
    except FileNotFoundError:
        looks_like_url = ":" in name and "/" in name and not path.parent.exists()
        extra = " (a URL must start with http:// or https://)" if looks_like_url else ""
        raise UsageError(f"{name}: no such file{extra}; {hint}") from None
    except PermissionError:
        raise UsageError(f"{name}: permission denied; {hint}") from None
    except OSError as exc:
        raise UsageError(f"{name}: cannot read ({exc.strerror or type(exc).__name__}); {hint}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            raise UnusableInput(f"{name}: damaged gzip data; save the scrape again") from None
    return data


def _decode(data: bytes, name: str) -> str:
    if not data.strip():
        raise UnusableInput(f"{name}: empty; save vLLM's /metrics: curl http://HOST:8000/metrics > scrape.prom")
    head = data[:65536]
    text = data.decode("utf-8", errors="replace")
    if b"\x00" in head or text[:65536].count("\ufffd") > len(head) // 20:
        raise UnusableInput(
            f"{name}: binary data, not a Prometheus text exposition; "
            "save vLLM's /metrics as text: curl http://HOST:8000/metrics > scrape.prom"
        )
    return text


# --------------------------------------------------------------------------------------------
# JSON (kvwatch.snapshot/1)
# --------------------------------------------------------------------------------------------

_ENGINE_NUMBERS = (
    "running",
    "waiting",
    "waiting_capacity",
    "waiting_deferred",
    "swapped",
    "kv_usage_ratio",
)
_ENGINE_COUNTERS = (
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "prompt_tokens_total",
    "generation_tokens_total",
)
_ENGINE_HISTOGRAMS = ("request_prompt_tokens", "request_generation_tokens", "request_num_preemptions")


def snapshot_document(reading: ExpositionReading, source: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``kvwatch.snapshot/1`` document (docs/contracts.md) for one reading; absent values are null."""
    snap = reading.snapshot
    return {
        "schema": SCHEMA,
        "engines": [engine_document(e) for e in snap.engines],
        "cache_config": _clean_config(snap.cache_config),
        "cache_config_by_engine": {k: _clean_config(v) for k, v in snap.cache_config_by_engine.items()},
        "skipped": {"lines": snap.skipped_lines, "examples": list(snap.skipped_examples)},
        "uncatalogued_metrics": list(reading.uncatalogued),
        "source": source,
    }


def engine_document(e: EngineSample) -> dict[str, Any]:
    """One ``engines[]`` entry: every contract key present, null where the scrape had no value."""
    doc: dict[str, Any] = {"engine": e.engine, "model_name": e.model_name}
    for name in _ENGINE_NUMBERS:
        doc[name] = _number(getattr(e, name))
    doc["kv_usage_metric"] = e.kv_usage_metric
    for name in _ENGINE_COUNTERS:
        doc[name] = _number(getattr(e, name))
    for name in _ENGINE_HISTOGRAMS:
        doc[name] = histogram_document(getattr(e, name))
    return doc


def histogram_document(h: HistogramSummary | None) -> dict[str, float | None] | None:
    """``{count, sum, p50, p95}``, quantiles as Prometheus' histogram_quantile; null when absent."""
    if h is None:
        return None
    return {
        "count": _number(h.count),
        "sum": _number(h.sum),
        "p50": _number(h.quantile(0.5)),
        "p95": _number(h.quantile(0.95)),
    }


def _number(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return value


def _clean_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in config.items()}


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

_CONFIG_SHOWN = (
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "kv_cache_size_tokens",
    "kv_cache_max_concurrency",
    "kv_cache_memory_bytes",
    "cache_dtype",
    "gpu_memory_utilization",
    "enable_prefix_caching",
    "sliding_window",
)


def render_text(reading: ExpositionReading) -> str:
    """A compact table per engine, then the cache config and what was skipped."""
    snap = reading.snapshot
    count = len(snap.engines)
    lines = [f"vLLM /metrics snapshot: {count} engine{'s' if count != 1 else ''}"]
    if not snap.engines:
        lines.append("  (vLLM metric families are declared but no engine has reported samples yet)")
    for e in snap.engines:
        lines.append("")
        lines.extend(_engine_rows(e))
    lines.extend(_config_rows(snap))
    if snap.skipped_lines or snap.skipped_examples:
        lines.append("")
        lines.append(f"skipped: {snap.skipped_lines} unreadable line{'s' if snap.skipped_lines != 1 else ''}")
        lines.extend(f"  {example}" for example in snap.skipped_examples)
    if reading.uncatalogued:
        lines.append(
            f"not catalogued (new vLLM metrics?): {', '.join(reading.uncatalogued[:8])}"
            + (" ..." if len(reading.uncatalogued) > 8 else "")
        )
    return "\n".join(lines)


def _engine_rows(e: EngineSample) -> list[str]:
    title = f"engine {e.engine if e.engine is not None else '-'}   model {e.model_name or '-'}"
    waiting = _fmt(e.waiting)
    reasons = [
        f"{label} {_fmt(v)}"
        for label, v in (("capacity", e.waiting_capacity), ("deferred", e.waiting_deferred))
        if v is not None
    ]
    if reasons:
        waiting += f" ({', '.join(reasons)})"
    kv = "-" if e.kv_usage_ratio is None else f"{e.kv_usage_ratio * 100:.1f} %   ({e.kv_usage_metric})"
    prefix = "-"
    if e.prefix_cache_queries_total is not None or e.prefix_cache_hits_total is not None:
        prefix = f"{_fmt(e.prefix_cache_hits_total)} hits / {_fmt(e.prefix_cache_queries_total)} queried"
        if e.prefix_cache_queries_total and e.prefix_cache_hits_total is not None:
            prefix += f"   ({e.prefix_cache_hits_total / e.prefix_cache_queries_total * 100:.1f} %)"
    rows = [
        ("requests", f"running {_fmt(e.running)}   waiting {waiting}   swapped {_fmt(e.swapped)}"),
        ("KV cache used", kv),
        ("preemptions", _fmt(e.preemptions_total)),
        ("prefix cache", prefix),
        ("tokens", f"prompt {_fmt(e.prompt_tokens_total)}   generation {_fmt(e.generation_tokens_total)}"),
        ("per request", ""),
    ]
    out = [title] + [f"  {label:<14}{value}" for label, value in rows[:-1]]
    hist_rows = [
        (label, h)
        for label, h in (
            ("prompt tokens", e.request_prompt_tokens),
            ("output tokens", e.request_generation_tokens),
            ("preemptions", e.request_num_preemptions),
        )
        if h is not None
    ]
    if hist_rows:
        out.append(
            "  per request   "
            + "   ".join(f"{label} p50 {_fmt(h.quantile(0.5))} p95 {_fmt(h.quantile(0.95))}" for label, h in hist_rows)
            + f"   (over {_fmt(hist_rows[0][1].count)} requests)"
        )
    return out


def _config_rows(snap: MetricsSnapshot) -> list[str]:
    if not snap.cache_config_by_engine:
        return []
    out = [""]
    for engine, config in sorted(snap.cache_config_by_engine.items()):
        shown = [f"{k} {_fmt_config(config[k])}" for k in _CONFIG_SHOWN if k in config]
        more = len(config) - len(shown)
        label = f"cache config (engine {engine})" if engine else "cache config"
        out.append(f"{label}: {', '.join(shown) or '-'}" + (f"   (+{more} more in --format json)" if more else ""))
    return out


def _fmt(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.2f}"


def _fmt_config(value: object) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
