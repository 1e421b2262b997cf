"""The ways real vLLM output reaches an operator, as functions that rewrite a fixture that way.

Log forms (docker, kubectl, stern, journald, pod log files, colour terminals, hard wraps, CRLF)
and /metrics paste forms. Shared by the transport-form and real-extra tests (test modules never
import each other).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvwatch.commands.snapshot import load, snapshot_document
from tests.contract_rules import ENTRIES

LOGS = [e for e in ENTRIES if e["command"] == "analyze"]
LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")


def _docker(i: int, line: str) -> str:
    return f"2026-11-29T14:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}456789Z {line}"


def _kubectl(i: int, line: str) -> str:
    return f"[pod/vllm-7d9f8-x2k4q/vllm] {line}"


def _stern(i: int, line: str) -> str:
    return f"vllm-7d9f8-x2k4q vllm {line}"


def _colour(i: int, line: str) -> str:
    return LEVEL.sub(lambda m: f"\x1b[32m{m.group(1)}\x1b[0m", line)


def _journald(i: int, line: str) -> str:
    return f"Nov 29 14:{i // 60 % 60:02d}:{i % 60:02d} gpu-node-3 vllm[4711]: {line}"


def _compose(i: int, line: str) -> str:
    return f"vllm-1  | {line}"


def _docker_json(i: int, line: str) -> str:
    """A line of docker's json-file driver (/var/lib/docker/containers/*/*-json.log)."""
    stamp = f"2026-11-29T14:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}456789Z"
    return json.dumps({"log": line + "\n", "stream": "stdout", "time": stamp})


def _cri(i: int, line: str) -> str:
    """A line of the kubelet's CRI log files (/var/log/pods/*/*/N.log under containerd or CRI-O)."""
    return f"{_docker(i, '').rstrip()} stdout F {line}"


def _terminal(width: int) -> Callable[[int, str], str]:
    """Stats records as copied from a terminal of ``width`` columns that hard-wraps (k9s, a web
    console): cut at the column, not at a word."""

    def wrap(i: int, line: str) -> str:
        if "Avg prompt throughput" not in line or line.startswith("|"):  # a markdown table never saw a terminal
            return line
        return "\n".join(line[k : k + width] for k in range(0, len(line), width))

    return wrap


FORMS: dict[str, tuple[Callable[[int, str], str], str]] = {
    "terminal-80-columns": (_terminal(80), "\n"),
    "terminal-120-columns": (_terminal(120), "\n"),
    "cri-pod-log-file": (_cri, "\n"),
    "journald": (_journald, "\n"),
    "docker-compose": (_compose, "\n"),
    "docker-json-file": (_docker_json, "\n"),
    "docker-timestamps": (_docker, "\n"),
    "kubectl-prefix": (_kubectl, "\n"),
    "kubectl-prefix-and-timestamps": (lambda i, line: _kubectl(i, _docker(i, line)), "\n"),
    "stern": (_stern, "\n"),
    "colour-levels": (_colour, "\n"),
    "crlf": (lambda i, line: line, "\r\n"),
}


# A container runtime stores a long line as pieces (kvwatch/sources/pieces.py).
PIECE = 16 * 1024  # moby Copier bufSize; containerd's default max_container_log_line_size
STAMP = "2026-11-29T14:45:08.123456789Z"


def docker_pieces(line: str, stream: str = "stdout") -> list[str]:
    """One line as docker's json-file driver stores it: 16 KiB pieces, only the last ends in "\\n"."""
    raw = line + "\n"
    cut = [raw[i : i + PIECE] for i in range(0, len(raw), PIECE)]
    return [json.dumps({"log": p, "stream": stream, "time": STAMP}, separators=(",", ":")) for p in cut]


def cri_pieces(line: str, stream: str = "stdout") -> list[str]:
    """One line as containerd/CRI-O store it: pieces tagged P, the last F."""
    cut = [line[i : i + PIECE] for i in range(0, len(line), PIECE)] or [""]
    return [f"{STAMP} {stream} {'F' if k == len(cut) - 1 else 'P'} {p}" for k, p in enumerate(cut)]


HEADER = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d")


def _wrapped_continuation(previous: str, line: str) -> bool:
    """``line`` is the rest of a stats record hard-wrapped at the end of ``previous``."""
    cut = "Avg prompt throughput" in previous and not previous.rstrip().rstrip(".").endswith("%")
    return cut and not HEADER.search(line)


# Files the shipper itself writes (no terminal in between), and a terminal's own wrap: the records
# start as whole lines (026's 160-column wrap undone first).
WRITTEN_BY_THE_SHIPPER = {"docker-json-file", "cri-pod-log-file", "terminal-80-columns", "terminal-120-columns"}


def _unwrapped(lines: list[str]) -> list[str]:
    out: list[str] = []
    for i, line in enumerate(lines):
        if i and _wrapped_continuation(lines[i - 1], line):
            out[-1] += line
        else:
            out.append(line)
    return out


def shipped(source: Path, form: str, out: Path) -> Path:
    """``source`` rewritten as ``form`` would deliver it."""
    rewrite, newline = FORMS[form]
    lines = source.read_bytes().decode("utf-8", "surrogateescape").splitlines()
    if form in WRITTEN_BY_THE_SHIPPER:
        lines = _unwrapped(lines)
    result = [
        line if i and _wrapped_continuation(lines[i - 1], line) else rewrite(i, line) for i, line in enumerate(lines)
    ]
    out.write_bytes(newline.join(result).encode("utf-8", "surrogateescape") + newline.encode())
    return out


SCRAPES = [e for e in ENTRIES if e["command"] == "snapshot"]
CURL_HEADERS = (
    "HTTP/1.1 200 OK\ndate: Sun, 29 Nov 2026 14:00:00 GMT\nserver: uvicorn\n"
    "content-type: text/plain; version=0.0.4; charset=utf-8\n\n"
)
SCRAPE_FORMS: dict[str, Callable[[str], str]] = {
    "crlf": lambda text: text.replace("\n", "\r\n"),
    "curl-include-headers": lambda text: CURL_HEADERS + text,  # curl -i
    "blockquote": lambda text: "".join(f"> {line}\n" for line in text.splitlines()),
    "indented-code-block": lambda text: "".join(f"    {line}\n" for line in text.splitlines()),
    "shell-session": lambda text: f"$ curl -s localhost:8000/metrics\n{text}$ \n",
}


def snapshot_of(path: Path) -> Any:
    """The ``kvwatch.snapshot/1`` document of the exposition at ``path``, as JSON reads it back."""
    reading, origin = load(str(path))
    return json.loads(json.dumps(snapshot_document(reading, origin)))


def pasted(source: Path, paste: Callable[[str], str], out: Path) -> Path:
    """``source`` as ``paste`` would leave it, written to ``out``."""
    out.write_text(paste(source.read_text(encoding="utf-8")), encoding="utf-8")
    return out
