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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kvwatch import cli_options as opt
from kvwatch.batch import analyze_paths  # (its reconcile imports wait until the workers are forked)
from kvwatch.commands.history import engine_history, prometheus_query
from kvwatch.errors import UsageError

if TYPE_CHECKING:
    from kvwatch.reconcile.evidence import EngineTimeline

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
    **prometheus_flags: Any,  # --prometheus URL and its range: commands.history.prometheus_query's
) -> None:
    """Postmortem of saved vLLM logs, /metrics scrapes and Prometheus history: what happened and why."""
    paths = paths or []
    if not paths and not prometheus_flags.get("prometheus"):
        raise UsageError("give saved logs or scrapes (PATH...) or --prometheus URL")
    query = prometheus_query(**prometheus_flags)
    history = engine_history(query) if query is not None else None
    if model_config and model:
        raise UsageError("give --model-config FILE or --model NAME, not both")
    if model_config and not os.path.isfile(model_config):
        raise UsageError(f"{model_config}: no such file; --model-config takes the model's config.json")
    doc = _run(paths, model_config or model, jobs, history)
    if output_format is OutputFormat.json:
        text = json.dumps(doc, indent=2)
    else:
        from kvwatch.export.report import render_markdown, render_text

        text = render_markdown(doc) if output_format is OutputFormat.markdown else render_text(doc)
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


opt.share_options(analyze, prometheus_query)


@contextmanager
def _progress(paths: list[str]) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr for large inputs when both ends are a terminal, else None."""
    total = sum(os.path.getsize(p) for p in paths if p != "-" and os.path.isfile(p))
    if not (sys.stderr.isatty() and sys.stdout.isatty() and total >= PROGRESS_MIN_BYTES):
        yield None
        return
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
        yield lambda n: bar.advance(task, n)


def _run(
    paths: list[str],
    model: str | None,
    jobs: int | None,
    history: tuple[list[EngineTimeline], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    timelines, prometheus = history if history is not None else (None, None)
    configs = prometheus.pop("cache_configs", None) if prometheus else None
    with _progress(paths) as progress:
        return analyze_paths(
            paths,
            model=model,
            jobs=jobs,
            progress=progress,
            timelines=timelines,
            prometheus=prometheus,
            cache_configs=configs,
        )
