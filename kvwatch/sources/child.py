"""Wrapper mode (``kvwatch run ... -- vllm serve ...``): vLLM as a child process whose output we read.

What this module owns: starting the child with its stdout and stderr on pipes; passing every byte
through unchanged to our own stdout and stderr (each stream to its own, as it arrives, so
``docker logs`` and ``kubectl logs`` look as if kvwatch were not there); splitting both streams
into lines for the sidecar; forwarding SIGTERM, SIGINT and SIGHUP to the child; and returning the
child's exit code (a death by signal N becomes 128+N, as a shell reports it).

The child runs in its own process group, so a terminal's Ctrl-C reaches it once (forwarded by us)
rather than twice (the terminal's and ours), which vLLM's server would take as "force quit".
If our stdout or stderr goes away (``kvwatch run ... | head``), pass-through stops for that
stream but reading continues, so vLLM never blocks on a full pipe.

Never an orphaned vLLM (it holds the GPU):

- Signals go to the child's whole **process group**, as a terminal's Ctrl-C would: vLLM 0.32's
  engine-core processes install their own SIGTERM/SIGINT handlers for exactly that delivery
  (vllm/v1/engine/core.py, ``EngineCoreProc.run_engine_core``). Once the child has exited,
  whatever is left in its group gets SIGTERM, then SIGKILL after ``drain_timeout``.
- If kvwatch itself dies without a word (SIGKILL, the OOM killer), the kernel sends the child
  SIGKILL (``prctl(PR_SET_PDEATHSIG)``, Linux, set between fork and exec), and a tiny **reaper**
  process, which waits on a pipe only kvwatch holds, sees it close and signals the rest of the
  group (vLLM's engine core and workers are grandchildren: PDEATHSIG is not inherited).
  PDEATHSIG fires when the *thread* that started the child ends (prctl(2)), so ``start()`` is
  called from the main thread, which lives as long as kvwatch.

kvwatch's own log lines never land inside a child's line: ``log_handler()`` writes them through
the same gate as the pass-through, only while the child's stream (both streams, when our stdout
and stderr are one file, as with ``2>&1``) stands at a line end; otherwise they wait (bounded)
for the child to finish its line, so the child's bytes come out unchanged and in order.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from kvwatch.errors import UsageError
from kvwatch.sources.lines import DEFAULT_MAX_LINE_BYTES, Line, LineSplitter, PipeLines, QueuedLines, SourceStatus

_CHUNK = 64 * 1024
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: kvwatch log lines held while the child is mid-line; beyond this they are dropped and counted.
_MAX_HELD_LINES = 1000
#: The reaper: blocks on stdin (a pipe whose write end only kvwatch holds). EOF means kvwatch is
#: gone or done: SIGTERM the child's group, then SIGKILL what is left after the grace period.
#: It ignores the terminal's signals, which reach it because it stays in kvwatch's group.
_REAPER = """
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
sys.stdin.buffer.read()
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
if alive():
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        pass
    end = time.monotonic() + grace
    while alive() and time.monotonic() < end:
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""
#: Signals a container runtime or a terminal sends to stop the server; forwarded to the child.
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def exit_code(returncode: int) -> int:
    """A Popen return code as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class ChildLines(PipeLines):
    """The child's output lines as a ``LineSource`` (when no ``on_line`` callback is given)."""

    def __init__(self, queue: QueuedLines, owner: ChildProcess) -> None:
        super().__init__(queue)
        self._owner = owner

    def close(self) -> None:
        """Nothing to release: the reader threads end with the child's output."""

    @property
    def up(self) -> bool:
        """True while the child's output is open."""
        return not self._queue.eof and self._owner.last_error is None

    @property
    def last_error(self) -> str | None:
        """Why reading the child's output failed, if it did."""
        return self._owner.last_error

    def status(self) -> SourceStatus:
        """Self-report; ``eof`` once the child has closed both streams and every line is delivered."""
        return SourceStatus(
            up=self.up,
            last_error=self.last_error,
            last_success_at=self._owner.last_success_at,
            lines_total=self._lines_total,
            truncated_lines_total=self._truncated_total,
            mode="pipe",
            eof=self._queue.eof,
            dropped_lines_total=self._owner.dropped_lines,
        )


class ChildProcess:
    """Run ``argv`` as a child, pass its output through, and hand its lines to the sidecar.

    ``on_line`` is called with every complete line of stdout and stderr, one call at a time (a
    lock serialises the two reader threads), from a reader thread: keep it short. Without
    ``on_line`` the lines queue up in ``self.lines``, a ``LineSource`` the main loop polls.
    ``stdout``/``stderr``: where the bytes are passed through (default: our own; None entries
    in tests can be ``io.BytesIO``). ``forward_signals``: installed as handlers while the child
    runs, when ``start()`` is called from the main thread. ``coalesce``: after draining a pipe,
    how long a reader lets more output gather before the next read; vLLM flushes every line, and
    a wake-up per line cost 1.4 % of a core at 500 lines/s (benchmarks/child_passthrough.py).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        on_line: Callable[[Line], None] | None = None,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        env: dict[str, str] | None = None,
        forward_signals: Sequence[signal.Signals] = FORWARDED_SIGNALS,
        new_process_group: bool = True,
        die_with_us: bool = True,
        drain_timeout: float = 5.0,
        group_grace: float = 2.0,
        coalesce: float = 0.02,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not argv:
            raise UsageError("no command to run: kvwatch run [watch options] -- vllm serve MODEL ...")
        self.argv = list(argv)
        self._on_line = on_line
        self._queue = QueuedLines()
        self.lines = ChildLines(self._queue, self)
        self._targets: dict[str, IO[bytes] | None] = {
            "stdout": stdout if stdout is not None else sys.stdout.buffer,
            "stderr": stderr if stderr is not None else sys.stderr.buffer,
        }
        self._max_line_bytes = max_line_bytes
        env = dict(os.environ if env is None else env)
        # A Python child writing to a pipe block-buffers print() output (8 KiB), so lines would
        # reach us and the user late; vLLM's logging handler flushes each record regardless.
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._env = env
        self._forward = tuple(forward_signals)
        self._new_group = new_process_group
        self._die_with_us = die_with_us
        self._group_grace = group_grace
        self._reaper: subprocess.Popen[bytes] | None = None
        self._reaper_fd: int | None = None
        # The gate: pass-through writes and kvwatch's own lines take turns under one lock, and
        # kvwatch's wait while a stream that shares their file is mid-line.
        self._gate = threading.Lock()
        self._mid_line = {"stdout": False, "stderr": False}
        shared = _same_file(self._targets["stdout"], self._targets["stderr"])
        self._gated_streams = ("stdout", "stderr") if shared else ("stderr",)
        self._held: list[bytes] = []
        self.held_lines_dropped = 0
        self._drain_timeout = drain_timeout
        self._coalesce = coalesce
        self._wall_clock = wall_clock
        self._deliver_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._old_handlers: dict[int, Any] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._returncode: int | None = None
        self.last_error: str | None = None
        self.last_success_at: float | None = None
        self.dropped_lines = 0  # lines not queued because the main loop fell 10,000 lines behind
        self._open_streams = 0
        self._streams_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The child's process id once started."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the child and its two reader threads; install the signal forwarders."""
        preexec = _pdeathsig_preexec() if self._die_with_us else None
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                process_group=0 if self._new_group else None,
                # Only a prctl call runs between fork and exec, resolved beforehand: none of the
                # locks that make preexec_fn unsafe with threads is taken (see _pdeathsig_preexec).
                preexec_fn=preexec,  # noqa: PLW1509
            )
        except FileNotFoundError:
            raise UsageError(
                f"cannot start {self.argv[0]!r}: command not found; install vLLM here or give its full path after --"
            ) from None
        except PermissionError:
            raise UsageError(f"cannot start {self.argv[0]!r}: not executable; check the path after --") from None
        except OSError as exc:
            raise UsageError(f"cannot start {self.argv[0]!r}: {exc.strerror or exc}") from None
        assert self._proc.stdout is not None
        assert self._proc.stderr is not None
        if self._die_with_us and self._new_group:
            self._start_reaper(self._proc.pid)
        self._open_streams = 2
        for name, pipe in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr)):
            thread = threading.Thread(target=self._pump, args=(pipe, name), name=f"kvwatch-child-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if self._forward and threading.current_thread() is threading.main_thread():
            for sig in self._forward:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (the child alone without one) while it runs."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self._new_group:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)

    def log_handler(self, formatter: logging.Formatter | None = None) -> logging.Handler:
        """A logging handler writing kvwatch's own lines to our stderr, never inside a child's line."""
        return _GatedHandler(self, formatter)

    def write_own_line(self, text: str) -> None:
        """Write one line of kvwatch's own to our stderr at the next line end of the child's output."""
        data = text.rstrip("\n").encode("utf-8", errors="replace") + b"\n"
        with self._gate:
            if self._held or any(self._mid_line[n] for n in self._gated_streams):
                if len(self._held) < _MAX_HELD_LINES:
                    self._held.append(data)
                else:
                    self.held_lines_dropped += 1
                return
            self._write_target("stderr", data)

    def _start_reaper(self, pgid: int) -> None:
        """Start the reaper (see the module docstring); without it PDEATHSIG still stops the child."""
        import sys as _sys

        try:
            read_end, write_end = os.pipe()
            try:
                self._reaper = subprocess.Popen(
                    [_sys.executable, "-I", "-S", "-c", _REAPER, str(pgid), str(self._group_grace)],
                    stdin=read_end,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            finally:
                os.close(read_end)
        except OSError as exc:
            self.last_error = f"cannot start the process-group reaper: {exc.strerror or exc}"
            return
        os.set_inheritable(write_end, False)  # vLLM must not hold it open: only kvwatch's death closes it
        self._reaper_fd = write_end

    def _stop_group(self) -> None:
        """After the child exited: what is left in its group gets SIGTERM, then SIGKILL."""
        proc = self._proc
        if proc is None or not self._new_group:
            return
        if _group_alive(proc.pid):
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + self._group_grace
            while _group_alive(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        fd = self._reaper_fd
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # the group is gone: the reaper finds nothing and exits
            self._reaper_fd = None
        if self._reaper is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._reaper.wait(timeout=self._group_grace + 5)

    def wait(self) -> int:
        """Wait for the child to exit and its output to be read; its exit code (signal N -> 128+N)."""
        if self._proc is None:
            raise RuntimeError("ChildProcess.wait() before start()")
        try:
            returncode = self._proc.wait()
        finally:
            self._restore_handlers()
        # A grandchild (vLLM's engine core) may hold the pipes open a little longer; do not hang on it.
        deadline = time.monotonic() + self._drain_timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._stop_group()
        self._flush_held()
        self._returncode = returncode
        return exit_code(returncode)

    # ------------------------------------------------------------------ internals

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.send_signal(signum)

    def _restore_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)
        self._old_handlers.clear()

    def _pump(self, pipe: IO[bytes], name: str) -> None:
        """Copy one stream through unchanged and split it into lines."""
        target: IO[bytes] | None = self._targets[name]
        splitter = LineSplitter(self._max_line_bytes, name)  # each line knows its pipe
        fd = pipe.fileno()
        try:
            while True:
                try:
                    data = os.read(fd, _CHUNK)
                except OSError as exc:
                    self.last_error = f"cannot read the child's {name}: {exc.strerror or exc}"
                    break
                if not data:
                    break
                self.last_success_at = self._wall_clock()
                with self._gate:
                    if target is not None and not self._write_target(name, data):
                        target = None  # our own stream is gone: keep reading anyway
                    self._mid_line[name] = not data.endswith(b"\n")
                    self._release_held()
                lines = splitter.feed(data)
                if lines:
                    self._deliver(lines)
                if len(data) < _CHUNK and self._coalesce > 0:
                    time.sleep(self._coalesce)  # the pipe is drained: let the next lines gather
            tail = splitter.flush()
            if tail is not None:
                self._deliver([tail])
            with self._gate:  # the stream ended mid-line: nothing will finish that line
                self._mid_line[name] = False
                self._release_held()
        finally:
            with contextlib.suppress(OSError):
                pipe.close()
            with self._streams_lock:
                self._open_streams -= 1
                last = self._open_streams == 0
            if last:
                self._queue.end()

    def _write_target(self, name: str, data: bytes) -> bool:
        """Write to our own stream ``name`` (under the gate); False once that stream is gone."""
        target = self._targets[name]
        if target is None:
            return False
        try:
            target.write(data)
            target.flush()
        except (OSError, ValueError):
            self._targets[name] = None
            return False
        return True

    def _release_held(self) -> None:
        """Under the gate: write kvwatch's held lines if every gated stream is at a line end."""
        if self._held and not any(self._mid_line[n] for n in self._gated_streams):
            held, self._held = self._held, []
            self._write_target("stderr", b"".join(held))

    def _flush_held(self) -> None:
        with self._gate:
            for name in self._mid_line:
                self._mid_line[name] = False
            self._release_held()

    def _deliver(self, lines: list[Line]) -> None:
        with self._deliver_lock:
            for line in lines:
                if self._on_line is None:
                    # Never block the reader: a stalled reader would stall vLLM on a full pipe.
                    if not self._queue.offer(line):
                        self.dropped_lines += 1
                    continue
                try:
                    self._on_line(line)
                except Exception as exc:  # a consumer bug must not stop the pass-through
                    # The type only: an exception's message may quote the line (request content).
                    self.last_error = f"line consumer failed: {type(exc).__name__}"


class _GatedHandler(logging.Handler):
    """kvwatch's log records, formatted, through ``ChildProcess.write_own_line``."""

    def __init__(self, child: ChildProcess, formatter: logging.Formatter | None) -> None:
        super().__init__()
        self._child = child
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._child.write_own_line(self.format(record))
        except Exception:
            self.handleError(record)


def _same_file(a: IO[bytes] | None, b: IO[bytes] | None) -> bool:
    """Whether two of our streams end up in one file (``2>&1``, one terminal, one container log)."""
    if a is None or b is None:
        return False
    if a is b:
        return True
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn that makes the kernel SIGKILL the child when kvwatch dies (Linux), or None.

    prctl is looked up here, before fork: between fork and exec only the call itself runs (no
    imports, no dlopen, no locks another thread might hold). If kvwatch died before the prctl
    took effect, the child is already orphaned: it kills itself rather than run unwatched.
    """
    if os.uname().sysname != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigkill)

    return preexec
