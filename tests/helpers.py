"""Helpers shared by test modules (test modules never import each other).

Waits are bounded polls on the event itself (a line, a port, a value), with generous ceilings:
on a loaded 2-core machine a child process can take many seconds to start, and a test that
raced a fixed deadline failed there while the code was right.
"""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server import free_port

# How long a test waits for an event before calling it missing. Far above any healthy run
# (seconds), so only a real hang fails; a passing wait returns as soon as the event happens.
EVENT_CEILING_SECONDS = 120.0


class MetricsEndpoint:
    """A local vLLM-like ``/metrics``: each GET is answered with ``body()`` (404 on other paths)
    once ``start()`` has run; ``port`` is known from construction, for a scrape config."""

    def __init__(self, body: Callable[[], bytes]) -> None:
        self.body = body

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                text = body()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        """Serve from now on."""
        self.thread.start()

    def stop(self) -> None:
        """Stop serving (shutdown() would wait forever for a loop that never started)."""
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


def wait_for(cond: Callable[[], bool], timeout: float = EVENT_CEILING_SECONDS, what: str = "condition") -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def read_metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """kvwatch's /metrics on ``port``: (name, labels without model_name/engine) -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))
            out[(s.name, labels)] = s.value
    return out


def value(port: int, name: str, **labels: str) -> float | None:
    """One sample of kvwatch's /metrics on ``port``, or None (absent, or not serving yet)."""
    try:
        return read_metrics(port).get((name, tuple(sorted(labels.items()))))
    except OSError:
        return None


KVWATCH = [sys.executable, "-m", "kvwatch"]


class Kvwatch:
    """A ``kvwatch watch`` child process with its stderr captured to a file."""

    def __init__(self, args: list[str], tmp: Path) -> None:
        self.port = free_port()
        self.err_path = tmp / f"kvwatch-{self.port}.err"
        self.out_path = tmp / f"kvwatch-{self.port}.out"
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.proc = subprocess.Popen(
                [*KVWATCH, "watch", "--listen", f"127.0.0.1:{self.port}", *args], stdout=out, stderr=err
            )
        wait_for(lambda: value(self.port, "kvwatch_build_info", version=_version()) == 1, what="kvwatch to serve")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(EVENT_CEILING_SECONDS)  # shutdown is the event; a loaded machine is slow

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()


def _version() -> str:
    from kvwatch import __version__

    return __version__


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``kvwatch ARGV``."""
    from kvwatch.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def recorded_calibration(d: Path) -> Any:
    """The simulator's calibration on a recorded run: ``d/server.log`` and its ``metrics-*.prom``
    (each stamped ``# scraped at t=+Xs`` by the recording script)."""
    from kvwatch.batch import analyze_paths
    from kvwatch.parse.metrics import parse_exposition
    from kvwatch.parse.scrapeseries import read_timing, scraped_at
    from kvwatch.reconcile.simulate.calibrate import calibrate, evidence_point

    points = []
    for p in sorted(d.glob("metrics-*.prom")):
        text = p.read_text()
        at = scraped_at(text)
        assert at is not None
        point = evidence_point(at, parse_exposition(text), read_timing(text))
        assert point is not None
        points.append(point)
    return calibrate(analyze_paths([str(d / "server.log")]), points)


def recording_sidecar(lines: Any = None) -> tuple[Any, list[Any]]:
    """A sidecar (no threads, no scraper) reading ``lines`` (a LineSource, or None: fed by hand),
    and the list of the log records it applies, in order. Close its ``server`` when done."""
    from kvwatch.parse.log import LogParser
    from kvwatch.reconcile.live import LiveState
    from kvwatch.sidecar import Sidecar

    seen: list[Any] = []
    state = LiveState(scrape_interval=10.0)
    real = state.on_log_record

    def record(rec: Any, now: float) -> Any:
        seen.append(rec)
        return real(rec, now)

    state.on_log_record = record  # type: ignore[method-assign]
    return Sidecar(state, parser=LogParser(), lines=lines, scraper=None, listen="127.0.0.1:0"), seen


def followed_records(lines: list[str], batch: int, cut: int | None = None) -> list[Any]:
    """The records a sidecar applies when it follows ``lines``, ``batch`` lines at a time, as its
    tail hands them over (``cut``: a batch also ends before that line)."""
    sidecar, seen = recording_sidecar()
    try:
        bounds = sorted({*range(0, len(lines), batch), *(() if cut is None else (cut,)), len(lines)})
        for k, end in itertools.pairwise(bounds):
            sidecar.feed_lines(lines[k:end])
        sidecar.flush_parser()
    finally:
        sidecar.server.close()
    return seen


# A kubelet CRI log (tests/e2e/cri_logger.py writes one around a real vLLM): each entry's stream
# and text, and where a line of one stream splits one record of the other.
_CRI_ENTRY = re.compile(r"^\S+ (stdout|stderr) [FP] (.*)$")
_VLLM_PREFIX = re.compile(
    r"^\([^)]* pid=\d+\) (?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+\] "
)
_ASGI_ERROR = "ERROR:    Exception in ASGI application"
# uvicorn's record of the forged /v1/responses request: its ASGI error line and traceback
# (tests/fixtures/vllm-cpu-traceback/responses.log), written at once, so consecutive on stderr.
_RESPONSES_LINES = 120


def cri_entries(log: Path) -> list[tuple[str, str]]:
    """``(stream, text)`` of every entry of a CRI log."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _CRI_ENTRY.match(line)
        if m is not None:
            out.append((m.group(1), m.group(2)))
    return out


def stream_splits(entries: list[tuple[str, str]]) -> dict[str, int]:
    """How often a line of one stream stands between two lines of one record of the other:
    stderr inside vLLM's traceback of a forged request (stdout, "[serving.py:N]" prefix), stdout
    with vLLM's header inside uvicorn's traceback (stderr, the lines after its ASGI error line)."""
    found = {"stderr_in_vllms_traceback": 0, "vllm_line_in_uvicorns_traceback": 0}
    out_idx = [i for i, (s, _) in enumerate(entries) if s == "stdout"]
    err_idx = [i for i, (s, _) in enumerate(entries) if s == "stderr"]
    for a, b in itertools.pairwise(out_idx):
        pa, pb = _VLLM_PREFIX.match(entries[a][1]), _VLLM_PREFIX.match(entries[b][1])
        if pa and pb and pa.group(0) == pb.group(0) and "[serving.py:" in pa.group(0) and b > a + 1:
            found["stderr_in_vllms_traceback"] += 1
    for k, i in enumerate(err_idx):
        if entries[i][1] != _ASGI_ERROR:
            continue
        record = err_idx[k : k + _RESPONSES_LINES]
        found["vllm_line_in_uvicorns_traceback"] += sum(
            1
            for j in range(record[0] + 1, record[-1])
            if entries[j][0] == "stdout" and _VLLM_PREFIX.match(entries[j][1])
        )
    return found


def two_chunk_doc(path: Path, at: int, monkeypatch: pytest.MonkeyPatch, doc: Callable[[Path], Any]) -> Any:
    """``doc(path)`` with the file read as two chunks, the second starting at line ``at`` (0-based)."""
    from kvwatch.sources import files

    data = path.read_bytes()
    cut = 0
    for _ in range(at):
        cut = data.index(b"\n", cut) + 1

    def two_pieces(fh: Any) -> Any:
        whole = fh.read()
        yield whole, 0, cut
        yield whole, cut, len(whole)

    with monkeypatch.context() as m:
        m.setattr(files, "_pieces", two_pieces)
        return doc(path)
