"""The candidate-line scan alone, per 16 MiB chunk of a log: compiled vs pure Python vs one literal.

In one process, interleaved, median of --runs, on the first 16 MiB of FILE (default: the
analyze_speed.py log):

* the candidate lines' spans by the compiled scanner (hyperscan): every pattern-table literal,
  one pass;
* the same by the pure-Python scanner: one ``bytes.find`` pass per literal;
* one ``bytes.find`` pass for "cache": what the big middle of a log used to get instead of every
  literal (the shortcut this reader no longer takes), as the yardstick;
* ``candidate_lines``: the compiled spans plus decoding and parsing the candidates.

    .venv/bin/python benchmarks/scanner_speed.py [FILE] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kvwatch.sources import files, scanner  # noqa: E402  (benchmarks/ is not a package)


def main() -> int:
    """Print the medians."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default="/tmp/kvwatch-bench/vllm-2m.log")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with open(args.file, "rb") as fh:
        data = fh.read(16 << 20)
    hi = data.rfind(b"\n") + 1
    from kvwatch.parse.logpatterns import PREFILTER_ANCHORS

    every = PREFILTER_ANCHORS
    cases: dict[str, Callable[[], object]] = {
        "spans, compiled, every literal": lambda: scanner.line_spans(data, 0, hi),
        "spans, python, every literal": lambda: scanner.find_lines(data, every, {}, 0, hi),
        "spans, python, 'cache' only": lambda: scanner.find_lines(data, (b"cache",), {}, 0, hi),
        "candidate_lines (+ decode, parse)": lambda: files.candidate_lines(data, True, 0, hi),
    }
    t: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, case in cases.items():
            t0 = time.perf_counter()
            case()
            t[name].append(time.perf_counter() - t0)
    os.environ.pop(scanner.ENV_VAR, None)
    load = os.getloadavg()[0]
    print(f"{args.file}: first {hi / 2**20:.1f} MiB; {scanner.name()}; median of {args.runs}; load {load:.1f}")
    base = statistics.median(t["spans, python, 'cache' only"])
    for name, v in t.items():
        m = statistics.median(v)
        print(f"  {name:34s} {m * 1000:7.1f} ms  {m / base:5.2f}x the 'cache'-only pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
