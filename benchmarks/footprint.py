#!/usr/bin/env python3
"""The sidecar's footprint: RSS, CPU and record-to-/metrics latency under a realistic log rate.

Runs ``kvwatch watch`` following a log that a writer appends at ``--rate`` lines/s (mostly
request and access lines, a stats record every 10 s, as vLLM writes them) while kvwatch scrapes a
local stand-in for vLLM's /metrics (a real recorded scrape) every ``--scrape-interval`` seconds,
and a Prometheus-like client scrapes kvwatch every 15 s. After ``--minutes``:

* RSS (VmRSS and VmHWM from /proc) of the kvwatch process;
* CPU: kvwatch's utime+stime over the steady phase / wall time, in % of one core, next to the
  baseline ``tail -F`` following the same file in the same run (the cheapest possible follower);
* latency: ``--probes`` times, a stats record with a unique "Running: N" is appended and
  /metrics polled every 5 ms until kvwatch_observed_running_requests == N; p50/p99.

Targets (the sidecar's budget), after 10 minutes with a 5 s scrape interval: at 500 lines/s RSS <= 60
MiB, CPU <= 2 % of one core, record -> visible within 1 s at p99; at 5,000 lines/s RSS <= 50 MiB,
CPU <= 3 %, p99 <= 200 ms.

``--form cri`` writes every line as a kubelet's CRI log file holds it (``TIME stdout F LINE``, and
a uvicorn warning on stderr every 100 lines): the sidecar of a pod reads that file, and reads its
streams apart (kvwatch.parse.log.StreamRuns).

``--baseline-src DIR`` also runs an older kvwatch (a directory holding its ``kvwatch/`` package, e.g.
``git archive REV kvwatch | tar -x -C DIR``, run as ``python -m kvwatch``) following the same log in
the same run, so both see the same writer and machine load; its CPU and RSS are printed beside.

    .venv/bin/python benchmarks/footprint.py --minutes 10          # the acceptance run at 500 lines/s
    .venv/bin/python benchmarks/footprint.py --minutes 10 --rate 5000 --baseline-src /tmp/base
    .venv/bin/python benchmarks/footprint.py --minutes 1 --probes 20  # a quick look
    .venv/bin/python benchmarks/footprint.py --minutes 10 --rate 5000 --form cri --baseline-src /tmp/base
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRAPE_FIXTURE = ROOT / "tests" / "fixtures" / "vllm-cpu-seed" / "metrics-05.prom"
STARTUP = ROOT / "tests" / "fixtures" / "vllm-cpu-seed" / "server.log"
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_fixture(port: int) -> http.server.ThreadingHTTPServer:
    body = SCRAPE_FIXTURE.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def stats_line(running: int, waiting: int = 3) -> str:
    return (
        "(APIServer pid=7) INFO 11-29 14:05:10 [loggers.py:236] Engine 000: Avg prompt throughput: 1532.4 tokens/s, "
        f"Avg generation throughput: 842.7 tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, "
        "GPU KV cache usage: 97.9%, Prefix cache hit rate: 42.2%\n"
    )


def filler(i: int) -> str:
    if i % 2:
        return f'(APIServer pid=7) INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/completions HTTP/1.1" 200 OK\n'
    return (
        f"(APIServer pid=7) INFO 11-29 14:05:10 [logger.py:43] Received request cmpl-{random.getrandbits(64):x}-0: "
        "prompt: 'Summarise the attached document in three bullet points.', params: SamplingParams(n=1, "
        "temperature=0.7, max_tokens=1000), prompt_token_ids: None, lora_request: None.\n"
    )


def cri(line: str, stream: str = "stdout") -> str:
    """``line`` (ending in a newline) as a CRI log file's entry."""
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}.123456789Z {stream} F {line}"


FORMS = {"plain": lambda i, line: line, "cri": lambda i, line: cri(line) if i % 100 else cri(WARNING, "stderr")}
WARNING = "WARNING:  Invalid HTTP request received.\n"


class Writer(threading.Thread):
    """Appends ``rate`` lines/s in 10 ms batches, a stats record every 10 s, in ``form``."""

    def __init__(self, path: Path, rate: int, form: str = "plain") -> None:
        super().__init__(daemon=True)
        self.path, self.rate = path, rate
        self.form = FORMS[form]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.written = 0
        self.stats = True  # the probe phase turns the writer's own stats records off

    def run(self) -> None:
        start = time.monotonic()
        with self.path.open("a", buffering=1) as f:
            while not self.stop.is_set():
                due = int((time.monotonic() - start) * self.rate)
                with self.lock:
                    while self.written < due:
                        self.written += 1
                        periodic = self.stats and self.written % (self.rate * 10) == 0
                        line = stats_line(40) if periodic else filler(self.written)
                        f.write(self.form(self.written if not periodic else 1, line))
                    f.flush()
                time.sleep(0.01)

    def append(self, text: str) -> None:
        with self.lock, self.path.open("a") as f:
            f.write(self.form(1, text))


def proc_stat(pid: int) -> tuple[float, int, int]:
    """(cpu seconds, VmRSS KiB, VmHWM KiB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return cpu, int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def scrape_value(port: int, name: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{" if "{" not in name else name)):
            return float(line.rsplit(" ", 1)[1])
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=500, help="log lines per second")
    ap.add_argument("--scrape-interval", type=float, default=5.0)
    ap.add_argument("--probes", type=int, default=100)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--baseline-src", default=None, help="an older kvwatch source tree to run beside")
    ap.add_argument("--form", choices=sorted(FORMS), default="plain", help="how the log file holds its lines")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kvwatch-footprint-"))
    log = work / "vllm.log"
    startup = STARTUP.read_text(errors="replace").split("Engine 000:")[0].rsplit("\n", 1)[0].split("\n")
    log.write_text("".join(FORMS[args.form](1, line.rstrip("\r") + "\n") for line in startup))
    vllm_port, kv_port = free_port(), free_port()
    httpd = serve_fixture(vllm_port)
    kvwatch = Path(sys.executable).with_name("kvwatch")
    cmd = [
        str(kvwatch),
        "watch",
        "--log",
        str(log),
        "--metrics-url",
        f"http://127.0.0.1:{vllm_port}/metrics",
        "--listen",
        f"127.0.0.1:{kv_port}",
        "--scrape-interval",
        str(args.scrape_interval),
        "--from-start",
        "--state-dir",
        str(work / "state"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=(work / "kvwatch.err").open("w"))
    base, base_port = None, 0
    if args.baseline_src:
        base_port = free_port()
        base_cmd = [sys.executable, "-m", "kvwatch", *cmd[1:]]
        base_cmd[base_cmd.index("--listen") + 1] = f"127.0.0.1:{base_port}"
        base_cmd[base_cmd.index("--state-dir") + 1] = str(work / "base-state")
        base = subprocess.Popen(
            base_cmd,
            stdout=subprocess.DEVNULL,
            stderr=(work / "baseline.err").open("w"),
            env={**os.environ, "PYTHONPATH": args.baseline_src},
            # `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH
            cwd=str(work),
        )
    tail = subprocess.Popen(["tail", "-F", "-n", "0", str(log)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    writer = Writer(log, args.rate, args.form)
    try:
        for port in (kv_port, base_port) if base is not None else (kv_port,):
            for _ in range(600):  # up to ~30 s on a busy machine
                try:
                    if scrape_value(port, "kvwatch_build_info") == 1:
                        break
                except OSError:
                    time.sleep(0.05)
        writer.start()
        time.sleep(2)  # let startup settle before the steady phase
        cpu0, _, _ = proc_stat(proc.pid)
        tail_cpu0, _, _ = proc_stat(tail.pid)
        base_cpu0 = proc_stat(base.pid)[0] if base is not None else 0.0
        wall0 = time.monotonic()
        deadline = wall0 + args.minutes * 60
        while time.monotonic() < deadline:
            scrape_value(kv_port, "kvwatch_build_info")  # Prometheus scraping kvwatch
            time.sleep(min(15.0, max(0.0, deadline - time.monotonic())))
        wall = time.monotonic() - wall0
        cpu1, rss, hwm = proc_stat(proc.pid)
        tail_cpu1, tail_rss, _ = proc_stat(tail.pid)
        base_cpu1, base_rss, _ = proc_stat(base.pid) if base is not None else (0.0, 0, 0)

        # Latency: kvwatch_log_records_total{kind="stats"} counts log records only (observed_running
        # prefers the fresh /metrics value), so each probe waits for it to count the probe's record.
        writer.stats = False
        time.sleep(0.5)
        latencies = []
        for _ in range(args.probes):
            before = scrape_value(kv_port, 'kvwatch_log_records_total{kind="stats"}') or 0.0
            writer.append(stats_line(99))
            t0 = time.monotonic()
            while (scrape_value(kv_port, 'kvwatch_log_records_total{kind="stats"}') or 0.0) <= before:
                if time.monotonic() - t0 > 10:
                    break
                time.sleep(0.005)
            latencies.append(time.monotonic() - t0)
            time.sleep(random.uniform(0.05, 0.3))
        latencies.sort()
        figures = {
            "minutes": args.minutes,
            "rate_lines_per_s": args.rate,
            "form": args.form,
            "lines_written": writer.written,
            "scrape_interval_s": args.scrape_interval,
            "rss_mib": round(rss / 1024, 1),
            "peak_rss_mib": round(hwm / 1024, 1),
            "cpu_pct_of_one_core": round(100 * (cpu1 - cpu0) / wall, 2),
            "baseline_tail_F_cpu_pct": round(100 * (tail_cpu1 - tail_cpu0) / wall, 2),
            "baseline_tail_F_rss_mib": round(tail_rss / 1024, 1),
            "latency_p50_s": round(statistics.median(latencies), 4),
            "latency_p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 4),
            "probes": len(latencies),
        }
        if base is not None:
            figures["baseline_cpu_pct_of_one_core"] = round(100 * (base_cpu1 - base_cpu0) / wall, 2)
            figures["baseline_rss_mib"] = round(base_rss / 1024, 1)
    finally:
        writer.stop.set()
        proc.terminate()
        tail.terminate()
        if base is not None:
            base.terminate()
            base.wait(10)
        proc.wait(10)
        tail.wait(10)
        httpd.shutdown()
    print(json.dumps(figures, indent=2))
    rss_max, cpu_max, p99_max = (50, 3, 0.2) if args.rate >= 5000 else (60, 2, 1)
    verdict = (
        figures["rss_mib"] <= rss_max
        and figures["cpu_pct_of_one_core"] <= cpu_max
        and figures["latency_p99_s"] <= p99_max
    )
    targets = f"RSS <= {rss_max} MiB, CPU <= {cpu_max} %, p99 <= {p99_max * 1000:.0f} ms"
    print(f"targets at {args.rate} lines/s ({targets}): {'met' if verdict else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
