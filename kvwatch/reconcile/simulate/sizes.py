"""Request sizes as a distribution: piecewise-uniform integer ranges, drawn with a seeded generator.

Two sources, both pure:

- ``from_buckets``: the spread vLLM's own histograms show (``vllm:request_prompt_tokens`` /
  ``vllm:request_generation_tokens``, Δ of each cumulative bucket over the run). A bucket
  (lo, hi] becomes the integers lo+1..hi with the bucket's count as weight; the ``+Inf`` bucket ends
  at a cap the caller gives (vLLM refuses a prompt of max_model_len tokens or more). When every
  request fell in one bucket the histogram shows no spread, and ``None`` says "replay the mean":
  the seed run's prompts are all exactly 7,500 tokens, inside the single bucket (5,000, +Inf).
  Given the histogram's Δsum, ``from_buckets`` also keeps the run's mean (``fit_mean``): a uniform
  draw inside each bucket has the buckets' midpoints for its mean, which the real sizes need not
  have.
- ``from_range_ratio``: what ``vllm bench serve --random-range-ratio R`` draws (vLLM 0.32.0
  vllm/benchmarks/datasets/utils.py ``get_sampling_params``): integers uniform in
  [floor(mean x (1 - R)), ceil(mean x (1 + R))], output at least 1.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SizeDist:
    """Integer ranges [lo, hi] with weights; a draw picks a range by weight, then an integer in it."""

    pieces: tuple[tuple[int, int, float], ...]

    @property
    def low(self) -> int:
        """The smallest size that can be drawn."""
        return min(lo for lo, _hi, _w in self.pieces)

    @property
    def high(self) -> int:
        """The largest size that can be drawn."""
        return max(hi for _lo, hi, _w in self.pieces)

    @property
    def mean(self) -> float:
        """The distribution's expected size."""
        total = sum(w for _lo, _hi, w in self.pieces)
        return sum(w * (lo + hi) / 2 for lo, hi, w in self.pieces) / total

    def scaled(self, k: float) -> SizeDist:
        """Every size times ``k`` (at least 1), weights kept."""
        return SizeDist(tuple((max(1, round(lo * k)), max(1, round(hi * k)), w) for lo, hi, w in self.pieces))

    def share_at_least(self, size: int) -> float:
        """The share of draws that are ``size`` or larger."""
        total = sum(w for _lo, _hi, w in self.pieces)
        above = sum(w * (hi - max(lo, size) + 1) / (hi - lo + 1) for lo, hi, w in self.pieces if hi >= size)
        return above / total

    def sampler(self, rng: random.Random) -> Sampler:
        """A drawing function bound to ``rng`` (cumulative weights computed once)."""
        return Sampler(self, rng)


class Sampler:
    """Draws sizes from one ``SizeDist`` with one generator."""

    __slots__ = ("_cum", "_pieces", "_rng", "_total")

    def __init__(self, dist: SizeDist, rng: random.Random) -> None:
        self._pieces = dist.pieces
        self._rng = rng
        acc = 0.0
        cum: list[float] = []
        for _lo, _hi, w in dist.pieces:
            acc += w
            cum.append(acc)
        self._cum = cum
        self._total = acc

    def draw(self) -> int:
        """One size."""
        i = 0
        if len(self._pieces) > 1:
            i = min(len(self._pieces) - 1, bisect.bisect_right(self._cum, self._rng.random() * self._total))
        lo, hi, _w = self._pieces[i]
        return self._rng.randint(lo, hi)


def from_range_ratio(mean: int, ratio: float, minimum: int = 1) -> SizeDist | None:
    """vllm bench serve's random-dataset lengths around ``mean`` (None when ``ratio`` is 0)."""
    if ratio <= 0:
        return None
    lo = max(minimum, math.floor(mean * (1 - ratio)))
    hi = max(lo, math.ceil(mean * (1 + ratio)))
    return SizeDist(((lo, hi, 1.0),))


def from_buckets(
    first: Sequence[tuple[float, float]],
    last: Sequence[tuple[float, float]],
    cap: int,
    mean: float | None = None,
) -> SizeDist | None:
    """The run's spread from two cumulative bucket lists (le, count) of one histogram, or None.

    None when the buckets differ between the two scrapes' layouts, fewer than two buckets gained
    requests (no spread shown), or nothing fits under ``cap``. With ``mean`` (the histogram's
    Δsum/Δcount over the same two scrapes) the pieces are narrowed inside their buckets so the
    distribution's mean is that mean (``fit_mean``).
    """
    if not last or (first and [le for le, _c in first] != [le for le, _c in last]):
        return None
    before = dict(first)
    pieces: list[tuple[int, int, float]] = []
    prev_le = 0.0
    prev_gain = 0.0
    open_top = False  # the highest filled piece is the +Inf bucket, ended only by the cap
    for le, c in last:
        gain = c - before.get(le, 0.0)
        n = gain - prev_gain
        prev_gain = gain
        lo = math.floor(prev_le) + 1
        hi = cap if math.isinf(le) else min(cap, math.floor(le))
        prev_le = le
        if n > 0 and hi >= lo:
            pieces.append((lo, hi, n))
            open_top = math.isinf(le)
    if len(pieces) < 2:
        return None
    dist = SizeDist(tuple(pieces))
    if mean is None:
        return dist
    return fit_mean(dist, mean, open_top=open_top)


def _mid_sum(pieces: Sequence[tuple[int, int, float]]) -> float:
    return sum(w * (lo + hi) / 2 for lo, hi, w in pieces)


def fit_mean(dist: SizeDist, mean: float, open_top: bool = False) -> SizeDist:
    """``dist`` with each piece narrowed inside its own bounds so the whole has ``mean``.

    vLLM states a histogram's bucket edges (vLLM 0.32.0 vllm/v1/metrics/buckets.py
    ``build_1_2_5_buckets``: 1, 2, 5, 10, ... up to max_model_len, for vllm:request_prompt_tokens
    and vllm:request_generation_tokens, vllm/v1/metrics/loggers.py ``PrometheusStatLogger``), each
    bucket's count, and the sum of every observed size (one ``observe`` per finished request in
    ``PrometheusStatLogger.record``); where in a bucket the sizes lie it does not state. So the
    counts stay as they are, every draw stays inside its bucket, and the mean the sum fixes is met
    by moving what is least known first:

    1. the upper end of an open ``+Inf`` bucket (``open_top``): no edge stated, only the caller's
       cap, so it is set where the mean needs it (the real sizes' top, when the other buckets sit
       near their midpoints);
    2. what is still left: every piece shifted by the same fraction of its half width, each a
       uniform sub-range of its bucket anchored at the edge the shift moves towards. The wider a
       bucket, the less its midpoint says, so the correction is shared by each bucket's freedom
       (count x half width) and no bucket of a few requests absorbs another's offset (a run's
       outputs 105-994 tokens sat 11 tokens above their midpoints' mean: given to the lowest bucket
       alone, its 16 requests would all have been drawn at 200).

    A mean outside what the buckets allow (a sum from other scrapes) narrows as far as it can.
    """
    pieces = [list(p) for p in dist.pieces]
    total = sum(w for _lo, _hi, w in dist.pieces)
    want = mean * total

    def gap() -> float:
        return want - _mid_sum([(int(lo), int(hi), w) for lo, hi, w in pieces])

    if open_top:
        lo, hi, w = pieces[-1]
        need = (want - _mid_sum([(int(a), int(b), c) for a, b, c in pieces[:-1]])) / w
        pieces[-1][1] = min(int(hi), max(int(lo), round(2 * need - lo)))
    g = gap()
    spread = sum(w * (hi - lo) / 2 for lo, hi, w in pieces)
    if abs(g) >= 0.5 * total and spread > 0:
        f = max(-1.0, min(1.0, g / spread))
        for piece in pieces:
            lo, hi, _w = piece
            keep = round((1 - abs(f)) * (hi - lo))
            if f < 0:
                piece[1] = int(lo) + keep
            else:
                piece[0] = int(hi) - keep
    return SizeDist(tuple((int(lo), int(hi), float(w)) for lo, hi, w in pieces))
