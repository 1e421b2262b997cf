"""Run a command with its output stored as a kubelet's CRI log file, the way containerd stores it.

    python cri_logger.py LOG [--pause SECONDS] -- COMMAND [ARG...]

containerd's CRI logger (pkg/cri/io/logger.go ``NewCRILogger``/``redirectLogs``) reads each of a
container's streams in its own goroutine, line by line (``bufio.Reader.ReadLine``), and writes
every line as one entry, ``TIMESTAMP STREAM TAG CONTENT`` (RFC3339Nano, ``stdout``/``stderr``, ``F``
for a full line, ``P`` for each piece of one longer than the buffer, 16 KiB by default), into the
one log file of the container. Here each stream has its own thread and each entry is one
``write`` to the file opened with O_APPEND, so the two streams' lines interleave as they arrive,
as they do on a node. ``--pause`` makes each copier wait that long after each entry, as a copier
does on a node whose cores the model server keeps busy (descheduled between two writes). The exit
status is the command's; SIGINT and SIGTERM are passed to it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

PIECE = 16 * 1024  # containerd's max_container_log_line_size default


def _stamp() -> bytes:
    now = time.time_ns()
    secs, nanos = divmod(now, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)).encode() + b".%09dZ" % nanos


def _copy(pipe: object, stream: bytes, fd: int, pause: float) -> None:
    assert hasattr(pipe, "readline")
    while True:
        line = pipe.readline(PIECE)  # a line, or the next PIECE bytes of a longer one
        if not line:
            return
        full = line.endswith(b"\n")
        body = line[:-1] if full else line
        if full and body.endswith(b"\r"):
            body = body[:-1]  # ReadLine drops the "\r\n"
        os.write(fd, b"%s %s %s %s\n" % (_stamp(), stream, b"F" if full else b"P", body))
        if pause:
            time.sleep(pause)


def main() -> int:
    """Run the command after ``--`` with its streams stored in the CRI log given first."""
    args = sys.argv[1:]
    pause = 0.0
    if len(args) > 2 and args[1] == "--pause":
        pause = float(args[2])
        del args[1:3]
    if len(args) < 3 or args[1] != "--":
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    fd = os.open(args[0], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    child = subprocess.Popen(args[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    copiers = [
        threading.Thread(target=_copy, args=(child.stdout, b"stdout", fd, pause), daemon=True),
        threading.Thread(target=_copy, args=(child.stderr, b"stderr", fd, pause), daemon=True),
    ]
    for t in copiers:
        t.start()
    code = child.wait()
    for t in copiers:
        t.join(timeout=10)
    os.close(fd)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
