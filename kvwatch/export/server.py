"""The sidecar's HTTP endpoint: ``/metrics`` (Prometheus text) and ``/healthz``, hardened.

Not prometheus_client.start_http_server: the sidecar also answers ``/healthz`` (Kubernetes
probes) on the same port, and whatever can reach ``:9400`` must not be able to flood kvwatch's
log, exhaust its threads or starve Prometheus' scrape. So:

- **One thread waits for all connections** (a selector) and reads each request head itself,
  non-blocking (and runs the TLS handshake the same way): a connection costs no thread until its
  whole request has arrived, so hundreds of idle, half-open or slow-loris connections cost file
  descriptors and a small buffer, not threads, and a scrape behind them is answered at once. A
  connection that sends nothing for ``idle_timeout`` seconds is closed; one whose request head
  (at most 16 KiB) is not complete ``read_timeout`` seconds after its first byte is closed.
- **A few workers answer complete requests** (``workers``); the answer must be taken by the
  client within ``read_timeout``.
- **Bounded connections**: at most ``max_connections`` open; beyond that the connection that
  has been idle longest is closed for the new one (a scraper that connects and asks at once
  always gets in; an idle flood evicts only itself).
- **A real backlog** (``socket.SOMAXCONN``, capped by the kernel's net.core.somaxconn) instead of
  socketserver's 5, so a burst of connects is queued by the kernel, not refused.
- **No log line per client**: an aborted, timed-out or refused connection is counted
  (``kvwatch_http_connections_dropped_total{reason}`` through ``on_drop``), never logged and never
  a traceback. http.server's per-request and per-error lines are silenced.
- **Optional TLS and basic auth** from a ``--web-config-file`` (kvwatch.export.webconfig); auth
  guards ``/metrics`` only, so kubelet probes of ``/healthz`` (which reveal nothing) need no
  credentials. The TLS handshake runs on a worker under ``read_timeout``, never on the selector.

Connections are HTTP/1.0 (one request each, then closed), as http.server defaults to; Prometheus
reconnects per scrape, which at one scrape per 15 s costs nothing and keeps a worker from being
held by an idle keep-alive connection.
"""

from __future__ import annotations

import contextlib
import io
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any, cast

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvwatch.export.webconfig import BasicAuth, WebConfig

#: Reasons a connection is dropped, the values of kvwatch_http_connections_dropped_total{reason}.
DROP_REASONS = ("aborted", "timeout", "over_limit", "tls_error", "bad_request")
_ACCEPT_BATCH = 16
_MAX_HEAD_BYTES = 16 * 1024  # a Prometheus scrape's request head is ~300 bytes


@dataclass(slots=True)
class _Pending:
    """A connection the selector holds: when it came, when its first byte came, what it sent."""

    accepted_at: float
    started_at: float | None = None
    head: bytearray | None = None
    handshaken: bool = False


@dataclass(frozen=True, slots=True)
class _Request:
    """What the handler gets as its "server": the request head the selector read."""

    head: bytes


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {listen!r} is not HOST:PORT (e.g. 0.0.0.0:9400)")
    return host.strip("[]") or "0.0.0.0", int(port)


class MetricsServer:
    """Serves a registry until ``close()``; ``healthy()`` decides /healthz's answer.

    ``web_config``: TLS and basic-auth users (None: plain HTTP, no auth). ``on_drop(reason)``:
    called once per dropped connection, reason in ``DROP_REASONS``; keep it short.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        listen: str,
        healthy: Callable[[], bool] = lambda: True,
        *,
        web_config: WebConfig | None = None,
        on_drop: Callable[[str], None] | None = None,
        max_connections: int = 512,
        workers: int = 4,
        idle_timeout: float = 30.0,
        read_timeout: float = 10.0,
    ) -> None:
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=socket.SOMAXCONN)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._ssl = web_config.tls.context() if web_config is not None and web_config.tls is not None else None
        auth = BasicAuth(web_config.basic_auth_users) if web_config and web_config.basic_auth_users else None
        self._on_drop = on_drop or (lambda reason: None)
        self._max_connections = max_connections
        self._idle_timeout = idle_timeout
        self._read_timeout = read_timeout
        self._selector = selectors.DefaultSelector()
        self._waiting: dict[socket.socket, _Pending] = {}  # connections whose request is not complete
        self._busy = 0  # connections handed to a worker
        self._conns: set[socket.socket] = set()  # every accepted connection not yet closed
        self._count_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvwatch-http-worker")
        self._handler = _handler_class(registry, healthy, auth, self._drop)
        self._thread = threading.Thread(target=self._loop, name="kvwatch-http", daemon=True)

    def start(self) -> MetricsServer:
        """Start serving in a background thread."""
        self._selector.register(self._sock, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._count_lock:
            conns = list(self._conns)
            self._waiting.clear()
        for conn in conns:  # wakes workers blocked on a client; queued ones find their socket closed
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            self._release(conn)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(Exception):
            self._selector.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            _close(s)

    @property
    def open_connections(self) -> int:
        """Connections open now (waiting for a request, or being answered)."""
        with self._count_lock:
            return len(self._waiting) + self._busy

    # ------------------------------------------------------------------ the selector thread

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._selector.select(timeout=min(1.0, self._idle_timeout / 2))
            except OSError:  # closed under us by close()
                return
            for key, _ in events:
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                else:
                    self._readable(key.fileobj)  # type: ignore[arg-type]
            self._expire(time.monotonic())

    def _accept(self) -> None:
        # A bounded batch per wake-up: under a connect flood the connections already accepted
        # (most of them readable at once, or already reset) are dispatched between batches, so
        # they do not pile up and push the connection bound onto idle clients. The rest wait in
        # the kernel's backlog.
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ECONNABORTED, EMFILE: nothing to log per client; try again next event
                return
            conn.setblocking(False)
            if self._ssl is not None:
                try:  # the handshake runs non-blocking in _readable, never holding a thread
                    conn = self._ssl.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    _close(conn)
                    self._drop("tls_error")
                    continue
            with self._count_lock:
                self._conns.add(conn)
            if self.open_connections >= self._max_connections and not self._evict_oldest():
                self._release(conn)
                self._drop("over_limit")
                continue
            with self._count_lock:
                self._waiting[conn] = _Pending(time.monotonic())
            try:
                self._selector.register(conn, selectors.EVENT_READ, "conn")
            except (OSError, ValueError):
                with self._count_lock:
                    self._waiting.pop(conn, None)
                self._release(conn)

    def _evict_oldest(self) -> bool:
        with self._count_lock:
            if not self._waiting:
                return False
            oldest = min(self._waiting, key=lambda c: self._waiting[c].accepted_at)
            del self._waiting[oldest]
        self._forget(oldest)
        self._drop("over_limit")
        return True

    def _readable(self, conn: socket.socket) -> None:
        """Advance a waiting connection: TLS handshake, then its request head, without blocking."""
        pending = self._waiting.get(conn)
        if pending is None:
            return
        if pending.started_at is None:
            pending.started_at = time.monotonic()
        try:
            if isinstance(conn, ssl.SSLSocket) and not pending.handshaken:
                conn.do_handshake()
                pending.handshaken = True
            data = conn.recv(8192)
            while isinstance(conn, ssl.SSLSocket) and data and conn.pending() and len(data) <= _MAX_HEAD_BYTES:
                data += conn.recv(8192)  # decrypted bytes the socket will not signal again
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
            return  # more bytes needed; the deadline in _expire still applies
        except ssl.SSLError:
            self._give_up(conn, "tls_error")
            return
        except OSError:
            self._give_up(conn, "aborted")
            return
        if not data:
            self._give_up(conn, "aborted")  # connected, then closed before a whole request
            return
        head = pending.head = (pending.head or bytearray()) + data
        if len(head) > _MAX_HEAD_BYTES:
            self._give_up(conn, "bad_request")
        elif b"\r\n\r\n" in head or b"\n\n" in head:
            self._dispatch(conn, bytes(head))

    def _give_up(self, conn: socket.socket, reason: str) -> None:
        with self._count_lock:
            self._waiting.pop(conn, None)
        self._forget(conn)
        self._drop(reason)

    def _dispatch(self, conn: socket.socket, head: bytes) -> None:
        with self._count_lock:
            if self._waiting.pop(conn, None) is None:
                return
            self._busy += 1
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn)
        try:
            self._pool.submit(self._serve, conn, head)
        except RuntimeError:  # shutting down
            with self._count_lock:
                self._busy -= 1
            self._release(conn)

    def _expire(self, now: float) -> None:
        def stale_one(p: _Pending) -> bool:
            if p.started_at is None:
                return now - p.accepted_at >= self._idle_timeout
            return now - p.started_at >= self._read_timeout

        with self._count_lock:
            stale = [c for c, p in self._waiting.items() if stale_one(p)]
            for conn in stale:
                del self._waiting[conn]
        for conn in stale:
            self._forget(conn)
            self._drop("timeout")

    def _forget(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn)
        self._release(conn)

    def _release(self, conn: socket.socket) -> None:
        """Close an accepted connection and stop tracking it."""
        with self._count_lock:
            self._conns.discard(conn)
        _close(conn)

    # ------------------------------------------------------------------ the workers

    def _serve(self, conn: socket.socket, head: bytes) -> None:
        """Answer the request whose head the selector read; every failure is a counted drop."""
        try:
            conn.setblocking(True)
            conn.settimeout(self._read_timeout)  # bounds writing the answer to a slow reader
            # The handler's "server" carries the head; it needs nothing of socketserver's.
            self._handler(conn, conn.getpeername(), cast(Any, _Request(head)))
        except TimeoutError:
            self._drop("timeout")
        except ssl.SSLError:
            self._drop("tls_error")
        except OSError:  # reset, broken pipe, closed mid-request
            self._drop("aborted")
        except Exception:  # a handler bug must not print a traceback per client either
            self._drop("aborted")
        finally:
            self._release(conn)
            with self._count_lock:
                self._busy -= 1

    def _drop(self, reason: str) -> None:
        with contextlib.suppress(Exception):  # counting must never break serving
            self._on_drop(reason)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _handler_class(
    registry: CollectorRegistry,
    healthy: Callable[[], bool],
    auth: BasicAuth | None,
    drop: Callable[[str], None],
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kvwatch"
        sys_version = ""

        def setup(self) -> None:
            super().setup()
            # The request head was read by the selector: parse it from memory (a GET has no body).
            self.rfile.close()
            self.rfile = io.BytesIO(cast(_Request, self.server).head)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            extra: dict[str, str] = {}
            if path == "/metrics":
                if auth is not None and not auth.allowed(self.headers.get("Authorization")):
                    body, ctype, code = b"Unauthorized\n", "text/plain; charset=utf-8", 401
                    extra["WWW-Authenticate"] = 'Basic realm="kvwatch"'
                else:
                    body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path == "/healthz":
                ok = healthy()
                body, ctype, code = (b"ok\n" if ok else b"unhealthy\n"), "text/plain", 200 if ok else 503
            else:
                body, ctype, code = b"kvwatch: see /metrics and /healthz\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # one line per state change, never per request

        def log_error(self, format: str, *args: object) -> None:
            # http.server reports a request that did not arrive within the timeout here
            # (handle_one_request's "Request timed out"); count it, never log it.
            if format.startswith("Request timed out"):
                drop("timeout")

    return Handler
