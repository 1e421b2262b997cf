"""The sidecar's settings in one place: defaults, types, bounds, ``KVWATCH_*`` environment names.

``kvwatch watch`` and ``kvwatch run`` build a ``WatchSettings`` with :func:`load_settings` from the
flags the user gave; every other field comes from ``KVWATCH_<FIELD>`` environment variables, then
the defaults here. ``--help`` shows each flag's variable (``env_name``).

pydantic-settings defines what the flags and variables mean (names, case, lax parsing, error
messages), but importing it and building its model costs a running sidecar about 24 MiB of its
~47 MiB resident floor and ~100 ms of start-up (benchmarks/footprint.py, ``python -X importtime``).
So the plain cases are read here without it: a typed flag value, or a variable holding a plain
decimal number, a boolean word or a string, inside the field's bounds, passing the checks below.
Anything else (``1e3``, `` 2 ``, ``1_000``, a value out of bounds, a bad ``--listen``, ...) goes to
the pydantic-settings model built from the same fields (kvwatch.settings_model), so its meaning and
its message stay pydantic's. tests/test_settings.py holds the two paths equal, case by case.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.reconcile.saturation import DEFAULT_THRESHOLD, DEFAULT_WINDOW_SECONDS

ENV_PREFIX = "KVWATCH_"


def env_name(field: str) -> str:
    """The environment variable that sets ``field``."""
    return f"{ENV_PREFIX}{field.removesuffix('_path').upper()}"


def _about(
    description: str, *, gt: float | None = None, le: float | None = None, aliases: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A field's metadata: what the pydantic model is built from (kvwatch.settings_model)."""
    return {"description": description, "gt": gt, "le": le, "aliases": aliases}


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """Everything ``kvwatch watch`` / ``kvwatch run`` can be told.

    Build it from user input with :func:`load_settings` (flags, ``KVWATCH_*`` variables, checks);
    ``WatchSettings()`` is the defaults alone.
    """

    log: str | None = field(default=None, metadata=_about("vLLM log file to follow, or - for stdin"))
    metrics_url: str | None = field(default=None, metadata=_about("vLLM /metrics URL to scrape"))
    # Not "model_config": pydantic reserves the name. KVWATCH_MODEL_CONFIG sets it (env_name).
    model_config_path: Path | None = field(
        default=None,
        metadata=_about(
            "the model's config.json (or its folder)", aliases=("model_config_path", "KVWATCH_MODEL_CONFIG")
        ),
    )
    model: str | None = field(default=None, metadata=_about("model id or catalogue name, instead of --model-config"))
    listen: str = field(default="0.0.0.0:9400", metadata=_about("HOST:PORT for kvwatch's /metrics and /healthz"))
    web_config_file: Path | None = field(
        default=None, metadata=_about("Prometheus exporter-toolkit web config (TLS, basic auth) for kvwatch's /metrics")
    )
    scrape_interval: float = field(default=5.0, metadata=_about("seconds between /metrics scrapes", gt=0))
    scrape_timeout: float = field(default=3.0, metadata=_about("seconds before a scrape is abandoned", gt=0))
    engine_expiry_scrapes: int | None = field(
        default=None,
        metadata=_about("drop an engine /metrics stopped reporting after this many scrapes (default: 5 min)", gt=0),
    )
    bearer_token: str | None = field(default=None, repr=False, metadata=_about("bearer token for a protected /metrics"))
    insecure: bool = field(default=False, metadata=_about("skip TLS certificate verification for --metrics-url"))
    ca_file: Path | None = field(default=None, metadata=_about("CA bundle to verify --metrics-url's certificate"))
    from_start: bool = field(default=False, metadata=_about("read the log from its start instead of its end"))
    state_dir: Path | None = field(default=None, metadata=_about("where the log position is kept across restarts"))
    poll_interval: float = field(
        default=1.0, metadata=_about("seconds between log polls when no file event comes", gt=0)
    )
    replay: Path | None = field(
        default=None, metadata=_about("feed a saved log through the pipeline at its recorded pace")
    )
    speed: float = field(default=1.0, metadata=_about("replay pace multiplier (10 = ten times faster)", gt=0))
    window: float = field(default=DEFAULT_WINDOW_SECONDS, metadata=_about("saturation window W in seconds", gt=0))
    threshold: float = field(
        default=DEFAULT_THRESHOLD, metadata=_about("KV usage peak (0..1) that makes waiting memory-bound", gt=0, le=1)
    )
    max_num_seqs: int | None = field(
        default=None, metadata=_about("vLLM's max_num_seqs when the log does not state it", gt=0)
    )
    kv_cache_dtype: str | None = field(default=None, metadata=_about("KV cache dtype when the log does not state it"))
    tensor_parallel_size: int | None = field(
        default=None, metadata=_about("TP size when the log does not state it", gt=0)
    )


FIELDS: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(WatchSettings)
_TYPES: dict[str, type] = {"str | None": str, "str": str, "Path | None": Path, "float": float, "int | None": int}
_TYPES.update({"float | None": float, "bool": bool})


def field_type(f: dataclasses.Field[Any]) -> type:
    """The value type of a settings field (str, Path, float, int or bool), None allowed or not."""
    return _TYPES[str(f.type)]


def env_names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The variables that set field ``f``, in the order pydantic-settings looks them up (lower case:
    its lookup ignores case): each alias as written, then the prefixed field name."""
    return (*(a.lower() for a in f.metadata["aliases"]), (ENV_PREFIX + f.name).lower())


def check_listen(value: str) -> str:
    """``--listen`` is HOST:PORT (ValueError otherwise)."""
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 0.0.0.0:9400)")
    return value


def check_one_source_each(settings: Any) -> None:
    """One model source and one log source at most (ValueError otherwise)."""
    if settings.model_config_path is not None and settings.model is not None:
        raise ValueError("give --model-config or --model, not both")
    if settings.replay is not None and settings.log is not None:
        raise ValueError("give --log or --replay, not both")


def load_settings(flags: Mapping[str, Any]) -> WatchSettings:
    """The given flags (by field name) over ``KVWATCH_*`` variables (os.environ) over the defaults,
    checked. Raises kvwatch.errors.UsageError with one line naming the setting and the problem.
    """
    fast = _plain(flags, os.environ)
    if fast is not None:
        return fast
    from kvwatch.settings_model import validated  # pydantic-settings: loaded only for this input

    return validated(flags)


# What the plain path reads from a variable; any other text goes to pydantic. No sign, exponent,
# underscore, whitespace or leading zero: pydantic's lax parsing of those is its own to define.
_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_INTEGER = re.compile(r"[1-9][0-9]*")
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


def _plain(flags: Mapping[str, Any], environ: Mapping[str, str]) -> WatchSettings | None:
    """The settings when every value given is plain (see the module docstring), else None."""
    names = {f.name for f in FIELDS}
    if not names.issuperset(flags):
        return None
    # pydantic-settings' view of the environment: names in lower case, a later spelling winning
    env = {k.lower(): v for k, v in environ.items()}
    values: dict[str, Any] = {}
    for f in FIELDS:
        if f.name in flags:
            value = _plain_flag(f, flags[f.name])
        else:
            text = next((env[n] for n in env_names(f) if n in env), None)
            if text is None:
                continue
            value = _plain_text(f, text)
        if value is _NOT_PLAIN or not _in_bounds(f, value):
            return None
        values[f.name] = value
    settings = WatchSettings(**values)
    try:
        check_listen(settings.listen)
        check_one_source_each(settings)
    except ValueError:
        return None  # pydantic words the message
    return settings


_NOT_PLAIN = object()


def _plain_flag(f: dataclasses.Field[Any], value: Any) -> Any:
    """A flag's value as typer coerced it, when it is already of the field's type."""
    kind = field_type(f)
    if value is None:
        return _NOT_PLAIN  # an unset flag is left out by the caller; None given on purpose is pydantic's
    if kind is bool:
        return value if isinstance(value, bool) else _NOT_PLAIN
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else _NOT_PLAIN
    if kind is int:
        return value if type(value) is int else _NOT_PLAIN
    if kind is Path:
        return value if isinstance(value, Path) else _NOT_PLAIN
    return value if type(value) is str else _NOT_PLAIN


def _plain_text(f: dataclasses.Field[Any], text: str) -> Any:
    """A variable's text read as the field's type, when it is plain."""
    kind = field_type(f)
    if kind is str:
        return text
    if kind is Path:
        return Path(text) if text and "\0" not in text else _NOT_PLAIN
    if kind is bool:
        return True if text.lower() in _TRUE else False if text.lower() in _FALSE else _NOT_PLAIN
    if kind is float:
        return float(text) if _DECIMAL.fullmatch(text) else _NOT_PLAIN
    return int(text) if _INTEGER.fullmatch(text) and len(text) < 19 else _NOT_PLAIN


def _in_bounds(f: dataclasses.Field[Any], value: Any) -> bool:
    gt, le = f.metadata["gt"], f.metadata["le"]
    return (gt is None or value > gt) and (le is None or value <= le)
