"""Shared test fixtures and the gates for tests that need real components.

Real components are required, not optional: under CI (``CI=true``) a missing ``promtool`` or
``prometheus`` fails the test instead of skipping it, so a missing install step in .ci/run shows.
The real-vLLM end-to-end tests (marker ``vllm``) take minutes and 2.5 GB; they run with
``--run-vllm`` or ``KVWATCH_RUN_VLLM=1`` (.ci/run sets it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import EVENT_CEILING_SECONDS, Kvwatch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    # kvwatch keeps its compiled log scanner under $XDG_CACHE_HOME/kvwatch (kvwatch.sources.scanner):
    # the suite, and every kvwatch process it starts, uses a cache of its own, never the user's.
    if not os.environ.get("KVWATCH_TEST_CACHE"):
        import tempfile

        os.environ["KVWATCH_TEST_CACHE"] = os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="kvwatch-test-cache-")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-vllm", action="store_true", help="run end-to-end tests against a real vLLM server")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-vllm") or os.environ.get("KVWATCH_RUN_VLLM") == "1":
        return
    skip = pytest.mark.skip(reason="real-vLLM end-to-end test: run with --run-vllm or KVWATCH_RUN_VLLM=1")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


def require_binary(name: str) -> str:
    """Path of a system binary the test needs; skip locally, fail under CI, when it is missing."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not found: install Debian's package (apt-get install -y prometheus), as .ci/run does"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
    raise AssertionError("unreachable")


@pytest.fixture
def fixtures_dir() -> Path:
    """tests/fixtures."""
    return FIXTURES


@pytest.fixture
def kvwatch(tmp_path: Path) -> Iterator[Callable[..., Kvwatch]]:
    started: list[Kvwatch] = []

    def start(*args: str) -> Kvwatch:
        k = Kvwatch(list(args), tmp_path)
        started.append(k)
        return k

    yield start
    for k in started:
        if k.proc.poll() is None:
            k.proc.kill()
            k.proc.wait(EVENT_CEILING_SECONDS)
