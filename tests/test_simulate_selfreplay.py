"""A closed loop's own evidence replays its request count: the step time is scaled on it, not on the drain.

The real runs (READMEs under tests/fixtures and shared/fixtures/vllm-cpu-seed): the seed run (46
requests), its re-run (48), the shared-prefix run (53) and the spread run (116), all 20
closed-loop users on vLLM 0.32.0 CPU. Scaled only so the replay drains when the run did, the
re-run and prefix replays sent 44 and 43: the drain hardly moves with the engine's speed in a
closed loop (a faster engine answers more, and has as many in flight when the load ends).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kvwatch.reconcile.simulate.calibrate as calibrate_mod
from kvwatch.reconcile.simulate.calibrate import Calibration
from kvwatch.reconcile.simulate.engine import simulate
from kvwatch.reconcile.simulate.rules import V0_32_0
from tests.helpers import recorded_calibration

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "seed": ROOT / "tests" / "fixtures" / "vllm-cpu-seed",  # the bundled copy of shared/fixtures/vllm-cpu-seed
    "seed-rerun": ROOT / "tests" / "fixtures" / "vllm-cpu-seed-rerun",
    "prefix": ROOT / "tests" / "fixtures" / "vllm-cpu-prefix",
    "spread": ROOT / "tests" / "fixtures" / "vllm-cpu-spread",
}
TRUTH = {"seed": 46, "seed-rerun": 48, "prefix": 53, "spread": 116}  # each README's request count


def _calibration(d: Path) -> Calibration:
    cal: Calibration = recorded_calibration(d)
    return cal


def _replay(cal: Calibration) -> tuple[int, float]:
    r = simulate(cal.engine, cal.workload, cal.step_time, V0_32_0, sample_at=cal.observed.sample_at)
    return r.sent, r.end_s


@pytest.mark.parametrize("name", list(RUNS))
def test_a_closed_loops_replay_sends_its_requests_and_still_drains_near_its_drain(name: str) -> None:
    cal = _calibration(RUNS[name])
    assert cal.observed.requests_sent == TRUTH[name]
    sent, end = _replay(cal)
    assert abs(sent - TRUTH[name]) <= 0.05 * TRUTH[name], sent
    drain = cal.observed.drain_end_s
    assert drain is not None
    assert abs(end - drain) <= 0.1 * drain, end


def test_scaled_on_the_drain_alone_the_replays_undershoot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibrate_mod, "_match_closed_loop_throughput", lambda e, w, s, r, o: (s, False))
    short = {n: _replay(_calibration(RUNS[n]))[0] for n in ("seed-rerun", "prefix")}
    assert short["seed-rerun"] < 0.95 * TRUTH["seed-rerun"], short
    assert short["prefix"] < 0.95 * TRUTH["prefix"], short
