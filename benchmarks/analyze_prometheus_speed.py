"""Speed of ``kvwatch analyze --prometheus`` over 24 h of 16 vLLM engines, against the bare queries.

Generates (once, cached in --dir) 24 h of vLLM V1 series for 16 engines (16 pods, one engine each)
scraped every 15 s: the gauges and counters analyze reads and the token, TTFT, end-to-end and
queue-time histograms with vLLM 0.32's bucket bounds (vllm/v1/metrics/buckets.py) -- about 1,300
series, 7.5 M samples. ``promtool tsdb create-blocks-from openmetrics`` turns it into TSDB blocks
and Debian's ``prometheus`` serves them on 127.0.0.1. Then, in the same run, median of --runs:

* baseline: the range queries kvwatch sends, fetched and JSON-decoded with ``requests``
  (what any client of the API pays for this range: Prometheus' evaluation plus the transfer);
* ``kvwatch analyze --prometheus URL --start T0 --end T1 --format json > /dev/null``, the whole
  command (interpreter start, queries, per-engine judgement, document).

Prints both, the ratio, and whether the command stays under the issue's 10 s.

    .venv/bin/python benchmarks/analyze_prometheus_speed.py [--dir /tmp/kvwatch-prom-bench] [--runs 3]
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

KVWATCH = str(Path(sys.executable).with_name("kvwatch"))
ENGINES = 16
HOURS = 24
INTERVAL = 15
T0 = 1_796_000_000  # 2026-12-02T...Z: a fixed day, so the cache is reusable
TARGET_SECONDS = 10.0

# vLLM 0.32 bucket bounds: 1-2-5 up to max_model_len (9,216 here) for tokens; its TTFT/e2e/queue lists.
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0]


def _labels(i: int) -> str:
    return f'engine="0",instance="10.0.0.{i}:8000",job="vllm",model_name="llama",pod="vllm-{i}"'


def generate(path: Path) -> None:
    """The OpenMetrics file: per engine a day of a memory-bound afternoon and a quiet night."""
    rng = random.Random(1)
    steps = HOURS * 3600 // INTERVAL + 1
    families: dict[str, list[str]] = {}

    def put(name: str, labels: str, values: list[float]) -> None:
        rows = families.setdefault(name, [])
        rows.extend(f"{name}{{{labels}}} {v:g} {T0 + k * INTERVAL}" for k, v in enumerate(values))

    for i in range(ENGINES):
        lab = _labels(i)
        load = [0.5 + 0.5 * math.sin(2 * math.pi * k / steps + i) for k in range(steps)]
        put("vllm:num_requests_running", lab, [round(5 * x) for x in load])
        put("vllm:num_requests_waiting", lab, [max(0, round(20 * x - 8)) for x in load])
        put("vllm:kv_cache_usage_perc", lab, [min(1.0, 0.3 + 0.7 * x) for x in load])
        requests_done = preempt = 0.0
        counters: dict[str, list[float]] = {k: [] for k in ("pre", "req", "q", "h")}
        for x in load:
            new = rng.randint(0, 2) if x > 0.2 else 0
            requests_done += new
            preempt += 1 if x > 0.9 and rng.random() < 0.2 else 0
            counters["pre"].append(preempt)
            counters["req"].append(requests_done)
            counters["q"].append(requests_done * 7500)
            counters["h"].append(requests_done * 1500)
        put("vllm:num_preemptions_total", lab, counters["pre"])
        put("vllm:prefix_cache_queries_total", lab, counters["q"])
        put("vllm:prefix_cache_hits_total", lab, counters["h"])
        put("vllm:prompt_tokens_total", lab, [r * 7500 for r in counters["req"]])
        put("vllm:generation_tokens_total", lab, [r * 1000 for r in counters["req"]])
        for name, bounds, each in (
            ("vllm:request_prompt_tokens", TOKEN_BUCKETS, 7500.0),
            ("vllm:request_generation_tokens", TOKEN_BUCKETS, 1000.0),
            ("vllm:time_to_first_token_seconds", TTFT_BUCKETS, 3.0),
            ("vllm:e2e_request_latency_seconds", LATENCY_BUCKETS, 45.0),
            ("vllm:request_queue_time_seconds", LATENCY_BUCKETS, 12.0),
        ):
            reqs = counters["req"]
            for le in [*bounds, math.inf]:
                le_text = "+Inf" if math.isinf(le) else f"{le:g}"
                put(f"{name}_bucket", f'{lab},le="{le_text}"', [r if each <= le else 0.0 for r in reqs])
            put(f"{name}_sum", lab, [r * each for r in reqs])
            put(f"{name}_count", lab, reqs)
    with path.open("w") as out:
        for name, rows in families.items():
            out.write(f"# TYPE {name} unknown\n")
            out.write("\n".join(rows))
            out.write("\n")
        out.write("# EOF\n")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> int:
    """Generate, load, serve, time; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kvwatch-prom-bench"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    data, tsdb = args.dir / "vllm-24h-16.om", args.dir / "tsdb"
    if not (tsdb / "done").exists():
        shutil.rmtree(tsdb, ignore_errors=True)
        t = time.monotonic()
        generate(data)
        print(f"generated {data.stat().st_size / 1e6:.0f} MB of OpenMetrics in {time.monotonic() - t:.0f} s")
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h", str(data), str(tsdb)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (tsdb / "done").write_text("ok\n")
        data.unlink()
    port = free_port()
    config = args.dir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        start, end = T0, T0 + HOURS * 3600
        from kvwatch.parse.series import query_names
        from kvwatch.sources.prometheus import PrometheusClient, read_history

        client = PrometheusClient(url)
        names = query_names()
        read = read_history(
            client, "", start, end, None, fine_names=names.fine, increase_names=names.increase, probe_names=names.probe
        )  # warms Prometheus' caches like the runs below
        engines = {s.labels.get("instance") for s in read.series}
        points = sum(len(s.points) for s in read.series)
        print(
            f"{len(engines)} engines, {len(read.series)} series, {points:,} points over {HOURS} h; step {read.step:g} s"
        )

        def baseline() -> float:
            t = time.perf_counter()
            session = requests.Session()
            for query, t_start, t_end, step in read.queries:
                session.post(
                    f"{url}/api/v1/query_range",
                    data={"query": query, "start": str(t_start), "end": str(t_end), "step": str(step)},
                    timeout=120,
                ).json()
            return time.perf_counter() - t

        def command() -> float:
            t = time.perf_counter()
            subprocess.run(
                [KVWATCH, "analyze", "--prometheus", url, "--start", str(start), "--end", str(end), "--format", "json"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            return time.perf_counter() - t

        base = statistics.median(baseline() for _ in range(args.runs))
        cmd = statistics.median(command() for _ in range(args.runs))
        print(
            f"baseline ({len(read.queries)} range queries, fetched and decoded): {base:.2f} s (median of {args.runs})"
        )
        print(f"kvwatch analyze --prometheus, whole command:           {cmd:.2f} s (median of {args.runs})")
        print(f"ratio {cmd / base:.2f}x; target < {TARGET_SECONDS:g} s: {'met' if cmd < TARGET_SECONDS else 'MISSED'}")
        return 0 if cmd < TARGET_SECONDS else 1
    finally:
        prom.terminate()
        prom.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
