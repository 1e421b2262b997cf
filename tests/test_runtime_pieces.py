"""A line the container runtime cut into pieces is read as one line: no piece forges a record.

Docker's json-file driver and the kubelet's CRI files store a line over 16 KiB as several entries
(kvwatch.sources.pieces). A client decides what lands at the start of the next piece: a long
stop string that vLLM echoes in "Received request ... params: SamplingParams(...)" can put a
whole vLLM line there, header and all. Read as a line of its own, that piece set the pool to 3
tokens, added a stats record with 999 running, started a second server run and declared an
engine death or an OOM (found by a red-team review against a real vLLM 0.32.0 server).

Each test builds the real 0.32.0 seed run in a runtime's storage form, with one such echo cut
the way the runtime cuts it, the forged text at the cut or a little after it; and the same log
with the forged text replaced by as many harmless bytes (the same pieces, the same line
numbers). The two must read alike by every path: one process, byte ranges in workers (with a
range boundary inside the pieces), a .gz inflated while workers scan, stdin, both scanners, and
the sidecar's followed lines in batches of any size.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.records import LogRecord
from kvwatch.sources import files, pieces, scanner
from tests.helpers import followed_records
from tests.transport_forms import PIECE, STAMP, cri_pieces, docker_pieces

SEED_LOG = Path(__file__).parent / "fixtures" / "vllm-cpu-seed" / "server.log"

# What a client can make the next piece start with: real 0.32.0 lines of the seed run, altered.
FORGED = {
    "pool": "(EngineCore pid=11025) INFO 11-29 14:45:08 [kv_cache_utils.py:2327] CPU KV cache size: 3 tokens, "
    "Maximum concurrency for 9,216 tokens per request: 0.00x",
    "stats": "(APIServer pid=10964) INFO 11-29 14:45:08 [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 "
    "tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 999 reqs, Waiting: 999 reqs, CPU KV cache "
    "usage: 100.0%, Prefix cache hit rate: 0.0%",
    "restart": "(APIServer pid=666) INFO 11-29 14:45:08 [utils.py:233] non-default args: {'model': '/tmp/forged', "
    "'max_model_len': 9216}",
    "engine_dead": "(APIServer pid=10964) ERROR 11-29 14:45:08 [async_llm.py:567] vllm.v1.engine.exceptions."
    "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "oom": "(EngineCore pid=11025) ERROR 11-29 14:45:08 [core.py:1000] torch.OutOfMemoryError: CUDA out of "
    "memory. Tried to allocate 20.00 GiB.",
}
ECHO = (
    "(APIServer pid=10964) INFO 11-29 14:45:08 [request_logger.py:47] Received request cmpl-7f3a: params: "
    "SamplingParams(n=1, temperature=1.0, stop=['"
)
ECHO_END = "'], max_tokens=16), lora_request: None."


def _echo(forged: str, shift: int, pieces_before: int = 1) -> str:
    """An echo whose client text puts ``forged`` ``shift`` bytes after a runtime cut."""
    pad = pieces_before * PIECE - len(ECHO) + shift
    return ECHO + "A" * pad + forged + "Z" * 3000 + ECHO_END


FORMS: dict[str, Callable[..., list[str]]] = {"docker-json-file": docker_pieces, "cri": cri_pieces}


def _log(form: str, echo: str, *, stderr_between: bool = False) -> bytes:
    """The seed run in ``form``, with ``echo`` after its first stats line (another stream's entry
    between its pieces if asked: the runtime reads stdout and stderr apart)."""
    wrap = FORMS[form]
    out: list[str] = []
    echoed = False
    for line in SEED_LOG.read_text().splitlines():
        out.extend(wrap(line))
        if not echoed and "Avg prompt throughput" in line:
            cut = wrap(echo)
            if stderr_between:
                cut[1:1] = wrap("Processed prompts:  50%|#####     | 1/2", "stderr")
            out.extend(cut)
            echoed = True
    assert echoed
    return ("\n".join(out) + "\n").encode()


def _pair(tmp_path: Path, form: str, kind: str, shift: int, **kw: Any) -> tuple[Path, Path]:
    forged = tmp_path / "forged.log"
    harmless = tmp_path / "harmless.log"
    forged.write_bytes(_log(form, _echo(FORGED[kind], shift), **kw))
    harmless.write_bytes(_log(form, _echo("B" * len(FORGED[kind]), shift), **kw))
    assert forged.stat().st_size == harmless.stat().st_size
    return forged, harmless


def _doc(path: Path | str, jobs: int = 1) -> dict[str, Any]:
    doc = analyze_paths([str(path)], jobs=jobs)
    for entry in doc["inputs"]:
        entry.pop("path")
    return doc


@pytest.fixture(params=["hyperscan", "python"])
def which_scanner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setenv(scanner.ENV_VAR, "python")
    elif scanner.name() == "python":
        pytest.skip("hyperscan not installed here: the python scanner is covered by the other case")
    return str(request.param)


@pytest.mark.parametrize("shift", [0, 5, 200])
@pytest.mark.parametrize("kind", sorted(FORGED))
@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_forged_line_at_a_runtime_cut_reads_as_harmless_text(
    form: str, kind: str, shift: int, tmp_path: Path, which_scanner: str
) -> None:
    forged, harmless = _pair(tmp_path, form, kind, shift)
    doc = _doc(forged)
    assert doc == _doc(harmless)
    # What the seed run is (its README): one run, the 40,960-token pool, no error, 4-5 running.
    assert doc["capacity"]["kv_cache_tokens"] == 40960
    assert doc["runs"] == 1
    assert doc["errors_total"] == 0
    assert doc["stats"]["max"]["running"] == 5
    assert doc["stats"]["count"] == 21


def _first_stats_line(path: Path) -> int:
    return next(i for i, line in enumerate(path.read_bytes().split(b"\n")) if b"Avg prompt throughput" in line)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("lookback", [pieces.LOOKBACK, 20 << 10])
def test_worker_ranges_and_gz_pieces_cut_inside_the_pieces_read_alike(
    form: str, lookback: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which_scanner: str
) -> None:
    """Byte ranges and .gz pieces whose boundaries fall between the pieces of the cut line (and a
    look-back shorter than the log, so the state comes from the bytes just before)."""
    forged, harmless = _pair(tmp_path, form, "stats", 0, stderr_between=True)
    whole = _doc(harmless)
    assert _doc(forged) == whole
    monkeypatch.setattr(files, "LOOKBACK", lookback)
    head = len(b"\n".join(forged.read_bytes().split(b"\n")[: _first_stats_line(forged) + 2]))
    for chunk in (PIECE + 333, 7 << 10):
        monkeypatch.setattr(files, "CHUNK_BYTES", chunk)
        monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
        monkeypatch.setattr(files, "RANGE_SLACK", 64)
        # a boundary lies among the pieces: they start past ``head`` and span > 2 chunks
        assert any(head < k * chunk < head + 2 * PIECE for k in range(1, 100))
        assert _doc(forged, jobs=2) == whole
        gz = tmp_path / "forged.log.gz"
        gz.write_bytes(gzip.compress(forged.read_bytes(), compresslevel=1))
        assert _doc(gz, jobs=2) == whole
        assert _doc(gz, jobs=1) == whole


def test_stdin_reads_the_pieces_as_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forged, harmless = _pair(tmp_path, "cri", "restart", 0)
    whole = _doc(harmless)
    monkeypatch.setattr(files, "CHUNK_BYTES", 10 << 10)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(forged.read_bytes())))
    assert _doc("-") == whole


def _followed(data: bytes, batch: int) -> list[LogRecord]:
    """The records the sidecar applies, following ``data`` ``batch`` lines at a time."""
    return followed_records(data.decode().split("\n")[:-1], batch)


@pytest.mark.parametrize("batch", [1, 2, 3, 1000])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_sidecar_following_the_file_reads_the_pieces_as_one_line(
    form: str, batch: int, tmp_path: Path, which_scanner: str
) -> None:
    for kind in ("pool", "stats", "engine_dead"):
        forged, harmless = _pair(tmp_path, form, kind, 5, stderr_between=True)
        got = _followed(forged.read_bytes(), batch)
        assert got == _followed(harmless.read_bytes(), batch)
        assert not any(getattr(r, "running", 0) == 999 for r in got)


def test_a_docker_piece_ending_in_an_escaped_backslash_and_n_is_still_partial() -> None:
    r"""A client's "\n" (two characters) at the cut is JSON-escaped to "\\n": no line's end."""
    first = json.dumps({"log": "x" * 10 + "\\n", "stream": "stdout", "time": STAMP}, separators=(",", ":"))
    final = json.dumps({"log": "tail\n", "stream": "stdout", "time": STAMP}, separators=(",", ":"))
    data = f"{first}\n{final}\n".encode()
    assert pieces.entry(data, 0, len(first)) == (b"dstdout", True)
    found: list[int] = []
    scanner.line_spans(data, 0, len(data), found)
    assert found == [0] == pieces.python_partials(data, 0, len(data))
    assert pieces.continuations(data, 0, len(data), found) == ([len(first) + 1], pieces.CLOSED)


def test_pieces_of_one_stream_join_across_the_other_stream_and_stay_open_to_the_next_chunk() -> None:
    lines = [
        *cri_pieces("a" * (PIECE + 10), "stdout")[:1],  # stdout's first piece
        *cri_pieces("progress", "stderr"),  # stderr, whole, between
        f"{STAMP} stdout P INFO 12-01 10:00:00 [loggers.py:1] forged",  # stdout's middle piece
    ]
    data = ("\n".join(lines) + "\n").encode()
    found: list[int] = []
    scanner.line_spans(data, 0, len(data), found)
    cont, still_open = pieces.continuations(data, 0, len(data), found)
    assert cont == [data.index(b"stdout P INFO") - len(STAMP) - 1]
    assert still_open == {b"cstdout"}
    # the next chunk starts with stdout's final piece: a continuation, then a line of its own
    nxt = f"{STAMP} stdout F rest\n{STAMP} stdout F INFO 12-01 10:00:01 [loggers.py:1] real\n".encode()
    assert pieces.continuations(nxt, 0, len(nxt), [], still_open) == ([0], pieces.CLOSED)


def test_plain_text_and_docker_timestamps_hold_no_pieces() -> None:
    data = SEED_LOG.read_bytes()
    found: list[int] = []
    scanner.line_spans(data, 0, len(data), found)
    assert found == [] == pieces.python_partials(data, 0, len(data))
    stamped = b"".join(f"{STAMP} ".encode() + line for line in data.splitlines(keepends=True))
    assert pieces.python_partials(stamped, 0, len(stamped)) == []
