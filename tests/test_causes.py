"""The cause table (kvwatch.reconcile.causes): real incidents named by their hand-read cause, advice that
fits the cause, levers only for the KV pool, and the same cause live as ``kvwatch_diagnosis{cause}``."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.export import exposition
from kvwatch.export.report import render_markdown, render_text
from kvwatch.parse.log import parse_line
from kvwatch.reconcile.analysis import Analysis
from kvwatch.reconcile.causes import CAUSE_IDS, CAUSES, KV_POOL_CAUSES
from kvwatch.reconcile.live import LiveState
from kvwatch.records import EngineSample, FactRecord, MetricsSnapshot, StatsRecord
from kvwatch.sources.files import iter_logs

FIXTURES = Path(__file__).parent / "fixtures"
INCIDENTS = FIXTURES / "incidents"
INDEX = json.loads((INCIDENTS / "index.json").read_text())
SEED_LOG = Path(__file__).parent.parent / "examples" / "vllm-cpu-seed" / "server.log"
START_OOM_CAUSES = {"oom_at_start", "oom_during_graph_capture"}


def _analysis(*paths: Path) -> Analysis:
    analysis = Analysis()
    for log in iter_logs([str(p) for p in paths]):
        for batch in log.batches():
            analysis.add(batch)
        analysis.add_input(log.path, log.lines, log.bytes)
    return analysis


def _recorded_paths(run: Path) -> list[str]:
    """A run recorded on this machine (incidents/recorded/): its log, then its scrapes in the order
    they were taken, as ``kvwatch analyze LOG metrics-*.prom`` is given them."""
    scrapes = [*sorted(run.glob("metrics-[0-9]*.prom")), *run.glob("metrics-final.prom")]
    return [str(p) for p in [run / "server.log", *scrapes]]


def _diagnosis(path: Path) -> dict[str, Any]:
    if path.is_dir():
        recorded: dict[str, Any] = analyze_paths(_recorded_paths(path))["diagnosis"]
        return recorded
    diag: dict[str, Any] = _analysis(path).document()["diagnosis"]
    return diag


def _is_real(entry: dict[str, Any]) -> bool:
    """Real vLLM output: pasted in a public thread (real-*) or recorded here (recorded/*)."""
    return bool(entry["file"].startswith(("real-", "recorded/")))


def _v1(t: str, prompt: float, gen: float, running: int, waiting: int, kv: float) -> str:
    """A V1 stats line as vLLM 0.11+ prints it (v1/metrics/loggers.py), at 11-29 14:05:<t>."""
    return (
        f"INFO 11-29 14:05:{t} [loggers.py:236] Engine 000: Avg prompt throughput: {prompt:.1f} tokens/s, "
        f"Avg generation throughput: {gen:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
        f"GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 0.0%"
    )


def _lines(text: str) -> Analysis:
    analysis = Analysis()
    analysis.add([rec for i, line in enumerate(text.strip().splitlines(), 1) for rec in parse_line(line, i)])
    return analysis


def _id(entry: dict[str, Any]) -> str:
    return str(entry["file"]).removesuffix(".log")


# ---- real incidents ----------------------------------------------------------------------------------


def _truth_cases() -> list[Any]:
    """Every incident; those kvwatch is known to get wrong (``known_miss``, README) are strict
    xfails, so a rule change that fixes one is seen, and none silently turns into a pass."""
    return [
        pytest.param(
            e,
            id=_id(e),
            marks=[pytest.mark.xfail(strict=True, reason=e["known_miss"]["why"])] if "known_miss" in e else [],
        )
        for e in INDEX
    ]


@pytest.mark.parametrize("entry", _truth_cases())
def test_incident_is_named_by_its_hand_read_cause(entry: dict[str, Any]) -> None:
    diag = _diagnosis(INCIDENTS / entry["file"])
    assert (diag["verdict"], diag["cause"]) == (entry["verdict"], entry["cause"]), diag["summary"]
    assert diag["summary"]
    assert set(diag) >= {"verdict", "cause", "summary", "evidence", "levers", "advice", "warnings"}
    for ev in diag["evidence"]:
        assert set(ev) == {"what", "value", "source", "ts"}
        assert ev["source"] in ("log", "metrics", "prometheus")


@pytest.mark.parametrize("entry", [e for e in INDEX if "known_miss" in e], ids=_id)
def test_a_known_miss_still_gives_the_answer_the_readme_records(entry: dict[str, Any]) -> None:
    diag = _diagnosis(INCIDENTS / entry["file"])
    miss = entry["known_miss"]
    assert (diag["verdict"], diag["cause"]) == (miss["verdict"], miss["cause"]), diag["summary"]
    assert miss["why"]


@pytest.mark.parametrize("entry", INDEX, ids=_id)
def test_levers_appear_exactly_when_the_cause_is_the_kv_pool(entry: dict[str, Any]) -> None:
    diag = _diagnosis(INCIDENTS / entry["file"])
    if diag["cause"] in KV_POOL_CAUSES:
        assert diag["levers"], "a KV-pool cause always carries the levers"
    else:
        assert diag["levers"] == [], f"{diag['cause']} is not the KV pool: no lever may grow it"


@pytest.mark.parametrize(
    "entry",
    [e for e in INDEX if e["cause"] in START_OOM_CAUSES and "known_miss" not in e],
    ids=_id,
)
def test_a_start_oom_is_told_to_shrink_never_to_grow_the_pool(entry: dict[str, Any]) -> None:
    diag = _diagnosis(INCIDENTS / entry["file"])
    advice = " ".join(diag["advice"])
    assert "lower --gpu-memory-utilization" in advice
    assert "--enforce-eager" in advice
    assert "--max-num-seqs" in advice
    assert "lever" not in advice
    assert "grow" not in advice
    assert "raise" not in advice
    assert diag["levers"] == []


def test_every_cause_row_has_a_real_or_synthetic_incident() -> None:
    named = {e["cause"] for e in INDEX}
    # Rows without an incident file are covered by the unit tests below (start_failed is the fallback
    # for start errors kvwatch cannot name; oom_while_serving and engine_dead have real ones).
    assert set(CAUSE_IDS) - named <= {"start_failed"}
    real = {e["cause"] for e in INDEX if _is_real(e)}
    assert {
        "max_model_len_exceeds_pool",
        "oom_during_graph_capture",
        "oom_at_start",
        "memory_held_by_other_process",
        "engine_dead",
        "kv_pool_too_small",
        "queued_not_kv",
        "prefill_starves_decode",
        "healthy",
        "engine_hang",
        "preemption_storm",
        "no_kv_memory_after_weights",
        "oom_while_serving",
        "start_failed",
        "seq_limit",  # recorded here: recorded/seq-limit-v032
    } <= real
    # Two or more real excerpts that kvwatch names right, per row (a known miss does not count).
    right = Counter(e["cause"] for e in INDEX if _is_real(e) and "known_miss" not in e)
    assert {row for row, n in right.items() if n >= 2} >= {
        "engine_hang",
        "preemption_storm",
        "unknown",
        "negative_cuda_graph_estimate",
    }


def test_no_cause_without_the_kv_pool_flag_is_given_levers_by_the_table() -> None:
    # Table-wide: whatever the evidence, diagnose() only asks for levers on rows marked kv_pool.
    kv_rows = {c.id for c in CAUSES if c.kv_pool}
    assert kv_rows == {"max_model_len_exceeds_pool", "preemption_loop", "kv_pool_too_small", "preemption_storm"}
    for c in CAUSES:
        if not c.kv_pool:
            assert not any("lever" in a for a in c.advice), c.id


# ---- rules against vLLM's semantics --------------------------------------------------------------


def test_v1_concurrency_below_one_after_a_finished_start_is_no_failed_start() -> None:
    # A sliding-window model passes V1's check_enough_kv_cache_memory and still prints < 1x.
    diag = _diagnosis(INCIDENTS / "real-ratio-below-one-v1-gemma3-started.log")
    assert diag["verdict"] != "failed_start"


def test_v0_concurrency_below_one_alone_is_a_failed_start() -> None:
    # V0 computes the ratio and its check from the same num_gpu_blocks x block_size.
    analysis = _lines(
        """
INFO 11-18 18:07:40 gpu_executor.py:113] # GPU blocks: 1478, # CPU blocks: 2048
INFO 11-18 18:07:40 gpu_executor.py:117] Maximum concurrency for 29000 tokens per request: 0.82x
"""
    )
    diag = analysis.document()["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("failed_start", "max_model_len_exceeds_pool")
    assert "29,000" in diag["summary"]
    assert diag["levers"]


def test_a_single_record_without_tokens_is_no_stall() -> None:
    analysis = _lines(
        f"""
{_v1("10", 0.0, 0.0, 4, 0, 12.4)}
{_v1("20", 0.0, 80.2, 4, 0, 12.9)}
{_v1("30", 0.0, 81.0, 4, 0, 13.4)}
"""
    )
    assert analysis.document()["diagnosis"]["cause"] == "healthy"


def test_a_debug_level_record_without_tokens_stands_for_two_tokenless_intervals() -> None:
    # vLLM logs a stats record at DEBUG only when it AND the interval before had no tokens
    # (v1/metrics/loggers.py LoggingStatLogger.log): with requests in flight, a sustained stall.
    line = _v1("10", 0.0, 0.0, 7, 0, 59.6).replace("INFO 11-29", "DEBUG 11-29")
    (rec,) = parse_line(line, 1)
    assert isinstance(rec, StatsRecord)
    assert rec.debug_level
    assert not parse_line(_v1("10", 0.0, 0.0, 7, 0, 59.6), 1)[0].debug_level  # type: ignore[union-attr]
    diag = _lines(line).document()["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("stalled", "engine_hang")
    assert "implied" in diag["summary"]
    # An idle engine logs at DEBUG too: nothing in flight, no stall.
    idle = _v1("10", 0.0, 0.0, 0, 0, 0.0).replace("INFO 11-29", "DEBUG 11-29")
    assert _lines(idle).document()["diagnosis"]["cause"] != "engine_hang"
    # After an INFO record without tokens the DEBUG one is the streak's second, not its third.
    both = _lines(f"{_v1('10', 0.0, 0.0, 7, 0, 59.6)}\n{line.replace(':10 ', ':20 ')}").document()["diagnosis"]
    assert both["cause"] == "engine_hang"
    assert "implied" not in both["summary"]


def test_one_worker_without_kv_memory_fails_the_start_whatever_the_last_figure() -> None:
    # V1 checks every worker's available memory (kv_cache_utils.py get_kv_cache_configs).
    analysis = _lines(
        """
(Worker_TP1 pid=2) INFO 12-10 03:24:48 [gpu_worker.py:298] Available KV cache memory: -3.86 GiB
(Worker_TP0 pid=1) INFO 12-10 03:24:48 [gpu_worker.py:298] Available KV cache memory: 9.90 GiB
(EngineCore_DP0 pid=3) ERROR 12-10 03:24:48 [core.py:708] EngineCore failed to start.
"""
    )
    diag = analysis.document()["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("failed_start", "no_kv_memory_after_weights")
    assert "-3.86 GiB" in diag["summary"]


def test_a_burst_still_prefilling_is_no_decode_collapse() -> None:
    # The first records of a burst: every running request is still in prefill (real 038 shape).
    analysis = _lines(
        f"""
{_v1("16", 410.1, 0.2, 8, 0, 16.6)}
{_v1("26", 2870.5, 0.8, 10, 0, 20.8)}
{_v1("36", 820.2, 30.0, 10, 0, 20.8)}
"""
    )
    assert analysis.document()["diagnosis"]["cause"] == "healthy"


def test_a_start_that_failed_then_served_is_judged_by_the_run_that_served() -> None:
    analysis = _lines(
        f"""
ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing.
INFO 11-29 14:00:05 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='m', max_seq_len=4096
{_v1("10", 0.0, 80.2, 4, 0, 12.9)}
{_v1("20", 0.0, 81.0, 4, 0, 13.4)}
"""
    )
    assert analysis.document()["diagnosis"]["verdict"] == "ok"


def test_a_negative_graph_estimate_is_a_warning_even_when_the_run_is_healthy() -> None:
    analysis = _lines(
        f"""
INFO 11-29 14:01:00 [gpu_model_runner.py:6806] Estimated CUDA graph memory: -1.52 GiB total
{_v1("10", 0.0, 80.2, 4, 0, 12.9)}
"""
    )
    diag = analysis.document()["diagnosis"]
    assert diag["cause"] == "healthy"
    # The run served and looks healthy: the estimate that inflated its pool is a warning, not the cause.
    assert diag["warnings"] == [
        "The CUDA-graph estimate is negative (-1.52 GiB: free memory grew while vLLM measured it): subtracted from the"
        " KV budget, it added 1.52 GiB no profile measured free, so the KV pool holds that much memory the"
        " device may not have, and the graphs still need their own."
    ]


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        (
            "INFO 04-23 14:48:46 [gpu_worker.py:298] Available KV cache memory: -2.14 GiB",
            "capacity.kv_cache_memory_gib",
            -2.14,
        ),
        (
            "INFO 04-23 14:48:44 [worker.py:287] model weights take 10.80GiB; non_torch_memory takes 0.33GiB; PyTorch "
            "activation peak memory takes 1.01GiB; the rest of the memory reserved for KV Cache is -1.05GiB.",
            "capacity.kv_cache_memory_gib",
            -1.05,
        ),
        (
            "INFO 12-19 22:58:41 model_runner.py:1535] Graph capturing finished in 14 secs, took -0.21 GiB",
            "capacity.cuda_graph_gib",
            -0.21,
        ),
        (
            "INFO 08-14 14:07:22 [gpu_model_runner.py:6806] Estimated CUDA graph memory: 0.36 GiB total",
            "capacity.cuda_graph_estimate_gib",
            0.36,
        ),
        (
            "INFO 11-29 14:01:40 [gpu_worker.py:1013] Free memory on device (78.66/79.18 GiB) on startup. Desired GPU "
            "memory utilization is (0.9, 71.26 GiB).",
            "memory.startup_free_gib",
            78.66,
        ),
        (
            "INFO 11-18 18:07:40 worker.py:232] Memory profiling results: total_gpu_memory=79.15GiB "
            "initial_memory_usage=70.16GiB peak_torch_memory=15.62GiB",
            "memory.initial_usage_gib",
            70.16,
        ),
    ],
    ids=["v1-negative-kv", "v0-negative-kv", "negative-graph-took", "graph-estimate", "startup-free", "v064-initial"],
)
def test_reader_states_the_numbers_the_cause_rules_need(line: str, field: str, value: float) -> None:
    facts = {r.field: r.value for r in parse_line(line, 1) if isinstance(r, FactRecord)}
    assert facts[field] == value


# ---- the summary and the evidence keys --------------------------------------------------------------


def test_memory_bound_summary_names_the_metrics_preemptions_and_request_sizes() -> None:
    # The document as the evidence reader fills it for the bundled seed run (its scrapes: 14
    # preemptions, 46 requests of 7,500 + 1,000 tokens).
    analysis = _analysis(SEED_LOG)
    doc = analysis.document()
    doc["preemptions"]["from_metrics"] = 14
    doc["requests"] = {
        "finished": 46,
        "prompt_tokens": {"mean": 7500.0, "p50": 7500.0, "p95": 7500.0},
        "generation_tokens": {"mean": 1000.0, "p50": 1000.0, "p95": 1000.0},
        "footprint_tokens_p95": 8500.0,
        "preempted": 14,
    }
    analysis.diagnose(doc)
    diag = doc["diagnosis"]
    assert diag["cause"] == "kv_pool_too_small"
    assert diag["summary"] == (
        "memory-bound: up to 5 running and 16 waiting (mean 12.3 over 15 records) at up to 100.0 % KV usage; "
        "14 of 46 requests were preempted and recomputed (at least 105,000 prompt tokens computed twice); "
        "the 40,960-token pool holds 4.8 requests of 8,500 tokens"
    )
    assert {"what": "preemptions", "value": 14, "source": "metrics", "ts": None} in diag["evidence"]


def test_memory_bound_summary_says_preemptions_are_not_in_a_v1_log() -> None:
    diag = _diagnosis(SEED_LOG)
    assert "preemptions are not in this log (give the scrapes or --prometheus)" in diag["summary"]
    assert "0 preemptions" not in diag["summary"]


def test_levers_are_always_there_for_a_memory_bound_log_without_capacity_lines() -> None:
    diag = _diagnosis(INCIDENTS / "real-kv-pool-v042-pending740.log")
    assert diag["cause"] == "kv_pool_too_small"
    assert [lever["lever"] for lever in diag["levers"]][:1] == ["fp8_kv_cache"]


def test_reports_name_the_cause_and_carry_advice_and_warnings() -> None:
    doc = _analysis(INCIDENTS / "synthetic-negative-graph-estimate-v021-then-oom.log").document()
    text, md = render_text(doc), render_markdown(doc)
    assert text.splitlines()[0] == "kvwatch analyze: CRASHED (cause: negative_cuda_graph_estimate)"
    for out in (text, md):
        assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in out
        assert "Advice" in out


# ---- the sidecar ---------------------------------------------------------------------------------


def _diagnosis_gauge(state: LiveState, now: float) -> dict[str, float]:
    return {dict(s.labels)["cause"]: s.value for s in exposition.samples(state, now) if s.name == "kvwatch_diagnosis"}


def test_sidecar_names_a_hang_from_the_log_and_forgets_it_when_tokens_flow() -> None:
    state = LiveState()
    t = 0.0
    for gen in (50.0, 0.0, 0.0, 0.0):
        t += 10.0
        state.on_log_record(StatsRecord(1, None, 0, None, 4, 1, kv_usage_pct=20.0, prompt_tps=0.0, gen_tps=gen), t)
    gauge = _diagnosis_gauge(state, t)
    assert gauge["engine_hang"] == 1.0
    assert sum(gauge.values()) == 1.0
    state.on_log_record(StatsRecord(1, None, 0, None, 4, 0, kv_usage_pct=20.0, prompt_tps=0.0, gen_tps=60.0), t + 10)
    assert _diagnosis_gauge(state, t + 10)["engine_hang"] == 0.0


def test_sidecar_names_a_hang_from_scrapes_whose_token_counters_stop() -> None:
    state = LiveState(scrape_interval=5.0)
    gen = 0.0
    for i in range(6):
        gen += 400.0 if i < 2 else 0.0  # tokens flow, then stop while 3 requests run
        sample = EngineSample(
            "m",
            "0",
            running=3.0,
            waiting=0.0,
            kv_usage_ratio=0.3,
            generation_tokens_total=gen,
            prompt_tokens_total=1000.0,
        )
        state.on_scrape(MetricsSnapshot((sample,)), 5.0 * (i + 1))
    assert _diagnosis_gauge(state, 30.0)["engine_hang"] == 1.0


def test_sidecar_exports_the_same_cause_as_analyze_for_a_failed_start() -> None:
    state = LiveState()
    for i, line in enumerate((INCIDENTS / "real-other-process-v010-free-memory-startup.log").read_text().splitlines()):
        for rec in parse_line(line, i + 1):
            state.on_log_record(rec, float(i))
    gauge = _diagnosis_gauge(state, 100.0)
    assert gauge["memory_held_by_other_process"] == 1.0


def test_every_incident_has_its_provenance_and_hand_read_truth() -> None:
    files = {p.name for p in INCIDENTS.glob("*.log")}
    files |= {f"recorded/{p.parent.name}" for p in INCIDENTS.glob("recorded/*/server.log")}
    assert files == {e["file"] for e in INDEX}
    for e in INDEX:
        assert e["truth"]
        assert e["cause"] in CAUSE_IDS
        if "warning" in e:  # a warning the hand reading expects, whatever the cause
            assert any(e["warning"] in w for w in _diagnosis(INCIDENTS / e["file"])["warnings"]), e["file"]
        if e["file"].startswith("recorded/"):
            # Recorded on this machine with vLLM 0.32.0 CPU: the run's README holds the commands
            # and the truth read from vLLM's own output before kvwatch ran.
            assert e["source_url"] is None, e["file"]
            assert e["vllm_version"].startswith("0.32.0"), e["file"]
            assert (INCIDENTS / e["file"] / "README.md").is_file(), e["file"]
        elif e["file"].startswith("real-"):
            assert str(e["source_url"]).startswith("https://github.com/"), e["file"]
        else:
            assert e["file"].startswith("synthetic-")
            assert e["source_url"] is None


# ---- a stall vLLM states itself: its ring-buffer wait (kvwatch.reconcile.stalls) -----------------------


def _ring_wait(t: str, process: str = "EngineCore_DP0 pid=7") -> str:
    """vLLM's long-wait notice as 0.11's shm_broadcast.py logs it, at 11-29 14:<t>."""
    return (
        f"({process}) INFO 11-29 14:{t} [shm_broadcast.py:466] No available shared memory broadcast block found in"
        " 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work"
        " (e.g. compilation)."
    )


def test_ring_buffer_waits_with_requests_in_flight_are_a_stall() -> None:
    # The record says 4 run and 2 wait; then no step result comes back for two warning intervals.
    diag = _lines(f"{_v1('10', 0.0, 80.2, 4, 2, 12.9)}\n{_ring_wait('06:20')}\n{_ring_wait('07:20')}").document()[
        "diagnosis"
    ]
    assert (diag["verdict"], diag["cause"]) == ("stalled", "engine_hang")
    assert "6 requests in flight" in diag["summary"]
    assert "120 s" in diag["summary"]
    assert {"what": "seconds vLLM waited for a step", "value": 120.0, "source": "log", "ts": "--11-29T14:06:20"} in (
        diag["evidence"]
    )
    assert diag["levers"] == []


@pytest.mark.parametrize(
    "text",
    [
        # start-up: the workers compile, nothing is in flight yet
        f"{_ring_wait('06:20')}\n{_ring_wait('07:20')}",
        # idle: the last record says nothing runs or waits (workers of 0.8-0.10 warned while idle)
        f"{_v1('10', 0.0, 80.2, 4, 0, 12.9)}\n{_v1('20', 0.0, 0.0, 0, 0, 0.0)}\n{_ring_wait('06:20')}\n"
        f"{_ring_wait('07:20')}",
    ],
    ids=["startup-compile", "idle"],
)
def test_a_ring_buffer_wait_with_nothing_in_flight_is_no_stall(text: str) -> None:
    assert _lines(text).document()["diagnosis"]["cause"] != "engine_hang"


def test_every_rank_logging_the_same_wait_counts_it_once() -> None:
    # Four TP ranks warn at the same second: one 60 s wait, not four.
    ranks = "\n".join(_ring_wait("06:20", f"Worker_TP{i} pid={10 + i}") for i in range(4))
    diag = _lines(f"{_v1('10', 0.0, 80.2, 4, 0, 12.9)}\n{ranks}").document()["diagnosis"]
    assert diag["cause"] == "engine_hang"
    assert "for 60 s" in diag["summary"]
    assert "x1)" in diag["summary"]


def test_llm_generate_progress_bar_states_the_requests_in_flight() -> None:
    bar = "Processed prompts:   0%|          | 0/4 [00:00<?, ?it/s, est. speed input: 0.00 toks/s, output: 0.00 toks/s]"
    (fact_done, fact_total) = [r for r in parse_line(bar, 1) if isinstance(r, FactRecord)]
    assert (fact_done.field, fact_done.value, fact_total.field, fact_total.value) == (
        "runtime.offline_done",
        0,
        "runtime.offline_total",
        4,
    )
    diag = _lines(f"{bar}\n{_ring_wait('06:20')}").document()["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("stalled", "engine_hang")
    assert "4 requests in flight" in diag["summary"]
    # A bar that moved since the wait began is progress: the wait before it is over.
    done = bar.replace("0%|", "100%|").replace("0/4", "4/4")
    assert _lines(f"{bar}\n{done}\n{_ring_wait('06:20')}").document()["diagnosis"]["cause"] != "engine_hang"


def test_sidecar_names_a_ring_buffer_stall_and_forgets_it_when_tokens_flow() -> None:
    state = LiveState()
    for i, line in enumerate((_v1("10", 0.0, 80.2, 4, 0, 12.9), _ring_wait("06:20"))):
        for rec in parse_line(line, i + 1):
            state.on_log_record(rec, 10.0 * (i + 1))
    assert _diagnosis_gauge(state, 30.0)["engine_hang"] == 1.0
    state.on_log_record(StatsRecord(3, None, 0, None, 4, 0, kv_usage_pct=13.0, prompt_tps=0.0, gen_tps=60.0), 40.0)
    assert _diagnosis_gauge(state, 40.0)["engine_hang"] == 0.0


# ---- the text report's V1 preemption wording ----------------------------------------------------------------


def test_text_report_says_a_v1_log_states_no_preemptions_rather_than_counting_none() -> None:
    text = render_text(_analysis(SEED_LOG).document())
    line = next(ln for ln in text.splitlines() if ln.lstrip().startswith("preemptions"))
    assert "in V1 stats" not in line
    assert "V1 stats lines state none (not a count: vLLM's LoggingStatLogger zeroes its count" in line


# ---- a cause per engine (data parallel) ----------------------------------------------------------------------


def test_each_data_parallel_engine_gets_its_own_cause() -> None:
    # Engine 000 is memory-bound while engine 001 runs with room: one server, two causes.
    diag = _diagnosis(FIXTURES / "synthetic-dp-two-engines.log")
    assert diag["cause"] == "kv_pool_too_small"
    assert diag["engines"] == [
        {"engine": 0, "source": None, "verdict": "memory_bound", "cause": "kv_pool_too_small"},
        {"engine": 1, "source": None, "verdict": "ok", "cause": "healthy"},
    ]


def test_a_server_wide_event_is_every_engines_cause_and_one_engine_lists_none() -> None:
    # A stall vLLM states (its step queue) holds every engine of the server: DP engines step together.
    two = f"{_v1('10', 0.0, 80.2, 4, 0, 12.9)}\n{_v1('10', 0.0, 80.2, 2, 0, 5.0).replace('Engine 000', 'Engine 001')}"
    diag = _lines(f"{two}\n{_ring_wait('06:20')}").document()["diagnosis"]
    assert [(e["engine"], e["cause"]) for e in diag["engines"]] == [(0, "engine_hang"), (1, "engine_hang")]
    assert _diagnosis(SEED_LOG)["engines"] == []


def test_reports_give_each_engines_cause() -> None:
    doc = _analysis(FIXTURES / "synthetic-dp-two-engines.log").document()
    want = "engine 0 memory-bound (kv_pool_too_small), engine 1 ok (healthy)"
    assert f"  per engine: {want}" in render_text(doc).splitlines()
    assert f"Per engine: {want}." in render_markdown(doc)


def test_a_v0_log_whose_last_record_had_requests_running_needs_a_queue_for_a_stall() -> None:
    # V0 logs from inside a step: its last record may show a request that finished in a step that
    # logged nothing, after which idle workers wait. Only a queue the engine stopped serving counts.
    def v0(running: int, pending: int) -> str:
        return (
            f"INFO 11-29 14:05:10 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
            f"80.2 tokens/s, Running: {running} reqs, Swapped: 0 reqs, Pending: {pending} reqs, GPU KV cache usage: "
            "12.9%, CPU KV cache usage: 0.0%."
        )

    assert _lines(f"{v0(1, 0)}\n{_ring_wait('06:20')}").document()["diagnosis"]["cause"] != "engine_hang"
    assert _lines(f"{v0(1, 3)}\n{_ring_wait('06:20')}").document()["diagnosis"]["cause"] == "engine_hang"


# ---- incidents recorded here with the real vLLM 0.32.0 CPU server (incidents/recorded/) ----------------

RECORDED = INCIDENTS / "recorded"


def _final_counter(run: Path, series: str) -> float:
    """A series of the run's last scrape, read with a regex over vLLM's own text (not kvwatch)."""
    m = re.search(rf"^{re.escape(series)}(?:\{{[^}}]*\}})? (\S+)$", (run / "metrics-final.prom").read_text(), re.M)
    assert m, series
    return float(m[1])


def test_a_recorded_v1_storm_is_named_from_the_counter_and_only_from_it() -> None:
    run = RECORDED / "preemption-storm-v032-32-blocks"
    counter = int(_final_counter(run, "vllm:num_preemptions_total"))
    assert counter == 386  # the README's hand reading
    assert "preempt" not in (run / "server.log").read_text().lower()  # V1 0.32.0 logs none of them
    doc = analyze_paths(_recorded_paths(run))
    diag = doc["diagnosis"]
    assert doc["preemptions"]["from_metrics"] == counter
    assert (diag["verdict"], diag["cause"]) == ("memory_bound", "kv_pool_too_small")
    assert f"{counter} preemptions" in diag["summary"]
    assert {"what": "preemptions", "value": counter, "source": "metrics"}.items() <= next(
        e for e in diag["evidence"] if e["what"] == "preemptions"
    ).items()
    assert diag["levers"]
    # The scrapes alone say the same; the log alone says the count is not in it, never 0.
    alone = analyze_paths(_recorded_paths(run)[1:])["diagnosis"]
    assert (alone["cause"], f"{counter} preemptions" in alone["summary"]) == ("kv_pool_too_small", True)
    log_only = analyze_paths([str(run / "server.log")])["diagnosis"]
    assert log_only["cause"] == "kv_pool_too_small"
    assert "preemptions are not in this log" in log_only["summary"]


def test_a_recorded_seq_limit_is_not_told_to_grow_the_kv_pool() -> None:
    run = RECORDED / "seq-limit-v032"
    diag = analyze_paths(_recorded_paths(run))["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("seq_bound", "seq_limit")
    assert "max_num_seqs 2" in diag["summary"]
    assert diag["levers"] == []
    assert any("--max-num-seqs" in a for a in diag["advice"])
    assert not any(w in " ".join(diag["advice"]) for w in ("lever", "fp8", "gpu-memory-utilization"))
    assert _final_counter(run, "vllm:num_preemptions_total") == 0


def test_a_recorded_start_refused_for_max_model_len_names_the_pool_not_the_rounded_gib() -> None:
    # 0.32.0 prints both GiB figures of a 1,024-token pool as 0.0 (format_gib rounds to 2 places): the
    # sentence must give the pool's tokens, and "0.0 GiB available" must not read as "no KV memory".
    run = RECORDED / "max-model-len-v032-override-32-blocks"
    assert "(0.0 GiB KV cache is needed" in (run / "server.log").read_text()
    diag = analyze_paths([str(run / "server.log")])["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("failed_start", "max_model_len_exceeds_pool")
    assert "max_model_len 2,048" in diag["summary"]
    assert "the pool holds 1,024 tokens" in diag["summary"]
    assert "0.0 GiB" not in diag["summary"]


def test_a_recorded_start_refused_for_kv_space_quotes_vllms_reason_and_blames_no_other_process() -> None:
    # 0.32.0 cpu_worker.py: the KV space asked for (64 GiB) exceeds the node (17.59 GiB, 15.92 free).
    # No row names a setting the machine cannot honour; kvwatch must not call it another process's
    # memory or the KV pool, and must say what vLLM said.
    diag = analyze_paths([str(RECORDED / "kv-space-v032-larger-than-ram" / "server.log")])["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("failed_start", "start_failed")
    assert "requested memory for kv (64.0 GiB)" in diag["summary"]
    assert diag["evidence"][0]["value"].startswith("Available memory on node 0 (15.92/17.59 GiB)")
    assert diag["levers"] == []


def test_a_recorded_run_the_gauges_catch_empty_is_judged_by_its_counters() -> None:
    # Short requests paced by the API server: most scrapes find Running 0, Waiting 0, yet between
    # them vLLM generated tokens and preempted 17 times (vllm:generation_tokens_total and
    # vllm:num_preemptions_total). Those intervals are not idle: the verdict is preempting, from the
    # counter, with the scrapes' KV peak (90.3 %), where the log alone reads a quiet healthy server.
    run = RECORDED / "preempting-v032-4-clients-32-blocks"
    assert int(_final_counter(run, "vllm:num_preemptions_total")) == 17
    for paths in (_recorded_paths(run), _recorded_paths(run)[1:]):
        doc = analyze_paths(paths)
        diag = doc["diagnosis"]
        assert (diag["verdict"], diag["cause"]) == ("preempting", "preemption_storm"), diag["summary"]
        assert doc["preemptions"]["from_metrics"] == 17
        assert "17 preemptions" in diag["summary"]
        assert diag["levers"]
    assert "90.3 %" in analyze_paths(_recorded_paths(run))["diagnosis"]["summary"]
    log_only = analyze_paths([str(run / "server.log")])["diagnosis"]
    assert (log_only["verdict"], log_only["cause"]) == ("ok", "healthy")


def test_a_recorded_seq_limit_from_its_scrapes_alone_is_a_queue_kv_does_not_explain() -> None:
    # /metrics does not carry max_num_seqs (vllm:cache_config_info has only cache settings), so the
    # scrapes alone cannot say seq_bound; they must still say the queue is not the KV cache, with
    # their own peaks (10 waiting, 9.6 %), never a missing figure.
    diag = analyze_paths(_recorded_paths(RECORDED / "seq-limit-v032")[1:])["diagnosis"]
    assert (diag["verdict"], diag["cause"]) == ("queued", "queued_not_kv")
    assert "up to 10 requests waiting" in diag["summary"]
    assert "9.6 %" in diag["summary"]
    assert "None" not in diag["summary"]
    assert diag["levers"] == []
