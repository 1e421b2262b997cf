"""The environment a timed kvwatch process gets: its modules from .pyc files, as installed.

An installed kvwatch runs from .pyc files (pip compiles them at install; an editable install writes
them on the first import). With PYTHONDONTWRITEBYTECODE set in the environment (as on some CI and
sandbox images, this one included), every timed run would compile each kvwatch module from source
again: ~0.15 s of each ``kvwatch analyze`` here, which no user pays. So timed processes get
PYTHONPYCACHEPREFIX, a fresh temporary directory filled by a warm-up run, and never that variable;
no source tree is written to. ``keep=True`` (a benchmark's ``--no-bytecode``) times the
environment as it is.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def timed_env(keep: bool = False) -> dict[str, str]:
    """A copy of os.environ for timed runs (see the module docstring)."""
    env = dict(os.environ)
    if not keep:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="kvwatch-bench-pyc-")
        atexit.register(shutil.rmtree, env["PYTHONPYCACHEPREFIX"], True)
    return env


def describe(env: dict[str, str]) -> str:
    """How the timed processes load kvwatch's modules, for the benchmark's heading."""
    return "modules from source each run" if "PYTHONDONTWRITEBYTECODE" in env else "modules from .pyc"
