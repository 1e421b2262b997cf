"""The batch wiring: ``analyze``'s postmortem in one call, files -> parser -> analysis -> evidence.

The sidecar's wiring is kvwatch/sidecar.py; this is the same for saved inputs. ``analyze_paths``
reads the logs (kvwatch.sources.files: plain, ``.gz``, ``-``, in worker processes for big files) and
the saved ``/metrics`` scrapes among the paths (kvwatch.sources.saved_scrapes, told apart by
content), folds them with ``kvwatch.reconcile.analysis.Analysis`` and adds the metrics' evidence
(kvwatch.reconcile.evidence). ``kvwatch analyze``, ``capacity --from-log`` and ``simulate`` call it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvwatch.parse.scrapes import creation_stamp, looks_like_exposition
from kvwatch.sources.files import check_path, paused_gc, started_logs
from kvwatch.sources.saved_scrapes import read_head, read_scrape

if TYPE_CHECKING:
    from kvwatch.reconcile.evidence import EngineTimeline


def split_inputs(paths: list[str]) -> tuple[list[str], list[str]]:
    """``analyze``'s inputs as (logs, scrapes), each in input order, told apart by content.

    Raises UsageError (exit 2) for a missing, unreadable or directory path, before any is read.
    """
    for path in paths:
        check_path(path)
    scrapes = [p for p in paths if (head := read_head(p)) is not None and looks_like_exposition(head)]
    return [p for p in paths if p not in scrapes], scrapes


def analyze_paths(
    paths: list[str],
    *,
    model: str | None = None,
    progress: Callable[[int], None] | None = None,
    jobs: int | None = None,
    timelines: list[EngineTimeline] | None = None,
    prometheus: dict[str, Any] | None = None,
    cache_configs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The analyze document for saved vLLM logs (plain, ``.gz`` or ``-`` for stdin), in order.

    Saved ``/metrics`` scrapes among ``paths`` are recognised by content and read as metrics
    evidence; ``timelines`` (with ``prometheus``, the query that gave them) is Prometheus history.
    ``model`` (a name or a config.json path) goes to ``levers_hook``. ``progress`` is called with
    the bytes read so far. Raises ``kvwatch.errors.UsageError`` for a missing/unreadable input.
    """
    log_paths, scrape_paths = split_inputs(paths)
    with started_logs(log_paths, progress=progress, jobs=jobs) as logs:
        # Imported here, not above: where the logs need workers, they were forked and sent their
        # first ranges just now (files.started_logs), and scan while the reconcile stack (~0.1 s) loads.
        from kvwatch.reconcile.analysis import Analysis
        from kvwatch.reconcile.evidence import (
            EvidenceInputs,
            ScrapeReading,
            TokenRateBound,
            infer_years,
            metrics_evidence,
            scrape_timelines,
        )

        analysis = Analysis()
        with paused_gc():
            for log in logs:
                source = log.path if len(log_paths) > 1 else None
                for batch in log.batches():
                    analysis.add(batch, source=source)
                analysis.add_input(log.path, log.lines, log.bytes)
    readings = []
    scrape_texts: list[tuple[str, float | None, Any]] = []
    if scrape_paths:
        # local: prometheus_client's parser (and its package's HTTP exposition) only for scrapes
        from kvwatch.parse.metrics import parse_exposition
    for path in scrape_paths:
        scrape = read_scrape(path)
        reading = ScrapeReading(path, scrape.mtime, creation_stamp(scrape.text), parse_exposition(scrape.text))
        readings.append(reading)
        scrape_texts.append((scrape.text, scrape.mtime, reading.snapshot))
        analysis.add_input(path, scrape.text.count("\n"), scrape.nbytes)
    all_timelines = list(timelines or [])
    time_source = "prometheus" if timelines else None
    if readings:
        rates = analysis.progress.token_rates()  # the log's own throughput bounds the files' times
        from_scrapes, time_source = scrape_timelines(readings, TokenRateBound(*rates) if rates else None)
        all_timelines += from_scrapes
    metrics = None
    if all_timelines:
        metrics = metrics_evidence(all_timelines, max_num_seqs=analysis.server_facts().max_num_seqs)
    configs = [*(cache_configs or []), *(r.snapshot.cache_config for r in readings)]
    inputs = EvidenceInputs(
        scrapes=len(readings), prometheus=prometheus, time_source=time_source, cache_configs=tuple(configs)
    )
    analysis.simulation_evidence = _simulation_evidence(scrape_texts, timelines)
    doc = analysis.document(model, (metrics, inputs))
    created = [r.created for r in readings if r.created is not None]
    mtimes = [os.path.getmtime(p) for p in log_paths if p != "-" and os.path.isfile(p)]
    infer_years(doc, created=min(created) if created else None, log_mtime=max(mtimes) if mtimes else None)
    return doc


def _simulation_evidence(scrapes: list[tuple[str, float | None, Any]], timelines: list[EngineTimeline] | None) -> Any:
    """What the levers' simulation calibrates on: the saved scrapes, else the Prometheus history."""
    if not scrapes and not timelines:
        return None
    from kvwatch.reconcile.simulate import levers as simulated

    if scrapes:
        mtimes = [m for _t, m, _s in scrapes]
        # Equal modification times (a checkout, a copy) say nothing about when each was taken.
        known = len(set(mtimes)) == len(mtimes)
        return simulated.from_scrapes([(t, m if known else None, s) for t, m, s in scrapes])
    return simulated.from_history([(tl.engine, [(ts.t, ts.sample) for ts in tl.samples]) for tl in timelines or []])
