"""The two ways kvwatch refuses input, mapped to docs/contracts.md exit codes.

Commands raise these; ``kvwatch.cli.main`` turns them into one line on stderr and the exit code.
No command prints a Python traceback for bad input.
"""

from __future__ import annotations


class KvwatchError(Exception):
    """Base: ``str(exc)`` is the one-line message shown to the user (problem, then what to do)."""

    exit_code = 1


class UsageError(KvwatchError):
    """Exit 2: bad flag, missing file, malformed config.json."""

    exit_code = 2


class UnusableInput(KvwatchError):
    """Exit 1: the input was read but holds nothing kvwatch can use (e.g. no vLLM lines)."""

    exit_code = 1
