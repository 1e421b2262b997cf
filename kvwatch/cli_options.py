"""The command-line options that several commands share, declared once (typer reads them as
``Annotated`` aliases): the Prometheus range and connection flags of ``analyze`` and ``simulate``,
and ``share_options``, which gives one command the options another declares."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

Prometheus = Annotated[
    str | None,
    typer.Option("--prometheus", metavar="URL", help="Read vLLM's series from a Prometheus-compatible HTTP API."),
]
Since = Annotated[
    str | None,
    typer.Option("--since", metavar="DURATION", help="With --prometheus: the last DURATION (default 1h)."),
]
Start = Annotated[
    str | None,
    typer.Option("--start", metavar="T", help="With --prometheus: range start, RFC 3339 or Unix seconds."),
]
End = Annotated[str | None, typer.Option("--end", metavar="T", help="With --prometheus: range end (default now).")]
Selector = Annotated[
    str | None,
    typer.Option("--selector", metavar="'{k=\"v\",...}'", help="With --prometheus: label matchers for every query."),
]
Step = Annotated[
    str | None,
    typer.Option("--step", metavar="DURATION", help="With --prometheus: resolution (default: the scrape interval)."),
]
BearerTokenFile = Annotated[
    Path | None,
    typer.Option("--bearer-token-file", show_default=False, help="With --prometheus: send this file's token."),
]
CaFile = Annotated[
    Path | None, typer.Option("--ca-file", show_default=False, help="With https: verify against this CA bundle.")
]
Insecure = Annotated[bool, typer.Option("--insecure", help="With https: do not verify the TLS certificate.")]


def share_options(command: Callable[..., Any], source: Callable[..., Any], leave_out: tuple[str, ...] = ()) -> None:
    """Give ``command`` (its own parameters, then ``**flags``) the parameters of ``source`` but
    ``leave_out``, in ``source``'s order: one declaration of a group of options.

    typer reads a command's options from its signature (``inspect.signature``, which honours
    ``__signature__``) and type hints; the annotations are resolved here (``eval_str``), since
    ``from __future__ import annotations`` leaves them as names of ``source``'s module. ``command``
    receives the shared options as keyword arguments in ``**flags``.
    """
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    shared = [p for p in inspect.signature(source, eval_str=True).parameters.values() if p.name not in leave_out]
    command.__signature__ = inspect.Signature([*own, *shared], return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in (*own, *shared)} | {"return": None}
