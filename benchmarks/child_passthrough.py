"""Cost of wrapper mode's pass-through (kvwatch.sources.child) against ``cat`` in the same run.

A child writes vLLM-sized lines (~250 bytes) to stdout at --rate lines/s; ChildProcess copies
them through (to /dev/null here) and splits them into lines for a callback that only counts.
Baseline: the same child piped into ``cat > /dev/null``. CPU is the reader's own (the child's is
excluded on both sides). Median of --runs runs.

    .venv/bin/python benchmarks/child_passthrough.py [--seconds 10] [--rate 500] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITER = """
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
pad = "." * 200
start = time.monotonic(); n = 0
while (now := time.monotonic()) - start < seconds:
    due = start + n / rate
    if due > now:
        time.sleep(due - now)
    sys.stdout.write(f"INFO 11-29 15:05:55 [loggers.py:123] n={n} {pad}\\n")
    sys.stdout.flush()
    n += 1
"""


def kvwatch_run(seconds: float, rate: float) -> tuple[float, int]:
    """CPU % of a core spent in this process by ChildProcess, and the lines it delivered."""
    from kvwatch.sources.child import ChildProcess
    from kvwatch.sources.lines import Line

    count = 0

    def on_line(_line: Line) -> None:
        nonlocal count
        count += 1

    with open(os.devnull, "wb") as sink:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        child = ChildProcess(
            [sys.executable, "-c", WRITER, str(rate), str(seconds)], on_line=on_line, stdout=sink, forward_signals=()
        )
        child.start()
        child.wait()
        wall = time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return 100 * cpu / wall, count


def cat_run(seconds: float, rate: float) -> float:
    """CPU % of a core spent by ``cat`` reading the same child."""
    with open(os.devnull, "wb") as sink:
        t0 = time.monotonic()
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(rate), str(seconds)], stdout=subprocess.PIPE)
        cat = subprocess.Popen(["cat"], stdin=writer.stdout, stdout=sink)
        assert writer.stdout is not None
        writer.stdout.close()
        writer.wait()
        fields = Path(f"/proc/{cat.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        cat.wait()
        return 100 * cpu / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    ours, lines, cats = [], [], []
    for _ in range(args.runs):
        pct, count = kvwatch_run(args.seconds, args.rate)
        ours.append(pct)
        lines.append(count)
        cats.append(cat_run(args.seconds, args.rate))
    ours_med, cat_med = statistics.median(ours), statistics.median(cats)
    ratio = f"{ours_med / cat_med:.1f}x" if cat_med > 0 else "n/a: cat under the tick"
    print(
        f"{args.rate:g} lines/s for {args.seconds:g} s, median of {args.runs} runs: "
        f"ChildProcess cpu={ours_med:.2f}% of a core, lines={statistics.median(lines):.0f}; "
        f"cat cpu={cat_med:.2f}% (ratio {ratio})"
    )


if __name__ == "__main__":
    main()
