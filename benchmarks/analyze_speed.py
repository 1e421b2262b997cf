"""Speed and memory of ``kvwatch analyze --format json`` on large logs, against grep, same run.

Builds (once, cached in --dir): the 2,000,000-line gen_log.py log; the 2,000,000-line "real mix"
of issue 12 (every real log under tests/fixtures/real*/logs once, in name order, each followed by
an equal share of uvicorn access-log filler: the construction of the acceptance's >= 1 GB log,
~169 MB, the issue's "2 M-line log assembled from the real logs", 164 MB then); the first as .gz
and as 8 pod files of 250,000 lines; a 20,000,000-line log (the first, 10 times). With
``--dense-mix`` also a "dense mix": the real logs back to back with no filler, over and over
(3,400 copies, ~64k server starts in 2 M lines), a stress case of the parent's fold with no target
in the issue. Then times, interleaved so that all see the same machine load, median of --runs:

* ``grep -c 'KV cache usage' FILE`` (the baseline: one literal, one pass, C) on each plain log;
* ``kvwatch analyze --format json`` on the plain log, the real mix (and the dense mix), the .gz
  and the 8 pods;

and prints the ratios the acceptance names (kvwatch / grep on the same file, .gz / plain, 8 pods /
one file) and the peak RSS (largest process, workers included) on 2 M vs 20 M lines.

    .venv/bin/python benchmarks/analyze_speed.py [--dir /tmp/kvwatch-bench] [--runs 3] [--jobs N]
        [--no-rss] [--no-real-mix] [--dense-mix] [--baseline-src DIR]

``--baseline-src DIR`` also times an older kvwatch (a directory holding its ``kvwatch/`` package,
e.g. ``git archive REV kvwatch | tar -x -C DIR``) on the plain log and the real mix, in the same loop.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bytecode import describe, timed_env  # noqa: E402  (benchmarks/ is not a package)
from gen_log import ACCESS_FILLER, generate, real_logs  # noqa: E402

KVWATCH = [str(Path(sys.executable).with_name("kvwatch"))]
REPO = HERE.parent
TARGETS = {"plain": 3.0, "real_mix": 5.0, "gz_vs_plain": 1.5, "pods_vs_plain": 1.2}

_RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "with open('/dev/null', 'wb') as out:\n"
    "    rc = subprocess.run(sys.argv[1:], stdout=out).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)\n"
)


CPU: dict[str, list[float]] = {}  # CPU seconds (user + system, worker processes included) per timed command


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


ENV: dict[str, str] = {}  # the timed processes' environment (bytecode.timed_env), set by main()


def _timed(cmd: list[str], env: dict[str, str] | None = None, key: str | None = None) -> float:
    # Output goes to a pipe, not /dev/null: GNU grep stops at the first match when its output is
    # /dev/null, which would time nothing.
    cpu0 = _cpu_children()
    t0 = time.perf_counter()
    # cwd: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH; run from
    # the repository, the baseline would import this tree's kvwatch.
    subprocess.run(cmd, stdout=subprocess.PIPE, check=True, env=env or ENV or None, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    if key is not None:
        # On a loaded machine wall time measures the load; CPU time (the workers are reaped by
        # kvwatch, so RUSAGE_CHILDREN counts them) measures the work.
        CPU.setdefault(key, []).append(_cpu_children() - cpu0)
    return wall


def _peak_rss_kib(cmd: list[str]) -> int:
    """Peak RSS (KiB) of the largest process ``cmd`` ran, measured in a fresh wrapper process."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_WRAPPER, *cmd], capture_output=True, text=True, check=True, env=ENV or None
    )
    rss, rc = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"{cmd} exited {rc}")
    return int(rss)


def real_mix(path: Path, lines: int) -> None:
    """Every real fixture log once, each followed by the same number of access lines: ``lines`` in all.

    Records, start-ups and crashes sit far apart, as in a real server's log (and a crash is far
    from any "cache" line: what the old big-file shortcut missed).
    """
    logs = real_logs(REPO)
    per = (lines - sum(log.count(b"\n") for log in logs)) // len(logs)
    rng = random.Random(7)
    with path.open("wb") as out:
        for log in logs:
            out.write(log)
            out.write("".join(ACCESS_FILLER.format(n=rng.randint(1, 254)) for _ in range(per)).encode())


def dense_mix(path: Path, lines: int) -> None:
    """``lines`` lines of the real fixture logs, repeated in order with nothing between them."""
    block = b"".join(real_logs(REPO))
    per = block.count(b"\n")
    with path.open("wb") as out:
        for _ in range(lines // per):
            out.write(block)
        out.write(b"".join(block.splitlines(keepends=True)[: lines % per]))


def _build(d: Path, big_log: bool = True, dense: bool = False) -> dict[str, list[str]]:
    gen = d / "vllm-2m.log"
    if not gen.exists():
        print(f"generating {gen} ...", flush=True)
        generate(str(gen), 2_000_000)
    mix = d / "real-sparse-2m.log"
    if not mix.exists():
        real_mix(mix, 2_000_000)
    dense_log = d / "real-mix-2m.log"  # the name this log had when it was the only "real mix"
    if dense and not dense_log.exists():
        dense_mix(dense_log, 2_000_000)
    gz = d / "vllm-2m.log.gz"
    if not gz.exists():
        with gz.open("wb") as out:
            subprocess.run(["gzip", "-6", "-c", str(gen)], stdout=out, check=True)
    pods = d / "pods"
    if not (pods / "pod-07.log").exists():
        pods.mkdir(exist_ok=True)
        subprocess.run(
            ["split", "-l", "250000", "-d", "--additional-suffix=.log", str(gen), f"{pods}/pod-"], check=True
        )
    big = d / "vllm-20m.log"
    if big_log and not big.exists():  # 4 GB: only for the peak-RSS runs
        with big.open("wb") as out:
            for _ in range(10):
                with gen.open("rb") as src:
                    shutil.copyfileobj(src, out, 16 << 20)
    return {
        "plain": [str(gen)],
        "real_mix": [str(mix)],
        "dense_mix": [str(dense_log)],
        "gz": [str(gz)],
        "pods": sorted(str(p) for p in pods.glob("pod-*.log")),
        "big": [str(big)],
    }


def main() -> int:
    """Run the benchmark and print the figures (also as one JSON line for notes)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/kvwatch-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=None, help="pass --jobs to kvwatch analyze")
    ap.add_argument("--no-rss", action="store_true", help="skip the 2 M vs 20 M lines peak-RSS runs")
    ap.add_argument("--no-real-mix", action="store_true", help="skip the real-mix log")
    ap.add_argument("--dense-mix", action="store_true", help="also time the dense mix (about a minute per run)")
    ap.add_argument("--baseline-src", default=None, help="an older kvwatch source tree to time beside")
    ap.add_argument("--no-bytecode", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    args = ap.parse_args()
    ENV.update(timed_env(keep=args.no_bytecode))
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    logs = _build(d, big_log=not args.no_rss, dense=args.dense_mix)
    analyze = [*KVWATCH, "analyze", "--format", "json"]
    if args.jobs:
        analyze += ["--jobs", str(args.jobs)]
    base_env = {**ENV, "PYTHONPATH": args.baseline_src} if args.baseline_src else None
    base_analyze = [sys.executable, "-m", "kvwatch", *analyze[1:]]
    keys = ("grep", "grep_mix", "grep_dense", "plain", "real_mix", "dense_mix", "gz", "pods")
    keys += ("baseline", "baseline_mix", "baseline_dense")
    t: dict[str, list[float]] = {k: [] for k in keys}
    _timed([*analyze, *logs["real_mix"]])  # warm-up: the .pyc files (and the page cache)
    if base_env:
        _timed([*base_analyze, *logs["real_mix"]], base_env)
    for _ in range(args.runs):  # interleaved, so all see the same machine load
        t["grep"].append(_timed(["grep", "-c", "KV cache usage", *logs["plain"]], key="grep"))
        t["plain"].append(_timed([*analyze, *logs["plain"]], key="plain"))
        if base_env:
            t["baseline"].append(_timed([*base_analyze, *logs["plain"]], base_env, key="baseline"))
        if not args.no_real_mix:
            t["grep_mix"].append(_timed(["grep", "-c", "KV cache usage", *logs["real_mix"]], key="grep_mix"))
            t["real_mix"].append(_timed([*analyze, *logs["real_mix"]], key="real_mix"))
            if base_env:
                t["baseline_mix"].append(_timed([*base_analyze, *logs["real_mix"]], base_env, key="baseline_mix"))
        if args.dense_mix:
            t["grep_dense"].append(_timed(["grep", "-c", "KV cache usage", *logs["dense_mix"]], key="grep_dense"))
            t["dense_mix"].append(_timed([*analyze, *logs["dense_mix"]], key="dense_mix"))
            if base_env:
                t["baseline_dense"].append(_timed([*base_analyze, *logs["dense_mix"]], base_env, key="baseline_dense"))
        t["gz"].append(_timed([*analyze, *logs["gz"]], key="gz"))
        t["pods"].append(_timed([*analyze, *logs["pods"]], key="pods"))
    m = {k: statistics.median(v) for k, v in t.items() if v}
    nan = float("nan")
    ratios = {
        "plain": m["plain"] / m["grep"],
        "real_mix": m["real_mix"] / m["grep_mix"] if "real_mix" in m else nan,
        "dense_mix": m["dense_mix"] / m["grep_dense"] if "dense_mix" in m else nan,
        "gz_vs_plain": m["gz"] / m["plain"],
        "pods_vs_plain": m["pods"] / m["plain"],
    }
    rss2 = rss20 = None
    if not args.no_rss:
        rss2 = _peak_rss_kib([*analyze, *logs["plain"]])
        rss20 = _peak_rss_kib([*analyze, *logs["big"]])
    scanner = subprocess.run([*KVWATCH, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    result = {
        "lines": 2_000_000,
        "file_mb": round(os.path.getsize(logs["plain"][0]) / 1e6, 1),
        "real_mix_mb": round(os.path.getsize(logs["real_mix"][0]) / 1e6, 1),
        "median_s": {k: round(v, 3) for k, v in m.items()},
        "median_cpu_s": {k: round(statistics.median(v), 3) for k, v in CPU.items()},
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
        "targets_met": {k: ratios[k] <= TARGETS[k] for k in TARGETS},  # the dense mix has none
        "kvwatch_lines_per_s": round(2_000_000 / m["plain"]),
        "peak_rss_mib_2m": round(rss2 / 1024, 1) if rss2 else None,
        "peak_rss_mib_20m": round(rss20 / 1024, 1) if rss20 else None,
        "runs": args.runs,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "version": scanner,
        "bytecode": "PYTHONDONTWRITEBYTECODE" not in ENV,
    }
    heading = f"{scanner}; median of {args.runs} runs; load average {os.getloadavg()[0]:.1f} on {result['cpus']} CPUs"
    print(f"{heading}; {describe(ENV)}")
    print(f"grep -c 'KV cache usage', 2 M-line log   {m['grep']:7.3f} s")
    print(f"kvwatch analyze, same log               {m['plain']:7.3f} s  {ratios['plain']:5.2f}x grep (<= 3.0)")
    if "baseline" in m:
        base = m["baseline"]
        print(f"baseline tree, same log                 {base:7.3f} s  {base / m['grep']:5.2f}x grep")
    if "real_mix" in m:
        print(f"grep, real-mix 2 M-line log             {m['grep_mix']:7.3f} s")
        mix = ratios["real_mix"]
        print(f"kvwatch analyze, real mix               {m['real_mix']:7.3f} s  {mix:5.2f}x grep (<= 5.0)")
        if "baseline_mix" in m:
            base = m["baseline_mix"]
            print(f"baseline tree, real mix                 {base:7.3f} s  {base / m['grep_mix']:5.2f}x grep")
    if "dense_mix" in m:
        print(f"grep, dense mix                         {m['grep_dense']:7.3f} s")
        dense = ratios["dense_mix"]
        print(f"kvwatch analyze, dense mix              {m['dense_mix']:7.3f} s  {dense:5.2f}x grep (no target)")
        if "baseline_dense" in m:
            base = m["baseline_dense"]
            print(f"baseline tree, dense mix                {base:7.3f} s  {base / m['grep_dense']:5.2f}x grep")
    print(f"kvwatch analyze, .gz of the 2 M log     {m['gz']:7.3f} s  {ratios['gz_vs_plain']:5.2f}x plain (<= 1.5)")
    print(
        f"kvwatch analyze, 8 pods x 250k lines    {m['pods']:7.3f} s  {ratios['pods_vs_plain']:5.2f}x one file (<= 1.2)"
    )
    cpu = {k: statistics.median(v) for k, v in CPU.items()}
    print(
        "CPU seconds (user + system, workers included), medians: " + ", ".join(f"{k} {v:.3f}" for k, v in cpu.items())
    )
    if "baseline" in cpu:
        print(f"CPU, this tree / baseline tree on the plain log: {cpu['plain'] / cpu['baseline']:.2f}")
    if "baseline_mix" in cpu:
        print(f"CPU, this tree / baseline tree on the real mix: {cpu['real_mix'] / cpu['baseline_mix']:.2f}")
    if "baseline_dense" in cpu:
        print(f"CPU, this tree / baseline tree on the dense mix: {cpu['dense_mix'] / cpu['baseline_dense']:.2f}")
    if rss2 and rss20:
        print(f"peak RSS: {rss2 / 1024:,.1f} MiB on 2 M lines, {rss20 / 1024:,.1f} MiB on 20 M lines")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
