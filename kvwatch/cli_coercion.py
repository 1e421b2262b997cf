"""typer's parameter coercion for plain values without importing pydantic: start-up time.

typer 0.2x coerces every parameter of the command that runs through a pydantic ``TypeAdapter``
(``typer.core._TyperParameter.get_runtime_param`` -> ``typer._coercion.build_runtime_param``),
built for each parameter even when its value is the default ``None``. Importing pydantic and
building those adapters was most of ``kvwatch capacity``'s and ``snapshot``'s start-up (measured
in benchmarks/startup_speed.py), for values that need no validation library: a string that stays
a string, a default that is already of its type, ``--jobs 2``.

``install()`` gives each parameter a runtime param that coerces exactly those values itself, with
the result typer's own adapter gives for them (tests/test_cli_coercion.py compares the two over a
table of values), and hands every other value (a malformed number, a bound to check, a path, a
choice under a token normaliser, any other annotation) to typer's own adapter, built then. So
typer's error messages, help and completion are unchanged. Where typer's internals differ (another
version), ``install()`` does nothing and typer works as it always does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

_NO = object()  # "not a plain value: typer's adapter decides"
# Decimal numbers as a user types them; anything else (signs, exponents, "1_000", spaces) goes to
# pydantic, whose parse of these equals Python's int()/float() (both correctly rounded).
_INT = re.compile(r"(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,18})?")


def plain_value(annotation: Any, info: Any, value: Any, ctx: Any) -> Any:
    """``value`` coerced to ``annotation`` as typer's adapter would, or ``_NO`` when it needs that adapter."""
    if getattr(info, "parser", None) is not None or getattr(info, "path_type", None) is not None:
        return _NO
    if get_origin(annotation) is list:
        (item,) = get_args(annotation) or (None,)
        if item is str and isinstance(value, list | tuple) and all(type(v) is str for v in value):
            return list(value)  # typer's list adapter validates each item as a str and returns a list
        return _NO
    if annotation is str:
        return value if type(value) is str else _NO
    if annotation is Path:
        return _plain_path(info, value)
    if annotation is int or annotation is float:
        if getattr(info, "clamp", False):
            return _NO
        if type(value) is annotation:
            number = value
        elif type(value) is str and (_INT if annotation is int else _FLOAT).fullmatch(value):
            number = annotation(value)
        else:
            return _NO
        low, high = getattr(info, "min", None), getattr(info, "max", None)
        if (low is not None and number < low) or (high is not None and number > high):
            return _NO  # out of bounds: typer's adapter words the error
        return number
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        if isinstance(value, annotation):
            return value  # typer's choice coercion returns a member given as itself
        plain_text = type(value) is str and getattr(info, "case_sensitive", True)
        if plain_text and getattr(ctx, "token_normalize_func", 1) is None:
            for member in annotation:
                if str(member.value) == value:  # typer compares str(choice.value) with the value
                    return member
        return _NO
    return _NO


def _plain_path(info: Any, value: Any) -> Any:
    """A path as typer 0.2x coerces it (``typer._param_types.coerce_cli_path``) under click's default
    path options, which check one thing only: an existing path must be readable.

    ``--state-dir`` and ``--model-config`` are such paths; typer's adapter for them alone imported
    pydantic into every running sidecar that was given one (9 MiB of its resident memory).
    """
    options = ("exists", "resolve_path", "allow_dash", "writable")
    if any(getattr(info, o, True) for o in options) or not (getattr(info, "file_okay", False) and info.dir_okay):
        return _NO
    if type(value) is not str or not value or "\0" in value:
        return _NO  # "" is Path("."), a NUL an error: pydantic's to say
    try:
        os.stat(value)
    except OSError:
        return Path(value)  # typer does not look further at a path that is not there
    if getattr(info, "readable", True) and not os.access(value, os.R_OK):
        return _NO  # typer's message: "... is not readable."
    return Path(value)


def install() -> None:
    """Coerce plain values without pydantic from now on (a no-op where typer's internals differ)."""
    try:
        from typer import _coercion, core
    except ImportError:
        return
    param_class = getattr(core, "_TyperParameter", None)
    runtime_param = getattr(_coercion, "RuntimeParam", None)
    build: Any = getattr(_coercion, "build_runtime_param", None)
    if param_class is None or runtime_param is None or build is None or getattr(param_class, "_kvwatch_plain", False):
        return
    if not hasattr(param_class, "get_runtime_param"):
        return

    @dataclass(frozen=True)
    class PlainRuntimeParam(runtime_param):  # type: ignore[misc,valid-type]
        """Plain values coerced here; any other value by typer's own runtime param, built then."""

        descriptor: Any = None

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            result = plain_value(self.annotation, self.parameter_info, value, ctx)
            if result is not _NO:
                return result
            real = build(self.descriptor)
            param._runtime_param = real
            return real._coerce_value(value, param=param, ctx=ctx)

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            descriptor = self.type_descriptor
            if getattr(descriptor, "file_annotation", None) is not None:
                self._runtime_param = build(descriptor)
            else:
                self._runtime_param = PlainRuntimeParam(
                    parameter_info=descriptor.parameter_info, annotation=descriptor.annotation, descriptor=descriptor
                )
        return self._runtime_param

    param_class.get_runtime_param = get_runtime_param
    param_class._kvwatch_plain = True
