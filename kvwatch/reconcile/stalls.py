"""A stall vLLM states itself: its ring-buffer wait while requests are in flight.

vLLM's multiprocess engine hands every step to its workers, and takes their results back, through
shared-memory message queues (vllm/distributed/device_communicators/shm_broadcast.py, MessageQueue).
A side that has waited VLLM_RINGBUFFER_WARNING_INTERVAL seconds (60 by default, vllm/envs.py) logs
"No available shared memory broadcast block found in %d seconds", once per interval while it keeps
waiting (0.32.0: acquire_write's ``n_warning``, acquire_read's ReadTimeoutWithWarnings). During
serving the EngineCore waits only on an RPC it sent (v1/executor/multiproc_executor.py
collective_rpc get_response: a step), and 0.32's idle workers wait with ``indefinite=True``, which
never warns; older versions warned from idle workers too, and every version warns during start-up
compilation and profiling (the sentence itself says so). So the sentence alone is no stall: it is one
when vLLM's own figures say requests were in flight (the last stats record's running or waiting
requests, or ``LLM.generate``'s progress bar, vllm/entrypoints/llm.py _run_engine, "Processed prompts
... k/N") and nothing progressed since. Then no step finished for the stated seconds: the contract's
"stalled" (no tokens for 60 s), known from vLLM's words rather than from the missing records.

Pure: the times are the log's own stamps; no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvwatch.records import LogTime

# The fields the parser fills from those two lines (kvwatch.parse.logpatterns "ring_buffer_wait" and
# "offline_progress"); runtime facts, not start-up ones.
RING_WAIT_FIELD = "runtime.ring_buffer_wait_s"
OFFLINE_DONE_FIELD = "runtime.offline_done"
OFFLINE_TOTAL_FIELD = "runtime.offline_total"
# They feed the cause tracker only: no startup fact, nothing the server's facts record keeps.
STALL_FIELDS = frozenset((RING_WAIT_FIELD, OFFLINE_DONE_FIELD, OFFLINE_TOTAL_FIELD))


@dataclass
class RingBufferStall:
    """Ring-buffer waits since the last progress, while requests were in flight (one server run)."""

    in_flight: int = 0  # requests vLLM last said were in flight (0: none, or not known)
    waited_s: float = 0.0  # seconds vLLM said it waited since the last progress
    warnings: int = 0
    start_ts: LogTime | None = None
    _first_t: float | None = None
    _last_t: float | None = None
    _interval: float = 0.0
    _offline_done: int | None = None
    offline_done_stated: int | None = None
    _engines: dict[object, int] = field(default_factory=dict)  # the bar's "k" of "k/N", read just before its "N"
    # The longest stall of the run: (seconds, warnings, requests in flight, when it began).
    best: tuple[float, int, int, LogTime | None] | None = None

    def reset(self, keep_best: bool = False) -> None:
        """A new server start: nothing is in flight, nothing has waited (a postmortem keeps the
        longest stall of an earlier start, ``keep_best``)."""
        self.in_flight, self._offline_done = 0, None
        if not keep_best:
            self.best = None
        self._engines.clear()
        self._progress()

    def _progress(self) -> None:
        self.waited_s, self.warnings, self.start_ts = 0.0, 0, None
        self._first_t = self._last_t = None

    def on_stats(self, engine: object, running: int, waiting: int, tokens: bool, step_driven: bool = False) -> None:
        """One engine's stats record: its scheduler's requests, and whether any token was processed.

        In flight is the sum over the engines' last records (data-parallel engines step in lockstep,
        v1/engine/core.py DPEngineCoreProc, so one engine's stuck step holds the others'). V1 logs on
        a timer in the API server, so its last record is the state when the wait began. V0 logs from
        inside a step (engine/llm_engine.py step -> do_log_stats, 0.2-0.10): its running requests
        may finish in steps that log nothing, and idle V0 workers warned too, so only its waiting
        requests, which a live engine keeps stepping for, count as in flight (``step_driven``)."""
        self._engines[engine] = waiting if step_driven else running + waiting
        self.in_flight = sum(self._engines.values())
        if tokens:
            self._progress()

    def on_offline(self, done: int | None, total: int | None) -> None:
        """``LLM.generate``'s progress bar: ``done`` of ``total`` prompts finished."""
        if done is None or total is None:
            return
        if self._offline_done is None or done > self._offline_done:
            self._progress()  # a request finished: the engine stepped
        self._offline_done = done
        self.in_flight = max(0, total - done)

    def on_wait(self, seconds: float, ts: LogTime | None) -> None:
        """vLLM waited ``seconds`` on a step queue (one warning; every TP rank may log its own)."""
        if self.in_flight <= 0 or seconds <= 0:
            return  # idle, or a start-up compile: the sentence alone is no stall
        t = ts.seconds() if ts is not None else None
        if t is not None and self._last_t is not None and t - self._last_t < seconds / 2:
            return  # the same wait logged by another process (each warns once per interval)
        if self.warnings == 0:
            self.start_ts, self._first_t, self._interval = ts, t, seconds
        self.warnings += 1
        self._last_t = t
        if t is not None and self._first_t is not None:
            # The first warning came `seconds` after the wait began; the rest are that much apart.
            self.waited_s = (t - self._first_t) + self._interval
        else:
            self.waited_s += seconds
        if self.best is None or self.waited_s > self.best[0]:
            self.best = (self.waited_s, self.warnings, self.in_flight, self.start_ts)

    def current(self) -> tuple[float, int, int, LogTime | None] | None:
        """The stall under way now (the sidecar's state), None once the engine progressed."""
        return (self.waited_s, self.warnings, self.in_flight, self.start_ts) if self.warnings else None
