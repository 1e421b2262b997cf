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
"""

from __future__ import annotations

import contextlib
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
        drain_timeout: float = 5.0,
        coalesce: float = 0.02,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not argv:
            raise UsageError("no command to run: kvwatch run [watch options] -- vllm serve MODEL ...")
        self.argv = list(argv)
        self._on_line = on_line
        self._queue = QueuedLines()
        self.lines = ChildLines(self._queue, self)
        self._targets = {
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
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                process_group=0 if self._new_group else None,
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
        self._open_streams = 2
        for name, pipe in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr)):
            thread = threading.Thread(target=self._pump, args=(pipe, name), name=f"kvwatch-child-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        if self._forward and threading.current_thread() is threading.main_thread():
            for sig in self._forward:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child if it is still running."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

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
        splitter = LineSplitter(self._max_line_bytes)
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
                if target is not None:
                    try:
                        target.write(data)
                        target.flush()
                    except (OSError, ValueError):  # our own stream is gone: keep reading anyway
                        target = None
                lines = splitter.feed(data)
                if lines:
                    self._deliver(lines)
                if len(data) < _CHUNK and self._coalesce > 0:
                    time.sleep(self._coalesce)  # the pipe is drained: let the next lines gather
            tail = splitter.flush()
            if tail is not None:
                self._deliver([tail])
        finally:
            with contextlib.suppress(OSError):
                pipe.close()
            with self._streams_lock:
                self._open_streams -= 1
                last = self._open_streams == 0
            if last:
                self._queue.end()

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
