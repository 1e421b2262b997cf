"""The one definition of saturation (docs/contracts.md "Saturation"), shared by analyze and watch.

KV usage oscillates between stats records (95 % -> 61 % -> 95 % in the real seed run while 13-16
requests wait), so a state is judged over a window W: memory_bound needs the KV usage to have
*peaked* at or above the threshold within W, not to be above it now. It drops out of memory_bound
as soon as the queue is empty.

Pure: observations carry their own time; nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise

# The window and threshold defaults, defined once (settings, analyze and the live state read these).
DEFAULT_WINDOW_SECONDS = 60.0
DEFAULT_THRESHOLD = 0.9


class SaturationState(StrEnum):
    """The saturation states (docs/contracts.md "Saturation"), the one list of them.

    ``queued`` is kvwatch's extension: requests wait while KV usage stayed below the threshold and
    running < max_num_seqs (scheduler token budget, deferred requests, or an unknown max_num_seqs).
    A StrEnum, so each member is the plain string the documents and labels carry.
    """

    IDLE = "idle"
    OK = "ok"
    MEMORY_BOUND = "memory_bound"
    SEQ_BOUND = "seq_bound"
    QUEUED = "queued"
    PREEMPTING = "preempting"


# Every state, in the order the exporter lists them.
STATES: tuple[str, ...] = tuple(s.value for s in SaturationState)

# Priority order for a verdict over a stretch (docs/contracts.md, plus kvwatch's "queued").
VERDICT_ORDER: tuple[str, ...] = (
    SaturationState.MEMORY_BOUND,
    SaturationState.SEQ_BOUND,
    SaturationState.QUEUED,
    SaturationState.PREEMPTING,
    SaturationState.OK,
    SaturationState.IDLE,
)


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
    """Classifies each observation, remembering the window it needs.

    The window is kept as data that makes each observation O(1) amortised (analyze feeds one per
    stats record, tens of thousands per GB of log): the observations' times and preemption counts
    in order, and the KV peaks as a monotonic deque (each entry higher than every later one), so
    the peak over the window is its first entry.
    """

    def __init__(
        self,
        window_seconds: float = DEFAULT_WINDOW_SECONDS,
        threshold: float = DEFAULT_THRESHOLD,
        max_num_seqs: int | None = None,
    ) -> None:
        self.window_seconds = window_seconds
        self.threshold = threshold
        self.max_num_seqs = max_num_seqs
        self._times: deque[float] = deque()  # t of each observation in the window, oldest first
        self._preemptions: deque[float] = deque()  # and its preemptions, in step with _times
        self._nonzero_preemptions = 0  # entries of _preemptions that are not 0
        self._seq = 0  # observations so far: the index of the next one
        self._first = 0  # index of the oldest observation still in the window
        self._peaks: deque[tuple[int, float]] = deque()  # (index, KV ratio), ratios decreasing

    def peak_kv_usage(self) -> float | None:
        """Highest KV usage within the window, None when no observation had one."""
        return self._peaks[0][1] if self._peaks else None

    def observe(self, obs: Observation) -> str:
        """Add ``obs`` and return the state it shows."""
        return self.observe_values(
            obs.t, obs.running, obs.waiting, obs.kv_usage_ratio, obs.preemptions, obs.waiting_capacity
        )

    def observe_values(
        self,
        t: float,
        running: float | None,
        waiting: float | None,
        kv_usage_ratio: float | None,
        preemptions: float = 0.0,
        waiting_capacity: float | None = None,
    ) -> str:
        """``observe`` without building an Observation (the fields in the same order)."""
        seq = self._seq
        self._seq = seq + 1
        times = self._times
        times.append(t)
        self._preemptions.append(preemptions)
        if preemptions:
            self._nonzero_preemptions += 1
        peaks = self._peaks
        if kv_usage_ratio is not None:
            while peaks and peaks[-1][1] <= kv_usage_ratio:
                peaks.pop()
            peaks.append((seq, kv_usage_ratio))
        # Keep the records inside W; always keep the newest, and the one before it, so that a
        # stats interval longer than W still compares two records.
        window = self.window_seconds
        while len(times) > 2 and t - times[0] > window:
            times.popleft()
            if self._preemptions.popleft():
                self._nonzero_preemptions -= 1
            if peaks and peaks[0][0] == self._first:
                peaks.popleft()
            self._first += 1
        return self.classify_values(running, waiting, waiting_capacity)

    def classify(self, obs: Observation) -> str:
        """The state for ``obs`` given the window already observed."""
        return self.classify_values(obs.running, obs.waiting, obs.waiting_capacity)

    def classify_values(
        self, running: float | None, waiting: float | None, waiting_capacity: float | None = None
    ) -> str:
        """``classify`` without building an Observation."""
        running = running or 0.0
        waiting = waiting or 0.0
        if running <= 0 and waiting <= 0:
            # A preemption needs running requests: an empty server is idle, whatever W saw.
            return SaturationState.IDLE
        capacity_waiting = waiting_capacity if waiting_capacity is not None else waiting
        max_num_seqs = self.max_num_seqs
        if (
            capacity_waiting > 0
            and (max_num_seqs is None or running < max_num_seqs)
            and self._peaks
            and self._peaks[0][1] >= self.threshold
        ):
            return SaturationState.MEMORY_BOUND
        if waiting > 0 and max_num_seqs is not None and running >= max_num_seqs:
            return SaturationState.SEQ_BOUND
        if self._nonzero_preemptions and sum(self._preemptions) > 0:
            return SaturationState.PREEMPTING
        if waiting > 0:
            return SaturationState.QUEUED
        return SaturationState.OK


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
