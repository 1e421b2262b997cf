"""Speed and memory of ``kvwatch simulate``, each against a baseline timed in the same run.

Three figures, medians of --runs (default 3):

* the seed run (tests/fixtures/vllm-cpu-seed, the bundled shared/fixtures/vllm-cpu-seed: log + 20
  scrapes): ``kvwatch simulate`` in-process,
  calibration + replay + the observed scenario + every lever, against reading the same evidence
  alone (the analyze reader + the scrape parser), target < 5 s;
* one simulated hour of a 256-sequence server (closed loop of 300 users, 1,000 + 500 tokens,
  40 % shared prefix, a 448,000-token pool, a 25 ms step), >= 100,000 engine steps, on one core
  (``taskset`` when available), target < 30 s; steps per second printed;
* the verdicts use CPU seconds of the one core (``os.times``, worker processes included): on a shared machine the
  wall clock also counts other jobs' turns; both are printed;
* memory: tracemalloc peak of 10 simulated minutes against 60 of the same server: flat means the
  ratio stays near 1, not 6.

    .venv/bin/python benchmarks/simulate_speed.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from kvwatch.batch import analyze_paths
from kvwatch.commands.simulate import _build, _read_evidence
from kvwatch.reconcile.simulate.engine import EngineConfig, SimResult, StepTime, Workload, simulate
from kvwatch.reconcile.simulate.rules import V0_32_0

SEED = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-cpu-seed"
SERVER = EngineConfig(
    blocks=28_000, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192, prefix_caching=True, max_model_len=8192
)
STEP = StepTime(per_step_s=0.02, per_prefill_token_s=2e-6, per_decode_s=2e-5, per_context_token_s=1e-8)


def _cpu() -> float:
    """CPU seconds of this process and of any worker processes it waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _median(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds (CPU: what one core spent, whatever else the machine runs)."""
    walls, cpus = [], []
    for _ in range(runs):
        w, c = time.perf_counter(), _cpu()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(_cpu() - c)
    return statistics.median(walls), statistics.median(cpus)


def _hour(minutes: float) -> SimResult:
    wl = Workload("closed", 300, None, 1000, 500, 400, minutes * 60.0)
    return simulate(SERVER, wl, STEP, V0_32_0, sample_every_s=15.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    evidence = [str(SEED / "server.log"), *sorted(str(p) for p in SEED.glob("metrics-*.prom"))]

    def read_only() -> None:
        _read_evidence(evidence)
        analyze_paths([evidence[0]])

    def full() -> None:
        _build(
            evidence,
            users=None,
            rate=None,
            prompt_tokens=None,
            output_tokens=None,
            shared_prefix_tokens=None,
            pool_tokens=None,
            duration=None,
            levers=None,
            vllm_version=None,
            seed=0,
            arch=None,
        )

    base_wall, base_cpu = _median(read_only, args.runs)
    seed_wall, seed_cpu = _median(full, args.runs)
    print(
        f"seed run, calibration + all levers: {seed_wall:.2f} s wall, {seed_cpu:.2f} s CPU (reading the evidence "
        f"alone: {base_wall:.2f} s wall, {base_cpu:.2f} s CPU; CPU ratio {seed_cpu / base_cpu:.1f}x); "
        f"target < 5 s of one core: {'ok' if seed_cpu < 5 else 'MISSED'}"
    )

    results: list[SimResult] = []
    hour_wall, hour_cpu = _median(lambda: results.append(_hour(60)), args.runs)
    res = results[-1]
    print(
        f"one simulated hour, 256 sequences: {res.steps:,} steps, {res.finished:,} requests, "
        f"{res.preemptions} preemptions: {hour_wall:.1f} s wall, {hour_cpu:.1f} s CPU on one core "
        f"({res.steps / hour_cpu:,.0f} steps per CPU second); "
        f"target >= 100,000 steps in < 30 s of one core: {'ok' if res.steps >= 100_000 and hour_cpu < 30 else 'MISSED'}"
    )

    peaks = []
    for minutes in (10, 60):
        tracemalloc.start()
        _hour(minutes)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    print(
        f"memory peak: 10 min {peaks[0] / 2**20:.1f} MiB, 60 min {peaks[1] / 2**20:.1f} MiB "
        f"(ratio {peaks[1] / peaks[0]:.2f}; flat means ~1, not 6)"
    )


if __name__ == "__main__":
    main()
