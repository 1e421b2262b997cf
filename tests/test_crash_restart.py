"""SIGKILL mid-stream, then restart with the same --state-dir: no record is counted twice.

kvwatch saves its log position at most once a second, so a SIGKILL re-reads up to a second of
lines. The counters those lines feed (``kvwatch_log_records_total``, ``kvwatch_preemptions_total``
from the log) are saved in the same atomic write as the position and resume from it, so across
the crash they read as one counter that counted every record once: the assertions are exact.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.helpers import Kvwatch, value, wait_for


def _stats(i: int) -> str:
    # vLLM V1 0.11.1+ (v1/metrics/loggers.py, LoggingStatLogger.log): "Preemptions: N" only when N > 0.
    return (
        f"(APIServer pid=7) INFO 12-01 21:50:{i % 60:02d} [loggers.py:335] Engine 000: Avg prompt throughput: "
        f"2250.1 tokens/s, Avg generation throughput: 0.6 tokens/s, Running: {i} reqs, Waiting: 3 reqs, "
        "Preemptions: 2, GPU KV cache usage: 91.0%, Prefix cache hit rate: 0.0%\n"
    )


def _v0_preemption(cumulative: int) -> str:
    # vLLM V0 0.4.3-0.10.2 (core/scheduler.py, Scheduler._preempt): every 50th, with the running total.
    return (
        "WARNING 12-01 21:50:00 scheduler.py:1481] Sequence group 7 is preempted by PreemptionMode.RECOMPUTE "
        "mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
        f"gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        f"total_num_cumulative_preemption={cumulative}\n"
    )


def _committed_to(state: Path, size: int) -> bool:
    files = list(state.glob("tail-*.json"))
    if not files:
        return False
    try:
        doc = json.loads(files[0].read_text())
    except ValueError:
        return False
    return any(f["offset"] == size for f in doc["files"])


def test_sigkill_mid_stream_and_restart_counts_every_record_once(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_text("".join(_stats(i) for i in range(1, 41)))
    first = Kvwatch(["--log", str(log), "--from-start", "--state-dir", str(state)], tmp_path)
    try:
        wait_for(lambda: value(first.port, "kvwatch_log_records_total", kind="stats") == 40, what="40 records")
        wait_for(lambda: _committed_to(state, log.stat().st_size), what="the first commit")
        with log.open("a") as f:  # read and counted, then killed before (most likely) the next commit
            f.writelines(_stats(i) for i in range(41, 61))
        wait_for(lambda: value(first.port, "kvwatch_log_records_total", kind="stats") == 60, what="60 records")
        assert value(first.port, "kvwatch_preemptions_total", source="log") == 120
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    with log.open("a") as f:
        f.writelines(_stats(i) for i in range(61, 71))
    second = Kvwatch(["--log", str(log), "--from-start", "--state-dir", str(state)], tmp_path)
    try:
        wait_for(lambda: _committed_to(state, log.stat().st_size), what="everything read after the restart")
        assert value(second.port, "kvwatch_log_records_total", kind="stats") == 70
        assert value(second.port, "kvwatch_preemptions_total", source="log") == 140
        assert second.stop() == 0
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
            second.proc.wait(10)


def test_v0_cumulative_preemption_warnings_are_not_doubled_across_a_crash(tmp_path: Path) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_text(_v0_preemption(50) + _v0_preemption(100))
    first = Kvwatch(["--log", str(log), "--from-start", "--state-dir", str(state)], tmp_path)
    try:
        wait_for(lambda: value(first.port, "kvwatch_preemptions_total", source="log") == 100, what="100")
        with log.open("a") as f:
            f.write(_v0_preemption(150))
        wait_for(lambda: value(first.port, "kvwatch_preemptions_total", source="log") == 150, what="150")
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    with log.open("a") as f:
        f.write(_v0_preemption(200))
    second = Kvwatch(["--log", str(log), "--from-start", "--state-dir", str(state)], tmp_path)
    try:
        wait_for(lambda: _committed_to(state, log.stat().st_size), what="everything read after the restart")
        assert value(second.port, "kvwatch_preemptions_total", source="log") == 200
        assert value(second.port, "kvwatch_log_records_total", kind="preemption") == 4
        assert second.stop() == 0
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
            second.proc.wait(10)
