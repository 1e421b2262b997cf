"""CUDA-graph memory figures against vLLM's semantics: only the estimate that vLLM subtracted from the
KV budget can be the cause of a wrong pool; the capture figure, measured after the pool was allocated,
is a warning about the suggested ``--kv-cache-memory`` values (kvwatch.reconcile.graph_memory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.export import exposition
from kvwatch.parse.log import parse_line
from kvwatch.reconcile.analysis import Analysis
from kvwatch.reconcile.graph_memory import capture_finding, estimate_applied, estimate_finding
from kvwatch.reconcile.live import LiveState
from kvwatch.records import FactRecord, StatsRecord

INCIDENTS = Path(__file__).parent / "fixtures" / "incidents"
INDEX = json.loads((INCIDENTS / "index.json").read_text())
GRAPH_ENTRIES = [e for e in INDEX if e["cause"] == "negative_cuda_graph_estimate" and "known_miss" not in e]


def _diagnosis(text: str) -> dict[str, Any]:
    analysis = Analysis()
    analysis.add([rec for i, line in enumerate(text.strip().splitlines(), 1) for rec in parse_line(line, i)])
    diag: dict[str, Any] = analysis.document()["diagnosis"]
    return diag


def _gauge(state: LiveState, now: float) -> dict[str, float]:
    return {dict(s.labels)["cause"]: s.value for s in exposition.samples(state, now) if s.name == "kvwatch_diagnosis"}


def _file(name: str) -> dict[str, Any]:
    return _diagnosis((INCIDENTS / name).read_text())


_ESTIMATE = (
    "(EngineCore pid=7) INFO 11-29 14:01:00 [gpu_model_runner.py:6366] Estimated CUDA graph memory: -3.5 GiB total"
)
_KV = "(EngineCore pid=7) INFO 11-29 14:01:01 [gpu_worker.py:460] Available KV cache memory: 40.0 GiB"


def _banner(version: str) -> str:
    return f"(APIServer pid=1) INFO 11-29 14:00:00 [api_server.py:1896] vLLM API server version {version}"


@pytest.mark.parametrize(
    ("version", "cause"),
    [
        ("0.22.0", "negative_cuda_graph_estimate"),  # subtracted by default (envs.py "1", 0.21+)
        ("0.21.0", "negative_cuda_graph_estimate"),
        ("0.19.1", "unknown"),  # opt-in then: the estimate was printed, not subtracted
    ],
)
def test_a_negative_estimate_is_the_cause_only_where_vllm_subtracted_it(version: str, cause: str) -> None:
    diag = _diagnosis("\n".join((_banner(version), _ESTIMATE, _KV)))
    assert (diag["verdict"], diag["cause"]) == ("unknown", cause), diag["summary"]
    if cause == "unknown":
        assert any("likely did not size the pool" in w for w in diag["warnings"]), diag["warnings"]
    else:
        assert "added 3.5 GiB" in diag["summary"]
        assert "at most 36.5 GiB" in diag["summary"]  # the pool less the estimate's surplus


def test_a_log_that_does_not_state_its_version_is_taken_at_vllms_current_default() -> None:
    diag = _diagnosis("\n".join((_ESTIMATE, _KV)))
    assert diag["cause"] == "negative_cuda_graph_estimate"


def test_a_negative_capture_figure_then_an_oom_is_not_blamed_on_the_graphs() -> None:
    # 0.10.2 gpu_model_runner.py capture_model runs after initialize_from_config allocated the pool: a
    # negative "took" sized nothing, so the OOM that follows is the serving OOM's, not the graphs'.
    diag = _diagnosis(
        "\n".join(
            (
                "(EngineCore_DP0 pid=9) INFO 09-24 00:15:29 [gpu_model_runner.py:3380] Graph capturing finished in"
                " 79 secs, took -9.96 GiB",
                "(APIServer pid=1) INFO 09-24 00:16:00 [loggers.py:123] Engine 000: Avg prompt throughput: 900.0"
                " tokens/s, Avg generation throughput: 300.0 tokens/s, Running: 20 reqs, Waiting: 0 reqs, GPU KV"
                " cache usage: 40.0%, Prefix cache hit rate: 0.0%",
                "(EngineCore_DP0 pid=9) ERROR 09-24 00:16:05 [core.py:710] torch.OutOfMemoryError: CUDA out of"
                " memory. Tried to allocate 2.00 GiB.",
            )
        )
    )
    assert diag["cause"] != "negative_cuda_graph_estimate", diag["summary"]
    assert diag["verdict"] == "crashed"
    assert any("--kv-cache-memory values count it, so each is 9.96 GiB too large" in w for w in diag["warnings"])


def test_the_real_0_10_capture_figure_warns_about_the_suggestion_it_inflated() -> None:
    diag = _file("real-negative-graph-estimate-v010-took-negative-served.log")
    assert diag["cause"] == "unknown"
    # vLLM's own suggestion in that line (85.25 GiB) counted -9.96 GiB for graphs.
    assert any("each is 9.96 GiB too large" in w for w in diag["warnings"]), diag["warnings"]


def test_the_pool_without_the_estimate_agrees_with_vllms_own_post_capture_suggestion() -> None:
    # vllm issue 44740 (comment): pool 32.09 GiB from a -10.33 GiB estimate; vLLM's summary after capture
    # suggests --kv-cache-memory=23031691981 for the same target. kvwatch's bound (pool - surplus) must
    # hold that suggestion: the suggestion also subtracts the graphs' real memory and a 150 MiB buffer.
    diag = _file("real-negative-graph-estimate-v02x-gb10-mtp-comment.log")
    assert diag["cause"] == "negative_cuda_graph_estimate"
    assert "at most 21.76 GiB" in diag["summary"]
    assert 23031691981 / 2**30 <= 32.09 - 10.33


@pytest.mark.parametrize("entry", GRAPH_ENTRIES, ids=lambda e: str(e["file"]).removesuffix(".log"))
def test_a_negative_estimate_is_told_to_stop_the_subtraction_never_to_grow_the_pool(entry: dict[str, Any]) -> None:
    diag = _file(entry["file"])
    assert diag["cause"] == "negative_cuda_graph_estimate"
    advice = " ".join(diag["advice"])
    assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in advice
    assert "lower --gpu-memory-utilization" in advice
    assert "--kv-cache-memory-bytes" in advice
    for word in ("grow", "raise", "increase", "lever"):
        assert word not in advice
    assert diag["levers"] == []


def test_the_real_negative_estimates_kvwatch_names_come_from_public_threads() -> None:
    real = [e for e in GRAPH_ENTRIES if e["file"].startswith("real-")]
    assert len(real) >= 2
    assert all(str(e["source_url"]).startswith("https://github.com/") for e in real)


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        ("Estimated CUDA graph memory: -10.33 GiB", "capacity.cuda_graph_estimate_gib", -10.33),
        (
            "INFO 08-29 10:00:00 [gpu_worker.py:621] CUDA graph pool memory: -0.19 GiB (actual), 2.43 GiB "
            "(estimated), difference: 2.62 GiB (1378.9%).",
            "capacity.cuda_graph_gib",
            -0.19,
        ),
    ],
    ids=["estimate-retyped-without-total", "pool-actual"],
)
def test_reader_states_both_graph_figures(line: str, field: str, value: float) -> None:
    facts = {r.field: r.value for r in parse_line(line, 1) if isinstance(r, FactRecord)}
    assert facts[field] == value


def test_estimate_rules_follow_the_version_default_and_the_budget() -> None:
    assert estimate_applied(None)
    assert estimate_applied((0, 21, 0))
    assert estimate_applied((0, 32, 0))
    assert not estimate_applied((0, 20, 2))
    assert estimate_finding(0.52, applied=True, budget_gib=71.26) is None  # an ordinary estimate
    big = estimate_finding(80.0, applied=True, budget_gib=71.26)
    assert big is not None
    assert big.sized_pool
    assert not big.negative
    off = estimate_finding(-1.0, applied=False, kv_gib=10.0)
    assert off is not None
    assert not off.sized_pool
    assert capture_finding(0.37) is None
    took = capture_finding(-0.03)
    assert took is not None
    assert not took.sized_pool


@pytest.mark.parametrize(("version", "named"), [("0.22.0", True), ("0.19.1", False)])
def test_a_failed_start_names_the_estimates_share_only_where_it_was_subtracted(version: str, named: bool) -> None:
    diag = _diagnosis(
        "\n".join(
            (
                _banner(version),
                "(EngineCore pid=7) INFO 11-29 14:01:00 [gpu_model_runner.py:6366] Estimated CUDA graph memory:"
                " 6.0 GiB total",
                "(EngineCore pid=7) INFO 11-29 14:01:01 [gpu_worker.py:460] Available KV cache memory: -1.2 GiB",
            )
        )
    )
    assert (diag["verdict"], diag["cause"]) == ("failed_start", "no_kv_memory_after_weights")
    assert ("taken from the budget first" in diag["summary"]) is named, diag["summary"]


def test_sidecar_names_the_inflated_pool_at_start_and_forgets_it_once_the_run_serves_healthily() -> None:
    # The same cause table live (kvwatch_diagnosis{cause}): the real GB10 start names the estimate; the
    # first healthy stats records judge the run by how it serves, with the estimate as a warning.
    state = LiveState()
    name = "real-negative-graph-estimate-v02x-gb10-compose-inflated-pool.log"
    for i, line in enumerate((INCIDENTS / name).read_text().splitlines()):
        for rec in parse_line(line, i + 1):
            state.on_log_record(rec, float(i))
    assert _gauge(state, 100.0)["negative_cuda_graph_estimate"] == 1.0
    t = 100.0
    for _ in range(3):
        t += 10.0
        state.on_log_record(StatsRecord(1, None, 0, None, 4, 0, kv_usage_pct=12.0, prompt_tps=0.0, gen_tps=80.0), t)
    gauge = _gauge(state, t)
    assert gauge["negative_cuda_graph_estimate"] == 0.0
    assert sum(gauge.values()) == 1.0
