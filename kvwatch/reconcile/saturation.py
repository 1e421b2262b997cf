"""The one definition of saturation (CONTRACTS.md "Saturation"), shared by analyze and watch.

KV usage oscillates between stats records (95 % -> 61 % -> 95 % in the real seed run while 13-16
requests wait), so a state is judged over a window W: memory_bound needs the KV usage to have
*peaked* at or above the threshold within W, not to be above it now. It drops out of memory_bound
as soon as the queue is empty.

Pure: observations carry their own time; nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise

DEFAULT_WINDOW_SECONDS = 60.0
DEFAULT_THRESHOLD = 0.9

# Priority order for a verdict over a stretch (CONTRACTS.md, plus kvwatch's "queued").
VERDICT_ORDER = ("memory_bound", "seq_bound", "queued", "preempting", "ok", "idle")


@dataclass(frozen=True, slots=True)
class Observation:
    """One look at the scheduler: a stats record or a scrape."""

    t: float  # seconds on any monotonic base shared by the observations of one judge
    running: float | None
    waiting: float | None
    kv_usage_ratio: float | None  # 0..1
    preemptions: float = 0.0  # preemptions since the previous observation
    waiting_capacity: float | None = None  # vLLM's waiting_by_reason{reason="capacity"}, 0.20+


class SaturationJudge:
    """Classifies each observation, remembering the window it needs."""

    def __init__(
        self,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        threshold: float = DEFAULT_THRESHOLD,
        max_num_seqs: int | None = None,
    ) -> None:
        self.window_seconds = window_seconds
        self.threshold = threshold
        self.max_num_seqs = max_num_seqs
        self._recent: deque[Observation] = deque()

    def peak_kv_usage(self) -> float | None:
        """Highest KV usage within the window, None when no observation had one."""
        values = [o.kv_usage_ratio for o in self._recent if o.kv_usage_ratio is not None]
        return max(values) if values else None

    def observe(self, obs: Observation) -> str:
        """Add ``obs`` and return the state it shows."""
        self._recent.append(obs)
        # Keep the records inside W; always keep the newest, and the one before it, so that a
        # stats interval longer than W still compares two records.
        while len(self._recent) > 2 and obs.t - self._recent[0].t > self.window_seconds:
            self._recent.popleft()
        return self.classify(obs)

    def classify(self, obs: Observation) -> str:
        """The state for ``obs`` given the window already observed."""
        running = obs.running or 0.0
        waiting = obs.waiting or 0.0
        capacity_waiting = obs.waiting_capacity if obs.waiting_capacity is not None else waiting
        under_seq_cap = self.max_num_seqs is None or running < self.max_num_seqs
        peak = self.peak_kv_usage()
        if running <= 0 and waiting <= 0:
            return "idle"  # a preemption needs running requests: an empty server is idle, whatever W saw
        if capacity_waiting > 0 and under_seq_cap and peak is not None and peak >= self.threshold:
            return "memory_bound"
        if waiting > 0 and self.max_num_seqs is not None and running >= self.max_num_seqs:
            return "seq_bound"
        if sum(o.preemptions for o in self._recent) > 0:
            return "preempting"
        if waiting > 0:
            return "queued"
        return "ok"


def verdict(states: list[str]) -> str:
    """The first state of VERDICT_ORDER held for a sustained stretch (two or more consecutive
    observations); a single observation counts only when it is all there is; ``unknown`` when
    there are none."""
    if not states:
        return "unknown"
    sustained = {a for a, b in pairwise(states) if a == b}
    if not sustained:
        sustained = set(states) if len(states) == 1 else set()
    for state in VERDICT_ORDER:
        if state in sustained:
            return state
    # States never repeated back to back: take the latest, the least surprising summary.
    return states[-1]
