"""kvwatch's own HTTP server under hostile and unlucky clients, and behind TLS + basic auth.

- A real ``kvwatch watch`` process takes 1,000 aborted and 200 idle connections: at most a few
  lines of its own log, no traceback, one counter instead, few threads, and a normal scrape
  still answered in < 100 ms (median of several, the acceptance's ceiling).
- In-process servers with small limits show each defence on its own: idle timeout, request
  (slow-loris) timeout, the connection bound evicting the idlest, each counted by reason.
- ``--web-config-file`` in exporter-toolkit's format: TLS with a self-signed certificate and
  bcrypt basic auth, checked by a real Prometheus (Debian's 2.42) scraping with ``basic_auth`` and
  ``tls_config`` (up == 1), and a second job with a wrong password (up == 0, HTTP 401).
Waits are on events (a closed socket, a counter value, a target's health) with generous ceilings.
"""

from __future__ import annotations

import base64
import functools
import os
import socket
import ssl
import statistics
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

from kvwatch.errors import UsageError
from kvwatch.export import exposition
from kvwatch.export.collector import StateCollector
from kvwatch.export.server import DROP_REASONS, MetricsServer
from kvwatch.export.webconfig import _crypt, load_web_config
from kvwatch.reconcile.live import LiveState
from tests.conftest import ROOT, require_binary
from tests.e2e.server import (
    StartedProcess,
    free_port,
    start_process,
    start_prometheus,
    stop_process_tree,
)
from tests.helpers import Kvwatch, value, wait_for

CEILING = 60.0
PASSWORD = "s3cret-scrape"


def _rst(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0): the abrupt abort a killed client or a scanner makes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _scrape_seconds(port: int) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert b"kvwatch_build_info" in resp.read()
    return time.perf_counter() - started


def _drops(port: int) -> float:
    return sum(value(port, "kvwatch_http_connections_dropped_total", reason=r) or 0.0 for r in DROP_REASONS)


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def test_1000_aborted_and_200_idle_connections_cost_no_log_lines_and_scrapes_stay_fast(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    k = Kvwatch(["--log", str(log)], tmp_path)
    try:
        baseline = statistics.median(_scrape_seconds(k.port) for _ in range(5))
        lines_before = len(k.stderr.splitlines())
        idle = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", k.port), timeout=10)
            idle.append(s)
        for i in range(1000):
            s = socket.create_connection(("127.0.0.1", k.port), timeout=10)
            if i % 3 == 0:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x")  # half a request, then reset
            elif i % 3 == 1:
                s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # a whole request, gone before the answer
            _rst(s)
        wait_for(lambda: _drops(k.port) >= 600, timeout=CEILING, what="the aborted connections counted")
        flooded = [_scrape_seconds(k.port) for _ in range(7)]
        threads = _threads(k.proc.pid)
        assert all(s.fileno() != -1 for s in idle)  # the idle ones are still open while we scrape
    finally:
        for s in idle:
            s.close()
        code = k.stop()
    new_lines = k.stderr.splitlines()[lines_before:]
    print(f"\nscrape median: baseline {baseline * 1000:.1f} ms, flooded {statistics.median(flooded) * 1000:.1f} ms")
    assert code == 0
    assert "Traceback" not in k.stderr
    print(f"kvwatch log lines during the flood and shutdown: {len(new_lines)}")
    assert len(new_lines) <= 3, new_lines  # the flood itself adds nothing; shutdown may add a line
    assert statistics.median(flooded) < 0.100
    assert threads < 30  # one selector thread and a few workers, not a thread per idle connection


@pytest.fixture
def state() -> LiveState:
    return LiveState()


def _server(state: LiveState, **kw: object) -> MetricsServer:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(functools.partial(exposition.samples, state), threading.Lock(), time.time))
    return MetricsServer(registry, "127.0.0.1:0", on_drop=state.on_http_drop, **kw).start()  # type: ignore[arg-type]


def _dropped(state: LiveState, reason: str) -> float:
    for s in exposition.samples(state, time.time()):
        if s.name == "kvwatch_http_connections_dropped_total" and s.labels == (("reason", reason),):
            return s.value
    return 0.0


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(CEILING)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_an_idle_connection_is_closed_after_the_idle_timeout_and_counted(state: LiveState) -> None:
    server = _server(state, idle_timeout=0.3)
    try:
        s = socket.create_connection(("127.0.0.1", server.port))
        assert _closed_by_server(s)
        s.close()
        wait_for(lambda: _dropped(state, "timeout") == 1, timeout=CEILING, what="the timeout counted")
    finally:
        server.close()


def test_a_request_that_never_completes_is_cut_at_the_read_timeout(state: LiveState) -> None:
    server = _server(state, read_timeout=0.3)
    try:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /metrics HT")  # slow-loris: a few bytes, then nothing
        assert _closed_by_server(s)
        s.close()
        wait_for(lambda: _dropped(state, "timeout") == 1, timeout=CEILING, what="the timeout counted")
        assert _scrape_seconds(server.port) < CEILING  # and it still answers
    finally:
        server.close()


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_slow_loris_connections_hold_no_worker_and_a_scrape_behind_them_is_fast(
    state: LiveState, tls: bool, request: pytest.FixtureRequest
) -> None:
    # 4 workers and 100 clients that each send a few bytes of a request, then nothing: with a
    # thread (or a worker) per connection the scrape would wait behind them for the read timeout.
    web = load_web_config(request.getfixturevalue("web_config")) if tls else None
    server = _server(state, workers=4, web_config=web)
    stalled = []
    try:
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            if tls:
                ctx = ssl.create_default_context(cafile=str(request.getfixturevalue("certificate")[0]))
                s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
            s.sendall(b"GET /metrics HT")
            stalled.append(s)
        if tls:
            auth = "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
            ca = str(request.getfixturevalue("certificate")[0])

            def scrape() -> float:
                started = time.perf_counter()
                got = requests.get(
                    f"https://127.0.0.1:{server.port}/metrics", headers={"Authorization": auth}, verify=ca, timeout=10
                )
                assert got.status_code == 200
                return time.perf_counter() - started

            scrape()  # the first pays the bcrypt; later ones hit the cache
            times = [scrape() for _ in range(5)]
        else:
            times = [_scrape_seconds(server.port) for _ in range(5)]
        assert statistics.median(times) < 0.100
        assert server.open_connections >= 100  # they are all still there, costing no worker
    finally:
        for s in stalled:
            s.close()
        server.close()


def test_beyond_max_connections_the_idlest_is_evicted_and_a_scrape_still_gets_in(state: LiveState) -> None:
    server = _server(state, max_connections=20, workers=2)
    idle = []
    try:
        for _ in range(50):
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
        wait_for(lambda: _dropped(state, "over_limit") >= 30, timeout=CEILING, what="evictions counted")
        assert server.open_connections <= 20
        _scrape_seconds(server.port)
        assert _closed_by_server(idle[0])  # the oldest idle one went first
    finally:
        for s in idle:
            s.close()
        server.close()


# ---------------------------------------------------------------------- TLS and basic auth


def _bcrypt(password: str) -> str:
    hashed = _crypt(password.encode(), b"$2y$10$" + base64.b64encode(os.urandom(16))[:22].replace(b"+", b"."))
    assert hashed is not None, "libcrypt has no bcrypt here"
    return hashed.decode()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1, its key), made with the openssl CLI."""
    openssl = require_binary("openssl")
    d = tmp_path_factory.mktemp("tls")
    ca, ca_key, cert, key, csr = d / "ca.crt", d / "ca.key", d / "tls.crt", d / "tls.key", d / "tls.csr"
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=120)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kvwatch-test-ca",
        "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "2",
        "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return ca, cert, key


@pytest.fixture
def web_config(tmp_path: Path, certificate: tuple[Path, Path, Path]) -> Path:
    _ca, cert, key = certificate
    path = tmp_path / "web-config.yml"
    doc = {
        "tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
        "basic_auth_users": {"prometheus": _bcrypt(PASSWORD)},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_tls_and_basic_auth_guard_metrics_but_not_healthz(
    state: LiveState, web_config: Path, certificate: tuple[Path, Path, Path]
) -> None:
    server = _server(state, web_config=load_web_config(web_config))
    base = f"https://127.0.0.1:{server.port}"
    try:
        # verify= on each call: a Session's own verify loses to REQUESTS_CA_BUNDLE from the environment.
        ca = str(certificate[0])
        assert requests.get(f"{base}/metrics", verify=ca, timeout=10).status_code == 401
        assert requests.get(f"{base}/metrics", auth=("prometheus", "wrong"), verify=ca, timeout=10).status_code == 401
        assert requests.get(f"{base}/metrics", auth=("nobody", PASSWORD), verify=ca, timeout=10).status_code == 401
        ok = requests.get(f"{base}/metrics", auth=("prometheus", PASSWORD), verify=ca, timeout=10)
        assert ok.status_code == 200
        assert "kvwatch_build_info" in ok.text
        assert requests.get(f"{base}/healthz", verify=ca, timeout=10).status_code == 200
        with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP to a TLS port
            requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
        wait_for(lambda: _dropped(state, "tls_error") >= 1, timeout=CEILING, what="the failed handshake counted")
    finally:
        server.close()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls_server_config": {"cert_file": "a.crt"}}, "tls_server_config.key_file is required"),
        ({"basic_auth_users": {"u": "plaintext"}}, "must be a bcrypt hash"),
        ({"basic_auth_users": {"u": "$2y$10$short"}}, "not a valid bcrypt hash"),
        ({"http_server_config": {"http2": False}}, "'http_server_config' is not supported"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "cipher_suites": []}}, "cipher_suites"),
        ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}, "cannot load cert_file"),
        ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAnyClientCert"}},
         "not supported"),
    ],
    ids=["no_key", "plaintext_password", "bad_hash", "unknown_block", "unknown_tls_key", "missing_files", "auth_type"],
)  # fmt: skip
def test_a_bad_web_config_is_refused_naming_the_key(tmp_path: Path, doc: dict[str, object], message: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match=message):
        load_web_config(path)


def test_a_bad_web_config_file_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users: [not, a, mapping\n")
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "kvwatch"), "watch", "--log", str(tmp_path / "x.log"),
         "--listen", f"127.0.0.1:{free_port()}", "--web-config-file", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "not valid YAML" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def prometheus_against_kvwatch(
    tmp_path: Path, web_config: Path, certificate: tuple[Path, Path, Path]
) -> Iterator[tuple[str, StartedProcess]]:
    prometheus = require_binary("prometheus")
    kvwatch_port = free_port()
    target = {"targets": [f"127.0.0.1:{kvwatch_port}"]}
    tls = {"ca_file": str(certificate[0])}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "kvwatch", "scheme": "https", "tls_config": tls,
             "basic_auth": {"username": "prometheus", "password": PASSWORD}, "static_configs": [target]},
            {"job_name": "kvwatch-wrong-password", "scheme": "https", "tls_config": tls,
             "basic_auth": {"username": "prometheus", "password": "guess"}, "static_configs": [target]},
        ],
    }  # fmt: skip
    (tmp_path / "vllm.log").touch()
    started: list[StartedProcess] = []
    try:
        kvwatch = start_process(
            "kvwatch",
            [str(ROOT / ".venv" / "bin" / "kvwatch"), "watch", f"--log={tmp_path / 'vllm.log'}",
             f"--listen=127.0.0.1:{kvwatch_port}", f"--web-config-file={web_config}"],
            tmp_path / "kvwatch.log",
        )  # fmt: skip
        started.append(kvwatch)
        prom, url = start_prometheus(prometheus, tmp_path, config)
        started.append(prom)
        yield url, kvwatch
    finally:
        for proc in reversed(started):
            stop_process_tree(proc, grace_seconds=5)


@pytest.mark.prometheus
def test_real_prometheus_scrapes_kvwatch_over_tls_with_basic_auth(
    prometheus_against_kvwatch: tuple[str, StartedProcess],
) -> None:
    url, _kvwatch = prometheus_against_kvwatch
    health: dict[str, dict[str, str]] = {}

    def targets_judged() -> bool:
        data = requests.get(f"{url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        health.clear()
        health.update({t["labels"]["job"]: t for t in data})
        return len(health) == 2 and all(t["health"] in ("up", "down") for t in health.values())

    wait_for(targets_judged, timeout=CEILING, what="both targets scraped")
    wait_for(lambda: targets_judged() and health["kvwatch"]["health"] == "up", timeout=CEILING, what="up")
    assert health["kvwatch-wrong-password"]["health"] == "down"
    assert "401" in health["kvwatch-wrong-password"]["lastError"]

    def build_info() -> list[object]:
        q = requests.get(f"{url}/api/v1/query", params={"query": 'kvwatch_build_info{job="kvwatch"}'}, timeout=10)
        return list(q.json()["data"]["result"])

    wait_for(lambda: len(build_info()) == 1, timeout=CEILING, what="kvwatch's series in Prometheus")
