"""The /metrics source: one HTTP GET of a vLLM ``/metrics`` endpoint per :meth:`MetricsScraper.scrape`.

A scrape never raises and never blocks longer than its timeout: an endpoint that is down, slow,
answers 500, sends garbage or a truncated body gives ``ScrapeResult(ok=False, error=...)`` (one
line, never the response body), and the sidecar keeps tailing the log and serving its own
/metrics. Failures back off exponentially (:meth:`MetricsScraper.next_delay`); the first good
answer resets it. The clocks are injected so tests drive time without sleeping.

Bytes in, records out. STYLE.md keeps sources from importing later stages, but the scrape result
carries the snapshot (the sidecar's contract), so the reader is a parameter: the wiring passes
:func:`kvwatch.parse.metrics.read_exposition`, which is also the default (imported on first use).
"""

from __future__ import annotations

import errno
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import requests
import urllib3
import urllib3.exceptions

from kvwatch.errors import UsageError
from kvwatch.records import MetricsSnapshot

if TYPE_CHECKING:
    from kvwatch.parse.metrics import ExpositionReading

    Reader = Callable[[str], ExpositionReading]

# Ask for the classic text format: prometheus_client answers OpenMetrics when the client accepts
# it, and the reader is written for (and tested on) the text format vLLM serves to curl.
ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"
MAX_BODY_BYTES = 32 * 1024 * 1024  # a real vLLM /metrics is 20-60 KB; more is not vLLM
_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """The outcome of one scrape.

    ``ok`` is True only for an HTTP 200 whose body is a complete exposition with vLLM metrics.
    ``error`` is one line naming the problem and what to try (never response content).
    ``at`` is the wall-clock (Unix) time the scrape started; ``duration_seconds`` its length.
    """

    ok: bool
    snapshot: MetricsSnapshot | None
    error: str | None
    duration_seconds: float
    at: float
    status_code: int | None = None
    body_bytes: int = 0
    complete: bool = False  # the whole body arrived (a failure then means "read, but unusable")


class MetricsScraper:
    """Scrapes one vLLM ``/metrics`` URL, keeping up/backoff bookkeeping for the sidecar.

    ``session`` is injected (tests, connection reuse); ``timeout`` bounds the whole request,
    connect plus body; ``bearer_token`` is sent as ``Authorization: Bearer``; ``verify`` is
    requests' TLS setting (False, True or a CA bundle path). ``clock`` gives Unix time for
    ``ScrapeResult.at``; ``timer`` a monotonic clock for durations, deadlines and backoff;
    ``reader`` turns the body text into an ExpositionReading (default: the pure vLLM reader).
    """

    def __init__(
        self,
        url: str,
        *,
        session: requests.Session | None = None,
        timeout: float = 5.0,
        bearer_token: str | None = None,
        verify: bool | str = True,
        interval: float = 10.0,
        max_backoff: float = 60.0,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.monotonic,
        reader: Reader | None = None,
    ) -> None:
        check_url(url)
        if timeout <= 0:
            raise UsageError(f"scrape timeout must be > 0 seconds, got {timeout}")
        if interval <= 0:
            raise UsageError(f"scrape interval must be > 0 seconds, got {interval}")
        self.url = url
        self.timeout = timeout
        self.verify = verify
        self.interval = interval
        self.max_backoff = max(max_backoff, interval)
        self._clock = clock
        self._timer = timer
        if verify is False:
            # the user chose --insecure on purpose; a warning on every scrape would flood the log
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._session = session or requests.Session()
        self._reader = reader
        self._headers = {"Accept": ACCEPT, "User-Agent": "kvwatch"}
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token.strip()}"
        self.consecutive_failures = 0
        self.last_result: ScrapeResult | None = None
        self.last_success_at: float | None = None  # Unix time of the last ok scrape
        self._last_attempt: float | None = None  # timer() at the last attempt
        self._status: int | None = None  # HTTP status of the attempt under way
        # A refused connection is a server not listening (yet): vLLM takes 30-60 s to start, and
        # backing off exponentially from it left the sidecar blind for ~30 s after vLLM was ready
        # (real-vLLM e2e, wrapper mode). Refusals cost the server nothing, so they retry at the
        # interval; only failures that load the server (timeouts, errors, bad bodies) back off.
        self._last_refused = False

    def scrape(self) -> ScrapeResult:
        """GET the URL once and read it; never raises, never takes much longer than ``timeout``."""
        at = self._clock()
        start = self._timer()
        self._last_attempt = start
        self._status = None
        try:
            status, body = self._get(start)
            size = len(body)
        except Exception as exc:  # never let a source stop the sidecar; the message says what
            self._last_refused = isinstance(exc, requests.exceptions.ConnectionError) and _refused(exc)
            result = ScrapeResult(False, None, self._describe(exc), self._timer() - start, at, self._status, 0)
        else:
            self._last_refused = False
            try:
                result = self._judge(body, at, start, status)
            except Exception as exc:  # the whole body arrived but is no vLLM exposition
                result = ScrapeResult(
                    False, None, self._describe(exc), self._timer() - start, at, status, size, complete=True
                )
        self._record(result)
        return result

    def next_delay(self) -> float:
        """Seconds to wait before the next scrape: the interval after a success or a refused
        connection (before the first scrape: 0), doubling from the interval after each other
        consecutive failure up to ``max_backoff``."""
        if self.last_result is None:
            return 0.0
        if self.consecutive_failures == 0 or self._last_refused:
            return self.interval
        return float(min(self.max_backoff, self.interval * 2 ** (self.consecutive_failures - 1)))

    def due(self) -> bool:
        """Whether :meth:`next_delay` has elapsed since the last attempt (by the injected timer)."""
        if self._last_attempt is None:
            return True
        return self._timer() - self._last_attempt >= self.next_delay()

    @property
    def up(self) -> bool:
        """True when the last scrape succeeded (``kvwatch_source_up{source="metrics"}``)."""
        return self.last_result is not None and self.last_result.ok

    def close(self) -> None:
        """Close the HTTP session's pooled connections."""
        self._session.close()

    # -- internals ----------------------------------------------------------------------------

    def _get(self, start: float) -> tuple[int, bytes]:
        """Status and body; the body is read in chunks against an overall deadline."""
        with self._session.get(
            self.url,
            headers=self._headers,
            timeout=(self.timeout, self.timeout),
            verify=self.verify,
            stream=True,
            allow_redirects=True,
        ) as response:
            self._status = response.status_code
            if response.status_code != 200:
                raise _HttpStatus(response.status_code, response.reason or "")
            chunks: list[bytes] = []
            size = 0
            for chunk in _body_chunks(response):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise _Problem(f"response larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB: not a vLLM /metrics")
                if self._timer() - start > self.timeout:
                    raise _Problem(f"response slower than the {self.timeout:g} s timeout (body still arriving)")
            return response.status_code, b"".join(chunks)

    def _judge(self, body: bytes, at: float, start: float, status: int) -> ScrapeResult:
        text = body.decode("utf-8", errors="replace")
        if not text.strip():
            raise _Problem("empty response: is this vLLM's /metrics path?")
        if not text.endswith("\n"):
            # prometheus_client ends every exposition with a newline; a body that stops mid-line
            # lost its tail (connection closed early without a Content-Length to tell)
            raise _Problem("response truncated: it ends mid-line")
        reading = self._read(text)
        if not reading.vllm_names:
            raise _Problem(
                f"no vLLM metrics in the response ({reading.lines} lines): "
                "is the URL vLLM's /metrics (e.g. http://HOST:8000/metrics)?"
            )
        return ScrapeResult(True, reading.snapshot, None, self._timer() - start, at, status, len(body), complete=True)

    def _read(self, text: str) -> ExpositionReading:
        if self._reader is None:
            from kvwatch.parse.metrics import read_exposition  # see the module docstring

            self._reader = read_exposition
        return self._reader(text)

    def _record(self, result: ScrapeResult) -> None:
        self.last_result = result
        if result.ok:
            self.consecutive_failures = 0
            self.last_success_at = result.at
        else:
            self.consecutive_failures += 1

    def _describe(self, exc: Exception) -> str:
        """One line: what went wrong with which URL, and what to do. No response content."""
        where = f"GET {redact(self.url)}"
        if isinstance(exc, _HttpStatus):
            hint = " (check --bearer-token)" if exc.status in (401, 403) else ""
            return f"{where}: HTTP {exc.status} {exc.reason}{hint}".rstrip()
        if isinstance(exc, _Problem):
            return f"{where}: {exc}"
        if isinstance(exc, requests.exceptions.SSLError | urllib3.exceptions.SSLError):
            return f"{where}: TLS verification failed (pass a CA bundle, or --insecure to skip verification)"
        if _timed_out(exc):
            return f"{where}: no answer within the {self.timeout:g} s timeout (server overloaded or hung?)"
        if isinstance(exc, requests.exceptions.ChunkedEncodingError | urllib3.exceptions.ProtocolError):
            return f"{where}: response truncated (connection closed before the body was complete)"
        if isinstance(exc, urllib3.exceptions.DecodeError | requests.exceptions.ContentDecodingError):
            return f"{where}: response body could not be decompressed"
        if isinstance(exc, requests.exceptions.ConnectionError):
            if _refused(exc):
                return f"{where}: connection refused (is vLLM running and listening on that port?)"
            return f"{where}: cannot connect ({_root_cause(exc)})"
        if isinstance(exc, requests.exceptions.RequestException):
            return f"{where}: {type(exc).__name__}"
        # the exception text may quote the body (parser errors do): name the kind only
        return f"{where}: {type(exc).__name__} while reading the response"


def _body_chunks(response: requests.Response) -> Iterator[bytes]:
    """Body bytes as they arrive, so the overall deadline is checked between reads.

    ``iter_content(n)`` blocks until n bytes or EOF, which lets a server that trickles bytes
    hold a scrape for ever; ``read1`` returns what the socket has (each read still bounded by
    the read timeout). Chunked bodies arrive chunk by chunk anyway.
    """
    raw = response.raw
    if raw.chunked:
        yield from raw.stream(_CHUNK, decode_content=True)
        return
    while True:
        data = raw.read1(_CHUNK, decode_content=True)
        if not data:
            return
        yield data


class _Problem(Exception):
    """A response kvwatch cannot use; ``str`` is the one-line reason."""


class _HttpStatus(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = _first_line(reason)[:60]


def check_url(url: str) -> None:
    """Raise :class:`UsageError` unless ``url`` is an http(s) URL with a host."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(f"not an http(s) URL: {redact(url)!r}; give e.g. http://127.0.0.1:8000/metrics")


def redact(url: str) -> str:
    """The URL without user:password and query string, for messages and logs."""
    try:
        parsed = urllib.parse.urlsplit(url)
        host = parsed.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{parsed.port}" if parsed.port else host
    except ValueError:
        return "<unparseable URL>"
    return urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, "", ""))


def _refused(exc: BaseException) -> bool:
    """Connection refused: requests wraps the OSError twice, so its text is the reliable witness."""
    text = str(exc)
    return "Connection refused" in text or f"[Errno {errno.ECONNREFUSED}]" in text


def _timed_out(exc: BaseException) -> bool:
    """Connect or read timeout, however requests wrapped it (a read timeout while streaming the
    body surfaces as requests' ConnectionError around urllib3's ReadTimeoutError)."""
    if isinstance(exc, requests.exceptions.Timeout | urllib3.exceptions.TimeoutError | TimeoutError):
        return True
    inner = exc.args[0] if exc.args else None
    return isinstance(inner, urllib3.exceptions.TimeoutError | TimeoutError)


def _root_cause(exc: BaseException) -> str:
    text = str(exc)
    for marker in (
        "Name or service not known",
        "nodename nor servname",
        "Temporary failure in name resolution",
        "No route to host",
        "Network is unreachable",
        "Connection reset by peer",
        "Remote end closed connection",
    ):
        if marker in text:
            return marker.lower()
    return type(exc).__name__


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
