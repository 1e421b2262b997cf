"""The floor of ``kvwatch analyze`` on analyze_speed.py's 2 M-line log: its parts, measured apart.

What each part of a read costs, so that the wall time a design can reach on N cores is a sum, not a
guess. In one process, medians of --runs, on one 16 MiB range of the log (at 64 MiB, the middle of
the stats-heavy body):

* the byte work a worker cannot avoid: the read, the compiled scan for every anchor
  (kvwatch.sources.scanner.line_spans), the newline count;
* the stats rows read from bytes (statsbytes.plain_stats_row over the range's candidate lines) and
  the whole ``files.candidate_lines`` of the range;
* the parent's share per range: unpickling the range's ChunkScan and LogParser.feed_chunk;
* the parent's fold of every record of the log (``Analysis.add``), per record;
* the fixed cost: CPU of ``kvwatch analyze`` on a one-line log (a fresh process, from .pyc);
* ``grep -c 'KV cache usage'`` on the whole log, the yardstick.

Then the floor: (worker parts x ranges + parent parts) / cores, against grep's time.

    .venv/bin/python benchmarks/analyze_floor.py [--runs 5] [--cores 2] [--dir /tmp/kvwatch-bench]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from bytecode import timed_env  # noqa: E402  (benchmarks/ is not a package)
from gen_log import generate  # noqa: E402

from kvwatch.parse.log import LogParser  # noqa: E402
from kvwatch.parse.statsbytes import plain_stats_row  # noqa: E402
from kvwatch.reconcile.analysis import Analysis  # noqa: E402
from kvwatch.sources import files, scanner  # noqa: E402

RANGE_AT = 64 << 20


def _median(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _child_cpu(cmd: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, stdout=subprocess.PIPE, check=True, env=env, cwd=tempfile.gettempdir())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> int:
    """Print the parts and the floor (and one JSON line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/kvwatch-bench")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    log = Path(args.dir) / "vllm-2m.log"
    if not log.exists():
        log.parent.mkdir(parents=True, exist_ok=True)
        generate(str(log), 2_000_000)
    size = log.stat().st_size
    ranges = len(files._ranges(str(log), size))

    def read() -> bytes:
        with log.open("rb") as fh:
            fh.seek(RANGE_AT)
            return fh.read(files.CHUNK_BYTES)

    data = read()
    lo, hi = data.find(b"\n") + 1, data.rfind(b"\n") + 1
    scanner.line_spans(data, lo, hi)  # the database loaded (or compiled) before timing
    spans = sorted(scanner.line_spans(data, lo, hi).items())
    scan = files.candidate_lines(data, True, lo, hi)
    pickled = pickle.dumps(scan, protocol=pickle.HIGHEST_PROTOCOL)

    def parent_share() -> None:
        LogParser().feed_chunk(pickle.loads(pickled).candidates, 0)

    part_ms = {
        "read": _median(read, args.runs),
        "compiled scan": _median(lambda: scanner.line_spans(data, lo, hi), args.runs),
        "newline count": _median(lambda: data.count(b"\n", lo, hi), args.runs),
        "stats rows from bytes": _median(lambda: [plain_stats_row(data, s, e) for s, e in spans], args.runs),
        "candidate_lines (all of the above but the read)": _median(
            lambda: files.candidate_lines(data, True, lo, hi), args.runs
        ),
        "parent: unpickle + feed_chunk": _median(parent_share, args.runs),
    }
    part_ms = {k: v * 1000 for k, v in part_ms.items()}

    batches = list(files.LogInput(str(log), jobs=1).batches())
    records = sum(map(len, batches))

    def fold() -> None:
        analysis = Analysis()
        for batch in batches:
            analysis.add(batch)

    fold_s = _median(fold, max(3, args.runs // 2))
    env = timed_env()
    tiny = REPO / "tests" / "fixtures" / "real" / "logs" / "001-v03-single-stats-line.log"
    analyze = [sys.executable, "-m", "kvwatch", "analyze", "--format", "json", str(tiny)]
    _child_cpu(analyze, env)  # warm-up: the .pyc files
    fixed_s = statistics.median(_child_cpu(analyze, env) for _ in range(args.runs))
    grep_s = _median(
        lambda: subprocess.run(["grep", "-c", "KV cache usage", str(log)], stdout=subprocess.PIPE, check=True),
        args.runs,
    )

    worker_ms = part_ms["read"] + part_ms["candidate_lines (all of the above but the read)"]
    byte_ms = part_ms["read"] + part_ms["compiled scan"] + part_ms["newline count"]
    cpu_s = (worker_ms + part_ms["parent: unpickle + feed_chunk"]) * ranges / 1000 + fold_s + fixed_s
    floor_s = cpu_s / args.cores
    print(f"{log} ({size / 1e6:.0f} MB, {ranges} ranges of 16 MiB, {records:,} records); medians of {args.runs}")
    for name, ms in part_ms.items():
        print(f"  per range: {name:50s} {ms:7.2f} ms")
    print(f"  byte work per range (read + scan + count)              {byte_ms:7.2f} ms")
    print(f"  grep per range-equivalent                              {grep_s * 1000 / ranges:7.2f} ms")
    print(f"  parent fold: {fold_s:.3f} s, {fold_s / records * 1e6:.2f} us per record")
    print(f"  fixed cost (CPU of analyze on a one-line log): {fixed_s:.3f} s")
    ratio = floor_s / grep_s
    print(f"  CPU in all >= {cpu_s:.2f} s; on {args.cores} cores >= {floor_s:.2f} s wall = {ratio:.2f}x grep")
    print(
        json.dumps(
            {
                "ranges": ranges,
                "records": records,
                "part_ms": {k: round(v, 2) for k, v in part_ms.items()},
                "byte_work_ms": round(byte_ms, 2),
                "grep_s": round(grep_s, 3),
                "fold_s": round(fold_s, 3),
                "fixed_s": round(fixed_s, 3),
                "cpu_floor_s": round(cpu_s, 2),
                "wall_floor_s": round(floor_s, 2),
                "floor_vs_grep": round(floor_s / grep_s, 2),
                "cores": args.cores,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
