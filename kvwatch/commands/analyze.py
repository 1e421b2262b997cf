"""`kvwatch analyze PATH...`: postmortem of saved vLLM logs (plain, ``.gz``, ``-`` for stdin).

Wires files -> log parser -> analysis -> report. ``--format json`` prints the ``kvwatch.analyze/1``
document of docs/contracts.md; ``text`` is for an on-call engineer, ``markdown`` for an incident doc.
Exit codes (docs/contracts.md): 2 when an input cannot be read (missing, a directory, unreadable, a
damaged .gz); 1 when the inputs were read but hold no vLLM line at all (the document is still
printed); 0 otherwise. A progress bar goes to stderr for large inputs, only on a terminal.
"""

from __future__ import annotations

import json
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvwatch import cli_options as opt
from kvwatch.errors import UsageError
from kvwatch.export.report import render_markdown, render_text
from kvwatch.reconcile.analysis import analyze_paths
from kvwatch.reconcile.evidence import EngineTimeline, TimedSample, iso_utc

PROGRESS_MIN_BYTES = 64 << 20  # smaller inputs finish before a bar is worth drawing


class OutputFormat(StrEnum):
    """Output formats of ``kvwatch analyze``."""

    text = "text"
    json = "json"
    markdown = "markdown"


def analyze(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="PATH...",
            help="Saved vLLM logs and /metrics scrapes (recognised by content): plain, .gz, or - for stdin.",
            show_default=False,
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="text (on-call), json (kvwatch.analyze/1) or markdown.")
    ] = OutputFormat.text,
    model_config: Annotated[
        str | None, typer.Option("--model-config", metavar="FILE", help="The model's config.json, for levers.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", metavar="NAME", help="A model name from the catalogue, for levers.")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", min=1, help="Worker processes for a large file (default: CPUs, at most 4).")
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option("--prometheus", metavar="URL", help="Read vLLM's series from a Prometheus-compatible HTTP API."),
    ] = None,
    since: opt.Since = None,
    start: opt.Start = None,
    end: opt.End = None,
    selector: opt.Selector = None,
    step: opt.Step = None,
    bearer_token_file: opt.BearerTokenFile = None,
    ca_file: opt.CaFile = None,
    insecure: opt.Insecure = False,
) -> None:
    """Postmortem of saved vLLM logs, /metrics scrapes and Prometheus history: what happened and why."""
    paths = paths or []
    if not paths and not prometheus:
        raise UsageError("give saved logs or scrapes (PATH...) or --prometheus URL")
    history = None
    if prometheus:
        history = _history(prometheus, since, start, end, selector, step, bearer_token_file, ca_file, insecure)
    elif any(v is not None for v in (since, start, end, selector, step, bearer_token_file)):
        raise UsageError("--since/--start/--end/--selector/--step/--bearer-token-file need --prometheus URL")
    if model_config and model:
        raise UsageError("give --model-config FILE or --model NAME, not both")
    if model_config and not os.path.isfile(model_config):
        raise UsageError(f"{model_config}: no such file; --model-config takes the model's config.json")
    doc = _run(paths, model_config or model, jobs, history)
    if output_format is OutputFormat.json:
        text = json.dumps(doc, indent=2)
    elif output_format is OutputFormat.markdown:
        text = render_markdown(doc)
    else:
        text = render_text(doc)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    if doc["records_total"] == 0 and doc["evidence"]["scrapes"] and not doc["evidence"]["metrics_samples"]:
        print(
            f"kvwatch: error: {', '.join(paths)}: no vLLM log lines, and the scrapes hold no per-engine vLLM "
            "series (vllm:num_requests_running, ...); save the whole /metrics: curl http://HOST:8000/metrics",
            file=sys.stderr,
        )
        raise typer.Exit(1)
    if doc["records_total"] == 0 and not doc["evidence"]["metrics_samples"]:
        names = ", ".join(p for p in paths)
        print(
            f"kvwatch: error: {names}: no vLLM log lines found; pass the server's own output "
            "(vllm serve ... > server.log 2>&1, or kubectl logs POD)",
            file=sys.stderr,
        )
        raise typer.Exit(1)


def _history(
    url: str,
    since: str | None,
    start: str | None,
    end: str | None,
    selector: str | None,
    step: str | None,
    bearer_token_file: Path | None,
    ca_file: Path | None,
    insecure: bool,
) -> tuple[list[EngineTimeline], dict[str, Any]]:
    """Prometheus history as engine timelines, and the ``evidence.prometheus`` description."""
    from kvwatch.parse.metricnames import PREFIXES
    from kvwatch.parse.metrics import type_cache_config
    from kvwatch.parse.series import engine_samples, query_names
    from kvwatch.sources.prometheus import (
        PrometheusClient,
        parse_duration,
        parse_time,
        read_history,
        selector_matchers,
    )
    from kvwatch.sources.scrape import redact

    if since is not None and start is not None:
        raise UsageError("give --since DURATION or --start T [--end T], not both")
    t_end = parse_time(end, "--end") if end is not None else time.time()
    t_start = parse_time(start, "--start") if start is not None else t_end - parse_duration(since or "1h", "--since")
    if t_start >= t_end:
        raise UsageError(f"--start must be before --end ({start} .. {end}); give an earlier --start")
    step_s = parse_duration(step, "--step") if step is not None else None
    matchers = selector_matchers(selector)
    token = None
    if bearer_token_file is not None:
        try:
            token = bearer_token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(
                f"--bearer-token-file {bearer_token_file}: cannot read ({exc.strerror}); give a readable file"
            ) from None
    verify: bool | str = not insecure
    if ca_file is not None and not insecure:
        if not ca_file.is_file():
            raise UsageError(f"--ca-file {ca_file}: no such file; give a PEM CA bundle, or --insecure")
        verify = str(ca_file)
    client = PrometheusClient(url, bearer_token=token, verify=verify)
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
        "url": redact(url),
        "selector": selector,
        "start": iso_utc(t_start),
        "end": iso_utc(t_end),
        "step": read.step,
        "coarse_step": round(read.coarse_step, 3),
        "queries": len(read.queries),
        "requests": client.requests_sent,
        "cache_configs": configs,
    }
    return timelines, info


def _run(
    paths: list[str],
    model: str | None,
    jobs: int | None,
    history: tuple[list[EngineTimeline], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    timelines, prometheus = history if history is not None else (None, None)
    configs = prometheus.pop("cache_configs", None) if prometheus else None
    total = 0
    for p in paths:
        if p != "-" and os.path.isfile(p):
            total += os.path.getsize(p)
    show = sys.stderr.isatty() and sys.stdout.isatty() and total >= PROGRESS_MIN_BYTES
    if not show:
        return analyze_paths(
            paths, model=model, jobs=jobs, timelines=timelines, prometheus=prometheus, cache_configs=configs
        )
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("reading logs", total=total)
        return analyze_paths(
            paths,
            model=model,
            jobs=jobs,
            progress=lambda n: bar.advance(task, n),
            timelines=timelines,
            prometheus=prometheus,
            cache_configs=configs,
        )
