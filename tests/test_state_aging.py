"""State that ages: engines /metrics stopped reporting are dropped; one huge scrape is not kept.

A DP rank that goes away (or a server replaced by one with fewer engines) must leave the
exposition after ``engine_expiry_scrapes`` successful scrapes without it, or fleet sums keep
adding its last values forever. promtool judges the exposition clean before and after.
"""

from __future__ import annotations

import functools
import subprocess
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.export import exposition
from kvwatch.export.collector import StateCollector
from kvwatch.reconcile.live import LiveState
from kvwatch.records import EngineSample, MetricsSnapshot, StatsRecord
from tests.conftest import require_binary


def _snapshot(*engines: str, model: str = "m") -> MetricsSnapshot:
    return MetricsSnapshot(
        engines=tuple(
            EngineSample(model, e, running=2.0, waiting=0.0, kv_usage_ratio=0.4, preemptions_total=3.0) for e in engines
        )
    )


def _exposition(state: LiveState, now: float) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(functools.partial(exposition.samples, state), threading.Lock(), lambda: now))
    return generate_latest(registry).decode()


def _engines_exported(text: str) -> set[str]:
    return {
        line.split('engine="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("kvwatch_observed_running_requests{")
    }


def _promtool_clean(text: str) -> None:
    done = subprocess.run(
        [require_binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == ""
    assert done.stderr.strip() == ""


@pytest.mark.prometheus
def test_a_vanished_engine_is_dropped_after_the_configured_scrapes_and_promtool_stays_clean() -> None:
    state = LiveState(scrape_interval=5.0, engine_expiry_scrapes=4)
    now = 0.0
    for _ in range(3):
        now += 5
        state.on_scrape(_snapshot("0", "1"), now)
    before = _exposition(state, now)
    assert _engines_exported(before) == {"0", "1"}
    _promtool_clean(before)
    events = []
    for i in range(4):  # rank 1 is gone
        now += 5
        events += state.on_scrape(_snapshot("0"), now)
        assert _engines_exported(_exposition(state, now)) == ({"0", "1"} if i < 3 else {"0"})
    after = _exposition(state, now)
    assert 'engine="1"' not in after
    _promtool_clean(after)
    assert [e.message for e in events] == ["engine 1 (m): not in /metrics for 4 scrapes; its series are dropped"]


def test_the_default_age_is_five_minutes_of_scrapes() -> None:
    assert LiveState(scrape_interval=5.0).engine_expiry_scrapes == 60
    assert LiveState(scrape_interval=15.0).engine_expiry_scrapes == 20


def test_an_answer_without_vllm_series_does_not_age_anything() -> None:
    state = LiveState(scrape_interval=1.0, engine_expiry_scrapes=2)
    state.on_scrape(_snapshot("0", "1"), 1)
    for t in range(2, 10):
        state.on_scrape(MetricsSnapshot(engines=()), t)  # vLLM restarting: no series yet
    assert set(state.engines) == {"0", "1"}


def test_an_engine_the_log_still_reports_is_kept() -> None:
    state = LiveState(scrape_interval=1.0, engine_expiry_scrapes=2)
    state.on_scrape(_snapshot("0", "1"), 1)
    for t in range(2, 6):
        state.on_log_record(StatsRecord(t, None, 1, None, 1, 0, kv_usage_pct=10.0), t)
        state.on_scrape(_snapshot("0"), t)
    assert set(state.engines) == {"0", "1"}


def test_a_returning_engine_starts_fresh_and_is_counted_again() -> None:
    state = LiveState(scrape_interval=1.0, engine_expiry_scrapes=2)
    state.on_scrape(_snapshot("0", "1"), 1)
    state.on_scrape(_snapshot("0"), 2)
    state.on_scrape(_snapshot("0"), 3)
    assert "1" not in state.engines
    state.on_scrape(_snapshot("0", "1"), 4)
    assert state.engines["1"].missed_scrapes == 0


def test_many_model_names_on_one_engine_keep_one_footprint_sample_per_scrape() -> None:
    # What pinned 215 MiB after one 29 MB answer (benchmarks/scrape_memory.py): every
    # (model_name, engine) pair of a scrape kept for the 10-minute footprint window.
    state = LiveState(scrape_interval=5.0)
    names = [f"model-{i}" for i in range(500)]
    for t in (5.0, 10.0, 15.0):
        snap = MetricsSnapshot(engines=tuple(EngineSample(n, "0", running=1.0) for n in names))
        state.on_scrape(snap, t)
    assert len(state.engines["0"].footprint) == 3
