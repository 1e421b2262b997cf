"""`kvwatch analyze --prometheus`: Prometheus history read like the saved scrapes it came from.

A real Prometheus (Debian's ``prometheus``, started here on 127.0.0.1) scrapes two stand-ins for
vLLM that replay the seed run's recorded /metrics (tests/fixtures/vllm-cpu-seed/metrics-*.prom),
one recorded scrape per Prometheus scrape at a 1 s interval, then the last one for good. Every
sample carries an explicit timestamp, the time its scrape was recorded at (the file's
"# scraped at t=+X s" line, 10 s apart), which Prometheus keeps (``honor_timestamps``, on by
default): the history has the recorded run's own time axis however late a loaded machine makes
each scrape, so the step time calibrated from it is the run's.

- ``job="vllm"``: the whole run (14 preemptions, 46 requests);
- ``job="vllm-short"``: only the first nine scrapes of it (fewer preemptions and requests), so
  two targets in one Prometheus are seen to come out as two engines with their own figures.

The analysis of that history must match the log+scrapes analysis of the same run. Error cases run
against small fake APIs (no Prometheus needed) and the real one.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import FIXTURES, require_binary
from tests.e2e.server import free_port, start_prometheus, stop_process_tree
from tests.helpers import MetricsEndpoint, run

SEED = FIXTURES / "vllm-cpu-seed"
SCRAPES = [*sorted(SEED.glob("metrics-[0-9]*.prom")), SEED / "metrics-final.prom"]
SHORT = 9  # scrapes the second target replays
READY_SECONDS = 120.0  # generous: the machine is shared


class ReplayServer(MetricsEndpoint):
    """Serves the given recorded scrapes one per GET /metrics, then the last one forever, each
    sample stamped with its recording time (``base`` + the file's offset, in ms)."""

    def __init__(self, scrapes: list[bytes], base: float) -> None:
        self.scrapes = [_stamped(text, base) for text in scrapes]
        self.served = 0
        super().__init__(self._next)
        self.start()

    def _next(self) -> bytes:
        body = self.scrapes[min(self.served, len(self.scrapes) - 1)]
        self.served += 1
        return body


def _recorded_offset(text: bytes) -> float:
    """Seconds since the load started, from the recorder's first line ("# scraped at t=+10.1s ...")."""
    match = re.match(rb"# scraped at t=\+([0-9.]+)s", text)
    assert match, "a seed scrape without its '# scraped at' line"
    return float(match.group(1))


def _stamped(text: bytes, base: float) -> bytes:
    """The exposition with ``<timestamp_ms>`` after every sample (the recorder's labels hold no
    spaces, so a sample line is "name{labels} value")."""
    ms = b" %d" % round((base + _recorded_offset(text)) * 1000)
    return b"".join(
        line if line.startswith(b"#") or not line.strip() else line.rstrip(b"\n") + ms + b"\n"
        for line in text.splitlines(keepends=True)
    )


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    body = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus that has ingested both replays completely."""
    binary = require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("prom")
    texts = [p.read_bytes() for p in SCRAPES]
    # The recorded run ends just before now, so every stamp is in the past when it is served and
    # the whole run lies inside the tests' 10-minute ranges.
    base = time.time() - _recorded_offset(texts[-1]) - 5
    full, short = ReplayServer(texts, base), ReplayServer(texts[:SHORT], base)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{full.port}"]}]},
            {"job_name": "vllm-short", "static_configs": [{"targets": [f"127.0.0.1:{short.port}"]}]},
        ],
    }
    prom, url = start_prometheus(binary, tmp, config)
    try:
        # Wait on the event itself: both targets served past their last recording, and
        # Prometheus holds every recording of each (one sample per distinct stamp).
        want = {"vllm": len(texts), "vllm-short": SHORT}
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if full.served > len(texts) and short.served > SHORT:
                counts = _query(url, 'count_over_time(vllm:num_preemptions_total{job=~"vllm.*"}[10m])')
                if {c["metric"]["job"]: int(float(c["value"][1])) for c in counts} == want:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"Prometheus never ingested both replays: {prom.output_tail(20)}")
        yield url
    finally:
        stop_process_tree(prom, grace_seconds=5)
        full.stop()
        short.stop()


def analyze(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | None, str]:
    code, out, err = run(["analyze", "--format", "json", *argv], capsys)
    return code, (json.loads(out) if out.strip() else None), err


@pytest.mark.prometheus
def test_prometheus_history_matches_the_log_and_scrapes_analysis(
    prometheus_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, files, _ = analyze([str(SEED / "server.log"), *map(str, SCRAPES)], capsys)
    assert code == 0
    assert files is not None
    code, doc, err = analyze(["--prometheus", prometheus_url, "--since", "10m", "--selector", '{job="vllm"}'], capsys)
    assert code == 0, err
    assert doc is not None
    assert doc["preemptions"]["from_metrics"] == files["preemptions"]["from_metrics"] == 14
    for key in ("prompt_tokens", "generation_tokens"):
        assert doc["requests"][key]["mean"] == files["requests"][key]["mean"]
    assert (doc["requests"]["prompt_tokens"]["mean"], doc["requests"]["generation_tokens"]["mean"]) == (7500, 1000)
    assert doc["requests"]["finished"] == files["requests"]["finished"] == 46
    assert doc["requests"]["preempted"] == files["requests"]["preempted"] == 14
    assert doc["prefix_cache"]["hit_pct"] == files["prefix_cache"]["hit_pct"] == 0.0
    assert doc["diagnosis"]["verdict"] == files["diagnosis"]["verdict"] == "memory_bound"
    (engine,) = doc["engines"]
    assert (engine["source"], engine["engine"], engine["verdict"]) == ("prometheus", "0", "memory_bound")
    prom = doc["evidence"]["prometheus"]
    assert prom["selector"] == '{job="vllm"}'
    assert prom["step"] == 10  # the recorded scrape interval, read from the samples' stamps
    assert doc["evidence"]["first_ts"].startswith("20")  # ISO-8601 with the year, from the samples
    # the pool from vllm:cache_config_info, as the log states it
    assert (doc["capacity"]["kv_cache_tokens"], doc["capacity"]["gpu_blocks"]) == (40960, 1280)
    assert files["capacity"]["kv_cache_tokens"] == 40960


@pytest.mark.prometheus
def test_two_targets_in_one_prometheus_are_two_engines_never_summed(
    prometheus_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, err = analyze(
        ["--prometheus", prometheus_url, "--since", "10m", "--selector", '{job=~"vllm.*"}'], capsys
    )
    assert code == 0, err
    assert doc is not None
    # one pass of queries whatever the number of targets: one per metric name, never one per pod
    _code, one, _err = analyze(["--prometheus", prometheus_url, "--since", "10m", "--selector", '{job="vllm"}'], capsys)
    assert one is not None
    assert doc["evidence"]["prometheus"]["queries"] == one["evidence"]["prometheus"]["queries"]
    engines = {e["instance"]: e for e in doc["engines"]}
    assert len(engines) == 2
    code, short_files, _ = analyze(list(map(str, SCRAPES[:SHORT])), capsys)
    assert code == 0
    assert short_files is not None
    figures = sorted((e["preemptions"], e["requests"]["finished"]) for e in engines.values())
    short = (short_files["preemptions"]["from_metrics"], short_files["requests"]["finished"])
    assert figures == sorted([(14, 46), short])
    assert short != (14, 46)
    # each judged on its own; the KV peak is one engine's, never a sum or an average
    assert all(e["max_kv_usage_pct"] <= 100.0 for e in engines.values())


@pytest.mark.prometheus
def test_a_selector_matching_nothing_is_exit_1_naming_the_query(
    prometheus_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, doc, err = analyze(["--prometheus", prometheus_url, "--since", "10m", "--selector", '{job="nope"}'], capsys)
    assert code == 1
    assert doc is None
    assert err.count("\n") == 1
    assert 'job="nope"' in err
    assert "Traceback" not in err


@pytest.mark.prometheus
def test_a_range_over_11000_points_is_split_not_refused(
    prometheus_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 h at 1 s is 14,401 points per series: Prometheus refuses that in one query.
    code, doc, err = analyze(
        ["--prometheus", prometheus_url, "--since", "4h", "--step", "1s", "--selector", '{job="vllm"}'], capsys
    )
    assert code == 0, err
    assert doc is not None
    assert doc["preemptions"]["from_metrics"] == 14
    assert doc["evidence"]["prometheus"]["requests"] > 2  # the fine query went out in two chunks


class FakeApi:
    """A small HTTP server answering every request with one fixed status and body."""

    def __init__(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (500, b'{"status":"error","errorType":"internal","error":"storage is down"}', "storage is down"),
        (404, b"404 page not found", "HTTP 404"),
        (200, b'{"hello": "world"}', "not Prometheus' JSON"),
        (200, b"<html><body>Grafana</body></html>", "not Prometheus' JSON"),
        (401, b"Unauthorized", "--bearer-token-file"),
        (400, b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}', "parse error"),
    ],
    ids=["http-500-with-prometheus-error", "http-404", "json-not-prometheus", "html-page", "http-401", "bad-query"],
)
def test_bad_answers_are_one_line_errors(
    status: int, body: bytes, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi(status, body)
    try:
        code, doc, err = analyze(["--prometheus", api.url, "--since", "10m", "--step", "15s"], capsys)
    finally:
        api.stop()
    assert code == 2
    assert doc is None
    assert err.count("\n") == 1
    assert expected in err
    assert "Traceback" not in err


def test_an_unreachable_prometheus_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, err = analyze(["--prometheus", f"http://127.0.0.1:{free_port()}", "--since", "10m"], capsys)
    assert code == 2
    assert doc is None
    assert err.count("\n") == 1
    assert "cannot connect" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--since", "ten minutes"], "not a duration"),
        (["--start", "yesterday"], "not a time"),
        (["--since", "1h", "--start", "1700000000"], "not both"),
        (["--selector", "job=vllm"], "not label matchers"),
        (["--start", "1700000100", "--end", "1700000000"], "before --end"),
    ],
    ids=["bad-duration", "bad-time", "since-and-start", "bad-selector", "start-after-end"],
)
def test_bad_flags_are_usage_errors(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, err = analyze(["--prometheus", "http://127.0.0.1:9", *argv], capsys)
    assert code == 2
    assert doc is None
    assert expected in err
    assert err.count("\n") == 1


def test_time_flags_without_prometheus_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _doc, err = analyze([str(SEED / "server.log"), "--since", "1h"], capsys)
    assert code == 2
    assert "need --prometheus" in err


class LimitedApi:
    """A Prometheus-like API whose point limit is lower than Prometheus' own (as Thanos or Mimir
    may set): it refuses a range of more than LIMIT points and answers smaller ones with one series."""

    LIMIT = 3000

    def __init__(self) -> None:
        self.ranges: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from urllib.parse import parse_qs

                form = {
                    k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()
                }
                if self.path.endswith("/query"):
                    payload: dict[str, Any] = {"status": "success", "data": {"resultType": "matrix", "result": []}}
                else:
                    start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
                    points = int((end - start) / step) + 1
                    outer.ranges.append(points)
                    if points > outer.LIMIT:
                        payload = {
                            "status": "error",
                            "errorType": "bad_data",
                            "error": "exceeded maximum resolution of 3,000 points per timeseries. Try decreasing the "
                            "query resolution (?step=XX)",
                        }
                    else:
                        values = [[start + i * step, str(float(int(start + i * step) // 600))] for i in range(points)]
                        result = [] if "_bucket" in form["query"] else [
                            {"metric": {"__name__": "vllm:num_preemptions_total", "engine": "0", "model_name": "m",
                                        "instance": "a:8000"}, "values": values},
                            {"metric": {"__name__": "vllm:num_requests_running", "engine": "0", "model_name": "m",
                                        "instance": "a:8000"}, "values": [[v[0], "1"] for v in values]},
                        ]  # fmt: skip
                        payload = {"status": "success", "data": {"resultType": "matrix", "result": result}}
                body = json.dumps(payload).encode()
                self.send_response(400 if payload["status"] == "error" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def test_a_server_with_a_lower_point_limit_gets_halved_chunks(capsys: pytest.CaptureFixture[str]) -> None:
    api = LimitedApi()
    try:
        # 6 h at 1 s: 21,601 points, two 11,000-point chunks, each refused and halved until it fits.
        code, doc, err = analyze(
            ["--prometheus", api.url, "--start", "1800000000", "--end", "1800021600", "--step", "1s"], capsys
        )
    finally:
        api.stop()
    assert code == 0, err
    assert doc is not None
    assert max(api.ranges) > LimitedApi.LIMIT  # it was refused once...
    assert any(p <= LimitedApi.LIMIT for p in api.ranges)  # ...and asked again in smaller pieces
    # the counter rose by one every 600 s over 21,600 s: 36, with no point lost or doubled at the seams
    assert doc["preemptions"]["from_metrics"] == 36


def test_every_prefix_and_old_name_of_the_table_is_asked_for() -> None:
    from kvwatch.parse.series import names_of as _names

    names = set(_names(("gauge", "counter"), ()))
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "ray_vllm:num_preemptions"} <= names
    assert {"ray_vllm_num_requests_running", "vllm:num_preemptions_total", "vllm:gpu_prefix_cache_hits_total"} <= names


def test_the_bearer_token_file_is_sent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    try:
        code, _doc, err = analyze(
            ["--prometheus", f"http://127.0.0.1:{server.server_address[1]}", "--since", "5m", "--bearer-token-file",
             str(token)],
            capsys,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1, err  # an empty answer: nothing matches, exit 1
    assert seen
    assert set(seen) == {"Bearer s3cret"}
    assert "s3cret" not in err  # the token never reaches a message


def test_the_default_step_keeps_a_long_range_under_11000_points(capsys: pytest.CaptureFixture[str]) -> None:
    api = LimitedApi()
    api.LIMIT = 11_000
    try:
        # 30 days, no --step, no samples for the probe: the default step is capped at 11,000 points
        code, doc, err = analyze(["--prometheus", api.url, "--start", "1800000000", "--end", "1802592000"], capsys)
    finally:
        api.stop()
    assert code == 0, err
    assert doc is not None
    assert max(api.ranges) <= 11_000
    assert doc["evidence"]["prometheus"]["step"] == math.ceil(2_592_000 / 10_999)


@pytest.mark.prometheus
def test_simulate_calibrates_on_the_history_and_agrees_with_analyze(
    prometheus_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # One fixed range for both commands, so both read the very same samples.
    end = time.time()
    rng = ["--prometheus", prometheus_url, "--start", f"{end - 600:.3f}", "--end", f"{end:.3f}"]
    one = [*rng, "--selector", '{job="vllm"}']
    code, out, err = run(["simulate", *one, "--format", "json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    observed = doc["calibration"]["observed"]
    # The run's own numbers (the seed README): 46 requests, 14 preemptions, at most 5 running.
    assert (observed["requests_sent"], observed["preemptions"], observed["max_running"]) == (46, 14, 5)
    assert doc["engine"]["pool_tokens"] == 40960  # from vllm:cache_config_info in the history
    assert abs(doc["calibration"]["simulated"]["preemptions"] - 14) <= 2
    assert any("Prometheus history" in n for n in doc["notes"])
    scenarios = {s["name"]: s["result"] for s in doc["scenarios"]}

    code, adoc, err = analyze(one, capsys)
    assert code == 0, err
    assert adoc is not None
    sim = adoc["diagnosis"]["simulation"]
    assert sim["why_not"] is None
    assert sim["observed"]["mean_waiting"] == scenarios["observed"]["mean_waiting"]
    assert sim["observed"]["preemptions_per_100_requests"] == scenarios["observed"]["preemptions_per_100_requests"]

    code, out, err = run(["simulate", *rng, "--selector", '{job=~"vllm.*"}'], capsys)
    assert code == 1
    assert "2 engines" in err
    assert len(err.strip().splitlines()) == 1
