"""Request sizes drawn from vLLM's request-token histograms keep the run's mean (Δsum/Δcount).

The bucket edges are vLLM 0.32.0's for max_model_len 9,216 (vllm/v1/metrics/buckets.py
``build_1_2_5_buckets``: 1, 2, 5, ..., 5,000, then +Inf); the counts and sums are what a histogram
of the stated sizes holds, computed here from the sizes themselves.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics

from kvwatch.reconcile.simulate.sizes import SizeDist, fit_mean, from_buckets

EDGES = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, math.inf]


def _histogram(sizes: list[int]) -> tuple[list[tuple[float, float]], list[tuple[float, float]], float]:
    """(empty cumulative buckets, filled cumulative buckets, mean) as vLLM's histogram would hold them."""
    counts = [0.0] * len(EDGES)
    for s in sizes:
        counts[bisect.bisect_left(EDGES, s)] += 1
    cum = [sum(counts[: i + 1]) for i in range(len(EDGES))]
    return [(le, 0.0) for le in EDGES], list(zip(EDGES, cum, strict=True)), statistics.fmean(sizes)


def test_uniform_prompts_over_four_buckets_keep_their_mean_and_top() -> None:
    # prompts uniform in 600..7,500 (the spread run's workload): the open +Inf bucket's draw ended
    # at the cap (9,215) and put the mean 300 tokens high; fitted, its top lands near 7,500.
    rng = random.Random(11)
    sizes = [rng.randint(600, 7500) for _ in range(400)]
    first, last, mean = _histogram(sizes)
    raw = from_buckets(first, last, cap=9215)
    fitted = from_buckets(first, last, cap=9215, mean=mean)
    assert raw is not None
    assert fitted is not None
    assert raw.mean - mean > 250  # the within-bucket uniform draw shifts the mean
    assert abs(fitted.mean - mean) <= 1.0
    assert [w for *_r, w in fitted.pieces] == [w for *_r, w in raw.pieces]  # bucket counts kept
    # the top absorbs the other buckets' distance from their midpoints, and 400 draws' noise: the
    # top bucket's own sample mean alone moves its fitted end by about +-130 tokens (2 sigma / sqrt n)
    assert abs(fitted.high - 7500) <= 0.05 * 7500
    assert raw.high == 9215
    for (lo, hi, _w), (rlo, rhi, _rw) in zip(fitted.pieces, raw.pieces, strict=True):
        assert rlo <= lo <= hi <= rhi  # every draw stays in its bucket
    sampler = fitted.sampler(random.Random(5))
    draws = [sampler.draw() for _ in range(20000)]
    assert abs(statistics.fmean(draws) - mean) < 0.01 * mean


def test_outputs_short_of_the_top_buckets_far_edge_keep_their_mean() -> None:
    # outputs uniform in 100..700: the top filled bucket (500, 1000] is filled only to 700.
    rng = random.Random(12)
    sizes = [rng.randint(100, 700) for _ in range(300)]
    first, last, mean = _histogram(sizes)
    raw = from_buckets(first, last, cap=9215)
    fitted = from_buckets(first, last, cap=9215, mean=mean)
    assert raw is not None
    assert fitted is not None
    assert raw.mean - mean > 30
    assert abs(fitted.mean - mean) <= 1.0
    assert fitted.high < raw.high


def test_a_small_offset_is_shared_and_no_bucket_collapses() -> None:
    # The spread fixture's outputs (tests/fixtures/vllm-cpu-spread/README.md): 16, 29 and 71
    # requests in (100, 200], (200, 500], (500, 1000], mean 579.1 against the midpoints' 567.7.
    dist = SizeDist(((101, 200, 16.0), (201, 500, 29.0), (501, 1000, 71.0)))
    fitted = fit_mean(dist, 67170 / 116)
    assert abs(fitted.mean - 67170 / 116) <= 0.5
    for (lo, hi, _w), (rlo, rhi, _rw) in zip(fitted.pieces, dist.pieces, strict=True):
        assert rlo <= lo <= hi == rhi  # sizes above the midpoints: lower ends move up
        assert hi - lo >= 0.9 * (rhi - rlo)


def test_a_mean_no_buckets_allow_narrows_as_far_as_it_can() -> None:
    dist = SizeDist(((101, 200, 1.0), (201, 500, 1.0)))
    low = fit_mean(dist, 50.0)
    assert low.pieces == ((101, 101, 1.0), (201, 201, 1.0))
    high = fit_mean(dist, 900.0)
    assert high.pieces == ((200, 200, 1.0), (500, 500, 1.0))


def test_without_a_mean_the_buckets_are_drawn_whole() -> None:
    first, last, _mean = _histogram([150, 160, 170, 300])
    dist = from_buckets(first, last, cap=9215)
    assert dist is not None
    assert dist.pieces == ((101, 200, 3.0), (201, 500, 1.0))
