"""`kvwatch <cmd> --help` in an 80-column terminal shows every flag name whole, for every command."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import typer

from kvwatch.cli import _register_all, app


def _commands() -> dict[str, Any]:
    """Every registered command (typer's click group, read for its commands and their params)."""
    _register_all()
    group = typer.main.get_command(app)
    commands: dict[str, Any] = dict(getattr(group, "commands", {}))
    return commands


COMMANDS = _commands()


@pytest.mark.parametrize("name", sorted(COMMANDS), ids=sorted(COMMANDS))
def test_every_flag_name_is_whole_at_80_columns(name: str) -> None:
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm"}
    proc = subprocess.run(
        [sys.executable, "-m", "kvwatch", name, "--help"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    flags = [opt for param in COMMANDS[name].params for opt in getattr(param, "opts", []) if opt.startswith("-")]
    assert flags, name
    missing = [flag for flag in flags if flag not in text.replace("\n", " ").split(" ") and f"{flag}," not in text]
    assert missing == [], f"kvwatch {name} --help at 80 columns cuts or drops {missing}"
    assert "…" not in text  # nothing is ellipsised
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_capacity_flags_the_issue_named_are_whole() -> None:
    env = {**os.environ, "COLUMNS": "80"}
    text = subprocess.run(
        [sys.executable, "-m", "kvwatch", "capacity", "--help"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    ).stdout
    for flag in ("--gpu-memory-utilization", "--max-num-batched-tokens", "--model", "--model-config"):
        assert flag in text, flag
