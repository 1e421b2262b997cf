"""The sidecar's request-size window holds a bounded number of small samples, whatever the interval.

Counts of held items, never RSS or time (the memory figures are benchmarks/footprint.py's).
"""

from __future__ import annotations

import pytest

from kvwatch.reconcile.live import FOOTPRINT_WINDOW_SECONDS, LiveState
from kvwatch.reconcile.window import MAX_SAMPLES, RequestSizes, RequestSizeWindow
from kvwatch.records import EngineSample, HistogramSummary, MetricsSnapshot

_LE = (1.0, 10.0, 100.0, 1000.0, 10000.0, float("inf"))


def _hist(finished: int) -> HistogramSummary:
    # finished requests spread over the buckets, cumulative as vLLM exposes them
    counts = [finished * min(k, 4) // 4 for k in range(1, len(_LE) + 1)]  # all at or under 1,000 tokens
    return HistogramSummary(
        count=float(finished), sum=finished * 900.0, buckets=tuple(zip(_LE, map(float, counts), strict=True))
    )


def _sample(finished: int) -> EngineSample:
    return EngineSample(
        "m",
        "0",
        running=3.0,
        waiting=0.0,
        request_prompt_tokens=_hist(finished),
        request_generation_tokens=_hist(finished),
        ttft_seconds=_hist(finished),
        e2e_latency_seconds=_hist(finished),
        queue_time_seconds=_hist(finished),
    )


@pytest.mark.parametrize("interval", [0.05, 0.5, 1.0, 2.0], ids=lambda i: f"every-{i}s")
def test_a_fine_scrape_interval_holds_at_most_the_bound(interval: float) -> None:
    window = RequestSizeWindow(FOOTPRINT_WINDOW_SECONDS)
    held = []
    for i in range(int(3 * FOOTPRINT_WINDOW_SECONDS / interval)):
        window.add(i * interval, _sample(i))
        held.append(len(window))
    assert max(held) <= 2 * MAX_SAMPLES + 2
    now = (len(held) - 1) * interval
    assert window[-1][0] == now  # the newest scrape is always the window's end
    # the window's start: inside the window, and within one spacing (plus a scrape) of its edge
    assert 0 <= now - window[0][0] <= FOOTPRINT_WINDOW_SECONDS
    assert now - window[0][0] >= FOOTPRINT_WINDOW_SECONDS - window.spacing - interval


def test_at_the_default_interval_every_scrape_of_the_window_is_kept() -> None:
    window = RequestSizeWindow(FOOTPRINT_WINDOW_SECONDS)
    times = [5.0 * i + (0.3 if i % 3 else -0.2) for i in range(400)]  # 5 s, with a scraper's jitter
    for i, t in enumerate(times):
        window.add(t, _sample(i))
    expected = [t for t in times if times[-1] - t <= FOOTPRINT_WINDOW_SECONDS]
    assert [window[i][0] for i in range(len(window))] == expected


def test_only_the_request_size_histograms_are_kept_and_an_unchanged_one_is_shared() -> None:
    window = RequestSizeWindow(FOOTPRINT_WINDOW_SECONDS)
    for t in range(0, 600, 5):
        window.add(float(t), _sample(42))  # an idle server: nothing finishes
    entries = [window[i][1] for i in range(len(window))]
    assert all(type(e) is RequestSizes for e in entries)
    assert len({id(e.request_prompt_tokens) for e in entries}) == 1
    assert len({id(e.request_generation_tokens) for e in entries}) == 1


def test_the_live_state_keeps_the_bounded_window_and_judges_sizes_from_it() -> None:
    state = LiveState(scrape_interval=0.1)
    for i in range(int(2 * FOOTPRINT_WINDOW_SECONDS / 0.1)):
        state.on_scrape(MetricsSnapshot(engines=(_sample(i),)), i * 0.1)
    eng = state.engines["0"]
    assert len(eng.footprint) <= 2 * MAX_SAMPLES + 2
    assert set(state.request_tokens(eng)) == {"0.5", "0.95"}
