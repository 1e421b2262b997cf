"""RSS of the sidecar's scrape path before, during and after one huge /metrics answer.

A local HTTP server serves a normal vLLM exposition (a real vLLM CPU seed scrape, ~20 KB) and,
once, a huge one: the same families for as many model names as fill ``--huge-mb`` (30 MB of
text, under the scraper's 32 MiB cap, so it is parsed: the kind of answer that left 125 MB
behind in the probe); then a 50 MB answer, refused at the cap after reading 32 MiB. The scrape
path is the sidecar's own (``Sidecar.scrape_once``: MetricsScraper, the reader,
``LiveState.on_scrape``), so what it keeps or returns is what the sidecar keeps or returns.
Prints RSS (MiB): baseline (median of 5 normal scrapes), peak, and after (median of 5 normal
scrapes following the huge one); ``after - baseline`` is the figure docs/deploy.md quotes.

    .venv/bin/python benchmarks/scrape_memory.py [--huge-mb 30] [--refused-mb 50]
"""

from __future__ import annotations

import argparse
import statistics
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = sorted((ROOT / "tests" / "fixtures" / "vllm-cpu-seed").glob("metrics-*.prom"))


def rss_mib(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


def reset_peak() -> None:
    """Reset VmHWM (the peak RSS) to the current RSS (Linux 4.0+: clear_refs "5")."""
    Path("/proc/self/clear_refs").write_text("5")


def huge(normal: bytes, models: int) -> bytes:
    """The normal exposition's samples repeated for ``models`` model names (same families)."""
    out: list[bytes] = []
    lines = normal.splitlines()
    for line in lines:
        if line.startswith(b"#"):
            out.append(line)
    samples = [line for line in lines if line and not line.startswith(b"#") and b'model_name="' in line]
    for i in range(models):
        for line in samples:
            head, _, rest = line.partition(b'model_name="')
            _, _, tail = rest.partition(b'"')
            out.append(head + b'model_name="model-%05d"' % i + tail)
    return b"\n".join(out) + b"\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--huge-mb", type=float, default=30.0, help="size of the parsed huge answer (< the 32 MiB cap)")
    ap.add_argument("--refused-mb", type=int, default=50)
    args = ap.parse_args()

    from kvwatch.reconcile.live import LiveState
    from kvwatch.sidecar import Sidecar
    from kvwatch.sources.scrape import MetricsScraper

    normal = SEED[len(SEED) // 2].read_bytes()
    per_model = len(huge(normal, 10)) / 10
    models = int(args.huge_mb * (1 << 20) / per_model)
    bodies = {"normal": normal, "huge": huge(normal, models), "refused": b"#" * (args.refused_mb << 20)}
    print(f"huge answer: {models} model names")
    which = {"body": "normal"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies[which["body"]]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: object) -> None:
            return

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    state = LiveState()
    sidecar = Sidecar(state, parser=None, lines=None, scraper=MetricsScraper(url, timeout=120), listen="127.0.0.1:0")  # type: ignore[arg-type]
    peak = 0.0

    def scrape(kind: str, times: int) -> list[float]:
        nonlocal peak
        which["body"] = kind
        out = []
        for _ in range(times):
            sidecar.scrape_once()
            out.append(rss_mib())
            peak = max(peak, out[-1])
        return out

    scrape("normal", 5)
    baseline = statistics.median(scrape("normal", 5))
    for kind in ("refused", "huge"):  # each against the baseline just before it
        baseline = statistics.median(scrape("normal", 5))
        reset_peak()
        scrape(kind, 1)
        peak = rss_mib("VmHWM")
        after = statistics.median(scrape("normal", 5))
        size = len(bodies[kind]) / (1 << 20)
        print(f"{kind:8s} {size:6.1f} MB: baseline {baseline:7.1f} MiB, peak {peak:7.1f} MiB, "
              f"after {after:7.1f} MiB, after - baseline {after - baseline:+6.1f} MiB")  # fmt: skip
        peak = 0.0
    sidecar.server.close()
    httpd.shutdown()


if __name__ == "__main__":
    main()
