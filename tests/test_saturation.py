"""The one definition of saturation (docs/contracts.md), as analyze and watch both use it."""

from __future__ import annotations

import pytest

from kvwatch.reconcile.saturation import Observation, SaturationJudge, verdict


def _run(observations: list[Observation], **kw: object) -> list[str]:
    judge = SaturationJudge(**kw)  # type: ignore[arg-type]
    return [judge.observe(o) for o in observations]


# The real seed run (tests/fixtures/vllm-cpu-seed/server.log): usage swings 58.6 -> 81.0 -> 95+ %
# while 14-16 wait; the judge must hold memory_bound through the dips once the peak was >= 0.9.
SEED_LIKE = [
    Observation(0, 4, 16, 0.586),
    Observation(10, 4, 16, 0.810),
    Observation(20, 5, 15, 0.975),
    Observation(30, 5, 15, 0.612),
    Observation(40, 5, 15, 0.951),
    Observation(50, 3, 0, 0.40),
    Observation(60, 0, 0, 0.0),
]


def test_memory_bound_holds_through_usage_dips_within_the_window() -> None:
    states = _run(SEED_LIKE)
    assert states == ["queued", "queued", "memory_bound", "memory_bound", "memory_bound", "ok", "idle"]


def test_memory_bound_drops_out_as_soon_as_the_queue_is_empty() -> None:
    states = _run([Observation(0, 5, 3, 0.99), Observation(1, 5, 0, 0.99)])
    assert states == ["memory_bound", "ok"]


def test_peak_older_than_the_window_no_longer_counts() -> None:
    obs = [Observation(0, 5, 3, 0.99), Observation(30, 5, 3, 0.5), Observation(100, 5, 3, 0.5)]
    assert _run(obs, window_seconds=60) == ["memory_bound", "memory_bound", "queued"]


@pytest.mark.parametrize(
    ("obs", "max_num_seqs", "expected"),
    [
        (Observation(0, 8, 4, 0.95), 8, "seq_bound"),
        (Observation(0, 7, 4, 0.95), 8, "memory_bound"),
        (Observation(0, 8, 4, 0.20), 8, "seq_bound"),
        (Observation(0, 18, 226, 0.10), None, "queued"),
        (Observation(0, 3, 0, 0.99, preemptions=2), None, "preempting"),
        (Observation(0, 3, 0, 0.99), None, "ok"),
        (Observation(0, 0, 0, 0.0), None, "idle"),
        (Observation(0, 0, 0, 0.3, preemptions=5), None, "idle"),
        (Observation(0, 5, 6, 0.99, waiting_capacity=0), None, "queued"),
        (Observation(0, 5, 6, 0.99, waiting_capacity=4), None, "memory_bound"),
    ],
    ids=[
        "running-at-max-num-seqs-is-seq-bound",
        "one-under-max-num-seqs-with-full-kv-is-memory-bound",
        "seq-bound-whatever-the-kv-usage",
        "waiting-at-low-kv-unknown-cap-is-queued",
        "preemptions-in-window-without-queue-is-preempting",
        "running-nothing-waiting-is-ok",
        "nothing-running-or-waiting-is-idle",
        "an-empty-server-is-idle-even-after-preemptions",
        "only-deferred-waiting-is-not-memory-bound",
        "capacity-waiting-by-reason-counts",
    ],
)
def test_classifies_one_observation(obs: Observation, max_num_seqs: int | None, expected: str) -> None:
    assert _run([obs], max_num_seqs=max_num_seqs) == [expected]


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], "unknown"),
        (["idle"], "idle"),
        (["ok", "memory_bound", "memory_bound", "ok", "idle", "idle"], "memory_bound"),
        (["memory_bound", "ok", "ok", "idle"], "ok"),
        (["seq_bound", "seq_bound", "memory_bound", "memory_bound"], "memory_bound"),
        (["preempting", "preempting", "ok", "ok"], "preempting"),
    ],
    ids=[
        "no-records",
        "single-record",
        "sustained-memory-bound-wins",
        "a-single-blip-is-not-sustained",
        "memory-bound-outranks-seq-bound",
        "preempting-outranks-ok",
    ],
)
def test_verdict_takes_the_first_sustained_state(states: list[str], expected: str) -> None:
    assert verdict(states) == expected
