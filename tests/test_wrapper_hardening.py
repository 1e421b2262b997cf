"""Wrapper mode never orphans vLLM, and kvwatch's own lines never land inside a child's line.

- ``kvwatch run`` SIGKILLed (as the OOM killer would): the child (PR_SET_PDEATHSIG) and its
  grandchild (the reaper signals the child's process group) are gone within 5 s.
- SIGTERM to kvwatch: the child exits, and a grandchild it left behind is stopped with its group.
- A child writing lines in pieces while kvwatch logs from another thread into the same file
  (``2>&1``): with kvwatch's lines taken out, the bytes are exactly the child's, and every one of
  kvwatch's lines starts at a line start.
Waits are on events (a pid file, a process gone) with the acceptance's 5 s as the ceiling.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvwatch.sources.child import ChildProcess
from tests.conftest import ROOT
from tests.e2e.server import free_port

KVWATCH = str(ROOT / ".venv" / "bin" / "kvwatch")

# vLLM's shape: the API server (child) starts an engine core (grandchild) in the same group.
FAMILY = """
import os, signal, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
if len(sys.argv) > 2:  # exit cleanly on SIGTERM, leaving the grandchild behind (a careless server)
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for a reaper (it holds nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait(cond: object, seconds: float, what: str) -> float:
    started = time.monotonic()
    while not cond():  # type: ignore[operator]
        if time.monotonic() - started > seconds:
            raise AssertionError(f"not within {seconds}s: {what}")
        time.sleep(0.02)
    return time.monotonic() - started


def _start_family(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int, int]:
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    pids = tmp_path / "pids"
    proc = subprocess.Popen(
        [KVWATCH, "run", "--listen", f"127.0.0.1:{free_port()}", "--", sys.executable, str(script), str(pids), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait(pids.exists, 60, "the child to write its pids")
    child, grandchild = (int(x) for x in pids.read_text().split())
    return proc, child, grandchild


def _cleanup(*pids: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_kvwatch_sigkilled_takes_the_child_and_its_grandchild_within_5_seconds(tmp_path: Path) -> None:
    proc, child, grandchild = _start_family(tmp_path)
    try:
        assert not _gone(child)
        assert not _gone(grandchild)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        took = _wait(lambda: _gone(child) and _gone(grandchild), 5.0, "child and grandchild gone")
        print(f"\nchild and grandchild gone {took:.2f}s after kvwatch's SIGKILL")
    finally:
        _cleanup(child, grandchild)


def test_sigterm_stops_the_childs_whole_group_and_kvwatch_returns_its_code(tmp_path: Path) -> None:
    proc, child, grandchild = _start_family(tmp_path, "leave-grandchild")
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0  # the child's own exit code
        _wait(lambda: _gone(child) and _gone(grandchild), 5.0, "child and grandchild gone")
    finally:
        _cleanup(child, grandchild)


# A child writing 300 lines, each in three pieces with pauses between: kvwatch logs in the gaps.
# vLLM 0.32 logs to stdout (vllm/logger.py, DEFAULT_LOGGING_CONFIG: a StreamHandler on
# ext://sys.stdout); tracebacks and tqdm bars go to stderr. Order between two pipes is not
# defined, so each case writes one stream; the gate must hold for either.
PIECES = """
import sys, time
out = getattr(sys, sys.argv[1]).buffer
for i in range(300):
    out.write(b"INFO 12-01 21:50:00 [loggers.py:123] Engine 000: "); out.flush(); time.sleep(0.0005)
    out.write(b"Running: %d reqs, Waiting: 0 reqs, " % i); out.flush(); time.sleep(0.0005)
    out.write(b"GPU KV cache usage: 1.0%\\n"); out.flush()
"""


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_child_output_is_byte_identical_while_kvwatch_logs_into_the_same_file(tmp_path: Path, stream: str) -> None:
    script = tmp_path / "pieces.py"
    script.write_text(PIECES)
    shared = io.BytesIO()  # our stdout and stderr are one file, as with 2>&1, a terminal, journald
    child = ChildProcess([sys.executable, str(script), stream], on_line=lambda line: None, stdout=shared,
                         stderr=shared, coalesce=0.0)  # fmt: skip
    done = threading.Event()
    logged = 0

    def log_all_the_time() -> None:
        nonlocal logged
        while not done.is_set():
            child.write_own_line(f"2026-12-01T21:50:00Z INFO kvwatch state: line {logged}")
            logged += 1
            time.sleep(0.0002)

    child.start()
    logger = threading.Thread(target=log_all_the_time)
    logger.start()
    try:
        assert child.wait() == 0
    finally:
        done.set()
        logger.join()
    lines = shared.getvalue().split(b"\n")
    assert lines[-1] == b""
    ours = [line for line in lines if line.startswith(b"2026-12-01T21:50:00Z INFO kvwatch state: line ")]
    theirs = b"".join(line + b"\n" for line in lines[:-1] if not line.startswith(b"2026-12-01T21:50:00Z"))
    expected = b"".join(
        b"INFO 12-01 21:50:00 [loggers.py:123] Engine 000: Running: %d reqs, Waiting: 0 reqs, "
        b"GPU KV cache usage: 1.0%%\n" % i
        for i in range(300)
    )
    assert theirs == expected  # the child's bytes, unchanged and in order
    assert len(ours) + child.held_lines_dropped == logged  # every one of ours whole, on its own line
    assert len(ours) > 100  # and they really were written while the child was writing
