"""kvwatch's reader of the plain text format gives what prometheus_client's parser gives, or nothing.

kvwatch.parse.textformat reads an exposition only when every line has the strict form a server
writes, so that ``kvwatch snapshot FILE`` needs no prometheus_client import; any other text goes to
prometheus_client. The invariant: whenever it reads a text, prometheus_client reads it too, to the
same families and samples. Checked on every real exposition in tests/fixtures (whole and line by
line) and on each line of real vLLM scrapes changed in the ways pastes and other servers change
them; the reader must also read those real scrapes (else it would save nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.parse import metrics, paste
from kvwatch.parse.textformat import Family, read_families, refuses

FIXTURES = Path(__file__).parent / "fixtures"
EXPOSITIONS = sorted(
    p
    for p in FIXTURES.rglob("*")
    if p.is_file() and p.suffix in (".prom", ".txt", ".metrics") and p.stat().st_size < 4 << 20
)
# vLLM's own scrapes, as its prometheus_client wrote them (0.6-0.32, CPU runs recorded here)
REAL_VLLM = [
    FIXTURES / "vllm-cpu-seed" / "metrics-05.prom",
    *sorted((FIXTURES / "vllm-cpu-sliding-hybrid").rglob("metrics.prom")),
]


def _theirs(text: str) -> list[Family] | str:
    try:
        return [
            (f.name, [(s.name, dict(s.labels), float(s.value)) for s in f.samples])
            for f in text_string_to_metric_families(text + "\n")
        ]
    except Exception as exc:  # the parser raises ValueError, IndexError, ... (kvwatch.parse.metrics)
        return f"raises {type(exc).__name__}"


def _comparable(families: list[Family] | str) -> object:
    if isinstance(families, str):
        return families
    return [
        (n, [(s, sorted(labels.items()), "nan" if math.isnan(v) else v) for s, labels, v in ss]) for n, ss in families
    ]


def _agree(text: str) -> bool:
    """The invariants on one text; True when kvwatch read it."""
    if refuses(text):
        assert str(_theirs(text)).startswith("raises"), text[:200]
    ours = read_families(text)
    if ours is None:
        return False
    assert _comparable(ours) == _comparable(_theirs(text)), text[:200]
    return True


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


@pytest.mark.parametrize("path", EXPOSITIONS, ids=[str(p.relative_to(FIXTURES)) for p in EXPOSITIONS])
def test_every_fixture_reads_as_prometheus_client_reads_it_or_goes_to_it(path: Path) -> None:
    text = _read(path)
    _agree(text)
    for line in text.split("\n"):
        _agree(line)


@pytest.mark.parametrize("path", REAL_VLLM, ids=[str(p.relative_to(FIXTURES)) for p in REAL_VLLM])
def test_real_vllm_scrapes_are_read_without_prometheus_client(path: Path) -> None:
    assert _agree(_read(path))


# Ways a line is changed by pastes, other servers and other versions of the format.
_CHANGES: list[Callable[[str], str]] = [
    lambda s: s.replace(" ", "  ", 1),
    lambda s: s.replace(" ", "\t", 1),
    lambda s: s + " 1700000000000",  # a timestamp
    lambda s: s + ' # {trace_id="abc"} 1.0',  # an exemplar
    lambda s: s.replace('"', "", 1),
    lambda s: s.replace('",', '", ', 1),
    lambda s: s.replace("}", ",}", 1),
    lambda s: s.replace("{", '{__name__="x",', 1),
    lambda s: s.replace("{", '{__reserved="x",', 1),
    lambda s: s.replace("{", '{a:b="x",', 1),
    lambda s: s.replace("{", '{"quoted.name"="x",', 1),
    lambda s: s.replace("{", "{}", 1) if "{" not in s else s.replace("{", '{engine="9",', 1),
    lambda s: s.rsplit(" ", 1)[0] + " 1_000",
    lambda s: s.rsplit(" ", 1)[0] + " 0x10",
    lambda s: s.rsplit(" ", 1)[0] + " nan",
    lambda s: s.rsplit(" ", 1)[0] + " +Inf",
    lambda s: s.rsplit(" ", 1)[0] + " -Inf",
    lambda s: s.rsplit(" ", 1)[0] + " NaN",
    lambda s: s.rsplit(" ", 1)[0] + " 1e3",
    lambda s: s.rsplit(" ", 1)[0] + " .5",
    lambda s: s.rsplit(" ", 1)[0] + " 5.",
    lambda s: s.rsplit(" ", 1)[0] + " +7",
    lambda s: s.rsplit(" ", 1)[0] + " 123456789012345678901234567890",
    lambda s: s.rsplit(" ", 1)[0] + " ",
    lambda s: s.rsplit(" ", 1)[0],
    lambda s: s.replace("gauge", "info").replace("counter", "unknown"),
    lambda s: s.replace("histogram", "gaugehistogram").replace("summary", "stateset"),
    lambda s: s.replace("# HELP ", "#HELP ").replace("# TYPE ", "# TYPE  "),
    lambda s: s.replace("vllm:", "vllm.", 1),
    lambda s: s.replace("vllm:", "0vllm:", 1),
    lambda s: s.replace('="', '="\\\\n\\"', 1),
    lambda s: s.replace('="', '="\\t', 1),
    lambda s: s.replace('="', '="}{,=', 1),
    lambda s: "\ufeff" + s,
    lambda s: s + "\r",
    lambda s: "# EOF",
    lambda s: "# a comment " + s,
    lambda s: "# HELP",
    lambda s: "# TYPE x_total counter",
    lambda s: "# TYPE _total counter",
    lambda s: "$ curl http://127.0.0.1:8000/metrics",  # prose and shell pasted around a scrape
    lambda s: s.split("{")[0] + "$ 1",
    lambda s: "Running: 5 reqs " + s,
    lambda s: s.replace(" ", "x ", 1),
    lambda s: "- " + s,
    lambda s: "| " + s + " |",
    lambda s: "1 " + s,
    lambda s: "nan",
]


@pytest.mark.parametrize("change", range(len(_CHANGES)))
def test_each_line_changed_reads_as_prometheus_client_reads_it_or_goes_to_it(change: int) -> None:
    for path in REAL_VLLM[:2]:
        lines = _read(path).split("\n")
        for i, line in enumerate(lines):
            if not line:
                continue
            changed = _CHANGES[change](line)
            _agree(changed)
            # in its exposition: the families around it as well (a family opened or closed)
            _agree("\n".join([*lines[max(0, i - 3) : i], changed, *lines[i + 1 : i + 4]]))


def test_a_saved_scrape_with_a_shell_prompt_is_read_without_prometheus_client() -> None:
    """Users save `curl ... > file` output with the prompt line pasted in (real fixture 106)."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from kvwatch.parse.metrics import read_exposition\n"
        "r = read_exposition(open(sys.argv[1], encoding='utf-8').read())\n"
        "s = r.snapshot\n"
        "print(s.cache_config['num_gpu_blocks'], s.skipped_lines, 'prometheus_client' in sys.modules)\n"
    )
    path = FIXTURES / "real" / "metrics" / "106-v033-cache-config-info-curl.prom"
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["24188", "1", "False"]  # the pool as the paste states it; the prompt skipped


def test_the_snapshot_is_the_same_with_and_without_the_plain_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [metrics.read_exposition(_read(p)) for p in EXPOSITIONS]
    for module in (metrics, paste):
        monkeypatch.setattr(module, "read_families", lambda text: None)
        monkeypatch.setattr(module, "refuses", lambda text: False)
    slow = [metrics.read_exposition(_read(p)) for p in EXPOSITIONS]
    assert repr(fast) == repr(slow)
