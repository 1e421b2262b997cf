"""How much the /metrics reader costs on top of prometheus_client's own parser.

Baseline: ``list(text_string_to_metric_families(text))`` on the same real 52 KB vLLM 0.32 scrape
(tests/fixtures/vllm-cpu/metrics-03.prom), in the same run. Measured: ``parse_exposition`` on the
clean scrape (repair + parse + per-engine grouping), on the scrape pasted as a blockquote with
``#`` lost (repair path), and with one damaged line (line-by-line fallback path).
Reports the median of several runs per case, in milliseconds, and the ratio to the baseline.
Second table: one ``MetricsScraper.scrape()`` (GET + read) against a local http.server on
127.0.0.1 serving the same scrape, as a ratio to a bare ``requests.Session.get`` of it.

    .venv/bin/python benchmarks/bench_metrics_parse.py [--runs 15]
"""

from __future__ import annotations

import argparse
import http.server
import re
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.parse.metrics import parse_exposition
from kvwatch.sources.scrape import MetricsScraper

SCRAPE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-cpu" / "metrics-03.prom"


def _median_ms(fn: Callable[[], object], runs: int, inner: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner * 1000)
    return statistics.median(times)


def main() -> None:
    """Print one line per case: median ms and ratio to prometheus_client alone."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    clean = SCRAPE.read_text()
    pasted = "".join(f"> {line}\n" for line in re.sub(r"^# (HELP|TYPE) ", r"\1 ", clean, flags=re.M).splitlines())
    lines = clean.splitlines()
    lines.insert(len(lines) // 2, 'vllm:num_requests_waiting{engine="0",model_name="x" 1 oops')
    damaged = "\n".join(lines) + "\n"

    base = _median_ms(lambda: list(text_string_to_metric_families(clean)), args.runs)
    print(f"scrape: {SCRAPE.name}, {len(clean):,} bytes, {len(lines):,} lines; median of {args.runs} runs")
    print(f"{'prometheus_client parser alone (baseline)':<48}{base:8.2f} ms   1.00x")
    for label, text in (
        ("parse_exposition, clean", clean),
        ("parse_exposition, pasted blockquote, no #", pasted),
        ("parse_exposition, one damaged line (fallback)", damaged),
    ):
        ms = _median_ms(lambda text=text: parse_exposition(text), args.runs)
        print(f"{label:<48}{ms:8.2f} ms   {ms / base:4.2f}x")
    bench_scrape(args.runs)


class _Serve(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = SCRAPE.read_bytes()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def bench_scrape(runs: int) -> None:
    """Scrape cost over loopback: bare GET vs MetricsScraper.scrape()."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Serve)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        session = requests.Session()
        scraper = MetricsScraper(url, timeout=5.0, bearer_token=None, verify=True)
        base = _median_ms(lambda: session.get(url, timeout=5.0).content, runs)
        ms = _median_ms(scraper.scrape, runs)
        print(f"{'requests GET of the scrape alone (baseline)':<48}{base:8.2f} ms   1.00x")
        print(f"{'MetricsScraper.scrape() (GET + read)':<48}{ms:8.2f} ms   {ms / base:4.2f}x")
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main()
