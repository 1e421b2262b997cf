"""CPU cost of the sidecar's background what-if recompute (kvwatch_whatif_* gauges).

Two figures, medians of --runs (default 3), in CPU seconds of the recomputing thread
(``time.thread_time``; on a shared machine the wall clock also counts other jobs' turns):

* the seed run's window (tests/fixtures/vllm-cpu-seed: log + 20 scrapes, one engine, 46
  requests) fed through the sidecar's wiring, then one ``recompute_whatif_once``: calibration,
  the observed scenario and every lever ``capacity`` can size;
* the cap's worst case: a 256-sequence server (the simulate_speed.py server: a closed loop of 300
  users, 1,000 + 500 tokens, a 448,000-token pool, a 25 ms step) simulated for the longest load
  the sidecar simulates (``MAX_LOAD_SECONDS``), once per scenario of a recompute (observed + 7
  levers), against the budget (``WHATIF_CPU_SHARE`` of one core per ``WHATIF_INTERVAL_SECONDS``).

    .venv/bin/python benchmarks/whatif_cost.py [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kvwatch.parse.log import LogParser
from kvwatch.parse.scrapeseries import scraped_at
from kvwatch.reconcile.live import LiveState
from kvwatch.reconcile.simulate.engine import EngineConfig, StepTime, Workload, simulate
from kvwatch.reconcile.simulate.rules import V0_32_0
from kvwatch.reconcile.simulate.whatif import MAX_LOAD_SECONDS, MAX_SIM_SECONDS
from kvwatch.sidecar import WHATIF_CPU_SHARE, WHATIF_INTERVAL_SECONDS, Sidecar, read_exposition_timed, whatif_outcomes
from kvwatch.sources.scrape import ScrapeResult

SEED = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-cpu-seed"
SERVER = EngineConfig(
    blocks=28_000, block_size=16, max_num_seqs=256, max_num_batched_tokens=8192, prefix_caching=True, max_model_len=8192
)
STEP = StepTime(per_step_s=0.02, per_prefill_token_s=2e-6, per_decode_s=2e-5, per_context_token_s=1e-8)
SCENARIOS = 8  # observed + the levers a recompute simulates at most (pool x5, prefix, fewer prompt)
BASE = 1_800_000_000.0


class _Clock:
    def __init__(self) -> None:
        self.now = BASE

    def __call__(self) -> float:
        return self.now


class _Scraper:
    def __init__(self, texts: list[str], clock: _Clock) -> None:
        self.texts, self.clock = texts, clock

    def scrape(self) -> ScrapeResult:
        text = self.texts.pop(0)
        return ScrapeResult(True, read_exposition_timed(text).snapshot, None, 0.0, self.clock(), 200, len(text), True)

    def next_delay(self) -> float:
        return 10.0


def seed_recompute() -> float:
    """CPU seconds of one recompute on the seed run's window."""
    scrapes = sorted((scraped_at(p.read_text()) or 0.0, p.read_text()) for p in SEED.glob("metrics-*.prom"))
    clock = _Clock()
    sidecar = Sidecar(
        LiveState(scrape_interval=10.0),
        parser=LogParser(),
        lines=None,
        scraper=_Scraper([t for _a, t in scrapes], clock),  # type: ignore[arg-type]
        listen="127.0.0.1:0",
        clock=clock,
        whatif=lambda facts, points: whatif_outcomes(facts, points, None),
    )
    try:
        sidecar.feed_lines((SEED / "server.log").read_text().splitlines())
        sidecar.flush_parser()
        for at, _text in scrapes:
            clock.now = BASE + at
            sidecar.scrape_once()
        assert sidecar.recompute_whatif_once()
        assert sidecar.whatif_cpu_seconds is not None
        return sidecar.whatif_cpu_seconds
    finally:
        sidecar.server.close()


def capped_worst_case() -> tuple[float, int]:
    """CPU seconds and engine steps of SCENARIOS capped simulations of the 256-sequence server."""
    started = time.thread_time()
    steps = 0
    for _ in range(SCENARIOS):
        wl = Workload("closed", 300, None, 1000, 500, 400, MAX_LOAD_SECONDS)
        steps += simulate(SERVER, wl, STEP, V0_32_0, sample_every_s=10.0, max_sim_s=MAX_SIM_SECONDS).steps
    return time.thread_time() - started, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    seed = statistics.median(seed_recompute() for _ in range(args.runs))
    worst = [capped_worst_case() for _ in range(args.runs)]
    cpu = statistics.median(c for c, _s in worst)
    steps = worst[0][1]
    budget = WHATIF_CPU_SHARE * WHATIF_INTERVAL_SECONDS
    print(f"seed run window, one recompute (calibration + observed + levers): {seed:.3f} CPU s")
    print(f"  = {100 * seed / WHATIF_INTERVAL_SECONDS:.2f} % of one core at one recompute a minute")
    print(
        f"256-sequence server, {MAX_LOAD_SECONDS:.0f} s of load x {SCENARIOS} scenarios: {cpu:.2f} CPU s, "
        f"{steps:,} engine steps ({steps / cpu:,.0f} steps/s)"
    )
    gap = max(WHATIF_INTERVAL_SECONDS, cpu / WHATIF_CPU_SHARE)
    print(
        f"  budget {budget:.1f} CPU s a minute ({100 * WHATIF_CPU_SHARE:.0f} % of a core): "
        f"the next recompute waits {gap:.0f} s, {100 * cpu / gap:.1f} % of one core"
    )


if __name__ == "__main__":
    main()
