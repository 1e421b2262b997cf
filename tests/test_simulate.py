"""`kvwatch simulate`: the scheduler replay against real vLLM 0.32.0 runs, its rules, and bad input.

Truths are the real servers' own numbers (shared/fixtures/vllm-cpu-seed/README.md and the READMEs
of tests/fixtures/vllm-cpu-prefix, vllm-cpu-pool960 and vllm-cpu-seed-rerun), read by hand before
kvwatch ran on them.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvwatch.cli import main
from kvwatch.reconcile.simulate.blockpool import BlockPool
from kvwatch.reconcile.simulate.calibrate import Calibration, nnls
from kvwatch.reconcile.simulate.engine import EngineConfig, StepTime, Workload, simulate
from kvwatch.reconcile.simulate.rules import V0_32_0, SchedulerRules, rules_for, with_changes
from kvwatch.reconcile.simulate.sizes import from_buckets, from_range_ratio
from tests.helpers import recorded_calibration

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "tests" / "fixtures" / "vllm-cpu-seed"  # the bundled copy of shared/fixtures/vllm-cpu-seed
PREFIX = ROOT / "tests" / "fixtures" / "vllm-cpu-prefix"
POOL960 = ROOT / "tests" / "fixtures" / "vllm-cpu-pool960"
OPENLOOP = ROOT / "tests" / "fixtures" / "vllm-cpu-openloop"


def _evidence(d: Path) -> list[str]:
    return [str(d / "server.log"), *sorted(str(p) for p in d.glob("metrics-*.prom"))]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out = capsys.readouterr()
    return int(info.value.code or 0), out.out, out.err


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = _run(["simulate", *args, "--format", "json"], capsys)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def _calibration(d: Path) -> Calibration:
    cal: Calibration = recorded_calibration(d)
    return cal


@pytest.fixture(scope="module")
def seed_cal() -> Calibration:
    return _calibration(SEED)


def _preemptions(cal: Calibration, rules: SchedulerRules) -> int:
    return simulate(cal.engine, cal.workload, cal.step_time, rules, sample_at=cal.observed.sample_at).preemptions


# ---- (a) the seed run replayed -----------------------------------------------------------------


def test_seed_evidence_is_read_as_the_readme_states(seed_cal: Calibration) -> None:
    e, w, o = seed_cal.engine, seed_cal.workload, seed_cal.observed
    assert (e.blocks, e.block_size, e.max_num_seqs, e.max_num_batched_tokens, e.max_model_len) == (
        1280,
        32,
        256,
        8192,
        9216,
    )
    assert e.prefix_caching is True
    assert (w.kind, w.users, w.prompt_tokens, w.output_tokens, w.shared_prefix_tokens) == ("closed", 20, 7500, 1000, 0)
    assert 115 <= w.duration_s <= 125  # the load stopped sending at 120 s
    assert (o.requests_sent, o.preemptions, o.max_running, o.drain_end_s) == (46, 14, 5, 189.6)


def test_seed_calibration_replays_the_run_within_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(_evidence(SEED), capsys)
    assert doc["schema"] == "kvwatch.simulate/1"
    assert doc["vllm_version"] == "0.32.0"
    obs, sim = doc["calibration"]["observed"], doc["calibration"]["simulated"]
    assert obs["preemptions"] == 14
    assert abs(sim["preemptions"] - 14) <= 1
    assert sim["max_running"] == 5
    assert abs(sim["mean_waiting"] - obs["mean_waiting"]) <= 1.0
    assert abs(sim["requests_sent"] - 46) <= 0.05 * 46
    assert abs(sim["drain_end_s"] - 189.6) <= 0.05 * 189.6


def test_a_resumed_request_recomputes_only_what_was_evicted(seed_cal: Calibration) -> None:
    # A victim's full blocks keep their hashes in the free queue's tail (block_pool.py free_blocks),
    # so on resume it re-hits most of them; without prefix caching it recomputes its whole length.
    def recompute_per_preemption(caching: bool) -> float:
        engine = EngineConfig(**{**_engine_fields(seed_cal.engine), "prefix_caching": caching})
        res = simulate(engine, seed_cal.workload, seed_cal.step_time, V0_32_0, sample_at=seed_cal.observed.sample_at)
        assert res.preemption_events > 0
        first_prefills = res.finished * seed_cal.workload.prompt_tokens
        return (res.computed_prompt_tokens - first_prefills) / res.preemption_events

    assert recompute_per_preemption(True) < 0.25 * 7500
    assert recompute_per_preemption(False) > 7500


def _engine_fields(e: EngineConfig) -> dict[str, Any]:
    return {
        f: getattr(e, f)
        for f in ("blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "prefix_caching", "max_model_len")
    }


# ---- (b) each rule matters -------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [{"full_sequence_gate": False}, {"watermark": 0.01}, {"victim": "oldest"}],
    ids=["without_full_sequence_gate", "with_1pct_watermark", "preempting_oldest"],
)
def test_dropping_a_rule_moves_the_seed_preemptions_out_of_tolerance(
    seed_cal: Calibration, changes: dict[str, Any]
) -> None:
    base = _preemptions(seed_cal, V0_32_0)
    changed = _preemptions(seed_cal, with_changes(V0_32_0, **changes))
    assert abs(base - 14) <= 1
    assert abs(changed - 14) > 1, f"{changes}: {changed} preemptions is still within 14 +- 1"
    assert abs(changed - base) >= 2


# ---- (c) predicting a change the simulator never saw -------------------------------------------


def test_prefix_fixture_truth_is_what_its_readme_states() -> None:
    cal = _calibration(PREFIX)
    o = cal.observed
    assert (o.requests_sent, o.preemptions, o.max_running) == (53, 11, 6)
    assert o.prefix_hit_pct is not None
    assert round(o.prefix_hit_pct, 2) == 19.66
    assert round(o.mean_running, 2) == 4.48
    assert round(o.mean_waiting, 2) == 10.14


def _within_preemption_tolerance(got: int, truth: int) -> bool:
    # The tolerance on a raw count: +-max(1, 10 %).
    return abs(got - truth) <= max(1.0, 0.1 * truth)


def test_seed_evidence_predicts_the_real_shared_prefix_run(capsys: pytest.CaptureFixture[str]) -> None:
    # The real run: tests/fixtures/vllm-cpu-prefix/README.md (53 requests, 11 preemptions, hit rate
    # 19.66 %, max running 6, means 4.48 running and 10.14 waiting over its scrapes).
    doc = _json(
        [*_evidence(SEED), "--shared-prefix-tokens", "1504", "--prompt-tokens", "7504", "--lever", "fp8_kv_cache"],
        capsys,
    )
    got = doc["scenarios"][0]
    assert got["name"] == "observed"
    assert got["changes"] == {"prompt_tokens": 7504, "shared_prefix_tokens": 1504}
    r = got["result"]
    assert _within_preemption_tolerance(r["preemptions"], 11), r["preemptions"]
    assert abs(r["prefix_hit_pct"] - 19.66) <= 1.0
    assert r["max_running"] == 6
    assert abs(r["mean_running"] - 4.48) <= 0.5
    assert abs(r["mean_waiting"] - 10.14) <= 1.0


def test_seed_evidence_predicts_a_second_real_run_of_the_same_workload(capsys: pytest.CaptureFixture[str]) -> None:
    # The control re-run on the machine the two prediction pairs were recorded on
    # (tests/fixtures/vllm-cpu-seed-rerun/README.md: 48 requests, 15 preemptions, max running 5,
    # means 3.95 running and 11.05 waiting): the seed's own replay must describe it too, by the
    # prediction criteria of the two pairs.
    doc = _json([*_evidence(SEED), "--lever", "fp8_kv_cache"], capsys)
    r = doc["scenarios"][0]["result"]
    assert _within_preemption_tolerance(r["preemptions"], 15), r["preemptions"]
    assert r["max_running"] == 5
    assert abs(r["mean_running"] - 3.95) <= 0.5
    assert abs(r["mean_waiting"] - 11.05) <= 1.0


# ---- the block pool ----------------------------------------------------------------------------


def test_pool_frees_hashed_blocks_to_the_tail_and_unhashed_to_the_head() -> None:
    pool = BlockPool(6, caching=True)  # blocks 1..5 free; 0 is the null block
    a = pool.take(3)
    pool.set_key(a[0], "h0")
    pool.set_key(a[1], "h1")
    pool.release(reversed(a))  # a[2] unhashed -> head; a[1], a[0] hashed -> tail, in that order
    order = pool.free_order()
    assert order[0] == a[2]
    assert order[-2:] == [a[1], a[0]]
    assert pool.lookup(["h0", "h1", "h2"]) == [a[0], a[1]]
    taken = pool.take(3)  # the head first: a[2], then the never-used blocks; hashes survive
    assert taken[0] == a[2]
    assert pool.lookup(["h0"]) == [a[0]]
    assert abs(pool.usage() - 3 / 5) < 1e-12  # 1 - free / (blocks - 1)


def test_a_full_prompt_hit_still_computes_one_token() -> None:
    # get_computed_blocks caps the hit at num_tokens - 1: two identical 64-token prompts on 32-token
    # blocks share only the first block, so the second computes 33 tokens, not 0.
    engine = EngineConfig(
        blocks=20, block_size=32, max_num_seqs=4, max_num_batched_tokens=512, prefix_caching=True, max_model_len=512
    )
    wl = Workload("closed", 1, None, 64, 1, 64, 1.0, max_requests=2)
    res = simulate(engine, wl, StepTime(0.01, 0, 0, 0), V0_32_0)
    assert res.finished == 2
    assert res.prefix_hits == 32
    assert res.computed_prompt_tokens == 64 + 32


def test_open_loop_is_deterministic_for_a_seed() -> None:
    engine = EngineConfig(200, 16, 8, 2048, True, 4096)
    wl = Workload("open", None, 2.0, 500, 100, 0, 60.0)
    st = StepTime(0.01, 1e-5, 1e-4, 0)
    one, two = simulate(engine, wl, st, V0_32_0, seed=7), simulate(engine, wl, st, V0_32_0, seed=7)
    other = simulate(engine, wl, st, V0_32_0, seed=8)
    assert (one.sent, one.preemptions, one.end_s) == (two.sent, two.preemptions, two.end_s)
    assert (one.sent, one.end_s) != (other.sent, other.end_s)


# ---- (d) bad input: one line, the right exit code, never a traceback -------------------------------


def _startup_only_log(tmp_path: Path) -> str:
    lines = (SEED / "server.log").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "Avg prompt throughput" in line)
    path = tmp_path / "synthetic-startup-only.log"
    path.write_text("\n".join(lines[:cut]) + "\n")
    return str(path)


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("no_stats_no_scrapes", 1, "no vLLM stats lines and no /metrics scrapes"),
        ("pool_of_zero", 2, "KV pool of 0 tokens"),
        ("longer_than_max_model_len", 1, "exceeds max_model_len 9,216"),
        ("v0_version", 2, "V0 scheduler"),
        ("nothing_at_all", 1, "no evidence given"),
        ("missing_file", 2, "no such file"),
        ("range_ratio_of_one", 2, "--range-ratio must be in [0, 1)"),
    ],
)
def test_bad_input_is_one_line(
    case: str, code: int, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {
        "no_stats_no_scrapes": [_startup_only_log(tmp_path)],
        "pool_of_zero": [*_evidence(SEED), "--pool-tokens", "0"],
        "longer_than_max_model_len": [*_evidence(SEED), "--prompt-tokens", "9000"],
        "v0_version": [*_evidence(SEED), "--vllm-version", "0.6.3"],
        "nothing_at_all": [],
        "missing_file": [str(tmp_path / "nope.log")],
        "range_ratio_of_one": [*_evidence(SEED), "--range-ratio", "1"],
    }[case]
    got, out, err = _run(["simulate", *args], capsys)
    assert got == code
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert words in err
    assert "Traceback" not in err


def test_an_unread_v1_version_uses_the_nearest_rules_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json([*_evidence(SEED), "--vllm-version", "0.20.1", "--lever", "fp8_kv_cache"], capsys)
    assert doc["vllm_version"] == "0.32.0"
    assert any("0.20.1" in n and "nearest" in n for n in doc["notes"])
    assert rules_for("0.32.1").note is None


def test_text_output_puts_the_static_ceiling_beside_the_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["simulate", *_evidence(SEED)], capsys)
    assert code == 0, err
    fp8 = next(line for line in out.splitlines() if line.startswith("fp8_kv_cache"))
    assert "9.64" in fp8  # capacity's static ceiling (81,920 / 8,500), then the simulated columns
    assert "calibration (the run replayed)" in out


def test_pool960_fixture_truth_is_what_its_readme_states() -> None:
    o = _calibration(POOL960).observed
    assert (o.requests_sent, o.preemptions, o.max_running) == (50, 16, 4)
    assert round(o.mean_running, 2) == 2.50
    assert round(o.mean_waiting, 2) == 12.15


def test_seed_evidence_predicts_the_real_smaller_pool_run(capsys: pytest.CaptureFixture[str]) -> None:
    # The real run: tests/fixtures/vllm-cpu-pool960/README.md (50 requests, 16 preemptions, max
    # running 4, means 2.50 running and 12.15 waiting over its scrapes).
    doc = _json([*_evidence(SEED), "--pool-tokens", "30720", "--lever", "fp8_kv_cache"], capsys)
    r = doc["scenarios"][0]["result"]
    assert doc["engine"]["pool_tokens"] == 30720
    assert _within_preemption_tolerance(r["preemptions"], 16), r["preemptions"]
    assert r["max_running"] == 4
    assert abs(r["mean_running"] - 2.50) <= 0.5
    assert abs(r["mean_waiting"] - 12.15) <= 1.0


def test_the_preemption_counter_lags_until_the_victim_resumes(seed_cal: Calibration) -> None:
    # v1/metrics/stats.py update_from_events: PREEMPTED reaches vllm:num_preemptions with the
    # victim's next output, so a scrape between a preemption and the resume reads the old count.
    def series(rules: SchedulerRules) -> list[int]:
        res = simulate(seed_cal.engine, seed_cal.workload, seed_cal.step_time, rules, sample_every_s=0.5)
        return [s.preemptions for s in res.samples]

    lagged = series(V0_32_0)
    at_once = series(with_changes(V0_32_0, preemption_counted_on_resume=False))
    assert len(lagged) == len(at_once)
    assert all(a <= b for a, b in zip(lagged, at_once, strict=True))
    assert any(a < b for a, b in zip(lagged, at_once, strict=True))
    assert lagged[-1] == at_once[-1]


def test_scrapes_alone_give_the_pool_from_cache_config_info(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json([*_evidence(SEED)[1:], "--lever", "fp8_kv_cache"], capsys)
    assert doc["engine"]["pool_tokens"] == 40960
    assert doc["engine"]["block_size"] == 32
    assert doc["calibration"]["observed"]["preemptions"] == 14
    assert any("cache_config_info" in n for n in doc["notes"])


def test_every_request_gets_its_first_token_timed_even_when_a_chunk_ends_one_short() -> None:
    # 513-token prompts on a 512-token budget: the first chunk leaves exactly one prompt token,
    # which looks like a decode but yields the first token.
    engine = EngineConfig(200, 16, 4, 512, True, 2048)
    res = simulate(engine, Workload("closed", 1, None, 513, 50, 0, 5.0), StepTime(0.01, 1e-5, 0, 0), V0_32_0)
    assert res.finished > 1
    assert res.ttft.n == res.finished
    assert res.generated_tokens == 50 * res.finished
    # two steps (the 512-token chunk, then the last prompt token), not the 50 of the whole answer
    ttft = res.ttft.mean()
    assert ttft is not None
    assert ttft < 0.05


def test_an_interval_that_ended_idle_bounds_the_step_time_fit() -> None:
    # Steady intervals carry five sequences per step, so "10 ms per step" and "2 ms per sequence"
    # fit them equally well; only the drain's last interval (one sequence per step, the server idle
    # before the scrape) tells them apart: 1,000 such steps took at most 3 s, not 10 s.
    rows = [[float(s), 0.0, 5.0 * s, 0.0] for s in (900, 1000, 1100, 950)]
    ys = [0.002 * 5 * s for s in (900, 1000, 1100, 950)]
    drain = ([1000.0, 0.0, 1000.0, 0.0], 3.0)
    free = nnls(rows, ys)
    bounded = nnls(rows, ys, [drain])
    assert sum(a * b for a, b in zip(drain[0], free, strict=True)) > 3.0  # the free pick contradicts the drain
    assert bounded[0] == 0.0
    assert abs(bounded[2] - 0.002) < 1e-9


# ---- request sizes that differ -------------------------------------------------------------------


def test_histogram_buckets_give_a_spread_only_when_they_show_one() -> None:
    # vllm:request_prompt_tokens buckets (le, cumulative) before and after a run: 3 requests in
    # (100, 200], 1 in (200, 500], none above; the +Inf bucket ends at the cap.
    first = [(100.0, 2.0), (200.0, 2.0), (500.0, 2.0), (math.inf, 2.0)]
    last = [(100.0, 2.0), (200.0, 5.0), (500.0, 6.0), (math.inf, 6.0)]
    dist = from_buckets(first, last, cap=4095)
    assert dist is not None
    assert dist.pieces == ((101, 200, 3.0), (201, 500, 1.0))
    # every request in one bucket (the seed run: all 46 prompts above 5,000): no spread to draw from
    assert from_buckets([(5000.0, 0.0), (math.inf, 0.0)], [(5000.0, 0.0), (math.inf, 46.0)], cap=9215) is None
    sampler = dist.sampler(random.Random(3))
    draws = [sampler.draw() for _ in range(4000)]
    assert all(101 <= d <= 500 for d in draws)
    assert 0.70 < sum(d <= 200 for d in draws) / len(draws) < 0.80  # 3 of 4 by weight


def test_range_ratio_draws_what_vllm_bench_serve_draws() -> None:
    # vllm/benchmarks/datasets/utils.py get_sampling_params: [floor(6000 x 0.9), ceil(6000 x 1.1)],
    # in floating point as vLLM computes it (6000 x 1.1 = 6600.000000000001, so 6,601)
    dist = from_range_ratio(6000, 0.1)
    assert dist is not None
    assert (dist.low, dist.high) == (5400, 6601)
    assert from_range_ratio(6000, 0.0) is None


def test_a_size_spread_reproduces_the_open_loop_runs_preemptions(capsys: pytest.CaptureFixture[str]) -> None:
    # tests/fixtures/vllm-cpu-openloop: vllm bench serve --random-range-ratio 0.1 (prompts 5,403-6,598,
    # outputs 727-871), 60 requests, 2 preempted. At the mean sizes six requests fit the pool exactly
    # (6 x 213 = 1,278 of 1,279 blocks) and none is ever preempted; the spread makes six long ones
    # overflow it now and then. One real run is one draw, so the median over arrival/size seeds is
    # compared (+-1, the calibration tolerance).
    doc = _json([*_evidence(OPENLOOP), "--lever", "fp8_kv_cache", "--range-ratio", "0.1"], capsys)
    assert doc["workload"]["prompt_tokens_range"] == [5400, 6602]  # around the histogram mean 6,001
    assert doc["workload"]["output_tokens_range"] == [722, 884]  # around 803
    assert doc["scenarios"][0]["changes"] == {"prompt_tokens_range": [5400, 6602], "output_tokens_range": [722, 884]}
    args = [*_evidence(OPENLOOP), "--lever", "fp8_kv_cache", "--range-ratio", "0.1"]
    code, text, err = _run(["simulate", *args], capsys)
    assert code == 0, err
    assert "sizes drawn per request: prompts 5,400-6,602, outputs 722-884 tokens" in text
    cal = _calibration(OPENLOOP)
    spread = replace(
        cal.workload,
        prompt_dist=from_range_ratio(cal.workload.prompt_tokens, 0.1),
        output_dist=from_range_ratio(cal.workload.output_tokens, 0.1),
    )

    def preemptions(wl: Workload, seed: int) -> int:
        return simulate(cal.engine, wl, cal.step_time, V0_32_0, sample_every_s=10.0, seed=seed).preemptions

    with_spread = [preemptions(spread, seed) for seed in range(20)]
    at_mean = [preemptions(cal.workload, seed) for seed in range(20)]
    assert doc["scenarios"][0]["result"]["preemptions"] == with_spread[0]  # the command's seed 0
    assert abs(statistics.median(with_spread) - 2) <= 1
    assert max(at_mean) == 0


def test_a_closed_loop_sends_until_its_arrival_rate_reaches_the_total() -> None:
    # tests/fixtures/vllm-cpu: 12 clients for 60 s (README); its scrapes at +50.1 s and +60.1 s saw
    # 166 and all 197 arrivals. Stopping the replay at the last scrape short of the total (+50.1 s)
    # cut a sixth of the load (129 requests replayed against 197); the arrivals' steady rate
    # (3.1 per second) reaches 197 at +60.0 s.
    cal = _calibration(ROOT / "tests" / "fixtures" / "vllm-cpu")
    assert cal.workload.kind == "closed"
    assert abs(cal.workload.duration_s - 60.0) <= 1.0
    replay = simulate(cal.engine, cal.workload, cal.step_time, V0_32_0, sample_at=cal.observed.sample_at)
    assert cal.observed.preemptions == 708
    assert _within_preemption_tolerance(replay.preemptions, 708), replay.preemptions


def test_a_closed_loop_whose_count_dips_now_and_then_is_still_closed() -> None:
    # The prefix run's running + waiting while requests waited: 20, 20, 20, 19, 20, 18, 20, 17, 20,
    # 18, 20 (answers on their way back at a scrape); the open-loop run's climbs 7 ... 42 and falls.
    prefix = _calibration(PREFIX).workload
    assert (prefix.kind, prefix.users) == ("closed", 20)
    assert abs(prefix.duration_s - 120.0) <= 5.0  # the load stopped sending at 120 s (README)
    assert _calibration(OPENLOOP).workload.kind == "open"
