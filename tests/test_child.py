"""Wrapper mode's child process (kvwatch.sources.child): pass-through, lines, exit codes, signals.

The children are small Python scripts standing in for ``vllm serve``; no vLLM is needed.
Signal forwarding is tested end to end: a harness process runs ChildProcess in its main thread
(where signal handlers live), the test signals the harness, and the child must hear it.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvwatch.errors import UsageError
from kvwatch.sources.child import ChildProcess, exit_code
from kvwatch.sources.lines import Line
from tests.helpers import EVENT_CEILING_SECONDS

PY = sys.executable


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def run_child(argv: list[str], **kwargs: object) -> tuple[int, list[Line], bytes, bytes]:
    """Run a child to completion with in-memory pass-through targets."""
    out, err = io.BytesIO(), io.BytesIO()
    lines: list[Line] = []
    child = ChildProcess(argv, on_line=lines.append, stdout=out, stderr=err, **kwargs)  # type: ignore[arg-type]
    child.start()
    code = child.wait()
    return code, lines, out.getvalue(), err.getvalue()


def test_output_passes_through_unchanged_and_is_split_into_lines(tmp_path: Path) -> None:
    child = script(
        tmp_path,
        "child.py",
        r"""
        import sys
        sys.stdout.buffer.write(b"INFO out 1\nINFO out \xff 2\r\n"); sys.stdout.flush()
        sys.stderr.buffer.write(b"WARNING err 1\n"); sys.stderr.flush()
        sys.stdout.buffer.write(b"no newline at exit")
        sys.exit(3)
        """,
    )
    code, lines, out, err = run_child([PY, str(child)])
    assert code == 3
    assert out == b"INFO out 1\nINFO out \xff 2\r\nno newline at exit"  # byte for byte, CR and all
    assert err == b"WARNING err 1\n"
    texts = [line.text for line in lines]
    assert sorted(texts) == sorted(["INFO out 1", "INFO out \ufffd 2", "no newline at exit", "WARNING err 1"])
    assert texts.index("INFO out 1") < texts.index("INFO out \ufffd 2") < texts.index("no newline at exit")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("sys.exit(0)", 0),
        ("sys.exit(3)", 3),
        ("os.kill(os.getpid(), signal.SIGKILL)", 128 + 9),
        ("os.kill(os.getpid(), signal.SIGTERM)", 128 + 15),
    ],
    ids=["success", "failure_code", "killed", "terminated"],
)
def test_exit_code_is_the_childs_as_a_shell_reports_it(tmp_path: Path, body: str, expected: int) -> None:
    child = script(tmp_path, "child.py", f"import os, signal, sys\n{body}\n")
    code, _, _, _ = run_child([PY, str(child)])
    assert code == expected


@pytest.mark.parametrize(("returncode", "expected"), [(0, 0), (1, 1), (-9, 137), (-2, 130)], ids=str)
def test_exit_code_mapping(returncode: int, expected: int) -> None:
    assert exit_code(returncode) == expected


def test_without_a_callback_lines_queue_as_a_line_source(tmp_path: Path) -> None:
    child = script(tmp_path, "child.py", "print('a'); print('b')\n")
    proc = ChildProcess([PY, str(child)], stdout=io.BytesIO(), stderr=io.BytesIO())
    proc.start()
    assert proc.wait() == 0
    assert [line.text for line in proc.lines.poll()] == ["a", "b"]
    assert proc.lines.poll() == []
    status = proc.lines.status()
    assert (status.eof, status.up, status.lines_total) == (True, False, 2)


def test_long_line_from_the_child_is_bounded(tmp_path: Path) -> None:
    child = script(tmp_path, "child.py", "import sys\nsys.stdout.write('x' * 3_000_000 + '\\nafter\\n')\n")
    _, lines, out, _ = run_child([PY, str(child)], max_line_bytes=1024)
    assert [(len(line.text), line.truncated) for line in lines] == [(1024, True), (5, False)]
    assert len(out) == 3_000_000 + 7  # pass-through is not truncated


class ClosedStream(io.RawIOBase):
    """Our stdout after the reader of ``kvwatch run ... | head`` has gone."""

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        raise BrokenPipeError("closed")


def test_child_never_blocks_when_our_own_stdout_is_gone(tmp_path: Path) -> None:
    # 2 MB is far more than a pipe holds: had we stopped reading, the child would hang forever.
    child = script(tmp_path, "child.py", "import sys\nfor i in range(20_000): print('line', i, '.' * 90)\n")
    lines: list[Line] = []
    proc = ChildProcess([PY, str(child)], on_line=lines.append, stdout=ClosedStream(), stderr=io.BytesIO())  # type: ignore[arg-type]
    proc.start()
    assert proc.wait() == 0
    assert len(lines) == 20_000


def test_a_failing_line_consumer_does_not_stop_the_pass_through(tmp_path: Path) -> None:
    child = script(tmp_path, "child.py", "print('one'); print('two')\n")
    out = io.BytesIO()

    def broken(line: Line) -> None:
        raise RuntimeError("consumer bug")

    proc = ChildProcess([PY, str(child)], on_line=broken, stdout=out, stderr=io.BytesIO())
    proc.start()
    assert proc.wait() == 0
    assert out.getvalue() == b"one\ntwo\n"
    assert proc.last_error == "line consumer failed: RuntimeError"  # never its message: it may quote a line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["kvwatch-no-such-vllm", "serve"], "command not found"),
        ([os.devnull], "not executable"),
        ([], "no command to run"),
    ],
    ids=["missing", "not_executable", "empty"],
)
def test_a_child_that_cannot_start_is_a_usage_error(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ChildProcess(argv, stdout=io.BytesIO(), stderr=io.BytesIO()).start()


# ----------------------------------------------------------------------------- signals, end to end

HARNESS = """
import sys
from kvwatch.sources.child import ChildProcess
child = ChildProcess(sys.argv[1:], on_line=lambda line: None)
child.start()
sys.exit(child.wait())
"""

TRAPPING_CHILD = """
import os, signal, sys
def stop(signum, frame):
    print("child got", signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
print("ready", os.getpid(), flush=True)
while True:
    signal.pause()
"""

PLAIN_CHILD = """
import os, signal
print("ready", os.getpid(), flush=True)
while True:
    signal.pause()
"""


def read_until(stream: io.BufferedReader, marker: bytes, timeout: float = EVENT_CEILING_SECONDS) -> bytes:
    """Read a pipe until ``marker`` shows up (or fail after ``timeout``); never sleeps."""
    seen = b""
    deadline = time.monotonic() + timeout
    fd = stream.fileno()
    while marker not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {marker!r} within {timeout}s; got {seen!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"stream closed before {marker!r}; got {seen!r}"
            seen += chunk
    return seen


@pytest.mark.parametrize(
    ("child_body", "sig", "expected_code", "expected_output"),
    [
        (TRAPPING_CHILD, signal.SIGTERM, 0, b"child got SIGTERM"),
        (TRAPPING_CHILD, signal.SIGINT, 0, b"child got SIGINT"),
        (PLAIN_CHILD, signal.SIGTERM, 128 + 15, b""),
    ],
    ids=["sigterm_forwarded_child_exits_0", "sigint_forwarded_child_exits_0", "sigterm_kills_plain_child_143"],
)
def test_signals_to_kvwatch_reach_the_child_and_its_exit_code_comes_back(
    tmp_path: Path, child_body: str, sig: signal.Signals, expected_code: int, expected_output: bytes
) -> None:
    harness = script(tmp_path, "harness.py", HARNESS)
    child = script(tmp_path, "child.py", child_body)
    proc = subprocess.Popen([PY, str(harness), PY, str(child)], stdout=subprocess.PIPE)
    child_pid = None
    try:
        assert proc.stdout is not None
        seen = read_until(proc.stdout, b"\n")  # "ready <pid>\n", passed through by the harness
        child_pid = int(seen.split()[1])
        proc.send_signal(sig)  # only the harness: the child is in its own process group
        rest, _ = proc.communicate(timeout=EVENT_CEILING_SECONDS)
        assert proc.returncode == expected_code
        assert expected_output in seen + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
