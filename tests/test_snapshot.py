"""`kvwatch snapshot`: the kvwatch.snapshot/1 document, the text table, inputs and bad input.

Runs the real command line in-process (``kvwatch.cli.main``) on real scrapes from
tests/fixtures, on stdin, on gzip, and on a live local HTTP endpoint (127.0.0.1 only).
"""

from __future__ import annotations

import gzip
import http.server
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvwatch.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
REAL_INDEX = FIXTURES / "real" / "index.json"
V032 = FIXTURES / "vllm-cpu" / "metrics-03.prom"
CONTRACT_ENGINE_KEYS = {
    "engine",
    "model_name",
    "running",
    "waiting",
    "waiting_capacity",
    "waiting_deferred",
    "swapped",
    "kv_usage_ratio",
    "kv_usage_metric",
    "preemptions_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_prompt_tokens",
    "request_generation_tokens",
}
MISSING = object()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``kvwatch ARGV``."""
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def snapshot_json(path: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run(["snapshot", "--format", "json", path], capsys)
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def _resolve(doc: Any, path: str) -> Any:
    cur = doc
    for part in path.split("."):
        if isinstance(cur, list) and part.isdigit():
            cur = cur[int(part)] if int(part) < len(cur) else MISSING
        elif isinstance(cur, dict):
            cur = cur.get(part, MISSING)
        else:
            return MISSING
    return cur


# --------------------------------------------------------------------------------------------
# JSON: kvwatch.snapshot/1
# --------------------------------------------------------------------------------------------

SNAPSHOT_ENTRIES = [e for e in json.loads(REAL_INDEX.read_text()) if e["command"] == "snapshot"]


@pytest.mark.parametrize("entry", SNAPSHOT_ENTRIES, ids=lambda e: Path(e["file"]).stem)
def test_json_matches_the_hand_read_contract_expectations(
    entry: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = snapshot_json(str(REAL_INDEX.parent / entry["file"]), capsys)
    assert doc["schema"] == "kvwatch.snapshot/1"
    for key, expected in entry["expect"].items():
        actual = _resolve(doc, key)
        if expected is None:
            assert actual is None or actual is MISSING, key
        elif isinstance(expected, float):
            assert actual == pytest.approx(expected), key
        else:
            assert actual == expected, key


def test_every_engine_entry_carries_every_contract_key(capsys: pytest.CaptureFixture[str]) -> None:
    doc = snapshot_json(str(V032), capsys)
    (engine,) = doc["engines"]
    assert set(engine) >= CONTRACT_ENGINE_KEYS
    assert set(doc) >= {"schema", "engines", "cache_config"}
    for name in ("request_prompt_tokens", "request_generation_tokens"):
        assert set(engine[name]) == {"count", "sum", "p50", "p95"}


def test_histograms_are_summarised_with_prometheus_quantiles(capsys: pytest.CaptureFixture[str]) -> None:
    prompt = snapshot_json(str(V032), capsys)["engines"][0]["request_prompt_tokens"]
    # 89 prompts, all in the (50, 100] bucket: histogram_quantile interpolates inside it
    assert prompt == {"count": 89.0, "sum": 5696.0, "p50": pytest.approx(75.0), "p95": pytest.approx(97.5)}


def test_absent_metrics_are_null_not_zero(capsys: pytest.CaptureFixture[str]) -> None:
    doc = snapshot_json(str(FIXTURES / "real" / "metrics" / "107-v053-single-gauge-path-model-name.prom"), capsys)
    (engine,) = doc["engines"]
    assert engine["waiting"] == 0.0
    assert all(engine[k] is None for k in CONTRACT_ENGINE_KEYS - {"waiting", "model_name"})


def test_skipped_lines_are_reported_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    doc = snapshot_json(str(FIXTURES / "real" / "metrics" / "106-v033-cache-config-info-curl.prom"), capsys)
    assert doc["skipped"]["lines"] == 1
    assert doc["skipped"]["examples"] == ["line 1: not an exposition line"]


def test_dp_server_keeps_every_engine_and_each_cache_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scrape = tmp_path / "dp.prom"
    scrape.write_text(
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1\n'
        'vllm:cache_config_info{engine="1",num_gpu_blocks="200"} 1.0\n'
        'vllm:cache_config_info{engine="0",num_gpu_blocks="100"} 1.0\n'
    )
    doc = snapshot_json(str(scrape), capsys)
    assert [(e["engine"], e["kv_usage_ratio"]) for e in doc["engines"]] == [("0", 0.1), ("1", 0.9)]
    assert doc["cache_config"] == {"num_gpu_blocks": 100}
    assert doc["cache_config_by_engine"]["1"] == {"num_gpu_blocks": 200}


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------


def test_text_is_a_table_per_engine_with_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(["snapshot", str(V032)], capsys)
    assert code == 0
    assert "engine 0   model tiny-llama" in out
    assert "running 3   waiting 9 (capacity 9, deferred 0)" in out
    assert "100.0 %   (vllm:kv_cache_usage_perc)" in out
    assert "preemptions   325" in out
    assert "num_gpu_blocks 32" in out


def test_text_says_when_no_engine_has_samples_yet(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(
        ["snapshot", str(FIXTURES / "real" / "metrics" / "103-v054-help-type-only-no-samples.prom")], capsys
    )
    assert code == 0
    assert "0 engines" in out


# --------------------------------------------------------------------------------------------
# Inputs: stdin, gzip, URL
# --------------------------------------------------------------------------------------------


def test_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake_stdin = io.TextIOWrapper(io.BytesIO(V032.read_bytes()))
    monkeypatch.setattr(sys, "stdin", fake_stdin)
    doc = snapshot_json("-", capsys)
    assert doc["engines"][0]["running"] == 3.0
    assert doc["source"]["kind"] == "stdin"


def test_reads_a_gzip_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "scrape.prom.gz"
    packed.write_bytes(gzip.compress(V032.read_bytes()))
    assert snapshot_json(str(packed), capsys)["engines"][0]["preemptions_total"] == 325.0


class _Endpoint(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.status = 200
        self.body = V032.read_bytes()
        self.seen_auth: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Endpoint

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen_auth.append(self.headers.get("Authorization"))
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)


@pytest.fixture
def endpoint() -> Iterator[_Endpoint]:
    """A local /metrics endpoint serving the real 0.32 scrape."""
    srv = _Endpoint()
    threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_scrapes_a_live_url_with_a_bearer_token(endpoint: _Endpoint, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["snapshot", "--format", "json", "--bearer-token", "tok-123", endpoint.url], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["engines"][0]["kv_usage_ratio"] == 1.0
    assert doc["source"]["kind"] == "url"
    assert endpoint.seen_auth == ["Bearer tok-123"]
    assert "tok-123" not in out


# --------------------------------------------------------------------------------------------
# Bad input: one line on stderr, docs/contracts.md exit codes, never a traceback
# --------------------------------------------------------------------------------------------


def _closed_port_url() -> str:
    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = srv.server_address[1]
    srv.server_close()
    return f"http://127.0.0.1:{port}/metrics"


BAD_INPUTS: list[tuple[str, Any, int, str]] = [
    # (id, how to make the argument from tmp_path, exit code, words the message must hold)
    ("missing_file", lambda d: str(d / "nope.prom"), 2, "no such file"),
    ("directory", str, 2, "is a directory"),
    ("url_without_scheme", lambda d: "localhost:8000/metrics", 2, "http://"),
    ("empty_file", lambda d: _write(d / "empty.prom", b"\n\n"), 1, "empty"),
    ("binary_garbage", lambda d: _write(d / "x.bin", bytes(range(256)) * 40), 1, "binary"),
    ("damaged_gzip", lambda d: _write(d / "x.gz", b"\x1f\x8b\x08\x00garbage"), 1, "gzip"),
    (
        "another_exporter",
        lambda d: _write(d / "node.prom", b"# TYPE node_load1 gauge\nnode_load1 0.3\n"),
        1,
        "no vLLM metrics",
    ),
    (
        "a_vllm_log_not_a_scrape",
        lambda d: _write(d / "server.log", (FIXTURES / "vllm-cpu" / "server.log").read_bytes()),
        1,
        "no vLLM metrics",
    ),
    ("unreachable_url", lambda d: _closed_port_url(), 2, "connection refused"),
]


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(("make", "code", "says"), [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_line_with_the_contract_exit_code(
    make: Any, code: int, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for fmt in ("text", "json"):
        got, out, err = run(["snapshot", "--format", fmt, make(tmp_path)], capsys)
        assert got == code
        assert out == ""
        assert err.startswith("kvwatch: error: ")
        assert says in err
        assert err.count("\n") == 1
        assert "Traceback" not in err


@pytest.mark.parametrize(("status", "code"), [(500, 2), (404, 2), (200, 1)], ids=["http_500", "http_404", "html_200"])
def test_a_url_that_answers_badly_is_one_line(
    endpoint: _Endpoint, status: int, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint.status = status
    endpoint.body = b"<html>PRIVATE-PAGE-TEXT</html>\n"
    got, out, err = run(["snapshot", endpoint.url], capsys)
    assert got == code
    assert out == ""
    assert err.count("\n") == 1
    assert "PRIVATE-PAGE-TEXT" not in err


def test_never_copies_request_content_from_a_mixed_paste(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paste = tmp_path / "paste.prom"
    paste.write_text(
        "INFO 11-29 14:02:03 [logger.py:41] Received request cmpl-9: prompt: 'the launch code is 4242', params\n"
        + V032.read_text()
    )
    for fmt in ("text", "json"):
        code, out, err = run(["snapshot", "--format", fmt, str(paste)], capsys)
        assert code == 0
        assert "launch code" not in out + err
        assert "4242" not in out + err


def test_installed_command_prints_no_traceback_for_garbage(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.prom"
    garbage.write_bytes(b"\x00\xff" * 500)
    proc = subprocess.run(
        [sys.executable, "-m", "kvwatch", "snapshot", str(garbage)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("kvwatch: error: ")
