"""What the fold of ``Analysis.add`` costs per stats record, against an older kvwatch, same run.

Parses tests/fixtures/vllm-cpu-seed/server.log once, repeats its records until --records stats
records, and times ``Analysis().add(records)`` (the fold alone: no reading, no parsing), in a fresh
process per sample, alternating this tree and ``--baseline-src DIR`` (a directory holding an older
``kvwatch/`` package, e.g. ``git archive main kvwatch | tar -x -C DIR``) so both see the same
machine load; the figure is the fold's CPU time (``time.process_time``), which another process's
load on the cores disturbs far less than wall time. Prints the medians and their ratio.

    .venv/bin/python benchmarks/fold_cost.py --baseline-src DIR [--records 400000] [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_PROBE = """
import sys, time
sys.path.insert(0, sys.argv[1])
from kvwatch.parse.log import LogParser
from kvwatch.reconcile.analysis import Analysis
from kvwatch.records import StatsRecord
parser = LogParser()
records = []
with open(sys.argv[2], encoding="utf-8", errors="replace") as fh:
    for line in fh:
        records.extend(parser.feed_line(line))
records.extend(parser.finish())
stats = sum(1 for r in records if type(r) is StatsRecord)
records = records * (int(sys.argv[3]) // max(stats, 1) + 1)
t0 = time.process_time()
Analysis().add(records)
print(time.process_time() - t0)
"""


def _sample(src: str, log: str, records: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, src, log, str(records)], capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise SystemExit(out.stderr.strip().splitlines()[-1])
    return float(out.stdout.strip())


def main() -> int:
    """Time both trees, alternating, and print medians and the ratio."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-src", required=True)
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    log = str(REPO / "tests" / "fixtures" / "vllm-cpu-seed" / "server.log")
    here: list[float] = []
    base: list[float] = []
    for _ in range(args.runs):
        base.append(_sample(args.baseline_src, log, args.records))
        here.append(_sample(str(REPO), log, args.records))
    h, b = statistics.median(here), statistics.median(base)
    print(
        f"fold of ~{args.records:,} stats records, median of {args.runs}: "
        f"this tree {h:.3f} s CPU, baseline {b:.3f} s CPU"
    )
    print(f"ratio this / baseline: {h / b:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
