"""The request-size window of one engine: what the sidecar keeps of each scrape, bounded.

The observed KV footprint of a request (``kvwatch_request_tokens``) and the what-ifs' request
shape are quantiles of vLLM's ``request_prompt_tokens`` and ``request_generation_tokens``
histograms over the last window (kvwatch.reconcile.live): the newest scrape's buckets minus the
oldest's inside the window. So only those two histograms of each scrape are kept, not the whole
EngineSample (six histograms, ~13 KiB per scrape of a vLLM 0.x server), and an unchanged histogram
is the previous one's object (an idle server's window holds one).

The count is bounded whatever ``--scrape-interval``: a scrape is kept beside the newest only when
it is at least ``window / MAX_SAMPLES`` after the sample before that (5 s of the 10-minute window:
every scrape at the default 5 s interval is kept, so its figures are unchanged), else it takes
the newest's place; so at most ``2 * MAX_SAMPLES + 2`` are held. A finer interval moves the
window's start by about that spacing; before, a 0.1 s interval kept 6,000 samples (78 MiB).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvwatch.records import EngineSample, HistogramSummary

#: The window's start is resolved to window / MAX_SAMPLES; it holds at most 2 * MAX_SAMPLES + 2 samples.
MAX_SAMPLES = 120


@dataclass(frozen=True, slots=True)
class RequestSizes:
    """What the window needs of one scrape (named as EngineSample's fields)."""

    request_prompt_tokens: HistogramSummary | None
    request_generation_tokens: HistogramSummary | None


class RequestSizeWindow:
    """(time, RequestSizes) of the scrapes within ``seconds``, oldest first; indexable like a deque."""

    __slots__ = ("_held", "seconds", "spacing")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spacing = seconds / MAX_SAMPLES
        self._held: deque[tuple[float, RequestSizes]] = deque()

    def add(self, now: float, sample: EngineSample) -> None:
        """Keep this scrape's histograms as the newest; several samples of one scrape keep the last."""
        held = self._held
        last = held[-1][1] if held else None
        sizes = RequestSizes(
            _same_or_new(last.request_prompt_tokens if last else None, sample.request_prompt_tokens),
            _same_or_new(last.request_generation_tokens if last else None, sample.request_generation_tokens),
        )
        if held and (held[-1][0] == now or (len(held) >= 2 and now - held[-2][0] < self.spacing)):
            held[-1] = (now, sizes)  # the same scrape, or the newest moves on within one spacing
        else:
            held.append((now, sizes))
        while held and now - held[0][0] > self.seconds:
            held.popleft()

    def __len__(self) -> int:
        return len(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def __getitem__(self, index: int) -> tuple[float, RequestSizes]:
        return self._held[index]


def _same_or_new(old: HistogramSummary | None, new: HistogramSummary | None) -> HistogramSummary | None:
    return old if old is not None and old == new else new
