"""Prometheus history for the commands that read it (``analyze --prometheus``, ``simulate --prometheus``).

One home for what both commands do with their ``--prometheus URL`` and range flags
(kvwatch.cli_options): check the flags, query the range (one ``query_range`` per vLLM series name,
kvwatch.sources.prometheus), and turn the answer into per-engine timelines
(kvwatch.parse.series) plus the ``evidence.prometheus`` description of what was asked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvwatch import cli_options as opt
from kvwatch.errors import UsageError

if TYPE_CHECKING:
    from kvwatch.reconcile.evidence import EngineTimeline


@dataclass(frozen=True, slots=True)
class PrometheusQuery:
    """The ``--prometheus URL`` and range/connection flags of one command line, as given."""

    url: str
    since: str | None = None
    start: str | None = None
    end: str | None = None
    selector: str | None = None
    step: str | None = None
    bearer_token_file: Path | None = None
    ca_file: Path | None = None
    insecure: bool = False


def prometheus_query(
    prometheus: opt.Prometheus = None,
    since: opt.Since = None,
    start: opt.Start = None,
    end: opt.End = None,
    selector: opt.Selector = None,
    step: opt.Step = None,
    bearer_token_file: opt.BearerTokenFile = None,
    ca_file: opt.CaFile = None,
    insecure: opt.Insecure = False,
) -> PrometheusQuery | None:
    """The flags as one query, or None without ``--prometheus``; a range flag without it is a usage error.

    Its parameters are the one declaration of these flags: ``analyze`` and ``simulate`` take them
    (``cli_options.share_options``) and pass them here as they came.
    """
    if prometheus:
        return PrometheusQuery(prometheus, since, start, end, selector, step, bearer_token_file, ca_file, insecure)
    if any(v is not None for v in (since, start, end, selector, step, bearer_token_file)):
        raise UsageError("--since/--start/--end/--selector/--step/--bearer-token-file need --prometheus URL")
    return None


def engine_history(query: PrometheusQuery) -> tuple[list[EngineTimeline], dict[str, Any]]:
    """Prometheus history as engine timelines, and the ``evidence.prometheus`` description."""
    from kvwatch.parse.metricnames import PREFIXES
    from kvwatch.parse.metrics import type_cache_config
    from kvwatch.parse.series import engine_samples, query_names
    from kvwatch.reconcile.evidence import EngineTimeline, TimedSample, iso_utc
    from kvwatch.sources.prometheus import (
        PrometheusClient,
        parse_duration,
        parse_time,
        read_history,
        selector_matchers,
    )
    from kvwatch.sources.scrape import redact

    since, start, end = query.since, query.start, query.end
    if since is not None and start is not None:
        raise UsageError("give --since DURATION or --start T [--end T], not both")
    t_end = parse_time(end, "--end") if end is not None else time.time()
    t_start = parse_time(start, "--start") if start is not None else t_end - parse_duration(since or "1h", "--since")
    if t_start >= t_end:
        raise UsageError(f"--start must be before --end ({start} .. {end}); give an earlier --start")
    step_s = parse_duration(query.step, "--step") if query.step is not None else None
    matchers = selector_matchers(query.selector)
    token = None
    if query.bearer_token_file is not None:
        try:
            token = query.bearer_token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(
                f"--bearer-token-file {query.bearer_token_file}: cannot read ({exc.strerror}); give a readable file"
            ) from None
    verify: bool | str = not query.insecure
    if query.ca_file is not None and not query.insecure:
        if not query.ca_file.is_file():
            raise UsageError(f"--ca-file {query.ca_file}: no such file; give a PEM CA bundle, or --insecure")
        verify = str(query.ca_file)
    client = PrometheusClient(query.url, bearer_token=token, verify=verify)
    names = query_names()
    read = read_history(
        client,
        matchers,
        t_start,
        t_end,
        step_s,
        fine_names=names.fine,
        increase_names=names.increase,
        probe_names=names.probe,
    )
    timelines = [
        EngineTimeline(inst, model, engine, "prometheus", tuple(map(TimedSample._make, rows)))
        for (inst, model, engine), rows in sorted(
            engine_samples(read.series).items(), key=lambda kv: tuple(str(x) for x in kv[0])
        )
    ]
    configs = [
        type_cache_config(labels)
        for labels in client.info_labels([p + "cache_config_info" for p, _why in PREFIXES], matchers, t_start, t_end)
    ]
    info: dict[str, Any] = {
        "url": redact(query.url),
        "selector": query.selector,
        "start": iso_utc(t_start),
        "end": iso_utc(t_end),
        "step": read.step,
        "coarse_step": round(read.coarse_step, 3),
        "queries": len(read.queries),
        "requests": client.requests_sent,
        "cache_configs": configs,
    }
    return timelines, info
