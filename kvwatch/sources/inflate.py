"""A saved ``.gz`` log opened for reading: inflated by ISA-L where it is installed, by zlib elsewhere.

A gzip stream has one reading order, so its inflation is serial however many workers scan what it
gives: on analyze_speed.py's 412 MB log, as .gz, zlib's ``inflate`` alone takes 1.04 s of CPU,
about as long as ``kvwatch analyze`` takes on the plain file, so the .gz could never come within
1.5x of it. ISA-L (Intel's Intelligent Storage Acceleration Library; python-isal's ``isal.igzip``
is a drop-in for the standard library's ``gzip``) inflates the same stream in 0.41 s
(``benchmarks/inflate_speed.py``, median of 5), and, like CPython's zlib module, outside the GIL,
so the reader thread of kvwatch.sources.readahead still overlaps the scan.

Both give the same bytes, so no document depends on which ran; ``name()`` says which did
(``kvwatch --version``). ``KVWATCH_GZIP=zlib`` forces the standard library (tests compare the two).
"""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from types import ModuleType
from typing import Any, BinaryIO

ENV_VAR = "KVWATCH_GZIP"  # "zlib" forces the standard library's gzip; anything else: the fastest one


@functools.cache
def _isal() -> tuple[ModuleType, type[Exception]] | None:
    """``isal.igzip`` and ISA-L's error class, or None where python-isal has no wheel."""
    try:
        from isal import igzip, isal_zlib
    except ImportError:
        return None
    error: Any = isal_zlib.error  # a class; python-isal's stubs declare an instance
    return igzip, error


def _engine() -> tuple[ModuleType, type[Exception]] | None:
    if os.environ.get(ENV_VAR, "").lower() == "zlib":
        return None
    return _isal()


def open_gzip(path: str) -> BinaryIO:
    """``path`` (a gzip file, one member or several) opened for reading its inflated bytes."""
    engine = _engine()
    if engine is None:
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return engine[0].open(path, "rb")  # type: ignore[no-any-return]


def errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged or truncated gzip raises, whichever inflater runs."""
    engine = _engine()
    extra = (engine[1],) if engine is not None else ()
    return (EOFError, gzip.BadGzipFile, zlib.error, *extra)


def name() -> str:
    """Which inflater reads ``.gz`` logs in this process: ``isal X.Y.Z`` or ``zlib X.Y.Z``."""
    if _engine() is not None:
        import isal

        return f"isal {isal.__version__}"
    return f"zlib {zlib.ZLIB_RUNTIME_VERSION}"
