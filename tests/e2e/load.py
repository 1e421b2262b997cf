"""A bounded closed-loop load generator for a vLLM OpenAI-compatible server on loopback.

Each client thread sends ``POST /v1/completions`` with a prompt of random token ids (the tiny
model has no tokenizer, so prompts must be id lists) and ``ignore_eos`` so every request really
generates ``max_tokens`` tokens; when the answer comes back it sends the next one (closed loop).
Bounded both ways: no new request after ``duration_seconds`` and never more than ``max_requests``
in total; requests already in flight finish (the drain). Only 127.0.0.1 / localhost URLs are
accepted: the harness never sends traffic anywhere else.

Nothing here prints or keeps the prompts: only counts, status codes and latencies.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import requests

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})


def require_loopback(url: str) -> str:
    """Return ``url`` unchanged if it points at this machine's loopback, else raise ValueError."""
    host = urlsplit(url).hostname
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"refusing to send load to {url!r}: the e2e harness only talks to 127.0.0.1")
    return url


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """What to send and how much of it.

    The defaults are the shape of shared/fixtures/vllm-cpu's run: 12 clients, 72-id prompts,
    440 generated tokens, so one request needs 512 tokens of KV and the 1,024-token pool holds two.
    """

    base_url: str  # e.g. http://127.0.0.1:8011 (no trailing /v1)
    model: str = "tiny-llama"
    clients: int = 12
    prompt_tokens: int = 72
    max_tokens: int = 440
    duration_seconds: float = 30.0  # no new request after this
    max_requests: int = 400  # total cap over all clients
    request_timeout_seconds: float = 120.0
    vocab_low: int = 3  # skip bos/eos ids (1, 2) of tiny-llama
    vocab_high: int = 999
    seed: int = 0


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What came back: counts, HTTP statuses (or exception class names) and latencies."""

    sent: int
    ok: int
    failures: tuple[str, ...]
    latencies_seconds: tuple[float, ...]
    wall_seconds: float
    completion_tokens: int


@dataclass
class _Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    ok: int = 0
    completion_tokens: int = 0
    failures: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


class ClosedLoopLoad:
    """Runs ``config.clients`` threads against ``config.base_url`` until the bounds are hit.

    ``start()`` returns at once; ``wait(timeout)`` joins the clients (the drain) and returns the
    result. ``stop()`` ends the sending early (requests in flight still finish). ``clock`` is
    injectable so the bounds can be tested without waiting.
    """

    def __init__(self, config: LoadConfig, clock: Callable[[], float] = time.monotonic) -> None:
        require_loopback(config.base_url)
        self.config = config
        self._clock = clock
        self._tally = _Tally()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started_at: float | None = None
        self._deadline = 0.0

    @property
    def url(self) -> str:
        """The completions endpoint the clients post to."""
        return self.config.base_url.rstrip("/") + "/v1/completions"

    def start(self) -> None:
        """Start the client threads."""
        if self._threads:
            raise RuntimeError("load already started")
        self._started_at = self._clock()
        self._deadline = self._started_at + self.config.duration_seconds
        for index in range(self.config.clients):
            thread = threading.Thread(target=self._client, args=(index,), name=f"load-{index}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Send no new requests; those in flight still finish."""
        self._stop.set()

    def in_flight_or_running(self) -> bool:
        """True while any client thread is alive."""
        return any(t.is_alive() for t in self._threads)

    def wait(self, timeout_seconds: float) -> LoadResult:
        """Join the clients (bounded) and return the result; raise TimeoutError if they hang."""
        end = time.monotonic() + timeout_seconds
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        if self.in_flight_or_running():
            self.stop()
            raise TimeoutError(f"load clients still running {timeout_seconds:.0f} s after wait() began")
        started = self._started_at if self._started_at is not None else self._clock()
        tally = self._tally
        with tally.lock:
            return LoadResult(
                sent=tally.sent,
                ok=tally.ok,
                failures=tuple(tally.failures),
                latencies_seconds=tuple(tally.latencies),
                wall_seconds=self._clock() - started,
                completion_tokens=tally.completion_tokens,
            )

    def _take_ticket(self) -> bool:
        """Reserve one request under both bounds."""
        if self._stop.is_set() or self._clock() >= self._deadline:
            return False
        with self._tally.lock:
            if self._tally.sent >= self.config.max_requests:
                return False
            self._tally.sent += 1
            return True

    def _client(self, index: int) -> None:
        cfg = self.config
        rng = random.Random(cfg.seed * 1000 + index)
        with requests.Session() as session:
            while self._take_ticket():
                prompt = [rng.randint(cfg.vocab_low, cfg.vocab_high) for _ in range(cfg.prompt_tokens)]
                body = {
                    "model": cfg.model,
                    "prompt": [prompt],
                    "max_tokens": cfg.max_tokens,
                    "ignore_eos": True,
                    "temperature": 0.8,
                }
                began = time.monotonic()
                outcome: str | None = None
                tokens = 0
                try:
                    # A fresh connection per request: a kept-alive one that sat idle while this
                    # thread waited for a core can be closed by uvicorn (timeout_keep_alive, 5 s)
                    # just as it is reused, a ConnectionError no server ever saw.
                    response = session.post(
                        self.url, json=body, timeout=cfg.request_timeout_seconds, headers={"Connection": "close"}
                    )
                    if response.status_code == 200:
                        usage = response.json().get("usage") or {}
                        tokens = int(usage.get("completion_tokens") or 0)
                    else:
                        outcome = f"HTTP {response.status_code}"
                except (requests.RequestException, ValueError) as exc:
                    outcome = type(exc).__name__
                latency = time.monotonic() - began
                with self._tally.lock:
                    if outcome is None:
                        self._tally.ok += 1
                        self._tally.completion_tokens += tokens
                        self._tally.latencies.append(latency)
                    else:
                        self._tally.failures.append(outcome)
