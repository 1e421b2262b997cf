"""`kvwatch simulate` on a real run whose request sizes spread over several histogram buckets.

The run: tests/fixtures/vllm-cpu-spread (vLLM 0.32.0 CPU, the seed server's flags, 20 closed-loop
users, prompts uniform in 600..7,500 and outputs in 100..1,000 tokens); its truth, read by hand
before kvwatch ran on it, is in its README: 116 requests, 22 preemptions, max running 12, means
7.44 running and 8.44 waiting over the 16 scrapes, prompt mean 3,979.5 and output mean 579.1.

One real run is one draw of sizes and arrivals, so the replay is compared by its median over
seeds, as the open-loop test does.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.reconcile.simulate.calibrate import Calibration
from kvwatch.reconcile.simulate.engine import Workload, simulate
from kvwatch.reconcile.simulate.rules import V0_32_0
from kvwatch.reconcile.simulate.sizes import SizeDist
from tests.helpers import recorded_calibration

SPREAD = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu-spread"
SEEDS = range(15)


def _calibration(d: Path) -> Calibration:
    cal: Calibration = recorded_calibration(d)
    return cal


@dataclass(frozen=True)
class Medians:
    sent: float
    preemptions: float
    max_running: float
    mean_running: float
    mean_waiting: float


def _medians(cal: Calibration, wl: Workload) -> Medians:
    rows = []
    for seed in SEEDS:
        r = simulate(cal.engine, wl, cal.step_time, V0_32_0, sample_at=cal.observed.sample_at, seed=seed)
        run = [s.running for s in r.samples]
        wait = [s.waiting for s in r.samples]
        rows.append((r.sent, r.preemptions, max(run), statistics.fmean(run), statistics.fmean(wait)))
    return Medians(*(statistics.median(col) for col in zip(*rows, strict=True)))


@pytest.fixture(scope="module")
def cal() -> Calibration:
    return _calibration(SPREAD)


def test_spread_fixture_truth_is_what_its_readme_states(cal: Calibration) -> None:
    o, w = cal.observed, cal.workload
    assert (o.requests_sent, o.preemptions, o.max_running) == (116, 22, 12)
    assert round(o.mean_running, 2) == 7.44
    assert round(o.mean_waiting, 2) == 8.44
    assert (w.kind, w.users, w.prompt_tokens, w.output_tokens) == ("closed", 20, 3980, 579)


def test_the_drawn_sizes_keep_the_histograms_means(cal: Calibration) -> None:
    p, g = cal.workload.prompt_dist, cal.workload.output_dist
    assert p is not None
    assert g is not None
    assert [w for *_r, w in p.pieces] == [7.0, 12.0, 63.0, 34.0]  # the README's prompt buckets
    assert [w for *_r, w in g.pieces] == [16.0, 29.0, 71.0]
    assert abs(p.mean - 461627 / 116) <= 1.0
    assert abs(g.mean - 67170 / 116) <= 1.0
    # the open +Inf bucket ends where the mean puts it, not at max_model_len - 1 (real top: 7,489)
    assert 7000 <= p.high <= 8000


def test_the_fitted_spread_replays_the_run_where_the_mean_and_the_midpoints_miss(cal: Calibration) -> None:
    spread = _medians(cal, cal.workload)
    at_mean = _medians(cal, replace(cal.workload, prompt_dist=None, output_dist=None))
    # the README's buckets drawn uniformly without the mean fit (prompts 4,185 on average, not
    # 3,980: the +Inf bucket runs to max_model_len - 1)
    unfitted = replace(
        cal.workload,
        prompt_dist=SizeDist(((501, 1000, 7.0), (1001, 2000, 12.0), (2001, 5000, 63.0), (5001, 9215, 34.0))),
        output_dist=SizeDist(((101, 200, 16.0), (201, 500, 29.0), (501, 1000, 71.0))),
    )
    raw = _medians(cal, unfitted)
    o = cal.observed
    # the issue's tolerances that hold (medians over seeds; the calibration matched seed 0's count)
    assert abs(spread.sent - o.requests_sent) <= 0.05 * o.requests_sent, spread
    assert abs(spread.mean_running - o.mean_running) <= 0.5, spread
    assert abs(spread.mean_waiting - o.mean_waiting) <= 1.0, spread
    assert o.max_running - spread.max_running <= 1, spread  # 11 of the real 12: not exact
    # at the mean every request is 3,980 + 579 tokens: ten fit the pool at admission, and the
    # batch never holds the real run's 11-12 (short prompts admitted beside long ones)
    assert at_mean.max_running <= 10, at_mean
    assert abs(spread.max_running - o.max_running) < abs(at_mean.max_running - o.max_running)
    # without the mean fit prompts are drawn 200 tokens too long: fewer fit beside each other, so
    # mean running misses its tolerance, and fewer grow into a preemption
    assert abs(raw.mean_running - o.mean_running) > 0.5, raw
    assert abs(spread.preemptions - o.preemptions) < abs(raw.preemptions - o.preemptions)


def test_fewer_prompt_tokens_shrinks_a_drawn_spread_too(capsys: pytest.CaptureFixture[str]) -> None:
    # Drawn sizes ignore the workload's mean, so the lever must shrink the spread itself: before,
    # the spread run's fewer_prompt_tokens row equalled the observed one (116 requests each).
    args = ["simulate", str(SPREAD / "server.log"), *sorted(str(p) for p in SPREAD.glob("metrics-*.prom"))]
    with pytest.raises(SystemExit) as info:
        main([*args, "--lever", "fewer_prompt_tokens", "--format", "json"])
    out = capsys.readouterr()
    assert info.value.code in (0, None), out.err
    rows = {s["name"]: s["result"] for s in json.loads(out.out)["scenarios"]}
    assert rows["fewer_prompt_tokens"]["requests_finished"] > 1.1 * rows["observed"]["requests_finished"]


class _Trace:
    """Draws the recorded sizes in the order the run sent them."""

    def __init__(self, sizes: list[int]) -> None:
        self._sizes = sizes
        self._i = 0

    def draw(self) -> int:
        size = self._sizes[self._i % len(self._sizes)]
        self._i += 1
        return size


def test_the_preemption_miss_is_one_runs_draw_not_the_size_model(
    cal: Calibration, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The replay's 16 preemptions against vLLM's 22: replayed with the run's own sizes in the order
    # it sent them (load-result.json), the same calibration preempts within the tolerance
    # and runs 12 at once; drawn from the distribution record.py drew from (uniform 600..7,500 and
    # 100..1,000) it preempts as few as when drawn from the histograms. So 22 is a high draw of
    # this workload (the replays range 8-22 over seeds), and the size model is not what misses.
    sent = sorted(json.loads((SPREAD / "load-result.json").read_text())["per_request"], key=lambda r: r["sent_at_s"])
    p, g = cal.workload.prompt_dist, cal.workload.output_dist
    assert p is not None
    assert g is not None
    traces = {id(p): [int(r["prompt_tokens"]) for r in sent], id(g): [int(r["completion_tokens"]) for r in sent]}
    with monkeypatch.context() as m:
        m.setattr(SizeDist, "sampler", lambda self, rng: _Trace(traces[id(self)]))
        r = simulate(cal.engine, cal.workload, cal.step_time, V0_32_0, sample_at=cal.observed.sample_at)
    truth = cal.observed.preemptions
    assert truth == 22
    assert abs(r.preemptions - truth) <= max(1.0, 0.1 * truth), r.preemptions
    assert max(s.running for s in r.samples) == cal.observed.max_running
    true_dist = replace(
        cal.workload, prompt_dist=SizeDist(((600, 7500, 1.0),)), output_dist=SizeDist(((100, 1000, 1.0),))
    )
    from_truth = _medians(cal, true_dist)
    from_histograms = _medians(cal, cal.workload)
    assert abs(from_histograms.preemptions - from_truth.preemptions) <= 2, (from_histograms, from_truth)
    assert abs(from_histograms.mean_running - from_truth.mean_running) <= 0.25


def test_halving_max_model_len_under_a_spread_says_which_prompts_vllm_would_refuse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before, the draws above 4,608 tokens were held to the limit and the row replayed 185 requests
    # the real server would have refused in part: prompts are drawn up to 7,813 tokens here.
    args = ["simulate", str(SPREAD / "server.log"), *sorted(str(p) for p in SPREAD.glob("metrics-*.prom"))]
    with pytest.raises(SystemExit) as info:
        main([*args, "--lever", "max_model_len_half", "--format", "json"])
    out = capsys.readouterr()
    assert info.value.code in (0, None), out.err
    row = next(s for s in json.loads(out.out)["scenarios"] if s["name"] == "max_model_len_half")
    assert row["result"] is None
    assert "of the prompts drawn are longer than 4,608 tokens: vLLM would refuse them" in json.dumps(row)


def test_share_at_least_counts_whole_integers() -> None:
    dist = SizeDist(((1, 10, 1.0), (11, 20, 1.0)))
    assert dist.share_at_least(1) == 1.0
    assert dist.share_at_least(16) == 0.25
    assert dist.share_at_least(21) == 0.0
