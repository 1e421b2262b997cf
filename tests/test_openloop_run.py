"""A real open-loop run (``vllm bench serve``, 60 Poisson arrivals at 1 req/s, prompts of 5,400-6,600
tokens, all above the prompt histogram's last finite bucket of 5,000) held to vLLM's own counters.

The truth is tests/fixtures/vllm-cpu-openloop/README.md, read from the scrapes, the log and the
client's result before kvwatch ran on them; the constants below are those figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run

RUN = Path(__file__).parent / "fixtures" / "vllm-cpu-openloop"
LOG = RUN / "server.log"
SCRAPES = [*sorted(RUN.glob("metrics-[0-9]*.prom")), RUN / "metrics-final.prom"]

PREEMPTIONS = 2  # vllm:num_preemptions_total 0 -> 2; request_num_preemptions: 2 requests once each
FINISHED = 60  # vllm:request_success_total{finished_reason="length"}
PROMPT_SUM, GEN_SUM = 360041, 48183  # the request histograms' _sum over _count 60
WAITING_PEAK = 36  # the queue's peak, in the scrapes (metrics-08) and the stats lines alike
SCRAPE_WAITING_MEAN, SCRAPE_RUNNING_MEAN = 14.65, 4.90  # over the 20 scrapes


def _doc(paths: list[Path], capsys: pytest.CaptureFixture[str], command: str = "analyze") -> dict[str, Any]:
    code, out, err = run([command, "--format", "json", *map(str, paths)], capsys)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def _stats_lines() -> list[tuple[int, int, float]]:
    pat = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs, CPU KV cache usage: ([\d.]+)%")
    return [(int(m[1]), int(m[2]), float(m[3])) for m in pat.finditer(LOG.read_text())]


def test_the_fixture_is_what_its_readme_states() -> None:
    # Independent of kvwatch: the README's figures re-read with a regex over vLLM's own text.
    final = RUN.joinpath("metrics-final.prom").read_text()

    def value(series: str) -> float:
        m = re.search(rf"^{re.escape(series)}\{{[^}}]*\}} (\S+)$", final, re.M)
        assert m, series
        return float(m[1])

    assert value("vllm:num_preemptions_total") == PREEMPTIONS
    assert value("vllm:request_prompt_tokens_sum") == PROMPT_SUM
    assert value("vllm:request_generation_tokens_sum") == GEN_SUM
    assert value("vllm:request_prompt_tokens_count") == FINISHED
    waiting = [
        float(m[1])
        for p in SCRAPES
        for m in re.finditer(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", p.read_text(), re.M)
    ]
    assert (len(waiting), max(waiting), round(sum(waiting) / len(waiting), 2)) == (20, WAITING_PEAK, 14.65)
    bench = json.loads(RUN.joinpath("bench-result.json").read_text())
    assert (bench["completed"], bench["total_input_tokens"], bench["total_output_tokens"]) == (60, PROMPT_SUM, GEN_SUM)
    assert min(bench["input_lens"]) > 5000  # every prompt above the last finite bucket


@pytest.mark.parametrize("with_log", [True, False], ids=["log+scrapes", "scrapes"])
def test_preemptions_finished_and_means_equal_vllms_counters(
    with_log: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _doc([LOG, *SCRAPES] if with_log else SCRAPES, capsys)
    assert doc["preemptions"]["from_metrics"] == PREEMPTIONS
    req = doc["requests"]
    assert (req["finished"], req["preempted"]) == (FINISHED, PREEMPTIONS)
    assert req["prompt_tokens"]["mean"] == round(PROMPT_SUM / FINISHED, 1)  # Δsum/Δcount, 6,000.7
    assert req["generation_tokens"]["mean"] == round(GEN_SUM / FINISHED, 1)  # 803.0(5)
    assert doc["prefix_cache"]["hit_pct"] == 0.0
    assert doc["diagnosis"]["verdict"] == "memory_bound"


def test_the_prompt_p95_above_the_last_bucket_is_a_bound_never_the_mean(capsys: pytest.CaptureFixture[str]) -> None:
    prompt = _doc([LOG, *SCRAPES], capsys)["requests"]["prompt_tokens"]
    # All 60 prompts are in the +Inf bucket above le="5000.0": no quantile can be placed (the true
    # p95 is 6,542 by the client's input_lens), only bounded below by 5,000.
    assert (prompt["p50"], prompt["p95"]) == (None, None)
    assert (prompt["p50_lower_bound"], prompt["p95_lower_bound"]) == (5000.0, 5000.0)
    assert "5,000" in prompt["note"]
    assert prompt["mean"] not in (prompt["p95"], prompt["p95_lower_bound"])


def test_the_summary_uses_the_episodes_peak_and_mean_queue_not_the_sample_at_the_kv_peak(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = _stats_lines()
    at_kv_peak = max(lines, key=lambda r: r[2])
    assert at_kv_peak == (6, 4, 98.8)  # the sample at the KV peak shows a queue of only 4
    episode = [w for _, w, _ in lines if w > 0]  # the memory-bound records: waiting at >= 90 % KV
    assert (max(episode), len(episode), sum(episode)) == (WAITING_PEAK, 15, 293)
    diag = _doc([LOG, *SCRAPES], capsys)["diagnosis"]
    summary = diag["summary"]
    assert f"up to 6 running and {WAITING_PEAK} waiting (mean {293 / 15:.1f} over 15 records)" in summary
    assert "4 waiting" not in summary
    assert f"{PREEMPTIONS} of {FINISHED} requests were preempted" in summary
    ev = {e["what"]: e["value"] for e in diag["evidence"]}
    assert ev["peak waiting while memory-bound"] == WAITING_PEAK
    assert ev["mean waiting while memory-bound"] == round(293 / 15, 2)


def test_simulate_reads_an_open_loop_and_replays_it_within_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc([LOG, *SCRAPES], capsys, command="simulate")
    w = doc["workload"]
    assert w["kind"] == "open"
    assert w["users"] is None
    assert abs(w["rate_per_s"] - 1.0) <= 0.1  # the client's --request-rate 1 (60 sent in 59.2 s)
    assert (w["prompt_tokens"], w["output_tokens"], w["shared_prefix_tokens"]) == (6001, 803, 0)
    assert w["requests"] == FINISHED  # the client's --num-prompts: a count, not a time, bounds the load
    obs, sim = doc["calibration"]["observed"], doc["calibration"]["simulated"]
    assert (obs["requests_sent"], obs["preemptions"], obs["max_running"]) == (FINISHED, PREEMPTIONS, 6)
    assert (obs["mean_waiting"], obs["mean_running"]) == (SCRAPE_WAITING_MEAN, SCRAPE_RUNNING_MEAN)
    # The tolerances of test_simulate's seed replay, unchanged:
    assert sim["requests_sent"] == FINISHED
    assert sim["max_running"] == 6
    assert abs(sim["mean_waiting"] - obs["mean_waiting"]) <= 1.0
    assert abs(sim["drain_end_s"] - obs["drain_end_s"]) <= 0.05 * obs["drain_end_s"]
    # Not asserted: preemptions (simulated 0 against the real 2; README "What kvwatch gets wrong").


def test_the_levers_are_sized_on_the_requests_the_histograms_measured(capsys: pytest.CaptureFixture[str]) -> None:
    # Not on one stats record's pool x usage / running (6,676 tokens here): every request's prompt
    # and generation are in the histograms, so the what-ifs use their exact means (the p95s are
    # beyond the buckets), as the summary's "6.0 requests of 6,804 tokens" does.
    doc = _doc([LOG, *SCRAPES], capsys)
    basis = {"prompt_tokens": round(PROMPT_SUM / FINISHED), "output_tokens": round(GEN_SUM / FINISHED)}
    assert doc["whatif_basis"] == {**basis, "source": "metrics"}
    fp8 = {r["lever"]: r for r in doc["diagnosis"]["levers"]}["fp8_kv_cache"]
    assert fp8["basis_request"] == {**basis, "shared_prefix_tokens": 0, "source": "metrics"}
    assert fp8["max_concurrency"] == pytest.approx(2 * 40960 / (6001 + 803), abs=0.01)


def test_the_scrapes_alone_summarise_the_episodes_queue_too(capsys: pytest.CaptureFixture[str]) -> None:
    # The scrapes' memory-bound episode: from the first scrape at >= 90 % KV usage with requests
    # waiting (metrics-03, 97.2 %) to the last with any waiting (metrics-17): 15 scrapes, 292 waiting.
    waiting, kv = [], []
    for p in SCRAPES:
        text = p.read_text()
        w = re.search(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", text, re.M)
        k = re.search(r"^vllm:kv_cache_usage_perc\{[^}]*\} (\S+)$", text, re.M)
        assert w
        assert k
        waiting.append(float(w[1]))
        kv.append(float(k[1]))
    first = next(i for i, (w, k) in enumerate(zip(waiting, kv, strict=True)) if w > 0 and k >= 0.9)
    episode = [w for w in waiting[first:] if w > 0]
    assert (len(episode), sum(episode), max(episode)) == (15, 292, WAITING_PEAK)
    summary = _doc(SCRAPES, capsys)["diagnosis"]["summary"]
    assert summary.startswith(f"memory-bound: up to {WAITING_PEAK} waiting (mean {292 / 15:.1f} over 15 scrapes)")
    assert f"{PREEMPTIONS} of {FINISHED} requests were preempted" in summary
