"""Start-up: each command imports only its own module; ``kvwatch --help`` imports none.

Importing every command module (pydantic settings, prometheus_client, requests, the catalogue)
cost 0.2-0.3 s of every start-up; the figures are in benchmarks/startup_speed.py, never timed here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch import cli

FIXTURES = Path(__file__).parent / "fixtures"
SCRAPE = FIXTURES / "real" / "metrics" / "106-v033-cache-config-info-curl.prom"
BIGGEST_REAL_LOG = "022-v1-xpu-kv-cache-memory-bytes-fail.log"  # the largest real log: workers at a 1-byte threshold

_PROBE = """
import contextlib, io, sys
from kvwatch.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        assert not exc.code, exc.code
print(sorted(m for m in sys.modules if m.startswith("kvwatch.commands.")))
"""

_REGISTERED = """
from kvwatch import cli
cli._register_all()
for c in cli.app.registered_commands:
    print(c.name, c.callback.__module__, c.callback.__name__)
"""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--help"], []),
        (["--version"], []),
        # a given pool needs no memory profile; a GPU size loads its wiring (commands/capacity_memory.py)
        (["capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--kv-cache-gib", "5"], ["capacity"]),
        (
            ["capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-memory-gib", "80"],
            ["capacity", "capacity_memory"],
        ),
        (["fleet", "--help"], ["capacity"]),
        (["snapshot", str(SCRAPE)], ["snapshot"]),
        (["watch", "--help"], ["watch"]),
    ],
    ids=["help", "version", "capacity", "capacity-memory", "fleet", "snapshot-of-a-saved-file", "watch-help"],
)
def test_a_command_imports_only_its_own_module(argv: list[str], expected: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == repr([f"kvwatch.commands.{m}" for m in expected])


_HEAVY = (
    "kvwatch.records",
    "kvwatch.reconcile.weights",
    "prometheus_client",
    "pydantic",
    "requests",
    "urllib3",
    "rich",
)
_PROBE_HEAVY = _PROBE.replace(
    'print(sorted(m for m in sys.modules if m.startswith("kvwatch.commands.")))',
    f"print(sorted(m for m in {_HEAVY!r} if m in sys.modules))",
)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # typer's help needs none of them; rich stays a lazy placeholder (cli._lazy_rich_utils)
        (["--help"], []),
        # the napkin math of a given pool: no log records, no config.json weights, no HTTP, no validation library
        (["capacity", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--kv-cache-gib", "5"], []),
        # a saved file: the records it fills; no prometheus_client (kvwatch.parse.textformat), no HTTP client
        (["snapshot", str(SCRAPE)], ["kvwatch.records"]),
    ],
    ids=["help", "capacity", "snapshot-of-a-saved-file"],
)
def test_a_command_does_not_import_what_it_does_not_use(argv: list[str], expected: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE_HEAVY, *argv], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == repr(sorted(expected))


def test_every_registered_command_has_its_lazy_row() -> None:
    """A command added to _register_all but not to _LAZY would vanish from `kvwatch --help`."""
    out = subprocess.run([sys.executable, "-c", _REGISTERED], capture_output=True, text=True, check=True)
    registered = [line.split() for line in out.stdout.strip().splitlines()]
    lazy = [[name, f"kvwatch.commands.{module}", attr] for name, (module, attr, _) in cli._LAZY.items()]
    assert registered == lazy


def test_the_overview_lists_each_command_with_its_docstring() -> None:
    import importlib
    import inspect

    for module, attr, _ in cli._LAZY.values():
        func = getattr(importlib.import_module(f"kvwatch.commands.{module}"), attr)
        assert cli._summary(module, attr) == inspect.getdoc(func)  # what typer would show


def test_the_overview_parses_only_each_commands_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvwatch --help` parsed every command module whole (~5 ms each); the slice from `def NAME(`
    holds the function, so the whole module is never parsed (same docstring: the test above)."""
    import ast
    import importlib.util

    parsed: list[str] = []
    real_parse = ast.parse

    def recording_parse(source: str, *args: object, **kwargs: object) -> ast.Module:
        parsed.append(source)
        return real_parse(source)

    monkeypatch.setattr(cli.ast, "parse", recording_parse)
    for module, attr, _ in cli._LAZY.values():
        parsed.clear()
        assert cli._summary(module, attr)
        spec = importlib.util.find_spec(f"kvwatch.commands.{module}")
        assert spec is not None
        assert spec.origin is not None
        whole = Path(spec.origin).read_text(encoding="utf-8")
        assert len(parsed) == 1
        assert f"def {attr}(" in parsed[0]
        assert len(parsed[0]) < len(whole)


# `kvwatch analyze` on a log big enough for workers: what the parent had imported when they forked,
# and whether the document is the one a serial read gives. The size threshold is lowered so that a
# real fixture log is "big".
_EARLY_FORK = """
import contextlib, io, json, sys
from kvwatch.sources import files
files.PARALLEL_MIN_BYTES = 1
real_pool = files._pool
seen = []
def pool(jobs):
    seen.append(sorted(m for m in sys.modules if m.startswith("kvwatch.reconcile")))
    return real_pool(jobs)
files._pool = pool
from kvwatch.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["analyze", "--format", "json", "--jobs", "2", sys.argv[1]])
    except SystemExit as exc:
        assert not exc.code, exc.code
print(json.dumps({"reconcile_at_fork": seen, "doc": json.loads(out.getvalue())}))
"""


def test_analyze_forks_its_workers_before_it_imports_the_reconcile_stack() -> None:
    # The workers scan the log's first ranges while the parent imports what folds and explains
    # the records (~0.1 s): with them forked after, a big log's analyze paid both in turn.
    log = FIXTURES / "real" / "logs" / BIGGEST_REAL_LOG
    out = subprocess.run([sys.executable, "-c", _EARLY_FORK, str(log)], capture_output=True, text=True, check=True)
    probe = json.loads(out.stdout)
    assert probe["reconcile_at_fork"] == [[]]  # one pool, forked with nothing of kvwatch.reconcile loaded
    from kvwatch.batch import analyze_paths

    serial = analyze_paths([str(log)], jobs=1)
    assert probe["doc"] == serial
    assert serial["records_total"] > 0
