"""The /metrics source against a real HTTP server on 127.0.0.1: faults, recovery, auth, backoff.

The server runs in a thread and serves the real vLLM 0.32 scrape (tests/fixtures/vllm-cpu) or a
fault. Nothing sleeps longer than the small timeouts under test; the backoff is driven by an
injected clock.
"""

from __future__ import annotations

import gzip
import http.server
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kvwatch.errors import UsageError
from kvwatch.sources.scrape import MetricsScraper, redact
from tests.e2e.server import free_port

FIXTURES = Path(__file__).parent / "fixtures"
REAL_SCRAPE = (FIXTURES / "vllm-cpu" / "metrics-03.prom").read_bytes()
SECRET = b"SECRET-BODY-CONTENT"  # put in fault bodies: must never reach an error message
TIMEOUT = 0.25  # for the tests of a timeout: the endpoint is made slower than this on purpose
# Every other scrape waits on the answer itself: a busy machine (load ~9 on 2 cores) can take
# longer than TIMEOUT to answer a healthy endpoint, and that is not what those tests are about.
ANSWER_CEILING = 60.0


class FakeVllm(http.server.ThreadingHTTPServer):
    """A /metrics endpoint whose behaviour (``mode``) the test switches between scrapes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.mode = "ok"
        self.required_token: str | None = None
        self.seen_auth: list[str | None] = []
        self.release = threading.Event()  # ends a "slow" handler early at teardown

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"

    def handle_error(self, request: object, client_address: object) -> None:
        """A scraper that gave up ("slow", "trickle") closes its end: expected here, not worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeVllm

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def _send(
        self,
        status: int,
        body: bytes,
        *,
        length: int | None = None,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if length is not None:
            self.send_header("Content-Length", str(length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self) -> None:
        srv = self.server
        srv.seen_auth.append(self.headers.get("Authorization"))
        if srv.required_token and self.headers.get("Authorization") != f"Bearer {srv.required_token}":
            self._send(401, SECRET, length=len(SECRET))
            return
        mode = srv.mode
        if mode == "ok":
            self._send(200, REAL_SCRAPE, length=len(REAL_SCRAPE))
        elif mode == "gzip":
            body = gzip.compress(REAL_SCRAPE)
            self._send(200, body, length=len(body), headers={"Content-Encoding": "gzip"})
        elif mode == "http500":
            self._send(500, SECRET, length=len(SECRET))
        elif mode == "slow":
            srv.release.wait(TIMEOUT * 8)
            self._send(200, REAL_SCRAPE, length=len(REAL_SCRAPE))
        elif mode == "trickle":  # headers at once, then a comment line every 50 ms: never finishes in time
            self.send_response(200)
            self.send_header("Content-Length", str(len(REAL_SCRAPE)))
            self.end_headers()
            for _ in range(int(TIMEOUT * 8 / 0.05)):
                if srv.release.wait(0.05):
                    return
                try:
                    self.wfile.write(b"# still coming\n")
                    self.wfile.flush()
                except OSError:
                    return
        elif mode == "garbage":
            body = b"<html><body>" + SECRET + b"</body></html>\n" + bytes(range(256)) + b"\n"
            self._send(200, body, length=len(body))
        elif mode == "truncated":  # Content-Length promises more than arrives, then the connection closes
            self._send(200, REAL_SCRAPE[: len(REAL_SCRAPE) // 2], length=len(REAL_SCRAPE), close=True)
        elif mode == "truncated_close":  # no Content-Length: the body ends where the connection does, mid-line
            cut = REAL_SCRAPE.index(b"vllm:num_requests_running{") + 20
            self._send(200, REAL_SCRAPE[:cut], close=True)
        elif mode == "not_vllm":  # a healthy exporter that is not vLLM
            body = b"# TYPE node_load1 gauge\nnode_load1 0.5\n"
            self._send(200, body, length=len(body))
        else:
            raise AssertionError(mode)


@pytest.fixture
def server() -> Iterator[FakeVllm]:
    """A fresh local endpoint per test, shut down (and any slow handler released) afterwards."""
    srv = FakeVllm()
    thread = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()


class FakeClock:
    """Injected time: tests advance it instead of sleeping."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def _scraper(
    url: str,
    *,
    bearer_token: str | None = None,
    clock: FakeClock | None = None,
    reader: Callable[[str], Any] | None = None,
    timeout: float = ANSWER_CEILING,
) -> MetricsScraper:
    return MetricsScraper(
        url, timeout=timeout, bearer_token=bearer_token, verify=True, clock=clock or FakeClock(), reader=reader
    )


# --------------------------------------------------------------------------------------------


def test_reads_the_real_vllm_scrape_into_a_snapshot(server: FakeVllm) -> None:
    scraper = _scraper(server.url, clock=FakeClock(1_700_000_000.0))
    result = scraper.scrape()
    assert result.ok, result.error
    assert result.error is None
    assert result.status_code == 200
    assert result.at == 1_700_000_000.0
    assert result.duration_seconds >= 0.0
    assert result.body_bytes == len(REAL_SCRAPE)
    assert result.snapshot is not None
    (engine,) = result.snapshot.engines
    assert (engine.model_name, engine.engine, engine.running, engine.waiting) == ("tiny-llama", "0", 3.0, 9.0)
    assert engine.preemptions_total == 325.0
    assert scraper.up
    assert scraper.last_success_at == 1_700_000_000.0


def test_reads_a_gzip_encoded_answer(server: FakeVllm) -> None:
    server.mode = "gzip"
    result = _scraper(server.url).scrape()
    assert result.ok, result.error
    assert result.snapshot is not None
    assert result.snapshot.engines[0].kv_usage_ratio == 1.0


FAULTS = [
    ("http500", "HTTP 500"),
    ("slow", "timeout"),
    ("trickle", "timeout"),
    ("garbage", "no vLLM metrics"),
    ("truncated", "truncated"),
    ("truncated_close", "truncated"),
    ("not_vllm", "no vLLM metrics"),
]


@pytest.mark.parametrize(
    ("mode", "says"), FAULTS, ids=[f"reports_source_down_when_{m}_then_recovers" for m, _ in FAULTS]
)
def test_fault_gives_source_down_without_raising_and_recovers(server: FakeVllm, mode: str, says: str) -> None:
    scraper = _scraper(server.url, timeout=TIMEOUT if says == "timeout" else ANSWER_CEILING)
    server.mode = mode
    bad = scraper.scrape()
    assert not bad.ok
    assert bad.snapshot is None
    assert bad.error is not None
    assert says in bad.error
    assert "\n" not in bad.error
    assert SECRET.decode() not in bad.error  # never the response body
    if says == "timeout":
        assert bad.duration_seconds < TIMEOUT * 4  # a slow endpoint costs one timeout, not its delay
    assert not scraper.up
    assert scraper.consecutive_failures == 1

    server.release.set()  # let a still-running slow handler finish before the next request
    server.mode = "ok"
    scraper.timeout = ANSWER_CEILING  # the recovery is the event here, not the timeout
    good = scraper.scrape()
    assert good.ok, good.error
    assert scraper.up
    assert scraper.consecutive_failures == 0
    assert good.snapshot is not None
    assert good.snapshot.engines[0].running == 3.0


def test_connection_refused_is_source_down_then_recovers_when_the_server_returns() -> None:
    first = FakeVllm()
    port = first.server_address[1]
    first.server_close()  # nothing listens on the port now
    scraper = _scraper(f"http://127.0.0.1:{port}/metrics")
    bad = scraper.scrape()
    assert not bad.ok
    assert bad.error is not None
    assert "connection refused" in bad.error
    assert not scraper.up

    back = FakeVllm(port)
    thread = threading.Thread(target=back.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        good = scraper.scrape()
    finally:
        back.shutdown()
        back.server_close()
    assert good.ok, good.error
    assert scraper.up


def test_sends_the_bearer_token_and_says_what_to_check_when_refused(server: FakeVllm) -> None:
    server.required_token = "s3cret-token"
    without = _scraper(server.url).scrape()
    assert not without.ok
    assert without.error is not None
    assert "HTTP 401" in without.error
    assert "--bearer-token" in without.error

    with_token = _scraper(server.url, bearer_token="s3cret-token")
    result = with_token.scrape()
    assert result.ok, result.error
    assert server.seen_auth[-1] == "Bearer s3cret-token"


def test_token_never_appears_in_an_error(server: FakeVllm) -> None:
    server.required_token = "the-right-one"
    result = _scraper(server.url, bearer_token="wrong-token-value").scrape()
    assert result.error is not None
    assert "wrong-token-value" not in result.error


def test_a_reader_that_raises_is_a_failed_scrape_not_a_crash(server: FakeVllm) -> None:
    def broken_reader(text: str) -> object:
        raise RuntimeError(f"Invalid labels: {SECRET.decode()}")  # parser errors quote the line

    result = _scraper(server.url, reader=broken_reader).scrape()
    assert not result.ok
    assert result.error is not None
    assert "RuntimeError" in result.error
    assert SECRET.decode() not in result.error


BACKOFF_STEPS = [
    # (consecutive failures, expected delay) with interval 10 s, max 60 s
    (1, 10.0),
    (2, 20.0),
    (3, 40.0),
    (4, 60.0),
    (7, 60.0),
]


@pytest.mark.parametrize(("failures", "delay"), BACKOFF_STEPS, ids=[f"after_{n}_failures" for n, _ in BACKOFF_STEPS])
def test_backs_off_exponentially_up_to_the_cap(failures: int, delay: float, server: FakeVllm) -> None:
    server.mode = "http500"  # a failure that loads the server (a refusal retries at the interval)
    timer = FakeClock()
    scraper = MetricsScraper(
        server.url,
        timeout=TIMEOUT,
        bearer_token=None,
        verify=True,
        interval=10.0,
        max_backoff=60.0,
        timer=timer,
    )
    for _ in range(failures):
        assert not scraper.scrape().ok
    assert scraper.consecutive_failures == failures
    assert scraper.next_delay() == delay


def test_due_follows_the_injected_clock_and_a_success_resets_the_backoff(server: FakeVllm) -> None:
    timer = FakeClock()
    scraper = MetricsScraper(server.url, timeout=TIMEOUT, bearer_token=None, verify=True, interval=10.0, timer=timer)
    assert scraper.next_delay() == 0.0
    assert scraper.due()
    server.mode = "http500"
    scraper.scrape()
    scraper.scrape()
    assert scraper.next_delay() == 20.0
    timer.now += 19.9
    assert not scraper.due()
    timer.now += 0.1
    assert scraper.due()
    server.mode = "ok"
    assert scraper.scrape().ok
    assert scraper.next_delay() == 10.0


@pytest.mark.parametrize(
    "url",
    ["localhost:8000/metrics", "ftp://host/metrics", "http:///metrics", "metrics.prom"],
    ids=["no_scheme", "ftp", "no_host", "a_path"],
)
def test_refuses_a_url_that_is_not_http(url: str) -> None:
    with pytest.raises(UsageError, match="http"):
        MetricsScraper(url, timeout=1.0, bearer_token=None, verify=True)


def test_redact_drops_credentials_and_query() -> None:
    assert redact("https://user:pw@example.com:8443/metrics?token=abc") == "https://example.com:8443/metrics"


def test_injected_session_is_used(server: FakeVllm) -> None:
    calls: list[str] = []

    class CountingSession(requests.Session):
        def get(self, url: str | bytes, **kwargs: Any) -> requests.Response:
            calls.append(str(url))
            return super().get(url, **kwargs)

    scraper = MetricsScraper(server.url, session=CountingSession(), timeout=TIMEOUT, bearer_token=None, verify=True)
    assert scraper.scrape().ok
    assert calls == [server.url]


# --------------------------------------------------------------------------------------------
# TLS: verification on by default, --insecure, a CA bundle
# --------------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[FakeVllm, Path]]:
    """The fake endpoint behind TLS with a fresh self-signed certificate for 127.0.0.1."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed: needed to make a throwaway certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    srv = FakeVllm()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True).start()
    yield srv, cert
    srv.shutdown()
    srv.server_close()


def test_tls_is_verified_by_default(tls_server: tuple[FakeVllm, Path]) -> None:
    srv, _cert = tls_server
    url = srv.url.replace("http://", "https://")
    result = MetricsScraper(url, timeout=2.0, bearer_token=None, verify=True).scrape()
    assert not result.ok
    assert result.error is not None
    assert "TLS verification failed" in result.error


@pytest.mark.parametrize("how", ["insecure", "ca_bundle"])
def test_tls_endpoint_is_read_when_told_how_to_trust_it(tls_server: tuple[FakeVllm, Path], how: str) -> None:
    srv, cert = tls_server
    url = srv.url.replace("http://", "https://")
    verify: bool | str = False if how == "insecure" else str(cert)
    # warnings are errors in this suite: an InsecureRequestWarning would fail the scrape
    result = MetricsScraper(url, timeout=2.0, bearer_token="t", verify=verify).scrape()
    assert result.ok, result.error
    assert srv.seen_auth == ["Bearer t"]


def test_a_refused_connection_retries_at_the_interval_so_a_starting_vllm_is_seen_at_once() -> None:
    # vLLM takes 30-60 s to listen; exponential backoff from refusals left the sidecar blind for
    # ~30 s after vLLM was ready (found by the real-vLLM e2e test in wrapper mode).
    port = free_port()  # nothing listens there: refused
    scraper = MetricsScraper(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT, bearer_token=None, verify=True,
                             interval=1.0, max_backoff=60.0)  # fmt: skip
    for _ in range(6):
        result = scraper.scrape()
        assert not result.ok
        assert "refused" in (result.error or "")
    assert scraper.consecutive_failures == 6
    assert scraper.next_delay() == 1.0
