"""Prometheus history: vLLM's series read over a Prometheus-compatible HTTP API.

``/api/v1/query_range`` and ``/api/v1/query`` are the same on Prometheus, Thanos, Mimir and
VictoriaMetrics (https://prometheus.io/docs/prometheus/latest/querying/api/). A fleet-wide
selection stays one pass: one query per metric name present (the names, every prefix and old
name, come from the one name table through kvwatch.parse.series.query_names, handed in by the
wiring), never one per pod; every series comes back with its labels and is split by (instance,
model_name, engine) by kvwatch.parse.series.engine_samples.

Limits of the API, respected rather than hit:

- Prometheus refuses a range query of more than 11,000 points per series
  (web/api/v1/api.go, ``maxPointsPerSeries``): a long range is split into chunks of at most
  MAX_POINTS steps and the answers concatenated. Should a server still answer with that error (a
  lower limit, as Thanos and Mimir may set), the chunk is halved and retried.
- Histogram buckets are many series (a dozen ``le`` per histogram per engine) and only their
  increase over the range is used, so they are read at a coarser step (at most BUCKET_POINTS
  points over the range); ``_sum`` and ``_count`` come at the full step, so means are exact.

Errors are one line naming the query or the URL and what to do: an unreachable server, HTTP
4xx/5xx (with Prometheus' own ``error`` text), a body that is not Prometheus' JSON.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

import requests

from kvwatch.errors import UnusableInput, UsageError

MAX_POINTS = 11_000  # Prometheus' own limit per series and query (web/api/v1/api.go)
# Points over the range at which the increase-only series are read: a 15-minute step over a day.
# More would only sharpen the bucket quantiles across restarts; it costs transfer and decoding.
BUCKET_POINTS = 96
DEFAULT_TIMEOUT_S = 60.0

_TOO_MANY_POINTS = re.compile(r"exceeded maximum resolution|too many points|maximum resolution", re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_MATCHER = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


def parse_duration(text: str, flag: str) -> float:
    """Seconds of a Prometheus duration (``90s``, ``10m``, ``1h30m``, ``2d``) or plain seconds."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _DURATION.finditer(value):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
        if pos != len(value) or not value:
            raise UsageError(f"{flag} {text!r}: not a duration; give e.g. 30s, 10m, 2h or 1d") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{flag} {text!r}: must be a positive duration; give e.g. 30s, 10m, 2h or 1d")
    return seconds


def parse_time(text: str, flag: str) -> float:
    """Unix seconds from RFC 3339 (``2026-12-01T20:00:00Z``) or Unix seconds."""
    from datetime import UTC, datetime

    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(f"{flag} {text!r}: not a time; give RFC 3339 (2026-12-01T20:00:00Z) or Unix seconds") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)  # Prometheus' own times are UTC
    return stamp.timestamp()


def selector_matchers(selector: str | None) -> str:
    """The label matchers of ``--selector`` ('{job="vllm",namespace=~"prod-.*"}'), without braces,
    checked so a typo is a usage error here rather than a 400 from the server."""
    if not selector or not selector.strip():
        return ""
    text = selector.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    pos = 0
    parts = []
    while pos < len(text):
        m = _MATCHER.match(text, pos)
        if m is None:
            raise UsageError(
                f'--selector {selector!r}: not label matchers; give e.g. \'{{job="vllm",namespace="prod"}}\''
            )
        parts.append(m.group(0).strip())
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise UsageError(
                    f'--selector {selector!r}: not label matchers; give e.g. \'{{job="vllm",namespace="prod"}}\''
                )
            pos += 1
    return ",".join(parts)


def _name_regex(names: list[str]) -> str:
    # Prometheus regexes are fully anchored (RE2); ':' and '_' need no escaping.
    return "|".join(re.escape(n).replace("\\:", ":") for n in names)


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range query: its labels (``__name__`` included) and (t, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class RangeRead:
    """What one read of the history gave: the series, the range queries sent (query, start, end,
    step) and the two steps used."""

    series: list[Series]
    queries: list[tuple[str, float, float, float]]
    step: float
    coarse_step: float


class PrometheusClient:
    """Reads a Prometheus-compatible HTTP API. ``session`` is injected (tests, connection reuse)."""

    def __init__(
        self,
        url: str,
        *,
        session: requests.Session | None = None,
        bearer_token: str | None = None,
        verify: bool | str = True,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UsageError(f"--prometheus {url!r}: not an http(s) URL; give e.g. http://prometheus:9090")
        self.url = url.rstrip("/")
        self.session = session or requests.Session()
        self.session.verify = verify
        if bearer_token:
            self.session.headers["Authorization"] = f"Bearer {bearer_token}"
        self.timeout = timeout
        self.requests_sent = 0
        self._lock = threading.Lock()

    def _get(self, path: str, params: dict[str, str], query: str) -> Any:
        """The ``data`` of one API answer (an object with ``result``); one-line errors otherwise."""
        data = self._get_values(path, params, query)
        if not isinstance(data, dict) or "result" not in data:
            raise UsageError(f"--prometheus {self.url}: the answer to {path} has no data.result; is it Prometheus?")
        return data

    def _get_values(self, path: str, params: dict[str, str], query: str) -> Any:
        """The ``data`` of one API answer, whatever its shape; one-line errors naming the query."""
        where = f"{self.url}{path}"
        with self._lock:  # query_ranges sends from several threads
            self.requests_sent += 1
        try:
            # POST with a form body: a fleet-wide name regex can outgrow a URL's length limit,
            # and every Prometheus-compatible API accepts both (the HTTP API docs, "Range queries").
            if path.startswith("/api/v1/label/"):  # GET only (Prometheus 2.x answers POST with 405)
                response = self.session.get(where, params=params, timeout=self.timeout)
            else:
                response = self.session.post(where, data=params, timeout=self.timeout)
        except requests.exceptions.SSLError:
            raise UsageError(
                f"--prometheus {self.url}: TLS verification failed; give --ca-file or --insecure"
            ) from None
        except requests.exceptions.Timeout:
            raise UsageError(
                f"--prometheus {self.url}: no answer within {self.timeout:.0f} s to {query[:80]}; "
                "narrow --selector or the time range"
            ) from None
        except requests.exceptions.RequestException as exc:
            cause = "connection refused" if "refused" in str(exc).lower() else type(exc).__name__
            raise UsageError(
                f"--prometheus {self.url}: cannot connect ({cause}); check the URL and that it is up"
            ) from None
        body: Any
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):
            if response.status_code in (401, 403):
                raise UsageError(
                    f"--prometheus {self.url}: HTTP {response.status_code} (authentication); give --bearer-token-file"
                )
            if response.status_code >= 400:
                raise UsageError(
                    f"--prometheus {self.url}: HTTP {response.status_code} for {path}; "
                    "give the server's base URL (e.g. http://prometheus:9090)"
                )
            raise UsageError(
                f"--prometheus {self.url}: the answer to {path} is not Prometheus' JSON; "
                "give the base URL of a Prometheus-compatible API (e.g. http://prometheus:9090)"
            )
        if body["status"] == "error":
            error = str(body.get("error", "")).strip().splitlines()[0] if body.get("error") else "error"
            if _TOO_MANY_POINTS.search(error):
                raise _TooManyPoints(error)
            raise UsageError(f"--prometheus {self.url}: HTTP {response.status_code} for {query[:120]}: {error[:200]}")
        return body.get("data")

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """All series of ``query`` over [start, end] at ``step``, split to respect MAX_POINTS."""
        merged: dict[tuple[tuple[str, str], ...], Series] = {}
        chunk = (MAX_POINTS - 1) * step
        t = start
        while t <= end:
            stop = min(end, t + chunk)
            try:
                data = self._get(
                    "/api/v1/query_range",
                    {"query": query, "start": _fmt(t), "end": _fmt(stop), "step": _fmt(step)},
                    query,
                )
            except _TooManyPoints:
                if chunk <= step * 16:
                    raise UsageError(
                        f"--prometheus {self.url}: the server refuses even {int(chunk / step)} points per series "
                        f"for {query[:80]}; give a larger --step"
                    ) from None
                chunk = math.floor(chunk / step / 2) * step  # whole steps: the points stay on one grid
                continue
            if data.get("resultType") != "matrix":
                raise UsageError(
                    f"--prometheus {self.url}: query_range answered {data.get('resultType')!r}, not a matrix"
                )
            for item in data["result"]:
                labels = item.get("metric", {})
                key = tuple(sorted(labels.items()))
                points = [(ts, float(v)) for ts, v in item.get("values", ())]  # JSON numbers already
                if key in merged:
                    last = merged[key].points[-1][0] if merged[key].points else -math.inf
                    merged[key].points.extend(p for p in points if p[0] > last)
                else:
                    merged[key] = Series(labels, points)
            t = stop + step
        return list(merged.values())

    def query_ranges(self, queries: list[tuple[str, float, float, float]], workers: int = 4) -> list[list[Series]]:
        """Several range queries at once (Prometheus evaluates them in parallel), answers in order."""
        if len(queries) <= 1:
            return [self.query_range(*q) for q in queries]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, len(queries))) as pool:
            return list(pool.map(lambda q: self.query_range(*q), queries))

    def info_labels(self, names: list[str], matchers: str, start: float, end: float) -> list[dict[str, str]]:
        """The labels of the info series ``names`` (vllm:cache_config_info) last seen in the range,
        one dict per series; [] when the API cannot say (they only add detail)."""
        extra = "," + matchers if matchers else ""
        window = max(1, math.ceil(end - start))
        query = f'last_over_time({{__name__=~"{_name_regex(names)}"{extra}}}[{window}s])'
        try:
            data = self._get("/api/v1/query", {"query": query, "time": _fmt(end)}, query)
        except UsageError:
            return []
        return [dict(item.get("metric", {})) for item in data.get("result", ()) if isinstance(item, dict)]

    def present_names(self, names: list[str], matchers: str, start: float, end: float) -> list[str]:
        """Which of ``names`` have series matching ``matchers`` in [start, end] (one request to
        ``/api/v1/label/__name__/values`` with ``match[]``); all of them when the API cannot say."""
        extra = "," + matchers if matchers else ""
        match = f'{{__name__=~"{_name_regex(names)}"{extra}}}'
        try:
            data = self._get_values(
                "/api/v1/label/__name__/values", {"match[]": match, "start": _fmt(start), "end": _fmt(end)}, match
            )
        except UsageError:
            return names
        wanted = set(names)
        return sorted(n for n in data if isinstance(n, str) and n in wanted)

    def scrape_interval(self, names_of: list[str], matchers: str, start: float, end: float) -> float | None:
        """The data's own scrape interval: the median gap between raw samples of the series
        ``names_of`` (a gauge every scrape has) in the last hour of the range (None when none)."""
        window = min(end - start, 3600.0)
        names = _name_regex(names_of)
        sel = f'{{__name__=~"{names}"{"," + matchers if matchers else ""}}}'
        query = f"{sel}[{math.ceil(window)}s]"
        data = self._get("/api/v1/query", {"query": query, "time": _fmt(end)}, query)
        gaps: list[float] = []
        for item in data.get("result", ()):
            ts = [float(t) for t, _v in item.get("values", ())]
            gaps += [b - a for a, b in itertools.pairwise(ts) if b > a]
        return statistics.median(gaps) if gaps else None


class _TooManyPoints(Exception):
    """The server refused a range query for its number of points."""


def _fmt(t: float) -> str:
    return f"{t:.3f}".rstrip("0").rstrip(".")


def read_history(
    client: PrometheusClient,
    matchers: str,
    start: float,
    end: float,
    step: float | None,
    *,
    fine_names: list[str],
    increase_names: list[str],
    probe_names: list[str],
) -> RangeRead:
    """vLLM's series over [start, end]: the gauges and the preemption counter at ``step``
    (default: the data's scrape interval, at least 1 s and at most MAX_POINTS points over the
    range) for the saturation judgement; the other
    counters and the histograms (``_bucket``, ``_sum``, ``_count``) at a coarse step, one query
    per metric name present, as ``max_over_time`` over each coarse step.

    Why ``max_over_time``: those series are only used for their increase, and the maximum over a
    step is the counter's last value before a restart inside that step (vLLM's counters restart
    at 0 with the process), so the reset-aware increase over the coarse points stays exact unless
    a step holds two restarts, or a restart whose new process counts past the old one's total
    within the step. Raises UnusableInput naming the query when the selection holds no vLLM series.
    """
    if step is None:
        # CONTRACTS "Time flags": the data's own scrape interval, at most MAX_POINTS per series --
        # a month at 15 s would otherwise be 173,000 points per series; an explicit --step that
        # asks for more is honoured by splitting the range instead.
        interval = client.scrape_interval(probe_names, matchers, start, end)
        step = max(1.0, round(interval)) if interval else 15.0
        step = max(step, math.ceil((end - start) / (MAX_POINTS - 1)))
    increase_only = increase_names
    present = set(client.present_names(fine_names + increase_only, matchers, start, end))
    fine_queries = [(f"{name}{{{matchers}}}", start, end, step) for name in fine_names if name in present]
    series = [s for batch in client.query_ranges(fine_queries) for s in batch]
    if not series:
        shown = f"{{{matchers}}}" if matchers else "(no --selector)"
        probe = next((n for n in fine_names if n.endswith(":num_requests_running")), fine_names[0])
        first_query = f"{probe}{{{matchers}}} and {len(fine_names) - 1} other names"
        raise UnusableInput(
            f"--prometheus {client.url}: no vLLM series match {shown} between {_iso(start)} and {_iso(end)} "
            f"(query {first_query}); check --selector and the time range"
        )
    # The coarse points land on the first and last fine points, so the increase spans the evidence.
    first = min(p[0] for s in series for p in s.points[:1])
    last = max(p[0] for s in series for p in s.points[-1:])
    n = max(1, min(BUCKET_POINTS, int((last - first) / step)))
    coarse_step = (last - first) / n if last > first else step
    window = f"[{max(1, int(coarse_step * 1000))}ms]"
    coarse_names = [name for name in increase_only if name in present]
    coarse_queries = [
        (f"max_over_time({name}{{{matchers}}}{window})", first, last, coarse_step) for name in coarse_names
    ]
    for name, batch in zip(coarse_names, client.query_ranges(coarse_queries), strict=True):
        for item in batch:
            item.labels["__name__"] = name  # functions drop the name; one query per name keeps it known
            series.append(item)
    return RangeRead(series, fine_queries + coarse_queries, step, coarse_step)


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
