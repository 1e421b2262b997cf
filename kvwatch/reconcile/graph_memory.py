"""What vLLM's two CUDA-graph memory figures mean for the KV pool, version by version.

vLLM prints two different figures, and only one of them can size the pool:

- The **estimate** ("Estimated CUDA graph memory: X GiB total", ``gpu_model_runner.py``
  ``profile_cudagraph_memory``, read in 0.22.0): a dummy capture *before* the pool is sized, each
  sample a difference of two ``torch.cuda.mem_get_info()`` readings (``mem_before - free_after``), so
  it is negative whenever free memory grew meanwhile (unified memory, allocator consolidation,
  another process freeing memory). ``gpu_worker.py`` ``determine_available_memory`` (0.22.0) sets
  ``available_kv_cache_memory_bytes = requested_memory - non_kv_cache_memory -
  cudagraph_memory_estimate_applied``, the estimate applied whenever
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is on: opt-in when it appeared (the 0.18-0.19 notices
  say "will become the default in v0.19"), on by default "since v0.21.0" (vLLM's own notice, and
  ``envs.py`` defaults it to "1" in 0.22.0). A negative estimate, subtracted, *adds* its size to the
  pool: memory no profile measured free. Its notices ("CUDA graph memory profiling is enabled ...",
  "... is disabled ...") print only when the estimate is > 0, so for a negative one the log never
  says whether it was applied; the version's default decides.
- The **capture** ("Graph capturing finished in N secs, took X GiB", ``capture_model``; "... and X GiB
  for CUDAGraph memory" in the summary; "CUDA graph pool memory: X GiB (actual), ..."): measured in
  ``compile_or_warm_up_model`` *after* ``initialize_from_config`` allocated the pool (0.10.2 and 0.22.0
  alike), so it never sizes the pool. It enters only the summary's suggested ``--kv-cache-memory``
  values (``non_kv_cache_memory`` includes ``cuda_graph_memory_bytes``: 0.10.2 and 0.22.0
  ``gpu_worker.py`` ``compile_or_warm_up_model``), so a negative capture makes each suggestion too
  large by its size.

The functions here are pure: numbers in, a finding out. ``kvwatch.reconcile.causes`` decides which
finding is a cause (one that sized the pool) and which is a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GraphFinding", "capture_finding", "estimate_applied", "estimate_finding"]

# The release whose default turned the estimate's subtraction on (vLLM's notice: "CUDA graph memory
# profiling is enabled (default since v0.21.0)").
ESTIMATE_DEFAULT_ON = (0, 21)


@dataclass(frozen=True, slots=True)
class GraphFinding:
    """A CUDA-graph figure that is visibly wrong, and whether it sized the KV pool."""

    sentence: str
    sized_pool: bool  # the figure was subtracted from the KV budget (the estimate, when applied)
    negative: bool  # free memory grew while vLLM measured it
    pool_without_gib: float | None = None  # the pool the budget gives without the wrong figure


def _g(x: float) -> str:
    return f"{x:,.2f}".rstrip("0").rstrip(".") if abs(x) < 100 else f"{x:,.0f}"


def estimate_applied(version: tuple[int, ...] | None) -> bool:
    """Whether the estimate was subtracted, from the version's default: on from 0.21 (opt-in in the
    builds before, whose notices announced the default for "v0.19"); a log that does not state its
    version is taken at the current default."""
    return version is None or version[:2] >= ESTIMATE_DEFAULT_ON


def estimate_finding(
    estimate: float | None,
    *,
    applied: bool,
    kv_gib: float | None = None,
    budget_gib: float | None = None,
) -> GraphFinding | None:
    """The estimate, when it is wrong: negative (a difference of free-memory readings that grew), or
    more than the whole budget (``gpu_memory_utilization`` x total) for graphs alone."""
    if estimate is None:
        return None
    if estimate < 0:
        if not applied:
            return GraphFinding(
                f"the CUDA-graph estimate is negative ({_g(estimate)} GiB: free memory grew while vLLM measured it);"
                " this release subtracts it only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, so it"
                " likely did not size the pool",
                sized_pool=False,
                negative=True,
            )
        without = kv_gib + estimate if kv_gib is not None else None
        pool = f" the {_g(kv_gib)} GiB KV pool holds" if kv_gib is not None else " the KV pool holds"
        rest = f" (the budget gives at most {_g(without)} GiB without it)" if without is not None else ""
        return GraphFinding(
            f"the CUDA-graph estimate is negative ({_g(estimate)} GiB: free memory grew while vLLM measured it):"
            f" subtracted from the KV budget, it added {_g(-estimate)} GiB no profile measured free, so"
            f"{pool} that much memory the device may not have{rest}, and the graphs still need their own",
            sized_pool=True,
            negative=True,
            pool_without_gib=without,
        )
    if budget_gib is not None and estimate > budget_gib:
        return GraphFinding(
            f"the CUDA-graph estimate is {_g(estimate)} GiB, larger than the whole {_g(budget_gib)} GiB budget",
            sized_pool=applied,
            negative=False,
        )
    return None


def capture_finding(capture: float | None) -> GraphFinding | None:
    """A negative capture figure: it never sized the pool (measured after it was allocated), but it
    inflates the ``--kv-cache-memory`` values vLLM's summary suggests by its size."""
    if capture is None or capture >= 0:
        return None
    return GraphFinding(
        f"the CUDA-graph capture figure is negative ({_g(capture)} GiB: free memory grew while capturing): it did"
        f" not size the pool, which was allocated first, but vLLM's suggested --kv-cache-memory values"
        f" count it, so each is {_g(-capture)} GiB too large",
        sized_pool=False,
        negative=True,
    )
