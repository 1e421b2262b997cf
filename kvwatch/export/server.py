"""The sidecar's HTTP endpoint: ``/metrics`` (Prometheus text) and ``/healthz``.

A small threading HTTP server rather than prometheus_client.start_http_server, because the
sidecar also answers ``/healthz`` (for Kubernetes probes) on the same port.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {listen!r} is not HOST:PORT (e.g. 0.0.0.0:9400)")
    return host.strip("[]") or "0.0.0.0", int(port)


class MetricsServer:
    """Serves a registry until ``close()``; ``healthy()`` decides /healthz's answer."""

    def __init__(self, registry: CollectorRegistry, listen: str, healthy: Callable[[], bool] = lambda: True) -> None:
        host, port = parse_listen(listen)
        registry_ref, healthy_ref = registry, healthy

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, ctype, code = generate_latest(registry_ref), CONTENT_TYPE_LATEST, 200
                elif path == "/healthz":
                    ok = healthy_ref()
                    body, ctype, code = (b"ok\n" if ok else b"unhealthy\n"), "text/plain", 200 if ok else 503
                else:
                    body, ctype, code = b"kvwatch: see /metrics and /healthz\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # one line per state change, never per request

        ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kvwatch-http", daemon=True)

    def start(self) -> MetricsServer:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
