"""CPU per followed line in the sidecar's parse step: every line parsed vs the scanner-marked lines only.

The lines are benchmarks/footprint.py's mix (access and "Received request" lines, a stats record per
10 s of a 5,000 lines/s log) and gen_log.py's realistic log, fed in batches the size a follower
hands over at that rate (``--batch``, default 250 lines: 50 ms of log). Both paths run in this
process, interleaved, median of ``--runs``; they give the same records (checked here and in
tests/test_followed_lines.py).

    .venv/bin/python benchmarks/followed_lines_speed.py [--lines 50000] [--batch 250] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from footprint import filler, stats_line  # noqa: E402  (benchmarks/ is not a package)
from gen_log import generate  # noqa: E402

from kvwatch.parse.log import LogParser  # noqa: E402
from kvwatch.sources.scanner import anchored_lines, name  # noqa: E402


def footprint_mix(n: int, rate: int = 5000) -> list[str]:
    """footprint.py's writer, ``n`` lines: a stats record every 10 s of log at ``rate`` lines/s."""
    random.seed(7)
    return [(stats_line(40) if i % (rate * 10) == 0 else filler(i)).rstrip("\n") for i in range(1, n + 1)]


def every_line(lines: list[str], batch: int) -> tuple[float, int]:
    parser = LogParser()
    t0 = time.process_time()
    n = 0
    for i in range(0, len(lines), batch):
        for line in lines[i : i + batch]:
            n += len(parser.feed_line(line))
    return time.process_time() - t0, n + len(parser.finish())


def marked_lines(lines: list[str], batch: int) -> tuple[float, int]:
    parser = LogParser()
    t0 = time.process_time()
    n = 0
    for i in range(0, len(lines), batch):
        part = lines[i : i + batch]
        n += len(parser.feed_lines(part, anchored_lines(part)))
    return time.process_time() - t0, n + len(parser.finish())


def main() -> int:
    """Print CPU microseconds per line for both paths (and one JSON line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "gen.log"
        generate(str(path), args.lines)
        realistic = path.read_text().splitlines()
    result: dict[str, dict[str, float]] = {}
    for label, lines in (("footprint mix", footprint_mix(args.lines)), ("gen_log.py log", realistic)):
        old: list[float] = []
        new: list[float] = []
        for _ in range(args.runs):
            t_old, n_old = every_line(lines, args.batch)
            t_new, n_new = marked_lines(lines, args.batch)
            if n_old != n_new:
                raise SystemExit(f"{label}: {n_old} records line by line, {n_new} with the scanner")
            old.append(t_old)
            new.append(t_new)
        m_old, m_new = statistics.median(old), statistics.median(new)
        per = 1e6 / len(lines)
        result[label] = {"every_line_us": round(m_old * per, 2), "marked_us": round(m_new * per, 2)}
        print(
            f"{label:15s} every line {m_old * per:6.2f} us/line, scanner-marked {m_new * per:6.2f} us/line: "
            f"{m_old / m_new:4.1f}x less CPU ({name()}, batches of {args.batch}, median of {args.runs})"
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
