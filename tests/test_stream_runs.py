"""A line of the other stream inside a message ends none of the message's runs.

A container runtime copies a container's stdout and stderr into one log line by line, one copier
per stream (containerd pkg/cri/io/logger.go ``NewCRILogger``/``redirectLogs``; docker's json-file
driver alike), so a line of stderr may land between two lines of one stdout write. vLLM's logger
writes to stdout, uvicorn's error logger to stderr, and any client can make uvicorn write a
stderr line at will: a malformed request gets "WARNING:  Invalid HTTP request received."
(uvicorn/protocols/http/httptools_impl.py ``data_received``). Before runs were kept apart by
stream, that one line inside vLLM's traceback of the recorded forged request
(tests/fixtures/vllm-cpu-traceback) ended the message's run, and the client's lines after it were
read as vLLM's own: an OOM and an engine death, forged. The same holds for a vLLM line on stdout
inside uvicorn's raw traceback on stderr. ``kvwatch run`` reads the child's two pipes apart and
keeps their lines apart the same way.

Each line of the recorded run is given the stream that wrote it (vLLM's logger and uvicorn's
access log: stdout; uvicorn's error logger, Python's warnings, torch's C++ warnings: stderr), and
a line of the other stream is put before every line of the four requests in turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.batch import analyze_paths
from kvwatch.parse.log import LogParser, line_stream, record_head
from kvwatch.records import ErrorRecord, LogRecord
from kvwatch.sources import files, pieces
from kvwatch.sources.lines import Line, LineSplitter
from tests.helpers import cri_entries, followed_records, recording_sidecar, stream_splits, two_chunk_doc

FIXTURES = Path(__file__).parent / "fixtures"
RUN = FIXTURES / "vllm-cpu-traceback" / "server.log"
# A real vLLM 0.32.0 in a CRI log, attacked: the forged requests and a flood of malformed ones
# (its README; recorded by tests/e2e/test_stream_interleave_e2e.py).
POD = FIXTURES / "vllm-cpu-cri-interleave" / "pod.log"
FIRST, LAST = 94, 369  # the four requests, 1-based (the fixture README's table)
ASGI = 249  # uvicorn's "ERROR:    Exception in ASGI application", its raw traceback to 368
# What a client makes either stream write between two lines of the other.
ON_STDERR = "WARNING:  Invalid HTTP request received."
ON_STDOUT = (
    "(APIServer pid=5279) WARNING 12-04 19:11:10 [protocol.py:58] The following fields were present "
    "in the request but ignored: {'foo'}"
)
STAMP = "2026-12-04T19:11:10.123456789Z"


def _lines() -> list[str]:
    return RUN.read_bytes().decode("utf-8").split("\n")[:-1]


def _stream(line: str) -> str:
    """The pipe that wrote a line of the recorded run (vllm/logger.py: stdout; uvicorn's
    LOGGING_CONFIG: its access log to stdout, the rest to stderr; warnings, torch: stderr)."""
    if record_head(line).key or line.startswith("INFO:     127.0.0.1:"):
        return "stdout"
    return "stderr"


def _streamed(at: int | None = None) -> list[tuple[str, str]]:
    """``(stream, line)`` of the run, with a line of the other stream before line ``at`` (1-based)."""
    out = [(_stream(line), line) for line in _lines()]
    if at is not None:
        stream = out[at - 1][0]
        out.insert(at - 1, ("stderr", ON_STDERR) if stream == "stdout" else ("stdout", ON_STDOUT))
    return out


def _cri(lines: list[tuple[str, str]]) -> list[str]:
    return [f"{STAMP} {stream} F {line.rstrip(chr(13))}" for stream, line in lines]


def _docker(lines: list[tuple[str, str]]) -> list[str]:
    return [
        json.dumps({"log": line + "\n", "stream": stream, "time": STAMP}, separators=(",", ":"))
        for stream, line in lines
    ]


def _plain(lines: list[tuple[str, str]]) -> list[str]:
    return [line for _, line in lines]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _errors(records: list[LogRecord]) -> list[ErrorRecord]:
    return [r for r in records if isinstance(r, ErrorRecord)]


def test_the_streams_are_the_ones_vllm_and_uvicorn_write_to() -> None:
    streamed = _streamed()
    assert streamed[ASGI - 1] == ("stderr", "ERROR:    Exception in ASGI application")
    assert {s for s, _ in streamed[ASGI : LAST - 1]} == {"stderr"}  # uvicorn's raw traceback
    assert {s for s, line in streamed if line.startswith("(APIServer pid=5279) ERROR")} == {"stdout"}
    assert streamed[247] == ("stdout", 'INFO:     127.0.0.1:38370 - "POST /v1/responses HTTP/1.1" 200 OK')


def test_a_runtime_line_names_its_stream_alike_in_text_and_bytes() -> None:
    """log.line_stream (text: the sidecar) and pieces.entry (bytes: analyze's chunks) agree."""
    forms = [*_cri(_streamed(120)), *_docker(_streamed(300)), *_plain(_streamed(120))]
    for line in forms:
        raw = line.encode()
        e = pieces.entry(raw, 0, len(raw))
        assert line_stream(line) == (e[0].decode() if e is not None else ""), line[:80]
    assert {line_stream(line) for line in forms} == {"cstdout", "cstderr", "dstdout", "dstderr", ""}


@pytest.mark.parametrize("form", [_cri, _docker], ids=["cri", "docker-json-file"])
def test_a_line_of_the_other_stream_inside_a_message_forges_nothing(form: Any, tmp_path: Path) -> None:
    """Before every line of the four requests in turn, by analyze and by the sidecar: not one
    error, whatever the other stream's line stands between."""
    clean = analyze_paths([str(_write(tmp_path / "clean.log", form(_streamed())))])
    assert clean["errors_total"] == 0
    for at in range(FIRST, LAST + 1):
        lines = form(_streamed(at))
        doc = analyze_paths([str(_write(tmp_path / "server.log", lines))])
        assert doc["errors_total"] == 0, f"a line of the other stream before line {at}"
        assert doc["runs"] == clean["runs"]
        assert _errors(followed_records(lines, 1000)) == [], f"sidecar, before line {at}"


def test_without_streams_the_same_line_forges_records(tmp_path: Path) -> None:
    """What the streams guard against: the same lines with nothing to tell their streams apart
    (``2>&1`` into a file) give forged errors where the other stream's line splits a message (a
    limit no text can lift: docs/architecture.md)."""
    forged = [
        at
        for at in range(FIRST, LAST + 1, 3)
        if analyze_paths([str(_write(tmp_path / "plain.log", _plain(_streamed(at))))])["errors_total"]
    ]
    # the split lets the client's lines through, in vLLM's record and in uvicorn's
    assert any(at < ASGI for at in forged)
    assert any(at > ASGI for at in forged)


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    for entry in doc["inputs"]:
        entry.pop("path")
    return doc


# Before the client's second line in vLLM's record of request 1, and inside uvicorn's traceback:
# both forge errors where nothing tells the streams apart (test_without_streams_...).
SPLITS = (103, 260)


@pytest.mark.parametrize("intruder", SPLITS, ids=["in-vllms-record", "in-uvicorns-traceback"])
def test_each_streams_run_is_carried_across_chunks_and_batches(
    intruder: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk or a sidecar batch that ends anywhere inside the requests: each stream's run is
    carried on its own (a stream with no line in a chunk keeps its run open past it)."""
    lines = _cri(_streamed(intruder))
    path = _write(tmp_path / "server.log", lines)
    whole = _comparable(analyze_paths([str(path)]))
    followed = followed_records(lines, 1000)
    assert whole["errors_total"] == 0
    monkeypatch.setattr(files, "CHUNK_BYTES", 2 << 10)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(files, "RANGE_SLACK", 64)
    assert _comparable(analyze_paths([str(path)], jobs=2)) == whole  # ranges of 2 KiB, in workers
    monkeypatch.undo()
    for at in range(FIRST - 1, LAST + 1):
        assert _comparable(two_chunk_doc(path, at, monkeypatch, lambda p: analyze_paths([str(p)]))) == whole, (
            f"cut before line {at + 1}"
        )
        assert followed_records(lines, 1000, cut=at) == followed, f"batch cut before line {at + 1}"


def test_a_plain_log_is_not_read_by_streams_a_client_line_spells(tmp_path: Path) -> None:
    """The streams are the input's: read off its first line, a runtime's. A client's raw line in
    a plain log that spells a CRI tag is text, and the document is the one without the tag."""
    lines = _plain(_streamed())
    spelled = [f"{STAMP} stderr F {line}" if ASGI < n <= LAST else line for n, line in enumerate(lines, 1)]
    assert line_stream(spelled[ASGI]) == "cstderr"
    doc = analyze_paths([str(_write(tmp_path / "spelled.log", spelled))])
    assert doc["errors_total"] == 0
    assert files.input_streams(spelled[0].encode()) == ()
    assert files.input_streams(_cri(_streamed())[0].encode()) == ("cstdout", "cstderr")


def test_a_childs_two_pipes_keep_their_runs_apart() -> None:
    """``kvwatch run``: the lines come untagged, each knowing its pipe (Line.stream); the parser
    keeps each pipe's runs apart as a runtime's tags would."""
    for at in sorted({*range(FIRST, LAST + 1, 5), *SPLITS}):
        streamed = _streamed(at)
        parser = LogParser()
        text = [line for _, line in streamed]
        records = parser.feed_lines(text, [True] * len(text), (), [s for s, _ in streamed]) + parser.finish()
        assert _errors(records) == [], f"before line {at}"
        if at in SPLITS:  # the same lines with no pipe to tell them apart
            untold = LogParser()
            assert _errors(untold.feed_lines(text, [True] * len(text)) + untold.finish())


def test_a_line_splitter_tags_its_lines_with_its_pipe() -> None:
    splitter = LineSplitter(16, "stderr")
    assert splitter.feed(b"a\n" + b"b" * 40 + b"\nc") == [
        Line("a", False, "stderr"),
        Line("b" * 16, True, "stderr"),
    ]
    assert splitter.flush() == Line("c", False, "stderr")
    assert LineSplitter().feed(b"x\n") == [Line("x")]


_WRITER = """
import json, sys, time
pairs = json.load(open(sys.argv[1], encoding="utf-8"))
last = None
for stream, line in pairs:
    if last is not None and stream != last:
        time.sleep(0.05)  # the other pipe's reader delivers what came before
    out = sys.stdout if stream == "stdout" else sys.stderr
    out.write(line + "\\n")
    out.flush()
    last = stream
"""


def test_kvwatch_run_keeps_the_childs_pipes_apart_end_to_end(tmp_path: Path) -> None:
    """The sidecar of ``kvwatch run`` over a real child writing the run to its two pipes, a line
    of stderr inside vLLM's record and one of stdout inside uvicorn's traceback: no error (each
    pipe's order is its own, however the two readers' deliveries interleave)."""
    import io
    import sys

    from kvwatch.sources.child import ChildProcess

    streamed = _streamed(SPLITS[0])
    streamed.insert(SPLITS[1], ("stdout", ON_STDOUT))
    script = tmp_path / "writer.py"
    script.write_text(_WRITER, encoding="utf-8")
    data = tmp_path / "lines.json"
    data.write_text(json.dumps(streamed), encoding="utf-8")
    proc = ChildProcess([sys.executable, str(script), str(data)], stdout=io.BytesIO(), stderr=io.BytesIO())
    delivered: list[Line] = []
    source = proc.lines
    poll = source.poll

    def polled() -> list[Line]:
        got = poll()
        delivered.extend(got)
        return got

    source.poll = polled  # type: ignore[method-assign]
    sidecar, seen = recording_sidecar(source)
    try:
        proc.start()
        assert proc.wait() == 0
        for _ in range(200):  # the child has exited: what its pipes held is queued or on its way
            source.wait(0.05)
            sidecar.read_log_once()
            if source.status().eof and len(delivered) == len(streamed):
                break
        sidecar.flush_parser()
    finally:
        sidecar.server.close()
    for name in ("stdout", "stderr"):  # each pipe's lines, in its order, each knowing its pipe
        assert [line.text for line in delivered if line.stream == name] == [
            line.rstrip("\r") for s, line in streamed if s == name
        ]
    assert len(delivered) == len(streamed)
    assert _errors(seen) == []


def test_the_recorded_pod_log_holds_splits_of_both_streams() -> None:
    """The recording: the copiers put stderr lines inside vLLM's tracebacks of the forged
    requests and vLLM's stdout lines inside uvicorn's (the README's counts)."""
    entries = cri_entries(POD)
    assert len(entries) == len(POD.read_bytes().splitlines()) == 814
    assert stream_splits(entries) == {"stderr_in_vllms_traceback": 150, "vllm_line_in_uvicorns_traceback": 170}
    assert sum(1 for _, line in entries if line == ON_STDERR) == 226


def test_the_recorded_pod_log_reads_with_no_error_by_every_reader(tmp_path: Path) -> None:
    """analyze (one chunk, 2 KiB worker ranges) and the sidecar (in batches of 1000 and of 7): no
    error, no crash; the same lines as one text give the forged OOM (kvwatch before the streams
    read 30 errors and oom_while_serving from the pod log itself)."""
    doc = analyze_paths([str(POD)])
    assert doc["errors_total"] == 0, doc["errors"][:3]
    assert doc["diagnosis"]["cause"] not in ("oom_while_serving", "engine_dead", "crashed")
    lines = POD.read_text(encoding="utf-8").split("\n")[:-1]
    for batch in (1000, 7):
        assert _errors(followed_records(lines, batch)) == [], batch
    untagged = _write(tmp_path / "untagged.log", [line for _, line in cri_entries(POD)])
    forged = analyze_paths([str(untagged)])
    assert forged["errors_total"] > 0
    assert forged["diagnosis"]["cause"] == "oom_while_serving"


def test_the_recorded_pod_log_reads_alike_in_worker_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = _comparable(analyze_paths([str(POD)]))
    monkeypatch.setattr(files, "CHUNK_BYTES", 2 << 10)
    monkeypatch.setattr(files, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(files, "RANGE_SLACK", 64)
    assert _comparable(analyze_paths([str(POD)], jobs=2)) == whole
    assert _comparable(analyze_paths([str(POD)])) == whole  # 2 KiB pieces, read in order
