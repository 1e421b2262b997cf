"""Request sizes as a distribution: piecewise-uniform integer ranges, drawn with a seeded generator.

Two sources, both pure:

- ``from_buckets``: the spread vLLM's own histograms show (``vllm:request_prompt_tokens`` /
  ``vllm:request_generation_tokens``, Δ of each cumulative bucket over the run). A bucket
  (lo, hi] becomes the integers lo+1..hi with the bucket's count as weight; the ``+Inf`` bucket ends
  at a cap the caller gives (vLLM refuses a prompt of max_model_len tokens or more). When every
  request fell in one bucket the histogram shows no spread, and ``None`` says "replay the mean":
  the seed run's prompts are all exactly 7,500 tokens, inside the single bucket (5,000, +Inf).
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
    first: Sequence[tuple[float, float]], last: Sequence[tuple[float, float]], cap: int
) -> SizeDist | None:
    """The run's spread from two cumulative bucket lists (le, count) of one histogram, or None.

    None when the buckets differ between the two scrapes' layouts, fewer than two buckets gained
    requests (no spread shown), or nothing fits under ``cap``.
    """
    if not last or (first and [le for le, _c in first] != [le for le, _c in last]):
        return None
    before = dict(first)
    pieces: list[tuple[int, int, float]] = []
    prev_le = 0.0
    prev_gain = 0.0
    for le, c in last:
        gain = c - before.get(le, 0.0)
        n = gain - prev_gain
        prev_gain = gain
        lo = math.floor(prev_le) + 1
        hi = cap if math.isinf(le) else min(cap, math.floor(le))
        prev_le = le
        if n > 0 and hi >= lo:
            pieces.append((lo, hi, n))
    if len(pieces) < 2:
        return None
    return SizeDist(tuple(pieces))
