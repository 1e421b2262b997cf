"""How long the capacity model takes: per call (what the sidecar pays) and per CLI run.

    .venv/bin/python benchmarks/capacity_speed.py

Medians of 7 runs. Per call: ``estimate`` and ``levers`` (9 estimates) over every catalogue model,
against ``kv_bytes_per_token`` as the in-run baseline. Per CLI run: ``kvwatch capacity ... --format
json`` against ``kvwatch --help`` (interpreter + typer start-up) as the baseline.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvwatch.reconcile import catalogue
from kvwatch.reconcile.capacity import GIB, Deployment, RequestShape, estimate, kv_bytes_per_token, levers

KVWATCH = str(Path(sys.executable).with_name("kvwatch"))
RUNS = 7


def median_seconds(fn: Callable[[], object], repeat: int = 1) -> float:
    """Median wall time of ``fn`` (called ``repeat`` times per run) over RUNS runs, per call."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - start) / repeat)
    return statistics.median(times)


def main() -> None:
    """Print the table."""
    archs = [catalogue.architecture(e) for e in catalogue.CATALOGUE]
    dep = Deployment(pool_bytes=40 * GIB, request=RequestShape(7_500, 1_000, 1_500), gpu_memory_bytes=80 * GIB)
    base = median_seconds(lambda: [kv_bytes_per_token(a) for a in archs], 20) / len(archs)
    est = median_seconds(lambda: [estimate(a, dep) for a in archs], 20) / len(archs)
    lev = median_seconds(lambda: [levers(a, dep) for a in archs], 5) / len(archs)
    print(f"per model ({len(archs)} catalogue models), median of {RUNS}:")
    print(f"  kv_bytes_per_token  {base * 1e6:8.1f} us  (baseline)")
    print(f"  estimate            {est * 1e6:8.1f} us  ({est / base:.1f}x baseline)")
    print(f"  levers (8 rows)     {lev * 1e6:8.1f} us  ({lev / base:.1f}x baseline)")

    def cli(*args: str) -> Callable[[], object]:
        return lambda: subprocess.run([KVWATCH, *args], check=True, capture_output=True)

    help_s = median_seconds(cli("--help"))
    cap_s = median_seconds(
        cli(
            "capacity",
            "--model",
            "llama-3.1-8b",
            "--kv-cache-gib",
            "5",
            "--prompt-tokens",
            "7500",
            "--output-tokens",
            "1000",
            "--format",
            "json",
        )
    )
    print(f"CLI, median of {RUNS}:")
    print(f"  kvwatch --help      {help_s * 1e3:8.1f} ms  (baseline)")
    print(f"  kvwatch capacity    {cap_s * 1e3:8.1f} ms  ({cap_s / help_s:.2f}x baseline)")


if __name__ == "__main__":
    main()
