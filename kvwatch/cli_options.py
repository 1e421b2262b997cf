"""The command-line options that several commands share, declared once (typer reads them as
``Annotated`` aliases): the Prometheus range and connection flags of ``analyze`` and ``simulate``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
