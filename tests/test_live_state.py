"""The sidecar's reconciler: observed vs expected, reset-aware counters, states, catalogue-only output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.export.catalogue import BY_NAME, CATALOGUE
from kvwatch.export.collector import StateCollector
from kvwatch.export.exposition import samples
from kvwatch.reconcile.live import Expected, LiveState
from kvwatch.records import (
    EngineSample,
    FactRecord,
    HistogramSummary,
    MetricsSnapshot,
    PreemptionRecord,
    RunStartRecord,
    StatsRecord,
)
from tests.conftest import require_binary

INF = float("inf")


def _fact(field: str, value: object) -> FactRecord:
    return FactRecord(1, None, field, value)  # type: ignore[arg-type]


def _stats(running: int, waiting: int, kv: float, engine: int = 0, preemptions: int | None = None) -> StatsRecord:
    return StatsRecord(2, None, engine, None, running, waiting, kv_usage_pct=kv, preemptions=preemptions)


def _hist(*counts: float, bounds: tuple[float, ...] = (1000, 5000, 10000)) -> HistogramSummary:
    buckets = (*zip(bounds, counts, strict=True), (INF, counts[-1]))
    return HistogramSummary(count=counts[-1], sum=None, buckets=buckets)


def _engine(
    preemptions: float,
    prompt: HistogramSummary | None = None,
    gen: HistogramSummary | None = None,
    running: float = 5,
    waiting: float = 15,
    kv: float = 0.95,
    capacity: float | None = 15,
) -> EngineSample:
    return EngineSample(
        "llama-3.1-8b-sim",
        "0",
        running=running,
        waiting=waiting,
        waiting_capacity=capacity,
        kv_usage_ratio=kv,
        kv_usage_metric="vllm:kv_cache_usage_perc",
        preemptions_total=preemptions,
        request_prompt_tokens=prompt,
        request_generation_tokens=gen,
    )


def _snapshot(*engines: EngineSample, **cache: object) -> MetricsSnapshot:
    return MetricsSnapshot(engines=engines, cache_config=dict(cache))  # type: ignore[arg-type]


def _values(state: LiveState, now: float) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, s.labels): s.value for s in samples(state, now)}


def _get(live: LiveState, now: float, name: str, **labels: str) -> float | None:
    for s in samples(live, now):
        d = dict(s.labels)
        if s.name == name and all(d.get(k) == v for k, v in labels.items()):
            return s.value
    return None


SEED_FACTS = [
    _fact("capacity.kv_cache_tokens", 40960),
    _fact("config.max_seq_len", 9216),
    _fact("config.block_size", 32),
    _fact("config.served_model_name", "llama-3.1-8b-sim"),
]


def test_pool_and_concurrency_from_log_match_vllms_startup_line() -> None:
    state = LiveState()
    for f in SEED_FACTS:
        state.on_log_record(f, 0)
    state.on_log_record(_stats(4, 16, 81.0), 1)
    assert _get(state, 1, "kvwatch_kv_pool_tokens", source="log") == 40960
    # vLLM printed 4.44x for 9,216 tokens per request: 1,280 blocks / cdiv(9216, 32) = 4.444
    assert _get(state, 1, "kvwatch_max_concurrency", basis="max_model_len") == pytest.approx(4.444, abs=1e-3)
    # Without a scrape, the request footprint is estimated from the log: pool x usage / running.
    assert _get(state, 1, "kvwatch_request_tokens", quantile="0.95") == pytest.approx(40960 * 0.81 / 4)


def test_observed_values_prefer_fresh_metrics_and_fall_back_to_the_log() -> None:
    state = LiveState(scrape_interval=5)
    state.on_scrape(_snapshot(_engine(0, running=3, waiting=9, kv=1.0)), now=100)
    state.on_log_record(_stats(5, 15, 50.0), 101)
    assert _get(state, 101, "kvwatch_observed_running_requests") == 3  # the scrape is fresh
    assert _get(state, 200, "kvwatch_observed_running_requests") == 5  # scrape stale: the log's value
    assert _get(state, 200, "kvwatch_observed_kv_usage_ratio") == pytest.approx(0.5)


def test_memory_bound_follows_the_scheduler_and_leaves_when_the_queue_drains() -> None:
    state = LiveState()
    events = state.on_scrape(_snapshot(_engine(0)), 0)
    assert _get(state, 0, "kvwatch_memory_bound") == 1
    assert _get(state, 0, "kvwatch_saturation_state", state="memory_bound") == 1
    assert [e.kind for e in events] == ["state"]
    state.on_scrape(_snapshot(_engine(0, running=2, waiting=0, kv=0.4, capacity=0)), 5)
    assert _get(state, 5, "kvwatch_memory_bound") == 0
    assert _get(state, 5, "kvwatch_saturation_state", state="ok") == 1


def test_state_change_events_are_one_per_change_never_per_record() -> None:
    state = LiveState()
    kinds = [e.kind for t in range(10) for e in state.on_scrape(_snapshot(_engine(0)), t)]
    assert kinds == ["state"]


def test_metrics_preemption_counter_equals_vllms_and_survives_a_vllm_restart() -> None:
    state = LiveState()
    for t, value in enumerate([14, 20, 3, 5]):  # vLLM restarted between 20 and 3
        state.on_scrape(_snapshot(_engine(value)), t)
    assert _get(state, 3, "kvwatch_preemptions_total", source="metrics") == 14 + 6 + 3 + 2


def test_log_preemptions_sum_v1_interval_counts_and_track_v0_cumulative_totals() -> None:
    state = LiveState()
    state.on_log_record(_stats(5, 3, 99.0, preemptions=2), 0)
    state.on_log_record(_stats(5, 3, 99.0, preemptions=3), 10)
    assert _get(state, 10, "kvwatch_preemptions_total", source="log") == 5
    v0 = LiveState()
    v0.on_log_record(PreemptionRecord(1, None, "recompute", 51), 0)
    v0.on_log_record(PreemptionRecord(2, None, "recompute", 101), 1)
    v0.on_log_record(RunStartRecord(3, None, "version_banner"), 2)
    v0.on_log_record(PreemptionRecord(4, None, "recompute", 1), 3)
    assert _get(v0, 3, "kvwatch_preemptions_total", source="log") == 102


def test_request_footprint_uses_histogram_deltas_of_the_window() -> None:
    state = LiveState()
    state.on_scrape(_snapshot(_engine(0, _hist(0, 0, 10), _hist(10, 10, 10))), 0)
    # 10 more requests, all 7,500-token prompts (5,000 < x <= 10,000) and <= 1,000 generated
    state.on_scrape(_snapshot(_engine(0, _hist(0, 0, 20), _hist(20, 20, 20))), 10, **{})
    p95 = _get(state, 10, "kvwatch_request_tokens", quantile="0.95")
    assert p95 == pytest.approx(5000 + 5000 * 0.95 + 1000 * 0.95)


def test_reconcile_ratios_and_one_mismatch_event_naming_a_cause() -> None:
    def expected(_facts: dict[str, object]) -> Expected:
        return Expected(bytes_per_token=131072, pool_tokens_for=lambda b: b // 131072)

    state = LiveState(expected=expected)
    events = []
    for f in [
        _fact("capacity.kv_cache_memory_gib", 5.0),
        _fact("capacity.kv_cache_tokens", 81920),
        _fact("config.kv_cache_dtype", "auto"),
    ]:
        events += state.on_log_record(f, 0)
    assert _get(state, 0, "kvwatch_reconcile_ratio", check="pool_tokens") == pytest.approx(2.0)
    assert _get(state, 0, "kvwatch_reconcile_ratio", check="bytes_per_token") == pytest.approx(0.5)
    mismatches = [e.message for e in events if e.kind == "mismatch"]
    assert any("fp8" in m for m in mismatches)
    assert len(mismatches) == len(set(mismatches))
    again = state.on_log_record(_fact("capacity.kv_cache_tokens", 81920), 1)
    assert not [e for e in again if e.kind == "mismatch"]


def test_absent_inputs_export_nothing_rather_than_zero() -> None:
    names = {s.name for s in samples(LiveState(), 0)}
    assert names == {"kvwatch_build_info"}


def test_label_values_are_bounded_when_engines_multiply() -> None:
    state = LiveState()
    for i in range(200):
        state.on_log_record(_stats(1, 0, 1.0, engine=i), 0)
    engines = {dict(s.labels).get("engine") for s in samples(state, 0)} - {None}
    assert len(engines) <= 65


def _full_state() -> LiveState:
    def expected(_facts: dict[str, object]) -> Expected:
        return Expected(1024, lambda b: b // 1024, lambda pool, req: {"fp8_kv_cache": 2 * pool / req.context_tokens})

    state = LiveState(expected=expected)
    for f in [*SEED_FACTS, _fact("capacity.kv_cache_memory_gib", 0.04), _fact("config.max_num_seqs", 256)]:
        state.on_log_record(f, 0)
    state.on_log_record(_stats(5, 15, 97.0, preemptions=1), 1)
    state.on_source("log", True, 1, 0.001)
    state.on_source("metrics", True, 1, 0.01)
    state.on_http_drop("aborted")
    state.on_scrape(
        _snapshot(
            _engine(2, _hist(0, 0, 9), _hist(9, 9, 9)),
            kv_cache_size_tokens=40960,
            block_size=32,
            kv_cache_max_concurrency=4.44,
        ),
        1,
    )
    # What the sidecar's background recompute stores (kvwatch.sidecar.Sidecar.recompute_whatif_once).
    state.whatif_errors = 0.0
    for key in state.engines:
        state.set_whatif(key, (("observed", 11.25, 30.43), ("fp8_kv_cache", 7.8, 9.43)))
    return state


def test_exporter_emits_exactly_the_catalogue() -> None:
    registry = CollectorRegistry()
    registry.register(StateCollector(lambda now: samples(_full_state(), now), clock=lambda: 2.0))
    text = generate_latest(registry).decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    exported = {name + ("_total" if BY_NAME.get(name + "_total", None) else "") for name in families}
    assert exported == {m.name for m in CATALOGUE}
    for family in text_string_to_metric_families(text):
        spec = BY_NAME.get(family.name) or BY_NAME[family.name + "_total"]
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            assert tuple(sorted(sample.labels)) == tuple(sorted(spec.all_labels)), sample


def test_promtool_check_metrics_passes_on_the_exposition() -> None:
    promtool = require_binary("promtool")
    registry = CollectorRegistry()
    registry.register(StateCollector(lambda now: samples(_full_state(), now), clock=lambda: 2.0))
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=generate_latest(registry), capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_a_footprint_above_the_last_bucket_is_never_the_mean_called_p95() -> None:
    # vLLM's prompt buckets stop at 5,000 for this server (1-2-5 steps below max_model_len 9,216),
    # so the 7,500-token prompts all sit in +Inf: the histogram cannot resolve their p50 or p95.
    # Neither the bound (5,000) nor the mean (7,500) is that quantile: with the scrapes alone
    # nothing is exported, and the observed_p95 ceiling with it.
    from kvwatch.parse.metrics import parse_exposition

    seed = Path(__file__).parent / "fixtures" / "vllm-cpu-seed"
    state = LiveState()
    for t, name in enumerate(["metrics-05.prom", "metrics-12.prom"]):
        state.on_scrape(parse_exposition((seed / name).read_text()), t * 70.0)
    assert _get(state, 70, "kvwatch_request_tokens", quantile="0.95") is None
    assert _get(state, 70, "kvwatch_request_tokens", quantile="0.5") is None
    assert _get(state, 70, "kvwatch_max_concurrency", basis="observed_p95") is None


def test_a_footprint_above_the_last_bucket_falls_back_to_what_the_log_measures() -> None:
    # With the log, the footprint is what the running requests hold: pool x usage / running
    # (40,960 x 100 % / 5 = 8,192 at the seed run's peak), a measurement, not the histogram's mean.
    from kvwatch.parse.metrics import parse_exposition

    seed = Path(__file__).parent / "fixtures" / "vllm-cpu-seed"
    state = LiveState()
    for f in SEED_FACTS:
        state.on_log_record(f, 0)
    state.on_log_record(_stats(5, 15, 100.0), 1)  # the seed log's peak record: Running 5, usage 100 %
    for t, name in enumerate(["metrics-05.prom", "metrics-12.prom"]):
        state.on_scrape(parse_exposition((seed / name).read_text()), t * 70.0)
    p95 = _get(state, 70, "kvwatch_request_tokens", quantile="0.95")
    assert p95 == pytest.approx(8192.0)
    assert p95 != 7500 + 1000  # the histograms' means, which the sidecar once exported as p95
