"""Where ``kvwatch analyze``'s CPU goes on one log, stage by stage, in this process (no workers).

Per 16 MiB chunk (the workers' unit), median of ``--runs``: the compiled anchor scan, the newline
count that numbers the lines, and the whole candidate-line read (scan + decode + parse); then over
the whole file: the parent's feed (rows -> records) and fold (records -> document state) per
record, and the document. These are the floors the speed targets are judged against (figures in
the issue notes).

    .venv/bin/python benchmarks/analyze_breakdown.py LOG [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

from kvwatch.parse.log import LogParser
from kvwatch.reconcile.analysis import Analysis
from kvwatch.sources import files, scanner


def _median(func: object, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        func()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    """Print the figures (and one JSON line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    gc.disable()
    with open(args.log, "rb") as fh:
        data = fh.read(files.CHUNK_BYTES)
    hi = data.rfind(b"\n") + 1
    chunk = {
        "anchor_scan_ms": _median(lambda: scanner.line_spans(data, 0, hi), args.runs) * 1e3,
        "newline_count_ms": _median(lambda: data.count(b"\n", 0, hi), args.runs) * 1e3,
        "candidate_lines_ms": _median(lambda: files.candidate_lines(data, True, 0, hi), args.runs) * 1e3,
    }
    candidates = len(files.candidate_lines(data, True, 0, hi).candidates)
    scans = list(files._scans(args.log, 1))
    parser = LogParser()
    lines = 0
    t0 = time.perf_counter()
    batches = []
    for sc in scans:
        batches.append(parser.feed_chunk(sc.candidates, lines))
        lines += sc.lines
    batches.append(parser.finish())
    feed = time.perf_counter() - t0
    records = sum(len(b) for b in batches)
    analysis = Analysis()
    t0 = time.perf_counter()
    for batch in batches:
        analysis.add(batch)
    fold = time.perf_counter() - t0
    t0 = time.perf_counter()
    analysis.document()
    document = time.perf_counter() - t0
    result = {
        "scanner": scanner.name(),
        "chunk": {k: round(v, 2) for k, v in chunk.items()},
        "chunk_candidates": candidates,
        "chunks": len(scans),
        "records": records,
        "feed_s": round(feed, 3),
        "fold_s": round(fold, 3),
        "fold_us_per_record": round(fold / max(records, 1) * 1e6, 2),
        "document_s": round(document, 3),
    }
    c = result["chunk"]
    print(f"{scanner.name()}; per 16 MiB chunk ({candidates} candidate lines), median of {args.runs}:")
    print(f"  anchor scan {c['anchor_scan_ms']} ms, newline count {c['newline_count_ms']} ms, ", end="")
    print(f"whole candidate read {c['candidate_lines_ms']} ms; {len(scans)} chunks")
    per = result["fold_us_per_record"]
    print(f"parent: feed {feed:.3f} s, fold {fold:.3f} s ({per} us x {records} records)", end="")
    print(f", document {document:.3f} s (first call, with its imports)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
