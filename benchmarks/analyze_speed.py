"""Speed and memory of ``kvwatch analyze --format json`` on a large realistic log, against grep.

Generates (once, cached in --dir) a 2,000,000-line and a 4,000,000-line log with gen_log.py, then
in the same run times, median of --runs (default 3):

* ``grep -c 'KV cache usage' FILE`` (the baseline: one literal, one pass, C);
* ``kvwatch analyze --format json FILE > /dev/null``;

and prints lines/s, the ratio to grep, and the peak RSS of kvwatch (its largest process, workers
included) on 2 M vs 4 M lines: streaming means the second must not be about twice the first.

    .venv/bin/python benchmarks/analyze_speed.py [--dir /tmp/kvwatch-bench] [--runs 3] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gen_log import generate  # noqa: E402  (benchmarks/ is not a package)

KVWATCH = [str(Path(sys.executable).with_name("kvwatch"))]
TARGET_LINES_PER_S = 3_000_000
TARGET_RATIO = 4.5

_RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "with open('/dev/null', 'wb') as out:\n"
    "    rc = subprocess.run(sys.argv[1:], stdout=out).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)\n"
)


def _timed(cmd: list[str]) -> float:
    # Output goes to a pipe, not /dev/null: GNU grep stops at the first match when its output is
    # /dev/null, which would time nothing.
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.PIPE, check=True)
    return time.perf_counter() - t0


def _peak_rss_kib(cmd: list[str]) -> int:
    """Peak RSS (KiB) of the largest process ``cmd`` ran, measured in a fresh wrapper process."""
    out = subprocess.run([sys.executable, "-c", _RSS_WRAPPER, *cmd], capture_output=True, text=True, check=True)
    rss, rc = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"{cmd} exited {rc}")
    return int(rss)


def main() -> int:
    """Run the benchmark and print the figures (also as one JSON line for notes)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/kvwatch-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None, help="pass --jobs to kvwatch analyze")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    logs = {}
    for n in (2_000_000, 4_000_000):
        path = Path(args.dir) / f"vllm-{n // 1_000_000}m.log"
        if not path.exists():
            print(f"generating {path} ...", flush=True)
            generate(str(path), n)
        logs[n] = path
    two = str(logs[2_000_000])
    analyze = [*KVWATCH, "analyze", "--format", "json"]
    if args.jobs:
        analyze += ["--jobs", str(args.jobs)]
    grep_t, kv_t = [], []
    for _ in range(args.runs):  # interleaved, so both see the same machine load
        grep_t.append(_timed(["grep", "-c", "KV cache usage", two]))
        kv_t.append(_timed([*analyze, two]))
    g, k = statistics.median(grep_t), statistics.median(kv_t)
    rss2 = _peak_rss_kib([*analyze, two])
    rss4 = _peak_rss_kib([*analyze, str(logs[4_000_000])])
    size_mb = os.path.getsize(two) / 1e6
    result = {
        "lines": 2_000_000,
        "file_mb": round(size_mb, 1),
        "grep_s": round(g, 3),
        "kvwatch_s": round(k, 3),
        "kvwatch_lines_per_s": round(2_000_000 / k),
        "ratio_to_grep": round(k / g, 2),
        "ratio_target_met": k / g <= TARGET_RATIO,
        "lines_per_s_target_met": 2_000_000 / k >= TARGET_LINES_PER_S,
        "peak_rss_mib_2m": round(rss2 / 1024, 1),
        "peak_rss_mib_4m": round(rss4 / 1024, 1),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }
    print(f"file: 2,000,000 lines, {size_mb:,.0f} MB; median of {args.runs} runs")
    print(f"grep -c 'KV cache usage'   {g:7.3f} s")
    print(f"kvwatch analyze --format json {k:7.3f} s  = {2_000_000 / k:,.0f} lines/s, {k / g:.2f}x grep")
    # Two criteria, reported apart: the ratio to grep is the one that holds on any machine; the
    # absolute rate depends on the CPU (and includes ~0.3 s of Python start-up).
    print(f"ratio target <= {TARGET_RATIO}x grep: {'met' if k / g <= TARGET_RATIO else 'NOT met'} ({k / g:.2f}x)")
    print(
        f"absolute target >= {TARGET_LINES_PER_S:,} lines/s: "
        f"{'met' if 2_000_000 / k >= TARGET_LINES_PER_S else 'NOT met'} ({2_000_000 / k:,.0f} lines/s)"
    )
    print(f"peak RSS: {rss2 / 1024:,.1f} MiB on 2 M lines, {rss4 / 1024:,.1f} MiB on 4 M lines")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
