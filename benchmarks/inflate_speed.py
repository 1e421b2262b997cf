"""Inflating a .gz log: ISA-L (python-isal) against the standard library's zlib, same run.

The one serial step of reading a .gz (kvwatch.sources.inflate): CPU seconds to inflate FILE
(default: analyze_speed.py's 2 M-line log as .gz) in 16 MiB reads, as ``kvwatch analyze`` does,
interleaved, median of --runs, each inflater in a fresh process.

    .venv/bin/python benchmarks/inflate_speed.py [FILE] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

_INFLATE = (
    "import os, sys, time\n"
    "os.environ['KVWATCH_GZIP'] = sys.argv[2]\n"
    "from kvwatch.sources import inflate\n"
    "t0 = time.process_time()\n"
    "n = 0\n"
    "with inflate.open_gzip(sys.argv[1]) as fh:\n"
    "    while block := fh.read(16 << 20):\n"
    "        n += len(block)\n"
    "print(time.process_time() - t0, n, inflate.name())\n"
)


def _cpu(path: str, which: str) -> tuple[float, int, str]:
    out = subprocess.run([sys.executable, "-c", _INFLATE, path, which], capture_output=True, text=True, check=True)
    cpu, n, *name = out.stdout.split()
    return float(cpu), int(n), " ".join(name)


def main() -> int:
    """Print the figures (and one JSON line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default="/tmp/kvwatch-bench/vllm-2m.log.gz")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cpu: dict[str, list[float]] = {"best": [], "zlib": []}
    names: dict[str, str] = {}
    sizes = set()
    for _ in range(args.runs):
        for which in ("best", "zlib"):
            seconds, n, name = _cpu(args.file, which)
            cpu[which].append(seconds)
            names[which] = name
            sizes.add(n)
    if len(sizes) != 1:
        print(f"the inflaters gave different sizes: {sorted(sizes)}", file=sys.stderr)
        return 1
    m = {k: statistics.median(v) for k, v in cpu.items()}
    mb = sizes.pop() / 1e6
    print(f"{args.file}: {mb:,.1f} MB inflated, CPU seconds, median of {args.runs}:")
    print(f"  {names['best']:<14} {m['best']:.3f} s ({mb / m['best']:,.0f} MB/s)")
    print(f"  {names['zlib']:<14} {m['zlib']:.3f} s ({mb / m['zlib']:,.0f} MB/s)")
    print(f"  zlib / best: {m['zlib'] / m['best']:.2f}x")
    print(json.dumps({"inflated_mb": round(mb, 1), "cpu_s": m, "names": names, "speedup": m["zlib"] / m["best"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
