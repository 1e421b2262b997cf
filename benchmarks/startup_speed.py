"""Start-up of the CLI: ``kvwatch --help``, ``capacity``, ``snapshot FILE`` against ``python -c pass``.

Each command imports only its own module (kvwatch/cli.py); this measures what that buys. Wall time
of a fresh process, median of --runs (default 15), all four commands interleaved so that they see
the same machine load; the interpreter's own start-up (``python -c pass``) is the baseline.

    .venv/bin/python benchmarks/startup_speed.py [--runs 15] [--baseline-src DIR]

``--baseline-src DIR`` also times an older kvwatch (a directory holding its ``kvwatch/`` package,
e.g. ``git archive REV kvwatch | tar -x -C DIR``) run as ``python -m kvwatch`` in the same loop.

Bytecode: the timed processes load kvwatch from .pyc files, as installed (benchmarks/bytecode.py);
``--no-bytecode`` times the environment as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bytecode import describe, timed_env

REPO = Path(__file__).resolve().parent.parent
# `python -m kvwatch`: the console script's own imports, and the same shape as the baseline's run.
KVWATCH = [sys.executable, "-m", "kvwatch"]
SCRAPE = REPO / "tests/fixtures/real/metrics/106-v033-cache-config-info-curl.prom"
TARGET_S = 0.120

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "kvwatch --help": [*KVWATCH, "--help"],
    "kvwatch capacity": [*KVWATCH, "capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--kv-cache-gib", "5"],
    "kvwatch snapshot FILE": [*KVWATCH, "snapshot", str(SCRAPE)],
}


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    # cwd: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH; run from
    # the repository, the baseline would import this tree's kvwatch.
    subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True, env=env, cwd=tempfile.gettempdir())
    return time.perf_counter() - t0


def main() -> int:
    """Print the medians (and one JSON line)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--baseline-src", default=None, help="an older kvwatch source tree to time beside")
    ap.add_argument("--no-bytecode", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    args = ap.parse_args()
    env = timed_env(keep=args.no_bytecode)
    here = {**env, "PYTHONPATH": str(REPO)}  # this tree, whatever the venv has installed
    commands: dict[str, tuple[list[str], dict[str, str] | None]] = {k: (v, here) for k, v in COMMANDS.items()}
    if args.baseline_src:
        base_env = {**env, "PYTHONPATH": args.baseline_src}
        for name, cmd in COMMANDS.items():
            if name.startswith("kvwatch"):
                commands["baseline " + name] = (cmd, base_env)
    for cmd, env in commands.values():  # warm the page cache and the .pyc files
        _timed(cmd, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, (cmd, env) in commands.items():
            times[name].append(_timed(cmd, env))
    med = {name: statistics.median(v) for name, v in times.items()}
    best = {name: min(v) for name, v in times.items()}  # beside the median: the load here is spiky
    base = med["python -c pass"]
    print(f"median (and best) of {args.runs} runs, load average {os.getloadavg()[0]:.1f}, {describe(env)}")
    for name, m in med.items():
        verdict = "" if not name.startswith("kvwatch") else f"  {'met' if m <= TARGET_S else 'NOT met'} (<= 120 ms)"
        print(f"{name:33s} {m * 1000:7.1f} ms ({best[name] * 1000:6.1f})  {m / base:5.1f}x python -c pass{verdict}")
    out = {
        "median_ms": {k: round(v * 1000, 1) for k, v in med.items()},
        "best_ms": {k: round(v * 1000, 1) for k, v in best.items()},
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "bytecode": "PYTHONDONTWRITEBYTECODE" not in env,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
