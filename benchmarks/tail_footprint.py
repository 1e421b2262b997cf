"""Footprint of the log follower (kvwatch.sources.tail) against ``tail -F`` in the same run.

The sidecar's footprint budget: RSS <= 60 MiB, CPU <= 2 % of a core at 500 lines/s,
record -> visible within 1 s p99. This measures the follower's share of it: a writer process
appends vLLM-sized lines (~250 bytes) at --rate lines/s, each stamped with its write time; a
follower process runs the sidecar's loop (wait, poll, commit positions) and reports its CPU time,
peak RSS and the write -> poll latency of every line; GNU ``tail -F`` follows the same file at
the same time as the baseline (its CPU from /proc). Each mode runs --runs times; medians shown.

    .venv/bin/python benchmarks/tail_footprint.py [--seconds 10] [--rates 500,1] [--runs 3]

At 1 line/s (vLLM's real pace: one stats record per engine every few seconds) every line finds
the follower idle, so it shows the event path's latency; at 500 lines/s the busy path's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def writer(log: Path, seconds: float, rate: float) -> None:
    """Append stamped lines at ``rate`` per second for ``seconds``."""
    pad = "." * 200
    with open(log, "ab") as fh:
        start = time.monotonic()
        n = 0
        while (now := time.monotonic()) - start < seconds:
            due = start + n / rate
            if due > now:
                time.sleep(due - now)
            fh.write(f"INFO 11-29 15:05:55 [loggers.py:123] t={time.time():.6f} n={n} {pad}\n".encode())
            fh.flush()
            n += 1


def follower(log: Path, state: Path, seconds: float, use_watchdog: bool) -> None:
    """The sidecar's loop over a LogFollower; prints one JSON line of measurements."""
    import watchdog.observers  # noqa: F401  imported once at sidecar start: not part of the steady state

    from kvwatch.sources.tail import LogFollower

    latencies: list[float] = []
    lines = 0
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.monotonic()
    with LogFollower(log, state_dir=state, use_watchdog=use_watchdog, poll_interval=1.0) as tail:
        while time.monotonic() - w0 < seconds:
            tail.wait(timeout=1.0)
            batch = tail.poll()
            now = time.time()
            for line in batch:
                stamp = line.text.split(" t=", 1)[1].split(" ", 1)[0]
                latencies.append(now - float(stamp))
            lines += len(batch)
            tail.commit()
        mode = tail.status().mode
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic() - w0
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")  # noqa: E731
    print(
        json.dumps(
            {
                "mode": mode,
                "lines": lines,
                "cpu_pct": 100 * cpu / wall,
                "rss_peak_mib": r1.ru_maxrss / 1024,
                "latency_p50_s": p(0.5),
                "latency_p99_s": p(0.99),
                "latency_max_s": latencies[-1] if latencies else float("nan"),
            }
        )
    )


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def one_run(seconds: float, rate: float, use_watchdog: bool) -> dict[str, float | str]:
    with tempfile.TemporaryDirectory() as tmp:
        log, state = Path(tmp) / "vllm.log", Path(tmp) / "state"
        log.touch()
        me = [sys.executable, __file__]
        follow = subprocess.Popen(
            [*me, "--role", "follower", "--log", str(log), "--state", str(state), "--seconds", str(seconds + 3.0)]
            + ([] if use_watchdog else ["--no-watchdog"]),
            stdout=subprocess.PIPE,
            text=True,
        )
        tail_bin = shutil.which("tail")
        baseline = (
            subprocess.Popen([tail_bin, "-F", "-n", "0", str(log)], stdout=subprocess.DEVNULL) if tail_bin else None
        )
        time.sleep(1.0)  # let both start (imports) before the writer begins
        t0 = time.monotonic()
        subprocess.run(
            [*me, "--role", "writer", "--log", str(log), "--seconds", str(seconds), "--rate", str(rate)], check=True
        )
        wall = time.monotonic() - t0
        out, _ = follow.communicate(timeout=seconds + 30)
        result: dict[str, float | str] = json.loads(out)
        if baseline is not None:
            result["tail_cpu_pct"] = 100 * proc_cpu_seconds(baseline.pid) / (wall + 1.0)
            baseline.terminate()
            baseline.wait()
        return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["bench", "writer", "follower"], default="bench")
    ap.add_argument("--log", type=Path)
    ap.add_argument("--state", type=Path)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=500.0, help="writer role: lines/s")
    ap.add_argument("--rates", default="500,1", help="bench: comma-separated lines/s to measure")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-watchdog", action="store_true")
    args = ap.parse_args()
    if args.role == "writer":
        writer(args.log, args.seconds, args.rate)
        return
    if args.role == "follower":
        follower(args.log, args.state, args.seconds, not args.no_watchdog)
        return
    bare = subprocess.run(
        [sys.executable, "-c", "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
        capture_output=True,
        text=True,
        check=True,
    )
    print(f"baseline: a bare Python interpreter peaks at {int(bare.stdout) / 1024:.1f} MiB RSS")
    for rate in (float(r) for r in args.rates.split(",")):
        print(f"{rate:g} lines/s for {args.seconds:g} s, median of {args.runs} runs")
        for use_watchdog in (True, False):
            report(rate, use_watchdog, [one_run(args.seconds, rate, use_watchdog) for _ in range(args.runs)])


def report(rate: float, use_watchdog: bool, runs: list[dict[str, float | str]]) -> None:
    """One line of medians for one (rate, mode)."""
    med = {k: statistics.median(float(r[k]) for r in runs) for k in runs[0] if k != "mode"}
    tail_cpu = med.get("tail_cpu_pct", 0.0)
    ratio = f"{med['cpu_pct'] / tail_cpu:.1f}x" if tail_cpu > 0 else "n/a: tail -F under the tick"
    print(
        f"  {runs[0]['mode']:8s} lines={med['lines']:.0f} cpu={med['cpu_pct']:.2f}% of a core "
        f"(tail -F {tail_cpu:.2f}%, ratio {ratio}) "
        f"rss_peak={med['rss_peak_mib']:.1f} MiB latency p50={med['latency_p50_s'] * 1000:.0f} ms "
        f"p99={med['latency_p99_s'] * 1000:.0f} ms max={med['latency_max_s'] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
