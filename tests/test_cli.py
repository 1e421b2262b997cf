"""The command line's outside: every command is listed, usage errors are one line with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

KVWATCH = [sys.executable, "-m", "kvwatch"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVWATCH, *args], capture_output=True, text=True, timeout=60, check=False)


def test_help_lists_every_contract_command() -> None:
    out = run("--help").stdout
    for command in ("analyze", "snapshot", "capacity", "fleet", "watch", "run"):
        assert command in out


@pytest.mark.parametrize(
    "args",
    [
        ["analyze", "--bogus", "x"],
        ["no-such-command"],
        ["analyze", "--format", "xml", "tests/fixtures/vllm-cpu/server.log"],
        ["snapshot", "--format", "yaml", "tests/fixtures/vllm-cpu/metrics-03.prom"],
        ["watch", "--scrape-interval", "soon"],
        ["fleet", "--peak-concurrent", "many"],
    ],
    ids=["unknown-flag", "unknown-command", "bad-choice", "bad-choice-snapshot", "not-a-number", "not-an-int"],
)
def test_usage_errors_are_one_line_on_stderr_with_exit_2(args: list[str]) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "error" in lines[0]
    assert "Traceback" not in proc.stderr
