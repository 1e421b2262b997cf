"""A client's newline inside a message vLLM logs starts no line of vLLM's own.

vLLM's NewLineFormatter writes every line of a multi-line message behind the message's own prefix
(process, level, time, file and line). When the message quotes a client (a request that failed
validation, its stop string holding newlines), each client line after a newline looks like a
vLLM line from async_llm.py, a logger that also writes engine deaths: a red-team review had an
EngineDeadError and an OOM forged that way, and the diagnosis turned to "oom_while_serving".

``tests/fixtures/vllm-cpu-newline`` was written by vLLM 0.32.0's own logging (its README):
``echoes.log`` holds the API server's failed-request messages with such stop strings, each
followed by a genuine vLLM line; ``genuine.log`` holds vLLM's own multi-line error, an
EngineCore start failure with its torch.OutOfMemoryError traceback, which must still count.

``tests/fixtures/vllm-cpu-traceback`` is a real vLLM 0.32.0 server run (its README): streaming
requests whose JSON schema's "type" holds newlines and lines that read as a CUDA OOM and an
EngineDeadError. The tracebacks the stream generators log (serving.py:500, :929) quote it in
every exception of their chain, behind the API server's prefix; uvicorn prints the /v1/responses
one raw, after "Exception in ASGI application". kvwatch before the fix read 17 forged errors from
the run and called it "oom_while_serving"; the server never ran out of memory and kept serving.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.parse.log import LogParser
from kvwatch.records import ErrorRecord, LogRecord
from kvwatch.sources import files, scanner
from tests.helpers import followed_records, two_chunk_doc
from tests.transport_forms import FORMS, cri_pieces, docker_pieces

FIXTURES = Path(__file__).parent / "fixtures"
SEED_LOG = FIXTURES / "vllm-cpu-seed" / "server.log"
ECHOES = FIXTURES / "vllm-cpu-newline" / "echoes.log"
GENUINE = FIXTURES / "vllm-cpu-newline" / "genuine.log"
TRACEBACKS = FIXTURES / "vllm-cpu-traceback"
TRACEBACK_RUN = TRACEBACKS / "server.log"
# The excerpts of that run: its three requests' tracebacks that quote the client, and the control
# (the same text without newlines).
FORGED = [TRACEBACKS / f"{name}.log" for name in ("forged", "forged-chat", "responses")]
CONTROL = TRACEBACKS / "control.log"
NEUTRAL = "(APIServer pid=10964) INFO 11-29 14:45:08 [x.py:1] hello"
SHIPPED = [
    "docker-json-file",
    "cri-pod-log-file",
    "docker-timestamps",
    "kubectl-prefix",
    "kubectl-prefix-and-timestamps",
    "journald",
    "docker-compose",
    "colour-levels",
    "crlf",
]


@pytest.fixture(autouse=True)
def _years_from_the_lines_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A year taken from a file's modification time belongs to the file, not to its lines (stdin
    has none), so it is left out (as in test_one_reading)."""
    from kvwatch.reconcile import evidence

    real = evidence.infer_years

    def lines_only(doc: dict[str, Any], *, created: float | None, log_mtime: float | None) -> None:
        real(doc, created=created, log_mtime=None)

    monkeypatch.setattr(evidence, "infer_years", lines_only)


def _lines(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").split("\n")[:-1]  # the "\r" vLLM wrote stays


def _every_line(lines: list[str]) -> list[LogRecord]:
    parser = LogParser()
    return [r for n, line in enumerate(lines, 1) for r in parser.feed_line(line, n)] + parser.finish()


def _followed(lines: list[str], batch: int) -> list[LogRecord]:
    return followed_records(lines, batch)


def _doc(path: Path | str, jobs: int = 1) -> dict[str, Any]:
    doc = analyze_paths([str(path)], jobs=jobs)
    for entry in doc["inputs"]:
        entry.pop("path")
        entry.pop("bytes")  # the harmless lines are shorter
    return doc


def test_the_fixture_is_vllms_formatter_output() -> None:
    text = ECHOES.read_bytes().decode("utf-8")
    # every client newline became "\r\n" and the message's prefix, as NewLineFormatter writes
    assert text.count("\r\n(APIServer pid=") >= 30
    assert "[async_llm.py:795] vllm.v1.engine.exceptions.EngineDeadError" in text
    assert "[async_llm.py:819] torch.OutOfMemoryError: CUDA out of memory" in text


@pytest.mark.parametrize("path", [ECHOES, *FORGED], ids=lambda p: p.stem)
@pytest.mark.parametrize("batch", [1, 2, 3, 1000])
def test_a_clients_lines_inside_vllms_message_give_no_record(path: Path, batch: int) -> None:
    """A failed request's message (echoes.log) and the tracebacks of the real run (each excerpt
    alone, from its first line: the error record's message, or uvicorn's ASGI error line)."""
    lines = _lines(path)
    assert _every_line(lines) == []
    assert _followed(lines, batch) == []
    doc = analyze_paths([str(path)])
    assert doc["errors"] == []
    assert doc["errors_total"] == 0
    assert doc["runs"] == 1


@pytest.mark.parametrize("batch", [1, 3, 1000])
def test_vllms_own_multi_line_error_still_counts(batch: int) -> None:
    lines = _lines(GENUINE)
    records = _every_line(lines)
    assert [r.kind for r in records if isinstance(r, ErrorRecord)] == ["other", "oom"]
    assert _followed(lines, batch) == records
    doc = analyze_paths([str(GENUINE)])
    assert doc["diagnosis"]["cause"] == "oom_at_start"


def _mixed(tmp_path: Path, form: str | None) -> tuple[Path, Path]:
    """The seed run with echoes.log and the forged tracebacks mid-run, and with as many harmless
    lines there instead."""
    seed = _lines(SEED_LOG)
    echoes = [*_lines(ECHOES), *(line for path in FORGED for line in _lines(path))]
    at = 120
    mixed = [*seed[:at], *echoes, *_lines(GENUINE), *seed[at:]]
    plain = [*seed[:at], *([NEUTRAL] * len(echoes)), *_lines(GENUINE), *seed[at:]]
    out = []
    for name, lines in (("mixed", mixed), ("plain", plain)):
        if form is not None:
            wrap, end = FORMS[form]
            text = end.join(wrap(i, line.rstrip("\r")) for i, line in enumerate(lines)) + end
        else:
            text = "\n".join(lines) + "\n"
        path = tmp_path / f"{name}.log"
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out[0], out[1]


@pytest.mark.parametrize("form", [None, *SHIPPED])
def test_the_echoes_change_no_document_and_the_genuine_error_counts(form: str | None, tmp_path: Path) -> None:
    mixed, plain = _mixed(tmp_path, form)
    doc = _doc(mixed)
    assert doc == _doc(plain)
    assert doc["runs"] == 1
    assert doc["capacity"]["kv_cache_tokens"] == 40960
    assert doc["errors_total"] == 2  # genuine.log's start failure and its OOM
    lines = mixed.read_text(encoding="utf-8").split("\n")[:-1]
    assert _followed(lines, 7) == _followed(plain.read_text(encoding="utf-8").split("\n")[:-1], 7)


@pytest.mark.parametrize("scanner_name", ["best", "python"])
@pytest.mark.parametrize("chunk", [1 << 10, 2 << 10, 4 << 10])
def test_a_message_cut_between_chunks_reads_alike_by_every_path(
    chunk: int, scanner_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks far smaller than a message: its run begins in one chunk and goes on in the next
    (the reader carries the run's state from chunk to chunk, in order)."""
    if scanner_name == "python":
        monkeypatch.setenv(scanner.ENV_VAR, "python")
    mixed, plain = _mixed(tmp_path, None)
    whole = _doc(plain)
    monkeypatch.setattr(files, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(files, "RANGE_SLACK", 64)
    with mixed.open("rb") as fh:  # some chunk starts inside a message: its reader decides that line
        assert sum(len(scan.echo_pending) for scan in files._serial_scans(fh, "plain")) > 0
    assert _doc(mixed) == whole
    assert _doc(mixed, jobs=2) == whole
    gz = tmp_path / "mixed.log.gz"
    gz.write_bytes(gzip.compress(mixed.read_bytes()))
    assert _doc(gz, jobs=2) == whole
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(mixed.read_bytes()), newline=""))
    assert _doc("-") == whole


def test_the_traceback_fixture_is_vllms_and_uvicorns_output() -> None:
    run = TRACEBACK_RUN.read_bytes().decode("utf-8")
    forged = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    # behind vLLM's prefix (NewLineFormatter's "\r\n" + prefix), three times per traceback
    assert run.count(f"[serving.py:500] {forged}") == 3
    assert run.count(f"[serving.py:929] {forged}") == 3
    # and raw in uvicorn's, after its ASGI error line
    assert run.count(f"\n{forged}") == 3
    assert "\nERROR:    Exception in ASGI application\n" in run
    for path in (*FORGED, CONTROL):  # the excerpts are slices of the run
        assert path.read_bytes() in TRACEBACK_RUN.read_bytes()


def test_the_run_with_the_forged_tracebacks_shows_no_crash() -> None:
    doc = analyze_paths([str(TRACEBACK_RUN)])
    assert doc["errors_total"] == 0  # not one forged OOM or engine death (the README's truth)
    assert doc["diagnosis"]["cause"] not in ("oom_while_serving", "engine_dead", "crashed")
    assert doc["runs"] == 1
    assert doc["capacity"]["kv_cache_tokens"] == 1048576  # the lines around them still read
    # the control, whose text has no newline, reads alike
    assert _every_line(_lines(CONTROL)) == []


def test_a_crashs_raw_traceback_still_counts_every_exception() -> None:
    """A traceback no ASGI error began is vLLM's own: its chained exceptions are records (the
    recorded start failure: the API server's RuntimeError, printed raw at exit, line 201)."""
    log = FIXTURES / "incidents" / "recorded" / "kv-space-v032-larger-than-ram" / "server.log"
    doc = analyze_paths([str(log)])
    assert [(e["line"], e["message"][:40]) for e in doc["errors"]] == [
        (48, "Available memory on node 0 (15.92/17.59 "),
        (57, "EngineCore failed to start."),
        (201, "Engine core initialization failed."),
    ]
    # the worker's repeated ValueError (its traceback printed twice in one message, line 55) is
    # that message's rest, read once
    assert doc["errors_total"] == 3


def _split_docs(path: Path, at: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The document of ``path`` read as two chunks, the second starting at line ``at`` (0-based)."""
    doc: dict[str, Any] = two_chunk_doc(path, at, monkeypatch, _doc)
    return doc


def test_a_traceback_cut_at_any_line_reads_alike_by_file_and_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chunk boundary inside the run's tracebacks (between a frame and its exception line,
    between an ASGI error line and its traceback, inside the client's lines): the reader carries
    what the run before holds; so does the sidecar from batch to batch."""
    lines = _lines(TRACEBACK_RUN)
    whole = _doc(TRACEBACK_RUN)
    followed = _followed(lines, 1000)
    assert whole["errors_total"] == 0
    first, last = 94, 369  # the four requests (the README's table)
    for at in range(first - 1, last):
        assert _split_docs(TRACEBACK_RUN, at, monkeypatch) == whole, f"cut before line {at + 1}"
        assert followed_records(lines, 1000, cut=at) == followed, f"batch cut before line {at + 1}"
    for batch in (1, 2, 3, 5, 7):
        assert _followed(lines, batch) == followed


FORGED_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
# More of a client's text, as it would stand in uvicorn's raw traceback of the /v1/responses
# request: lines that spell the start of a new request error, or a traceback of its own.
SPELLED = {
    "asgi-error-line": ["ERROR:    Exception in ASGI application", FORGED_OOM],
    "traceback-and-frame": ["Traceback (most recent call last):", '  File "x.py", line 1, in y', FORGED_OOM],
    # a stamp of the log's own that the byte search for a time cannot see (second red-team pass:
    # it ended the run only where a chunk or a sidecar batch began)
    "own-stamp-without-a-space": ["2024-12-04T19:11:10,5 ok", FORGED_OOM],
    "header-with-codes-in-its-time": [
        "(EngineCore_DP0 pid=5300) ERROR 12-04 19\x1b[0m:11:10 [core.py:1] " + FORGED_OOM,
        FORGED_OOM,
    ],
    "asgi-error-then-traceback": [
        "ERROR:    Exception in ASGI application",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in y',
        "    y()",
        FORGED_OOM,
    ],
}


@pytest.mark.parametrize("spelled", SPELLED, ids=str)
def test_a_client_that_spells_a_new_request_error_inside_one_gets_no_record(
    spelled: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's text sits after the traceback's first exception line (server.log 256, the
    client's lines from 257): whatever it spells, uvicorn's line or a traceback, is its own."""
    lines = _lines(TRACEBACK_RUN)
    at = 257  # after the client's first line, "fooo"'s successor (1-based 257 is index 256)
    forged = [*lines[:at], *SPELLED[spelled], *lines[at:]]
    path = tmp_path / "server.log"
    path.write_text("\n".join(forged) + "\n", encoding="utf-8")
    whole = _doc(path)
    assert whole["errors_total"] == 0
    followed = _followed(forged, 1000)
    assert [r for r in followed if isinstance(r, ErrorRecord)] == []
    for cut in range(246, 262 + len(SPELLED[spelled])):  # the ASGI error line to past the spelled lines
        assert _split_docs(path, cut, monkeypatch) == whole, f"cut before line {cut + 1}"
        assert followed_records(forged, 1000, cut=cut) == followed, f"batch cut before line {cut + 1}"


_COLOURED = {"DEBUG": "37", "INFO": "32", "WARNING": "33", "ERROR": "31", "CRITICAL": "35"}
_VLLM_LINE = re.compile(
    r"^(?P<proc>\([^)]*pid=\d+\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<time>\d\d-\d\d \d\d:\d\d:\d\d) (?P<file>\[[^\]]+\])"
)


def _vllm_colours(line: str) -> str:
    """A line as vLLM 0.32's ColoredFormatter writes it on a terminal (vllm/logging_utils/
    formatter.py: cyan process prefix, the level in its colour, grey time and file info), and
    uvicorn's level prefix in its colour (uvicorn's DefaultFormatter with use_colors)."""

    def paint(m: re.Match[str]) -> str:
        proc = f"\x1b[0;36m{m['proc'].rstrip()}\x1b[0;0m " if m["proc"] else ""
        level = f"\x1b[{_COLOURED[m['level']]}m{m['level']}\x1b[0m"
        return f"{proc}{level} \x1b[90m{m['time']}\x1b[0m \x1b[90m{m['file']}\x1b[0m"

    line = _VLLM_LINE.sub(paint, line)
    return re.sub(r"^(INFO|ERROR|WARNING):", lambda m: f"\x1b[{_COLOURED[m[1]]}m{m[1]}\x1b[0m:", line)


def test_on_a_terminal_the_run_after_a_request_error_ends_at_vllms_next_line(tmp_path: Path) -> None:
    """vLLM colours its prefix on a terminal (docker run -t); its lines still end uvicorn's raw
    run: a start failure's raw traceback after the forged run (a restart) counts, as in plain text."""
    crash = FIXTURES / "incidents" / "recorded" / "kv-space-v032-larger-than-ram" / "server.log"
    lines = [*_lines(TRACEBACK_RUN), *_lines(crash)]
    docs = []
    for name, form in (("plain", str), ("coloured", _vllm_colours)):
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(form(line) for line in lines) + "\n", encoding="utf-8")
        doc = _doc(path)
        assert [e["line"] - len(_lines(TRACEBACK_RUN)) for e in doc["errors"]] == [48, 57, 201], name
        docs.append(doc)
    assert "\x1b[0;36m(APIServer pid=5279)\x1b[0;0m \x1b[31mERROR\x1b[0m \x1b[90m12-04" in path.read_text()
    assert docs[0]["errors"] == docs[1]["errors"]


def _blanked(lines: list[str], first: int, count: int) -> list[str]:
    """``lines`` with ``count`` lines from index ``first`` replaced by harmless raw text."""
    return [*lines[:first], *(["x"] * count), *lines[first + count :]]


def _same_as_blanked(tmp_path: Path, lines: list[str], first: int, count: int) -> dict[str, Any]:
    """The document of ``lines``, checked equal to that of the same lines with the forged block
    blanked (so the lines around it read alike)."""
    docs = []
    for name, text in (("forged", lines), ("blanked", _blanked(lines, first, count))):
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(text) + "\n", encoding="utf-8")
        docs.append(_doc(path))
    assert docs[0] == docs[1]
    return docs[0]


def test_a_client_line_a_container_runtime_cuts_into_pieces_ends_no_run(tmp_path: Path) -> None:
    """A client line over 16 KiB is stored as pieces (docker json-file, CRI); the pieces after the
    first are no lines, and the run of the message goes on past them (red-team finding: the
    client's next lines behind vLLM's prefix were read as a fresh run)."""
    lines = _lines(TRACEBACK_RUN)
    prefix = lines[102][: lines[102].index("] ") + 2]  # server.log 103, behind [serving.py:500]
    assert prefix.endswith("[serving.py:500] ")
    long = [*lines[:102], prefix + "A" * 17000 + "\r", *lines[102:]]
    for name, wrap in (("docker", docker_pieces), ("cri", cri_pieces)):
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(p for line in long for p in wrap(line.rstrip("\r"))) + "\n", encoding="utf-8")
        doc = _doc(path)
        assert doc["errors_total"] == 0, name
        assert doc["runs"] == 1
        assert _doc(path, jobs=2) == doc
        shipped = path.read_text(encoding="utf-8").split("\n")[:-1]
        assert [r for r in _followed(shipped, 1000) if isinstance(r, ErrorRecord)] == [], name
        assert [r for r in _followed(shipped, 3) if isinstance(r, ErrorRecord)] == [], name


def test_uvicorns_lines_behind_vllms_stdout_prefix_are_still_a_request_error(tmp_path: Path) -> None:
    """vLLM 0.8.3-0.30 wrote "(APIServer pid=N) " before every line of the API server's stdout,
    uvicorn's too (real fixture 212: "(APIServer pid=1) INFO:     Shutting down"): the ASGI error
    line and its traceback are read behind it."""
    lines = _lines(TRACEBACK_RUN)
    decorated = [
        line if line.startswith("(") or n < 87 else "(APIServer pid=5279) " + line for n, line in enumerate(lines)
    ]
    assert decorated[248] == "(APIServer pid=5279) ERROR:    Exception in ASGI application"
    doc = _same_as_blanked(tmp_path, decorated, 248, 120)  # server.log 249-368, uvicorn's record
    assert doc["errors_total"] == 0


def test_a_request_error_in_a_log_of_the_users_own_format_hides_nothing_after_it(tmp_path: Path) -> None:
    """With vLLM's format replaced (real fixture 010, VLLM_CONFIGURE_LOGGING=0 and a dictConfig)
    no line has a vLLM header; each line's own stamp ends uvicorn's raw run, so a start failure's
    raw traceback after the forged one still counts (red-team finding: every later line read as
    the client's)."""
    own = (Path(__file__).parent / "fixtures" / "real" / "logs" / "010-v06-custom-logging-format.log").read_text()
    crash = _lines(FIXTURES / "incidents" / "recorded" / "kv-space-v032-larger-than-ram" / "server.log")[142:201]
    assert crash[0] == "Traceback (most recent call last):"  # the API server's, printed raw at exit
    access = 'INFO:     10.0.0.9:51234 - "POST /v1/responses HTTP/1.1" 200 OK'
    responses = _lines(TRACEBACKS / "responses.log")
    lines = [*own.splitlines(), access, *responses, *own.splitlines(), *crash]
    doc = _same_as_blanked(tmp_path, lines, 3, len(responses))
    assert [e["message"] for e in doc["errors"]] == ["Engine core initialization failed."]


def test_a_ray_task_errors_remote_exception_counts() -> None:
    """Ray's RayTaskError holds the remote task's traceback in its message (ray/exceptions.py):
    its line opens a traceback and the remote exception after the remote frames is the error, as
    Ray prints it (a record built to that format: no fixture here has one)."""
    prefix = "(EngineCore_DP0 pid=4711) ERROR 12-04 19:20:01 [core.py:710] "
    body = [
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 701, in run_engine_core',
        "    engine_core.run_busy_loop()",
        '  File "/usr/local/lib/python3.12/dist-packages/ray/_private/worker.py", line 2822, in get',
        "    raise value.as_instanceof_cause()",
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::RayWorkerWrapper.execute_model_ray() (pid=9137)",
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/executor/ray_utils.py", line 136, in execute_model_ray',
        "    output = self.worker.model_runner.execute_model(",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 1 has a total capacity of "
        "79.10 GiB of which 1.11 GiB is free.",
        "more text of the message, perhaps a client's",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    ]
    lines = [prefix + b + "\r" for b in body]
    kinds = [r.kind for r in _every_line(lines) if isinstance(r, ErrorRecord)]
    assert kinds == ["engine_dead", "oom"]  # the fatal error's line, then the remote OOM; nothing after
